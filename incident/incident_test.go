package incident

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/replay"
)

const MiB = testkit.MiB

// record runs reqs on a simulated device and returns the events.
func record(t *testing.T, reqs []replay.Request, capacity uint64, conf string) []gpu.Event {
	t.Helper()
	cfg, err := caching.ParseConfig(conf)
	if err != nil {
		t.Fatal(err)
	}
	var events []gpu.Event
	a, _ := caching.New(sim.New(capacity), cfg, caching.WithSink(gpu.SinkFunc(func(b []gpu.Event) { events = append(events, b...) })))
	if _, err := replay.Replay(a, reqs, nil); err != nil {
		t.Fatal(err)
	}
	return events
}

// onDevice is reqs on a device of capacity bytes.
func onDevice(reqs []replay.Request, capacity uint64) replay.Stream {
	s := replay.Stream{Requests: reqs}
	s.Use(capacity, 0)
	return s
}

// atFirstOOM returns the layout right after the first oom event, and it.
func atFirstOOM(t *testing.T, initial *gpu.Layout, events []gpu.Event) (*gpu.Layout, gpu.Event) {
	t.Helper()
	l := initial.Clone()
	for _, e := range events {
		if err := l.Apply(e); err != nil {
			t.Fatal(err)
		}
		if e.Action == gpu.ActionOOM {
			return l, e
		}
	}
	t.Fatal("no oom event")
	return nil, gpu.Event{}
}

func TestScenarioDIsFragmentation(t *testing.T) {
	events := record(t, testkit.ScenarioD(), 60*MiB, "")
	l, oom := atFirstOOM(t, gpu.NewLayout(gpu.DefaultRules()), events)
	r := Analyze(l, oom, Device{Capacity: 60 * MiB})
	if r.Kind != "fragmentation" {
		t.Fatalf("kind %s: %s", r.Kind, r.Verdict)
	}
	want := "Fragmentation: 10.00 MiB was asked for and 42.00 MiB was not allocated, but in pieces: 42.00 MiB cached (the largest free block 8.00 MiB). " +
		"No piece held the request. 3 split segments could not be released."
	if r.Verdict != want {
		t.Errorf("verdict %q\nwant    %q", r.Verdict, want)
	}
	if r.SegmentSize != 10*MiB || len(r.Pinned) != 3 || r.Pinned[0].Live != 1 || r.Pinned[0].Free != 14*MiB {
		t.Errorf("report %+v", r)
	}
	if len(r.Pinners) != 1 || r.Pinners[0].Count != 3 || r.Pinners[0].Segments != 3 {
		t.Errorf("pinners %+v", r.Pinners)
	}
	if len(r.Pools) != 1 || r.Pools[0].Pool != "large" || r.Pools[0].Free != 42*MiB || r.Pools[0].LargestFree != 8*MiB {
		t.Errorf("pools %+v", r.Pools)
	}

	_, ws, err := WhatIfs(onDevice(replay.FromEvents(nil, events), 60*MiB), Variants, 2)
	if err != nil {
		t.Fatal(err)
	}
	if ws[0].AllocConf != "" || len(ws[0].OOMs) != 1 || ws[0].FragmentationAtOOM[0] != 1-8.0/42 {
		t.Errorf("original %+v", ws[0])
	}
	if ws[1].AllocConf != "expandable_segments:True" || !ws[1].Serves(15) || len(ws[1].OOMs) != 0 {
		t.Errorf("expandable segments should avoid the OOM: %+v", ws[1])
	}
}

func TestShortageIsNotFragmentation(t *testing.T) {
	reqs := []replay.Request{
		{Op: replay.OpMalloc, ID: 1, Size: 40 * MiB},
		{Op: replay.OpMalloc, ID: 2, Size: 18 * MiB},
		{Op: replay.OpMalloc, ID: 3, Size: 10 * MiB},
	}
	events := record(t, reqs, 60*MiB, "")
	l, oom := atFirstOOM(t, gpu.NewLayout(gpu.DefaultRules()), events)
	r := Analyze(l, oom, Device{Capacity: 60 * MiB})
	if r.Kind != "shortage" || !strings.HasPrefix(r.Verdict, "A real shortage: 10.00 MiB was asked for and only 2.00 MiB was not allocated (2.00 MiB free on the device): even in one piece it would not fit.") {
		t.Errorf("%s: %q", r.Kind, r.Verdict)
	}
	_, ws, err := WhatIfs(onDevice(replay.FromEvents(nil, events), 60*MiB), Variants, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if len(w.Avoided) > 0 || len(w.OOMs) != 1 {
			t.Errorf("nothing avoids a real shortage: %+v", w)
		}
	}
}

func TestRealOOMSnapshots(t *testing.T) {
	for _, c := range []struct {
		file   string
		device int
		kind   string
	}{
		{"oom_nonexpandable.json", 0, ""},
		{"expandable_oom_multigpu.pickle", 1, ""},
	} {
		traces, err := pytorch.DecodeFile(testkit.Snapshot(t, c.file))
		if err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		var tr *pytorch.Trace
		for _, x := range traces {
			if x.Device == c.device {
				tr = x
			}
		}
		l, oom := atFirstOOM(t, tr.Initial, tr.Events)
		capacity, ok := replay.EstimateCapacity(tr.Initial, tr.Events)
		if !ok || capacity < l.Figures().Reserved {
			t.Errorf("%s: capacity estimate %d", c.file, capacity)
		}
		r := Analyze(l, oom, Device{})
		if r.Verdict == "" || r.Requested != oom.Size || r.DeviceFree != oom.DeviceFree {
			t.Errorf("%s: %+v", c.file, r)
		}
		// Both real OOMs asked for far more than the holes and the device had.
		if r.Kind != "shortage" && r.LargestFree >= r.Requested {
			t.Errorf("%s: %s yet the largest hole fits", c.file, r.Verdict)
		}
		t.Logf("%s: %s (%d pinned segments)", c.file, r.Verdict, len(r.Pinned))
		s := replay.FromRecording(tr.Recording())
		if s.Capacity.Bytes != capacity {
			t.Errorf("%s: %s, want the OOM's estimate %d", c.file, s.Capacity, capacity)
		}
		_, ws, err := WhatIfs(s, Variants[:2], 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(ws[0].OOMs) == 0 {
			t.Errorf("%s: the original settings replayed without the OOM: %+v", c.file, ws[0])
		}
		for _, w := range ws {
			if !strings.Contains(w.AllocConf, "expandable") && c.file == "expandable_oom_multigpu.pickle" && w.Variant != DefaultsVariant {
				t.Errorf("%s: variants keep the original expandable_segments: %q", c.file, w.AllocConf)
			}
		}
		// One row per distinct setting, and one of PyTorch's defaults.
		seen := map[string]bool{}
		for _, w := range ws {
			if seen[w.AllocConf] {
				t.Errorf("%s: two rows of %q", c.file, w.AllocConf)
			}
			seen[w.AllocConf] = true
		}
		if !seen[""] {
			t.Errorf("%s: no row of the default settings", c.file)
		}
	}
}

// The report's JSON keeps both the OOM's request and the layout's total of
// requested bytes.
func TestReportJSONKeepsBothRequests(t *testing.T) {
	events := record(t, testkit.ScenarioD(), 60*MiB, "")
	l, oom := atFirstOOM(t, gpu.NewLayout(gpu.DefaultRules()), events)
	b, err := json.Marshal(Analyze(l, oom, Device{Capacity: 60 * MiB}))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(b, &m)
	if m["request_bytes"] != float64(10*MiB) || m["requested_bytes"] != float64(18*MiB) {
		t.Fatalf("request_bytes %v, requested_bytes %v in %s", m["request_bytes"], m["requested_bytes"], b)
	}
}

// Scenario D, then a real shortage (50 MiB asked with 18 MiB live on the
// 60 MiB device): expandable segments serve the first OOM, not the second.
func TestWhatIfPerOOM(t *testing.T) {
	reqs := append(testkit.ScenarioD(), replay.Request{Op: replay.OpMalloc, ID: 11, Size: 50 * MiB})
	ooms, ws, err := WhatIfs(onDevice(reqs, testkit.ScenarioDCapacity), Variants, 2)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ooms) != "[{15 10485760} {16 52428800}]" {
		t.Fatalf("original OOMs %v", ooms)
	}
	orig, exp := ws[0], ws[1]
	if len(orig.OOMs) != 2 || len(orig.Avoided) != 0 || len(orig.NewOOMs) != 0 || len(orig.FragmentationAtOOM) != 2 {
		t.Errorf("original %+v", orig)
	}
	if exp.Variant != "expandable_segments:True" || fmt.Sprint(exp.Avoided) != "[15]" || len(exp.NewOOMs) != 0 ||
		fmt.Sprint(exp.OOMs) != "[{16 52428800}]" {
		t.Errorf("expandable segments: %+v", exp)
	}
	// Nine 6 MiB tensors take three 20 MiB segments; then 10 and 50 MiB
	// segments of their own. Expandable: the nine fill three 20 MiB pages,
	// whose holes no page is wholly inside; the 10 MiB go in a hole, and
	// the 50 MiB grow the 12 MiB free at the end by two pages, but a
	// per-process limit is asked for the whole 50 MiB segment on top of
	// the 60 mapped: 110 MiB, as the real allocator needs.
	if orig.CapacityNeeded != 120*MiB || exp.CapacityNeeded != 110*MiB {
		t.Errorf("needed %d, %d with expandable segments", orig.CapacityNeeded>>20, exp.CapacityNeeded>>20)
	}
	table := Table{Capacity: testkit.ScenarioDCapacity, OOMs: ooms, Rows: ws}
	first, _ := table.ForOOM(0)
	second, _ := table.ForOOM(1)
	if first.Index != 15 || len(first.ServedBy) == 0 || first.ServedBy[0] != "expandable_segments:True" ||
		first.Sentences[0] != "expandable_segments:True would have served this request." {
		t.Errorf("first OOM: %+v", first)
	}
	if len(second.ServedBy) != 0 || second.Sentences[0] != "None of the settings tried would have served this request." {
		t.Errorf("second OOM: %+v", second)
	}
	if want := "Needs 120.00 MiB with the recorded settings, 110.00 MiB with expandable_segments:True (as a per-process limit)."; table.Needed() != want {
		t.Errorf("needed %q\nwant   %q", table.Needed(), want)
	}
	if _, ok := table.ForOOM(2); ok {
		t.Error("a third OOM")
	}
}

// TestWhatIfUnderAnUnrecordedLimit: the 2.11 fragmenting stream ran out of
// memory under torch.cuda.set_per_process_memory_fraction, which the
// snapshot does not record. The what-if replays it under the limit it
// infers: the original row has the recorded OOM at request 5,677,
// expandable segments serve it (the real allocator ran the stream under
// that limit with them), and the memory needed with the recorded settings
// is the real allocator's, 5,299,503,104 B (frag_default.json).
func TestWhatIfUnderAnUnrecordedLimit(t *testing.T) {
	traces, err := pytorch.DecodeFile(testkit.SnapshotOf(t, "pytorch-2.11", "frag_default_oom.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	s := replay.FromRecording(traces[0].Recording())
	table, err := Answer(s)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(table.OOMs) != "[{5677 292552704}]" || fmt.Sprint(table.Rows[0].OOMs) != fmt.Sprint(table.OOMs) || table.Contradiction != "" {
		t.Errorf("original OOMs %v, replayed %v; %q", table.OOMs, table.Rows[0].OOMs, table.Contradiction)
	}
	if table.Limit == nil || table.Limit.DeviceFree < 100<<30 {
		t.Fatalf("limit %+v", table.Limit)
	}
	exp := table.Rows[1]
	if exp.Variant != "expandable_segments:True" || !exp.Serves(5677) || len(exp.NewOOMs) != 0 {
		t.Errorf("expandable segments: %+v", exp)
	}
	if n := table.Rows[0].CapacityNeeded; n != 5299503104 {
		t.Errorf("needs %d B with the recorded settings, the real allocator 5,299,503,104", n)
	}
	// The limit inferred is the most it can have been, a byte under what
	// the run needs: the two figures read apart, in one unit.
	if n := table.Needed(); !strings.Contains(n, "The recording ran under a per-process limit of 5,299,503,103 B (inferred): the recorded settings need 5,299,503,104 B, more than the limit.") ||
		!strings.HasSuffix(n, "The recording ends at its OOM: these figures cover the 5831 requests it holds, not what the job would have asked after it.") {
		t.Errorf("needed: %q", n)
	}
}

// A recording ends at its OOM when it asks for nothing after the last
// one: frees may follow.
func TestEndsAtOOM(t *testing.T) {
	m := func(id int64, oom bool) replay.Request {
		return replay.Request{Op: replay.OpMalloc, ID: id, Size: MiB, OOM: oom}
	}
	f := func(id int64) replay.Request { return replay.Request{Op: replay.OpFree, ID: id} }
	for _, c := range []struct {
		reqs []replay.Request
		want bool
	}{
		{[]replay.Request{m(1, false), m(2, true), f(1)}, true},
		{[]replay.Request{m(1, false), m(2, true), m(3, false)}, false},
		{[]replay.Request{m(1, false), f(1)}, false},
		{nil, false},
	} {
		if got := endsAtOOM(c.reqs); got != c.want {
			t.Errorf("%+v: %v, want %v", c.reqs, got, c.want)
		}
	}
}

// A non-monotone edge's limits, 2 MiB apart, read apart in words.
func TestNeededEdgeInMiB(t *testing.T) {
	got := neededText(WhatIf{AllocConf: "expandable_segments:True", CapacityNeeded: 3619684352, LowestThatRuns: 3615490048, FailsAt: 3617587200}, gpu.FormatBytes)
	if want := "3452 MiB (it also runs under 3448 MiB but not under 3450 MiB: the allocator asks a limit for whole segments)"; got != want {
		t.Errorf("%q\nwant %q", got, want)
	}
	got = neededText(WhatIf{AllocConf: "max_split_size_mb:32", CapacityNeeded: 3619684352, LowestThatRuns: 3615490048, FailsAt: 3617587200}, gpu.FormatBytes)
	if !strings.HasSuffix(got, ": under a lower limit the allocator gives its cached segments back sooner)") {
		t.Errorf("%q", got)
	}
}

// TestWhatIfSaysWhenItCannotReproduce: an OOM no capacity explains (the
// recording claims one where the replay serves the request) is said
// plainly, not contradicted by the table.
func TestWhatIfSaysWhenItCannotReproduce(t *testing.T) {
	reqs := []replay.Request{
		{Op: replay.OpMalloc, ID: 1, Size: 8 * MiB},
		{Op: replay.OpMalloc, ID: 2, Size: 8 * MiB, OOM: true},
	}
	table, err := Answer(onDevice(reqs, 1<<30))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.Contradiction, "does not reproduce the recording: it ran out of memory at no request where the recording did at request 1") {
		t.Errorf("contradiction %q", table.Contradiction)
	}
}

// TestWhatIfTrainingNeeds: the memory the 2.11 training run needs, as the
// real allocator's bisection found it on an H200 (PROVENANCE.md and the
// issue's figures): 6,717,177,856 B with the default settings,
// 5,920,260,096 B with expandable segments, from either recording; the
// expandable recording's table has a row of the defaults and no setting
// twice.
func TestWhatIfTrainingNeeds(t *testing.T) {
	for _, name := range []string{"train_default.pickle", "train_expandable.pickle"} {
		traces, err := pytorch.DecodeFile(testkit.SnapshotOf(t, "pytorch-2.11", name))
		if err != nil {
			t.Fatal(err)
		}
		s := replay.FromRecording(traces[0].Recording())
		s.Use(0, replay.DefaultCapacity)
		_, rows, err := WhatIfs(s, Variants[:1], 2)
		if err != nil {
			t.Fatal(err)
		}
		needs := map[string]uint64{}
		for _, r := range rows {
			needs[r.AllocConf] = r.CapacityNeeded
		}
		if len(rows) != 2 || needs[""] != 6717177856 || needs["expandable_segments:True"] != 5920260096 {
			t.Errorf("%s: %v", name, needs)
		}
	}
}
