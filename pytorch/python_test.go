package pytorch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/internal/testkit"

	ogórek "github.com/kisielk/og-rek"
)

// figuresScript prints per-device figures of each snapshot named on the
// command line, computed with the standard pickle module.
const figuresScript = `
import gzip, pickle, json, sys
out = {}
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    s = pickle.loads(data)
    if isinstance(s, list):
        s = {"segments": s}
    devs = {}
    def dev(d):
        return devs.setdefault(str(d), {"segments": 0, "blocks": 0, "events": 0, "allocated": 0, "reserved": 0, "ooms": 0})
    for seg in s["segments"]:
        f = dev(seg["device"])
        f["segments"] += 1
        f["reserved"] += seg["total_size"]
        for b in seg["blocks"]:
            f["blocks"] += 1
            if b["state"] == "active_allocated":
                f["allocated"] += b["size"]
    for d, t in enumerate(s.get("device_traces", [])):
        f = dev(d)
        f["events"] += len(t)
        f["ooms"] += sum(1 for e in t if e["action"] == "oom")
    out[path] = devs
json.dump(out, sys.stdout)
`

type pyFigures struct {
	Segments, Blocks, Events, Ooms int
	Allocated, Reserved            uint64
}

func goFigures(traces []*Trace) map[string]pyFigures {
	m := map[string]pyFigures{}
	for _, t := range traces {
		f := t.Final.Figures()
		m[fmt.Sprint(t.Device)] = pyFigures{f.Segments, f.Blocks, len(t.Events), t.OOMs(), f.Allocated, f.Reserved}
	}
	return m
}

// Every real file of both sets, and our export of it, give the figures
// CPython gives.
func TestAgainstCPythonPickle(t *testing.T) {
	tmp := t.TempDir()
	var paths []string
	want := map[string]map[string]pyFigures{}
	for _, p := range realFiles(t) {
		name := filepath.Base(p)
		traces, err := DecodeFile(p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want[p] = goFigures(traces)
		exp := filepath.Join(tmp, name+".exported.pickle")
		var out bytes.Buffer
		if err := Export(&out, traces...); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(exp, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		want[exp] = want[p]
		paths = append(paths, p, exp)
	}
	sort.Strings(paths)
	var got map[string]map[string]pyFigures
	if err := json.Unmarshal(testkit.Python3(t, figuresScript, paths...), &got); err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		g, w := got[p], want[p]
		for dev, wf := range w {
			// Go has a trace for every device the file names; Python
			// only sees devices with segments or a trace list.
			if gf := g[dev]; gf != wf {
				t.Errorf("%s device %s: python %+v, go %+v", filepath.Base(p), dev, gf, wf)
			}
		}
		for dev, gf := range g {
			if _, ok := w[dev]; !ok && gf != (pyFigures{}) {
				t.Errorf("%s: python sees device %s, go does not", filepath.Base(p), dev)
			}
		}
	}
}

// realFiles are the files of both real sets.
func realFiles(t *testing.T) []string {
	return append(testkit.RealFiles(t, "pytorch"), testkit.RealFiles(t, "pytorch-2.11")...)
}

// The opcodes our export uses are a subset of what MemoryViz.js's
// unpickler reads (spec §2 and §9).
func TestExportUsesViewerOpcodes(t *testing.T) {
	traces := decodeBytes(t, readReal(t, "expandable_oom_multigpu.pickle"))
	var out bytes.Buffer
	if err := Export(&out, traces...); err != nil {
		t.Fatal(err)
	}
	script := `
import pickletools, sys
print(" ".join(sorted({op.name for op, _, _ in pickletools.genops(sys.stdin.buffer.read())})))`
	cmd := exec.Command("python3", "-c", script)
	if _, err := exec.LookPath("python3"); err != nil {
		testkit.Python3(t, "") // skips or fails as the environment says
	}
	cmd.Stdin = &out
	res, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	viewer := "APPEND APPENDS BINFLOAT BINGET BININT BININT1 BININT2 BINUNICODE EMPTY_DICT EMPTY_LIST FRAME LONG1 LONG_BINGET MARK MEMOIZE NEWFALSE NEWTRUE NONE PROTO SETITEM SETITEMS SHORT_BINUNICODE STOP TUPLE2"
	for _, op := range strings.Fields(string(res)) {
		if !strings.Contains(" "+viewer+" ", " "+op+" ") {
			t.Errorf("export uses %s, which memory_viz does not read", op)
		}
	}
}

// Snapshots re-pickled with protocols 0 to 3 and 5 (the C++ writer and
// Python 3.14 write 2 and 5; _memory_viz.py reads them all) give the same
// traces.
func TestOtherProtocols(t *testing.T) {
	src := testkit.Snapshot(t, "snapshot_action_entry.pickle")
	tmp := t.TempDir()
	testkit.Python3(t, `
import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
for p in (0, 1, 2, 3, 5):
    pickle.dump(s, open("%s/p%d.pickle" % (sys.argv[2], p), "wb"), protocol=p)
`, src, tmp)
	want, err := DecodeFile(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []int{0, 1, 2, 3, 5} {
		got, err := DecodeFile(filepath.Join(tmp, fmt.Sprintf("p%d.pickle", p)))
		if err != nil {
			t.Fatalf("protocol %d: %v", p, err)
		}
		sameTraces(t, want, got)
	}
}

// A pickle that would run os.system is refused and runs nothing.
func TestOSSystemPickleRefused(t *testing.T) {
	tmp := t.TempDir()
	marker := filepath.Join(tmp, "ran")
	testkit.Python3(t, `
import os, pickle, sys
class Evil:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[1],))
for p in range(0, 6):
    open("%s/evil%d.pickle" % (sys.argv[2], p), "wb").write(pickle.dumps({"segments": [Evil()]}, protocol=p))
`, marker, tmp)
	for p := 0; p <= 5; p++ {
		b, err := os.ReadFile(filepath.Join(tmp, fmt.Sprintf("evil%d.pickle", p)))
		if err != nil {
			t.Fatal(err)
		}
		_, err = Unpickle(bytes.NewReader(b))
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "GLOBAL") {
			t.Errorf("protocol %d: %v", p, err)
		}
		if _, err := Decode(bytes.NewReader(b)); err == nil {
			t.Errorf("protocol %d decoded", p)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran")
	}
}

// og-rek is the oracle for generic decoding of small pickles.
func TestAgainstOgRek(t *testing.T) {
	tmp := t.TempDir()
	testkit.Python3(t, `
import pickle, sys
shared = [1, 2]
word = "repeated"
samples = [
    None, True, False, 0, 1, -1, 255, 256, 65535, 65536, -2**31, 2**31 - 1, 2**31, 2**63 - 1,
    2**63, 2**64 - 1, 2**64, -2**63, -2**63 - 1, 2**100, -2**100, 0.0, 1.5, -2.25e300, float("inf"),
    "", "a", "\u00e9\u2603\U0001f600", "x" * 300, b"", b"bytes", b"y" * 300,
    [], [1, 2, 3], list(range(2500)), (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4),
    {}, {"a": 1}, {i: str(i) for i in range(1500)}, {"nested": [{"x": [1, (2, 3)]}]},
    [shared, shared, {"s": shared}, "shared-marker"], [word, word, word], {"frames": [{"name": "f", "filename": "a.py", "line": 2**64 - 1}]},
]
for p in (2, 3, 4, 5):
    for i, v in enumerate(samples):
        open("%s/p%d_%03d.pickle" % (sys.argv[1], p, i), "wb").write(pickle.dumps(v, protocol=p))
`, tmp)
	files, _ := filepath.Glob(filepath.Join(tmp, "*.pickle"))
	if len(files) == 0 {
		t.Fatal("no samples")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		base := filepath.Base(f)
		ours, err := Unpickle(bytes.NewReader(b))
		if strings.HasPrefix(base, "p2_") && (bytes.Contains(b, []byte("_codecs")) || bytes.Contains(b, []byte("\nbytes\n"))) {
			// Protocol 2 writes bytes as a call (_codecs.encode, bytes()): refused.
			if !errors.Is(err, ErrRefused) {
				t.Errorf("%s: %v, want refused", base, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", base, err)
			continue
		}
		if bytes.Contains(b, []byte("shared-marker")) {
			// og-rek memoizes a list before it is filled and keeps the empty
			// copy, so it is no oracle here; CPython gives this.
			want := "[[int(1), int(2)], [int(1), int(2)], {\"s\": [int(1), int(2)]}, \"shared-marker\"]"
			if got := canon(ours); got != want {
				t.Errorf("%s: %s, want %s", base, got, want)
			}
			continue
		}
		theirs, err := ogórek.NewDecoder(bytes.NewReader(b)).Decode()
		if err != nil {
			t.Fatalf("og-rek %s: %v", filepath.Base(f), err)
		}
		if a, b := canon(ours), canon(theirs); a != b {
			t.Errorf("%s:\n ours   %.200s\n og-rek %.200s", filepath.Base(f), a, b)
		}
	}
}

// canon prints a decoded value the same way whichever decoder made it.
func canon(v any) string {
	switch x := v.(type) {
	case nil, ogórek.None:
		return "None"
	case bool:
		if x {
			return "True"
		}
		return "False"
	case int64, uint64, int:
		return fmt.Sprintf("int(%d)", x)
	case *big.Int:
		return "int(" + x.String() + ")"
	case float64:
		return fmt.Sprintf("float(%v)", x)
	case string:
		return fmt.Sprintf("%q", x)
	case []byte:
		return fmt.Sprintf("b%q", x)
	case ogórek.Bytes:
		return fmt.Sprintf("b%q", string(x))
	case []any:
		return "[" + canonList(x) + "]"
	case Tuple:
		return "(" + canonList(x) + ")"
	case ogórek.Tuple:
		return "(" + canonList(x) + ")"
	case Dict:
		m := map[any]any{}
		for _, kv := range x {
			m[kv.Key] = kv.Value
		}
		return canonMap(m)
	case map[any]any:
		return canonMap(x)
	case ogórek.Dict:
		m := map[any]any{}
		x.Iter()(func(k, v any) bool { m[k] = v; return true })
		return canonMap(m)
	}
	return fmt.Sprintf("?%T", v)
}

func canonList(xs []any) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = canon(x)
	}
	return strings.Join(parts, ", ")
}

func canonMap(m map[any]any) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, canon(k)+": "+canon(v))
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, ", ") + "}"
}

var _ = gpu.ActionAlloc

// Every real file of both sets, and one pickled with protocols 0 and 1,
// decode and export to the Python value CPython unpickles from the
// original, every dict's keys in their order (testdata/compare_snapshots.py).
func TestExportSameValueAsCPython(t *testing.T) {
	tmp := t.TempDir()
	testkit.Python3(t, `
import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
for p in (0, 1):
    pickle.dump(s, open("%s/expandable_oom_multigpu.p%d.pickle" % (sys.argv[2], p), "wb"), protocol=p)
`, testkit.Snapshot(t, "expandable_oom_multigpu.pickle"), tmp)
	args := append(realFiles(t), filepath.Join(tmp, "expandable_oom_multigpu.p0.pickle"), filepath.Join(tmp, "expandable_oom_multigpu.p1.pickle"))
	var pairs []string
	for _, in := range args {
		traces, err := DecodeFile(in)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(in), err)
		}
		var out bytes.Buffer
		if err := Export(&out, traces...); err != nil {
			t.Fatal(err)
		}
		exp := filepath.Join(tmp, "exported-"+filepath.Base(in))
		if err := os.WriteFile(exp, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		pairs = append(pairs, in, exp)
	}
	script, err := os.ReadFile("testdata/compare_snapshots.py")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]struct {
		Equal        bool
		Diffs, Order []string
	}
	if err := json.Unmarshal(testkit.Python3(t, string(script), pairs...), &got); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(pairs); i += 2 {
		if c := got[pairs[i]]; !c.Equal || len(c.Diffs)+len(c.Order) > 0 {
			t.Errorf("%s: %+v", filepath.Base(pairs[i-1]), c)
		}
	}
}
