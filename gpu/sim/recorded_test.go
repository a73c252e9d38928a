package sim_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/replay"
)

const mib = 1 << 20

// h200 is the memory of the H200 the 2.11 recordings were made on
// (PROVENANCE.md): PyTorch reserves 9/8 of it for an expandable segment,
// so the second reservation's place depends on it.
const h200 = 150_109_880_320

// placements says, for each 2.11 recording, where its start-up ends and
// what the driver did that the recording does not show.
//
// Start-up: the first cudaMallocs of a process land among memory the
// driver holds for itself and hands out then (code of kernels loaded on
// first use, pinned host buffers: they take addresses from the same range,
// and no recording shows them), so where they go says nothing of the rule.
// anchor is the first cudaMalloc after it (1-based): every later one must
// lie where the recording put it, relative to it. 0: the whole recording
// is start-up.
type placement struct {
	anchor int
	// unseen are allocations of the driver's own after start-up: the
	// gaps they leave in the recording, and the segments that land right
	// past them, are those a cudaMalloc of their size placed by the rule
	// leaves and moves.
	unseen []unseen
	// misses are the cudaMallocs after the anchor that land elsewhere,
	// each with why.
	misses map[int]string
	// parts, when not 0, is how many of the recording's driver calls the
	// new run makes alike before it goes its own way, for the reason
	// parted gives; 0: all of them.
	parts  int
	parted string
}

// unseen is an allocation the recording does not show, made after
// cudaMalloc number after.
type unseen struct {
	after int
	size  uint64
}

var placements = map[string]placement{
	// 76 cudaMallocs after the first three, which land among the start-up
	// memory above the first 240 MiB segment. The 276 MiB segment at
	// 0x7f2138000000 takes the room a freed 278 MiB one left in a chunk
	// run its 2 MiB neighbours keep; eight 2 MiB segments go next fit
	// right after a 302 MiB one; a 242 MiB one does not take room from
	// two runs at once.
	"frag_default_oom.pickle": {anchor: 4},
	// Up to the first 48 MiB segment, placements jump between holes of
	// the start-up memory (0x7fb53e000000, 0x7fb582000000, ...); from it
	// on they go down, 24 MiB segments in the tails of 36 MiB ones, 12 and
	// 20 MiB ones next fit. Three chunks' gap between the second and third
	// 1000 MiB segments, two before the fourth.
	"train_default.pickle": {anchor: 21, unseen: []unseen{{68, 96 * mib}, {69, 64 * mib}}},
	// The same job with C++ frames: four chunks' gap before the third
	// 1000 MiB segment, two before the fourth.
	"train_stacks_all.pickle": {anchor: 15, unseen: []unseen{{31, 128 * mib}, {32, 64 * mib}}},
	// The same job, 12 layers, 300 steps. Start-up reaches further: #33,
	// a 24 MiB segment after the first 48 MiB ones, still takes a chunk
	// among the start-up memory, which a new run, having none, places
	// below the rest: up to #38 (which lands in #31's tail) segments lie
	// 32 MiB from where the recording has them relative to later ones, so
	// the anchor is #39. Three chunks' gap before the third 1000 MiB
	// segment; 10 MiB taken in its tail before the 2 MiB segment that
	// lands there; two chunks' gap before the fourth.
	"big.pickle.gz": {anchor: 39, unseen: []unseen{{124, 96 * mib}, {125, 10 * mib}, {126, 64 * mib}}},
	// DDP over gloo: pinned host buffers come and go through the steps.
	// Two chunks' gap below the first 250 MiB segment, four below the
	// second; 4 MiB taken in the fourth's tail after the 2 MiB segment
	// there, 4 MiB in the third's before the one that lands there, and
	// 2 MiB in the second's.
	"ddp_rank0.pickle": {anchor: 16, unseen: []unseen{{16, 64 * mib}, {17, 128 * mib}, {20, 4 * mib}, {20, 4 * mib}, {21, 2 * mib}},
		misses: map[int]string{
			27: "the room it takes, the tail of the first 176 MiB segment's run, was laid out during start-up, among memory the new run does not have",
			28: "next fit after #27, in the same room",
		},
		// The allocator takes the lowest of free blocks of one size: the
		// 207th allocation, 2 MiB, went to the first 176 MiB segment in
		// the recording, and to a 20 MiB one (#13) that start-up placed
		// among the driver's memory above it there, and below it here; so
		// the new run serves the first of the last two 250 MiB requests
		// from its cache.
		parts: 29, parted: "the 207th allocation went to another segment of a start-up layout laid out otherwise"},
	// CUDA graph capture and a MemPool: the driver allocates for the
	// graph itself while the segments are made (a 32 MiB segment even
	// starts in a run's tail and ends past it), so every placement is
	// start-up.
	"graphs.pickle": {anchor: 0},
	// Expandable segments: no cudaMalloc; the reservations are checked
	// by TestReservationsAsRecorded.
	"train_expandable.pickle": {anchor: 0},
}

// FreshEnv names a folder of recordings that record.py made on another
// GPU or day than ../shared's (scripts/gpu-check.sh makes them:
// frag_default_oom.pickle, train_default.pickle). TestPlacementAsRecorded
// checks each of them too (subtests fresh/NAME), by the placements of the
// recording of that name, as a rule the driver keeps rather than a fact
// of one run.
const freshEnv = "VRAMSCOPE_FRESH_RECORDINGS"

var (
	decodeMu sync.Mutex
	decoded  = map[string]map[string][]*pytorch.Trace{} // by folder, by file name
)

// recordings2_11 decodes every recording of shared/testdata/pytorch-2.11
// (once), by file name.
func recordings2_11(t *testing.T) map[string][]*pytorch.Trace {
	t.Helper()
	return recordingsIn(t, filepath.Dir(testkit.SnapshotOf(t, "pytorch-2.11", "PROVENANCE.md")))
}

// recordingsIn decodes every recording (*.pickle*) of dir, once, by file
// name.
func recordingsIn(t *testing.T, dir string) map[string][]*pytorch.Trace {
	t.Helper()
	decodeMu.Lock()
	defer decodeMu.Unlock()
	if recs, ok := decoded[dir]; ok {
		return recs
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.pickle*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no recordings in %s: %v", dir, err)
	}
	recs := map[string][]*pytorch.Trace{}
	for _, f := range files {
		trs, err := pytorch.DecodeFile(f)
		if err != nil {
			t.Fatal(err)
		}
		recs[filepath.Base(f)] = trs
	}
	decoded[dir] = recs
	return recs
}

// newRun replays tr's requests as a new run on a fresh simulated H200
// that places every segment itself, making the driver's unseen
// allocations after the cudaMallocs they follow, and returns the
// allocator's segment events.
func newRun(t *testing.T, tr *pytorch.Trace, hidden []unseen) []gpu.Event {
	t.Helper()
	if tr.Initial != nil && len(tr.Initial.Segments) > 0 {
		t.Fatalf("device %d starts with %d segments: a new run cannot place them as the driver did", tr.Device, len(tr.Initial.Segments))
	}
	s := replay.FromRecording(tr.Recording()).Unplaced()
	cfg, err := s.Config("")
	if err != nil {
		t.Fatal(err)
	}
	var events []gpu.Event
	dev := s.Device(h200)
	a, err := caching.New(dev, cfg, caching.WithSink(gpu.SinkFunc(func(b []gpu.Event) {
		for _, e := range b {
			switch e.Action {
			case gpu.ActionSegmentAlloc, gpu.ActionSegmentFree, gpu.ActionSegmentMap, gpu.ActionSegmentUnmap:
				events = append(events, e)
			}
		}
	})))
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Start(a)
	if err != nil {
		t.Fatal(err)
	}
	made := 0 // unseen allocations made
	for i, r := range s.Requests {
		if err := p.Step(i, r); err != nil {
			t.Fatal(err)
		}
		for made < len(hidden) && hidden[made].after == dev.Counts().Mallocs-made {
			if _, err := dev.Malloc(hidden[made].size); err != nil {
				t.Fatal(err)
			}
			made++
		}
	}
	if made < len(hidden) {
		t.Fatalf("the run made %d cudaMallocs: unseen allocation after #%d never made", dev.Counts().Mallocs-made, hidden[made].after)
	}
	a.Flush()
	return events
}

// segmentEvents are the recording's segment events.
func segmentEvents(tr *pytorch.Trace) []gpu.Event {
	var out []gpu.Event
	for _, e := range tr.Events {
		switch e.Action {
		case gpu.ActionSegmentAlloc, gpu.ActionSegmentFree, gpu.ActionSegmentMap, gpu.ActionSegmentUnmap:
			out = append(out, e)
		}
	}
	return out
}

// sameCalls checks that a run made the recording's driver calls, in
// order and of the same sizes: placement aside, it went the same way.
// With parts > 0 it checks the first parts calls, and that the run then
// goes its own way, as parted says why.
func sameCalls(t *testing.T, got, want []gpu.Event, parts int, parted string) {
	t.Helper()
	n := len(want)
	if parts > 0 {
		n = parts
	}
	for i := range min(len(got), len(want), n) {
		if got[i].Action != want[i].Action || got[i].Size != want[i].Size {
			t.Fatalf("driver call %d: the new run made %s of %d B, the recording %s of %d B", i, got[i].Action, got[i].Size, want[i].Action, want[i].Size)
		}
	}
	switch {
	case len(got) < n || parts == 0 && len(got) != len(want):
		t.Fatalf("the new run made %d driver calls, the recording %d", len(got), len(want))
	case parts > 0 && slices.EqualFunc(got, want, func(a, b gpu.Event) bool { return a.Action == b.Action && a.Size == b.Size }):
		t.Errorf("the new run makes all the recording's driver calls, yet is said to part after %d (%s)", parts, parted)
	}
}

// TestPlacementAsRecorded replays each 2.11 recording as a new run, whose
// segments the simulated driver places, and checks every cudaMalloc after
// start-up against the address the H200's driver gave it, relative to the
// first one after start-up: all 76 of frag_default_oom.pickle's after its
// first three; in the others, the driver's own allocations the recording
// does not show are made at the gaps they leave, and every other miss is
// listed with why. With $VRAMSCOPE_FRESH_RECORDINGS it checks that
// folder's recordings the same way (subtests fresh/NAME): there the
// device's size does not matter, as only expandable segments' reserved
// ranges depend on it.
func TestPlacementAsRecorded(t *testing.T) {
	recs := recordings2_11(t)
	for name, trs := range recs {
		pl, ok := placements[name]
		if !ok {
			t.Errorf("%s: a recording placements does not know: say where its start-up ends", name)
			continue
		}
		t.Run(name, func(t *testing.T) {
			checked := checkPlacement(t, trs, pl)
			if name == "frag_default_oom.pickle" && checked != 75 {
				t.Errorf("%d of frag_default_oom.pickle's cudaMallocs after the fourth checked, want all 75", checked)
			}
		})
	}
	for name := range placements {
		if _, ok := recs[name]; !ok {
			t.Errorf("%s: not among the recordings", name)
		}
	}
	if dir := os.Getenv(freshEnv); dir != "" {
		t.Run("fresh", func(t *testing.T) {
			for name, trs := range recordingsIn(t, dir) {
				pl, ok := placements[name]
				if !ok {
					t.Errorf("%s/%s: a recording placements does not know (%s holds record.py's recordings under the names of ../shared's)", dir, name, freshEnv)
					continue
				}
				t.Run(name, func(t *testing.T) { checkPlacement(t, trs, pl) })
			}
		})
	}
}

// checkPlacement replays a recording's one device trace as a new run and
// checks its driver calls and every cudaMalloc after the anchor against
// the recording, as pl says; it returns how many landed where recorded.
func checkPlacement(t *testing.T, trs []*pytorch.Trace, pl placement) (checked int) {
	t.Helper()
	if len(trs) != 1 {
		t.Fatalf("%d device traces, want 1", len(trs))
	}
	tr := trs[0]
	want := segmentEvents(tr)
	got := newRun(t, tr, pl.unseen)
	sameCalls(t, got, want, pl.parts, pl.parted)
	var mallocs [][2]gpu.Event // new run's, recording's
	for i := range min(len(got), len(want)) {
		if got[i].Action == gpu.ActionSegmentAlloc {
			mallocs = append(mallocs, [2]gpu.Event{got[i], want[i]})
		}
	}
	if pl.anchor == 0 {
		t.Logf("%d cudaMallocs, all during start-up", len(mallocs))
		return 0
	}
	if pl.anchor > len(mallocs) {
		t.Fatalf("anchor #%d of %d cudaMallocs", pl.anchor, len(mallocs))
	}
	base := mallocs[pl.anchor-1]
	missed := 0
	for n := pl.anchor + 1; n <= len(mallocs); n++ {
		m := mallocs[n-1]
		at := int64(m[0].Addr - base[0].Addr)
		rec := int64(m[1].Addr - base[1].Addr)
		why, listed := pl.misses[n]
		switch {
		case at != rec && !listed:
			t.Errorf("cudaMalloc #%d (%d MiB) at %+d MiB from #%d, recorded at %+d MiB (%#x)", n, m[0].Size/mib, at/mib, pl.anchor, rec/mib, m[1].Addr)
		case at == rec && listed:
			t.Errorf("cudaMalloc #%d lands where the recording put it, yet is listed as a miss (%s)", n, why)
		case listed:
			missed++
		default:
			checked++
		}
	}
	t.Logf("%d cudaMallocs after the first after start-up where the driver put them, %d explained misses, %d unseen allocations", checked, missed, len(pl.unseen))
	return checked
}

// TestReservationsAsRecorded: the reserved ranges of expandable segments
// go upward, each at the next 32 MiB boundary after the one before, as
// the H200's driver placed them in train_expandable.pickle: a new run maps
// every page where the recording did, relative to its first.
func TestReservationsAsRecorded(t *testing.T) {
	tr := recordings2_11(t)["train_expandable.pickle"][0]
	want := segmentEvents(tr)
	got := newRun(t, tr, nil)
	sameCalls(t, got, want, 0, "")
	second := uint64(0) // the small pool's reservation, 9/8 of the device past the large pool's
	for i := range got {
		at, rec := int64(got[i].Addr-got[0].Addr), int64(want[i].Addr-want[0].Addr)
		if at != rec {
			t.Errorf("%s %d of %d MiB at %+#x from the first, recorded at %+#x", got[i].Action, i, got[i].Size/mib, at, rec)
		}
		if rec > h200 && second == 0 {
			second = want[i].Addr
		}
	}
	if second == 0 {
		t.Fatal("no second reservation in train_expandable.pickle: the test would check only the allocator's own offsets")
	}
	t.Logf("%d maps and unmaps, the second reservation's at %#x", len(got), second)
}

// TestPlacementOfFreshRecordings runs TestPlacementAsRecorded's fresh
// subtests in a child process on folders named by $VRAMSCOPE_FRESH_RECORDINGS,
// as scripts/gpu-check.sh does with record.py's new recordings: copies of
// ../shared's pass, each file checked by the placements of its name; a
// recording of another job under a known name fails, naming the
// mismatch; a name placements does not know fails.
func TestPlacementOfFreshRecordings(t *testing.T) {
	shared := filepath.Dir(testkit.SnapshotOf(t, "pytorch-2.11", "PROVENANCE.md"))
	fresh := func(files map[string]string) string { // name in the folder: file of ../shared
		dir := t.TempDir()
		for name, from := range files {
			data, err := os.ReadFile(filepath.Join(shared, from))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	run := func(dir string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestPlacementAsRecorded$/^fresh$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), freshEnv+"="+dir)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, c := range []struct {
		name   string
		files  map[string]string
		fails  bool
		output []string
	}{
		{"copies", map[string]string{"frag_default_oom.pickle": "frag_default_oom.pickle", "train_default.pickle": "train_default.pickle"}, false,
			[]string{"--- PASS: TestPlacementAsRecorded/fresh/frag_default_oom.pickle", "--- PASS: TestPlacementAsRecorded/fresh/train_default.pickle",
				"75 cudaMallocs after the first after start-up where the driver put them"}},
		{"another job", map[string]string{"train_default.pickle": "train_stacks_all.pickle"}, true,
			[]string{"--- FAIL: TestPlacementAsRecorded/fresh/train_default.pickle"}},
		{"unknown name", map[string]string{"mine.pickle": "frag_default_oom.pickle"}, true,
			[]string{"mine.pickle: a recording placements does not know"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := run(fresh(c.files))
			if (err != nil) != c.fails {
				t.Errorf("the fresh subtests ended with %v, want failing %v:\n%s", err, c.fails, out)
			}
			for _, s := range c.output {
				if !strings.Contains(out, s) {
					t.Errorf("the output lacks %q:\n%s", s, out)
				}
			}
		})
	}
}
