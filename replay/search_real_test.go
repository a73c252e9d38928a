package replay

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"vramscope/internal/testkit/need"
)

// fragOpsScript prints the request stream of record.py's frag scenario
// (frag_ops(), a seeded random list), reading only that function of the
// script: the stream the real allocator's bisection ran, whole, where the
// snapshot recorded under a limit holds it only up to its OOM.
const fragOpsScript = `
import ast, random, sys
tree = ast.parse(open(sys.argv[1]).read())
ns = {"random": random, "MiB": 1 << 20}
for node in tree.body:
    if isinstance(node, ast.FunctionDef) and node.name == "frag_ops":
        exec(compile(ast.Module([node], []), "record.py", "exec"), ns)
for op in ns["frag_ops"]():
    print(*op)
`

// TestFragStreamNeeded: the whole fragmenting stream of the 2.11
// recordings, replayed under per-process limits as the real allocator was
// bisected on an H200, needs what the real one needed: with the default
// settings it runs or fails under each limit the bisection tried as the
// real one did (frag_default.json's probes) and needs 5,299,503,104 B;
// with expandable segments (PROVENANCE.md) it fails at 3,613,392,896 B,
// runs at 3,615,490,048 B, fails at 3,617,587,200 B and runs from
// 3,619,684,352 B up, the non-monotone edge included. The default figure
// rests on where the driver puts segments (sim.chunkRun): placed first
// fit, bottom up, the stream needs 5,513,412,608 B. It rests on where the
// search starts, too: the simulated allocator also runs at 5,230,297,088
// B, which the real bisection never tried (it tried 5,203,034,112 and
// 5,251,268,608: both fail, here too); the search, as the real one, starts
// from what a run with no limit reserves and does not land there.
func TestFragStreamNeeded(t *testing.T) {
	script := need.SnapshotOf(t, "pytorch-2.11", "record.py")
	out, err := exec.Command(need.Program(t, "python3"), "-c", fragOpsScript, script).Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	var reqs []Request
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var op string
		var id int64
		var size uint64
		fmt.Sscan(sc.Text(), &op, &id, &size)
		if op == "alloc" {
			reqs = append(reqs, Request{Op: OpMalloc, ID: id + 1, Size: size})
		} else {
			reqs = append(reqs, Request{Op: OpFree, ID: id + 1})
		}
	}
	if len(reqs) != 11889 {
		t.Fatalf("%d requests, want the 11,889 of frag_default.json", len(reqs))
	}
	const h200 = 150109880320
	s := Stream{Requests: reqs, Capacity: Capacity{Bytes: h200, Source: CapacityGiven}}

	var truth struct {
		Bisect struct{ Needed uint64 }
		Probes []struct {
			Limit uint64
			OK    bool
		}
	}
	data, err := os.ReadFile(need.SnapshotOf(t, "pytorch-2.11", "frag_default.json"))
	if err == nil {
		err = json.Unmarshal(data, &truth)
	}
	if err != nil || len(truth.Probes) == 0 {
		t.Fatalf("frag_default.json: %v", err)
	}
	def, err := s.Config("")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range truth.Probes {
		if ok, err := s.fits(def, p.Limit); err != nil || ok != p.OK {
			t.Errorf("default settings under %d B: runs %v (%v), the real allocator %v", p.Limit, ok, err, p.OK)
		}
	}
	if n, err := s.CapacityNeeded(def, Result{}, 0); err != nil || n.Steady != truth.Bisect.Needed || n.Lowest != n.Steady {
		t.Errorf("default settings: needed %+v (%v), the real allocator %d", n, err, truth.Bisect.Needed)
	}
	if dir := os.Getenv(freshEnv); dir != "" {
		// The same stream bisected again by record.py frag, on another
		// card or day (scripts/gpu-check.sh): the driver places segments
		// alike, so each probe runs or fails as there.
		t.Run("fresh", func(t *testing.T) {
			fresh := truth
			fresh.Probes = nil
			data, err := os.ReadFile(dir + "/frag_default.json")
			if err == nil {
				err = json.Unmarshal(data, &fresh)
			}
			if err != nil || len(fresh.Probes) == 0 {
				t.Fatalf("%s/frag_default.json: %v, %d probes", dir, err, len(fresh.Probes))
			}
			for _, p := range fresh.Probes {
				if ok, err := s.fits(def, p.Limit); err != nil || ok != p.OK {
					t.Errorf("default settings under %d B: runs %v (%v), the real allocator %v", p.Limit, ok, err, p.OK)
				}
			}
			if n, err := s.CapacityNeeded(def, Result{}, 0); err != nil || n.Steady != fresh.Bisect.Needed || n.Lowest != n.Steady {
				t.Errorf("default settings: needed %+v (%v), the real allocator %d", n, err, fresh.Bisect.Needed)
			}
			t.Logf("%d probes as the real allocator's; both need %d B", len(fresh.Probes), fresh.Bisect.Needed)
		})
	}

	cfg, err := s.Config("expandable_segments:True")
	if err != nil {
		t.Fatal(err)
	}
	for limit, want := range map[uint64]bool{3613392896: false, 3615490048: true, 3617587200: false, 3619684352: true} {
		if ok, err := s.fits(cfg, limit); err != nil || ok != want {
			t.Errorf("under %d B: runs %v (%v), the real allocator %v", limit, ok, err, want)
		}
	}
	n, err := s.CapacityNeeded(cfg, Result{}, 0)
	if err != nil || n != (Needed{Steady: 3619684352, Lowest: 3615490048, FailsAt: 3617587200}) {
		t.Errorf("needed %+v (%v)", n, err)
	}
}

// freshEnv names a folder of recordings that record.py made on another
// GPU or day than ../shared's (scripts/gpu-check.sh makes them):
// TestFragStreamNeeded checks its frag_default.json too.
const freshEnv = "VRAMSCOPE_FRESH_RECORDINGS"
