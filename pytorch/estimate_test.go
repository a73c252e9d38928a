package pytorch_test

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/replay"
)

// estimateFile is what python -m vramscope_watch --estimate wrote for
// live/testdata/estimate_gpt.py (run as /tmp/job/train.py --batch 2 --seq
// 32 --layers 2 --d 64 --vocab 256): 3 steps of a small GPT, the
// requests alone.
const estimateFile = "testdata/estimate_gpt.pickle"

// rawRequests reads the file's trace entries as written: the requests.
func rawRequests(t *testing.T, path string) []pytorch.Dict {
	t.Helper()
	dt, _ := unpickled(t, path).Get("device_traces")
	var out []pytorch.Dict
	for _, e := range dt.([]any)[0].([]any) {
		out = append(out, e.(pytorch.Dict))
	}
	return out
}

// rawAnnotationTimes reads the file's external_annotations' times: the
// requests made before each.
func rawAnnotationTimes(t *testing.T, path string) []int64 {
	t.Helper()
	anns, _ := unpickled(t, path).Get("external_annotations")
	var out []int64
	for _, a := range anns.([]any) {
		at, _ := a.(pytorch.Dict).Get("time_us")
		out = append(out, at.(int64))
	}
	return out
}

func decodeOne(t *testing.T, path string) *pytorch.Trace {
	t.Helper()
	traces, err := pytorch.DecodeFile(path)
	if err != nil {
		t.Fatal(err)
	}
	traces, err = pytorch.Devices(traces, -1)
	if err != nil || len(traces) != 1 {
		t.Fatalf("%d traces, %v", len(traces), err)
	}
	return traces[0]
}

// An estimate's requests become what the allocator does with them: the
// same allocations and frees in the same order (sizes and frames as
// written), with the segments the allocator took around them, a layout
// that undoes to empty, and the regions moved onto the events.
func TestEstimateDecodesThroughTheAllocator(t *testing.T) {
	tr := decodeOne(t, estimateFile)
	e := tr.Estimate()
	if e == nil {
		t.Fatal("the estimate does not say it is one")
	}
	if e.Steps != 3 || e.StandIn != "meta" || e.DeviceMemory != 80<<30 || e.Capacity() != 80<<30-512<<20 || len(e.Added) != 2 || e.Added[0].Count != 2 {
		t.Fatalf("estimate %+v", e)
	}
	if tr.HasTime || len(tr.Mismatches) > 0 || len(tr.Dropped) > 0 {
		t.Fatalf("has time %v, %d mismatches, %d dropped", tr.HasTime, len(tr.Mismatches), len(tr.Dropped))
	}
	if len(tr.Initial.Segments) != 0 || len(tr.Final.Segments) == 0 {
		t.Fatalf("initial %d segments, final %d", len(tr.Initial.Segments), len(tr.Final.Segments))
	}
	raw := rawRequests(t, estimateFile)
	type req struct {
		action string
		size   int64
		top    string
	}
	var want, got []req
	for _, d := range raw {
		a, _ := d.Get("action")
		if a == "free_completed" {
			continue
		}
		s, _ := d.Get("size")
		fr, _ := d.Get("frames")
		top := ""
		if list := fr.([]any); len(list) > 0 {
			name, _ := list[0].(pytorch.Dict).Get("name")
			top = name.(string)
		}
		want = append(want, req{a.(string), s.(int64), top})
	}
	segments := 0
	for i, ev := range tr.Events {
		if ev.Seq != int64(i) || ev.TimeUS != int64(i) {
			t.Fatalf("event %d: seq %d, time %d", i, ev.Seq, ev.TimeUS)
		}
		switch ev.Action {
		case gpu.ActionAlloc, gpu.ActionFreeRequested:
			top := ""
			if st := tr.Stack(ev.Stack); len(st) > 0 {
				top = st[0].Name
			}
			got = append(got, req{ev.Action.String(), int64(ev.Size), top})
		case gpu.ActionSegmentAlloc:
			segments++
		case gpu.ActionOOM:
			t.Fatalf("an OOM on an 80 GiB device: %v", ev)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d requests, the file has %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("request %d: %+v, the file has %+v", i, got[i], want[i])
		}
	}
	if segments == 0 {
		t.Fatal("no segment_alloc: the requests did not go through the allocator")
	}
	// A region at time n in the file began after its n-th request: on the
	// events, n requests come before it.
	rawAnns := rawAnnotationTimes(t, estimateFile)
	anns := tr.Annotations()
	if len(anns) != len(rawAnns) {
		t.Fatalf("%d annotations, the file has %d", len(anns), len(rawAnns))
	}
	steps := 0
	for i, a := range anns {
		if a.TimeUS < 0 || a.TimeUS > int64(len(tr.Events)) {
			t.Fatalf("annotation %+v outside the events", a)
		}
		before := int64(0)
		for _, ev := range tr.Events[:a.TimeUS] {
			if ev.Action == gpu.ActionAlloc || ev.Action == gpu.ActionFreeRequested {
				before++
			}
		}
		if before != rawAnns[i] {
			t.Fatalf("annotation %d (%s %s) at event %d: %d requests before it, the file says %d", i, a.Stage, a.Name, a.TimeUS, before, rawAnns[i])
		}
		if a.Stage == "END" && a.Name == "Optimizer.step#AdamW.step" {
			steps++
		}
	}
	if steps != 3 {
		t.Fatalf("%d optimizer steps ended, want 3", steps)
	}
	rec := tr.Recording()
	if !rec.Estimated || rec.Capacity != e.Capacity() {
		t.Fatalf("recording: estimated %v, capacity %d", rec.Estimated, rec.Capacity)
	}
}

// On a device too small, the estimate runs out of memory where the
// allocator would, and goes on as on a larger device: the oom and the
// alloc that serves it are one request, so the memory the job needs does
// not depend on the device it was estimated for.
func TestEstimateOOMIsOneRequest(t *testing.T) {
	big := decodeOne(t, estimateFile)
	bigStream := replay.FromRecording(big.Recording())
	cfg, err := bigStream.Config("")
	if err != nil {
		t.Fatal(err)
	}
	need, err := bigStream.CapacityNeeded(cfg, replay.Result{}, 0)
	if err != nil {
		t.Fatal(err)
	}

	// The same file for a device whose allocator has less than it needs.
	small := filepath.Join(t.TempDir(), "small.pickle")
	capacity := need.Steady / 2
	testkit.Python3(t, `import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
s["vramscope_estimate"]["device_memory"] = int(sys.argv[3]) + sum(o["bytes"] for o in s["vramscope_estimate"]["outside_allocator"])
pickle.dump(s, open(sys.argv[2], "wb"), protocol=4)`, estimateFile, small, strconv.FormatUint(capacity, 10))
	tr := decodeOne(t, small)
	if tr.Estimate().Capacity() != capacity {
		t.Fatalf("capacity %d, want %d", tr.Estimate().Capacity(), capacity)
	}
	rules := gpu.DefaultRules()
	ooms := 0
	for i, ev := range tr.Events {
		if ev.Action != gpu.ActionOOM {
			continue
		}
		ooms++
		j := i + 1
		for j < len(tr.Events) && tr.Events[j].Action == gpu.ActionSegmentAlloc {
			j++
		}
		if a := tr.Events[j]; a.Action != gpu.ActionAlloc || a.Stack != ev.Stack || rules.RoundSize(a.Size) != ev.Size {
			t.Fatalf("after the oom %v comes %v, not the alloc that serves it", ev, a)
		}
	}
	if ooms != 1 {
		t.Fatalf("%d ooms, want 1 (then the device is large enough)", ooms)
	}
	s := replay.FromRecording(tr.Recording())
	if len(s.Requests) != len(bigStream.Requests) {
		t.Fatalf("%d requests, %d without the oom", len(s.Requests), len(bigStream.Requests))
	}
	if s.Capacity.Bytes != capacity || s.Capacity.Source != replay.CapacityEstimated {
		t.Fatalf("capacity %+v", s.Capacity)
	}
	_, res, err := s.Run(cfg, s.Capacity.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	recorded := -1
	for i, r := range s.Requests {
		if r.OOM {
			recorded = i
		}
	}
	if len(res.OOMs) == 0 || res.OOMs[0].Index != recorded {
		t.Fatalf("replayed on its device, it first runs out of memory at %v; the estimate did at request %d", res.OOMs, recorded)
	}
	got, err := s.CapacityNeeded(cfg, res, s.Capacity.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if got != need {
		t.Fatalf("needs %+v estimated for the small device, %+v for 80 GiB", got, need)
	}
}

// unpickled is the file at path decoded as a snapshot's top dictionary.
func unpickled(t *testing.T, path string) pytorch.Dict {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, err := pytorch.Unpickle(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v.(pytorch.Dict)
}
