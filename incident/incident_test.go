package incident

import (
	"encoding/json"
	"path/filepath"
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
	r := Analyze(l, oom, 60*MiB)
	if r.Kind != "fragmentation" {
		t.Fatalf("kind %s: %s", r.Kind, r.Verdict)
	}
	want := "Fragmentation: 42.00 MiB cached free, largest hole 8.00 MiB, 10.00 MiB needed. 3 split segments could not be released."
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

	ws, err := WhatIfs(replay.FromEvents(nil, events), 60*MiB, "", Variants)
	if err != nil {
		t.Fatal(err)
	}
	if ws[0].AllocConf != "" || ws[0].OOMs != 1 || ws[0].FragmentationAtOOM != 1-8.0/42 {
		t.Errorf("original %+v", ws[0])
	}
	if ws[1].AllocConf != "expandable_segments:True" || !ws[1].Avoided || ws[1].OOMs != 0 {
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
	r := Analyze(l, oom, 60*MiB)
	if r.Kind != "shortage" || r.Verdict != "A real shortage: only 2.00 MiB not allocated, 10.00 MiB needed." {
		t.Errorf("%s: %q", r.Kind, r.Verdict)
	}
	ws, err := WhatIfs(replay.FromEvents(nil, events), 60*MiB, "", Variants)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.Avoided || w.OOMs != 1 {
			t.Errorf("nothing avoids a real shortage: %+v", w)
		}
	}
}

func TestRealOOMSnapshots(t *testing.T) {
	dir := filepath.Join("..", "..", "shared", "testdata", "pytorch")
	for _, c := range []struct {
		file   string
		device int
		kind   string
	}{
		{"oom_nonexpandable.json", 0, ""},
		{"expandable_oom_multigpu.pickle", 1, ""},
	} {
		traces, err := pytorch.DecodeFile(filepath.Join(dir, c.file))
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
		r := Analyze(l, oom, capacity)
		if r.Verdict == "" || r.Requested != oom.Size || r.DeviceFree != oom.DeviceFree {
			t.Errorf("%s: %+v", c.file, r)
		}
		// Both real OOMs asked for far more than the holes and the device had.
		if r.Kind != "shortage" && r.LargestFree >= r.Requested {
			t.Errorf("%s: %s yet the largest hole fits", c.file, r.Verdict)
		}
		t.Logf("%s: %s (%d pinned segments)", c.file, r.Verdict, len(r.Pinned))
		ws, err := WhatIfs(replay.FromEvents(tr.Initial, tr.Events), capacity, tr.Settings.Conf, Variants[:2])
		if err != nil {
			t.Fatal(err)
		}
		if ws[0].OOMs == 0 {
			t.Errorf("%s: the original settings replayed without the OOM: %+v", c.file, ws[0])
		}
		for _, w := range ws {
			if !strings.Contains(w.AllocConf, "expandable") && c.file == "expandable_oom_multigpu.pickle" {
				t.Errorf("%s: variants keep the original expandable_segments: %q", c.file, w.AllocConf)
			}
		}
	}
}

// The report's JSON keeps both the OOM's request and the layout's total of
// requested bytes.
func TestReportJSONKeepsBothRequests(t *testing.T) {
	events := record(t, testkit.ScenarioD(), 60*MiB, "")
	l, oom := atFirstOOM(t, gpu.NewLayout(gpu.DefaultRules()), events)
	b, err := json.Marshal(Analyze(l, oom, 60*MiB))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(b, &m)
	if m["request_bytes"] != float64(10*MiB) || m["requested_bytes"] != float64(18*MiB) {
		t.Fatalf("request_bytes %v, requested_bytes %v in %s", m["request_bytes"], m["requested_bytes"], b)
	}
}
