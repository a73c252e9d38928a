package main

import (
	"encoding/binary"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"vramscope/gpu"
	"vramscope/gpu/cuda"
	"vramscope/internal/testkit/need"
	"vramscope/store"
)

// TestTraceDriverCalls runs `vramscope trace --device cuda` against the
// fake driver (gpu/cuda/testdata): it prints how long the workload ran and
// each driver function's calls and time, and those calls are the ones the
// stored events imply and the driver counted: with expandable segments a
// cuMemMap per page the segment_map events cover (20 MiB large, 2 MiB
// small) and one cuMemSetAccess per segment_map.
func TestTraceDriverCalls(t *testing.T) {
	cc := need.Program(t, "cc")
	dir := t.TempDir()
	lib := filepath.Join(dir, "libcuda.so.1")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-Wall", "-Werror", "-o", lib, "../../gpu/cuda/testdata/fakecuda.c").CombinedOutput(); err != nil {
		t.Fatalf("building the fake driver: %v\n%s", err, out)
	}
	head := regexp.MustCompile(`(?m)^trace (\S+): .*\nran for (\S+), (\S+) of it in (\d+) driver calls:\n((?:  .*\n)+)`)
	line := regexp.MustCompile(`(?m)^  (\w+) +(\d+)× +(\S+)$`)
	for _, conf := range []string{"", "expandable_segments:True"} {
		t.Run("conf="+conf, func(t *testing.T) {
			dir := t.TempDir()
			db, counts := filepath.Join(dir, "t.db"), filepath.Join(dir, "counts")
			cmd := vramscope(t, "trace", "--device", "cuda", "--workload", "frag", "--alloc-conf", conf, "--db", db, "--quiet")
			cmd.Env = append(cmd.Env, cuda.LibraryEnv+"="+lib, "FAKECUDA_COUNTS="+counts)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			m := head.FindStringSubmatch(string(out))
			if m == nil {
				t.Fatalf("no driver calls in the output:\n%s", out)
			}
			ran, sum := duration(t, m[2]), duration(t, m[3])
			if ran <= 0 || sum <= 0 || sum > ran {
				t.Errorf("driver calls took %v of a %v run", sum, ran)
			}
			calls, total := map[string]int{}, 0
			for _, l := range line.FindAllStringSubmatch(m[5], -1) {
				n, _ := strconv.Atoi(l[2])
				calls[l[1]] = n
				total += n
				if d := duration(t, l[3]); d <= 0 || d > sum {
					t.Errorf("%s took %v of the %v in driver calls", l[1], d, sum)
				}
			}
			if strconv.Itoa(total) != m[4] {
				t.Errorf("the lines count %d calls, the total says %s:\n%s", total, m[4], out)
			}

			// What the stored events imply.
			s, err := store.Open(db)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			events, err := s.Events(m[1], 0, math.MaxInt64)
			if err != nil {
				t.Fatal(err)
			}
			var maps, mapped, unmapped, segFrees int
			for _, e := range events {
				page := uint64(gpu.LargeBuffer)
				if e.Pool == gpu.PoolSmall {
					page = gpu.SmallBuffer
				}
				switch e.Action {
				case gpu.ActionSegmentMap:
					maps++
					mapped += int(e.Size / page)
				case gpu.ActionSegmentUnmap:
					unmapped += int(e.Size / page)
				case gpu.ActionSegmentFree:
					segFrees++
				}
			}
			want := map[string]int{"cuMemMap": mapped, "cuMemSetAccess": maps, "cuMemUnmap": unmapped, "cuMemFree_v2": segFrees}
			if conf != "" && (maps == 0 || unmapped == 0) {
				t.Fatalf("%d segment_map events, %d pages unmapped: the workload no longer maps and unmaps", maps, unmapped)
			}
			for name, n := range want {
				if calls[name] != n {
					t.Errorf("%s: %d calls printed, the events imply %d", name, calls[name], n)
				}
			}
			if conf != "" && calls["cuMemCreate"] < mapped {
				t.Errorf("%d cuMemCreate for %d pages mapped", calls["cuMemCreate"], mapped)
			}

			// What the driver counted (it counts the calls Close makes too,
			// but Close creates and maps nothing).
			b, err := os.ReadFile(counts)
			if err != nil || len(b) != 40 {
				t.Fatalf("the fake driver's counts: %d bytes, %v", len(b), err)
			}
			for i, name := range []string{"cuMemCreate", "cuMemMap", "cuMemSetAccess"} {
				if n := int(binary.NativeEndian.Uint64(b[8*i:])); n != calls[name] {
					t.Errorf("%s: %d calls printed, the driver counted %d", name, calls[name], n)
				}
			}
		})
	}
}

func duration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
