package tracer

import (
	"context"
	"errors"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
)

type stackRecorder struct {
	stacks []gpu.Stack
	ids    gpu.StackTable
}

func (s *stackRecorder) Stack(st gpu.Stack) gpu.StackID {
	id, fresh := s.ids.Intern(st)
	if fresh {
		s.stacks = append(s.stacks, append(gpu.Stack(nil), st...))
	}
	return id
}

type runResult struct {
	events []gpu.Event
	alloc  *caching.Allocator
	env    *Env
	stacks *stackRecorder
	err    error
}

func runWorkload(t *testing.T, w Workload, capacity uint64, conf string) runResult {
	t.Helper()
	cfg, err := caching.ParseConfig(conf)
	if err != nil {
		t.Fatal(err)
	}
	var res runResult
	clk := &Clock{}
	res.alloc, err = caching.New(sim.New(capacity), cfg, caching.WithClock(clk.Now),
		caching.WithSink(gpu.SinkFunc(func(b []gpu.Event) { res.events = append(res.events, b...) })))
	if err != nil {
		t.Fatal(err)
	}
	res.stacks = &stackRecorder{}
	res.env = &Env{Alloc: res.alloc, Clock: clk, Stacks: res.stacks}
	res.err = Run(context.Background(), w, res.env)
	// The events rebuild the allocator's own layout.
	l := gpu.NewLayout(cfg.Rules)
	for i, e := range res.events {
		if e.Seq != int64(i) {
			t.Fatalf("event %d has seq %d", i, e.Seq)
		}
		if i > 0 && e.TimeUS < res.events[i-1].TimeUS {
			t.Fatalf("event %d goes back in time", i)
		}
		if err := l.Apply(e); err != nil {
			t.Fatal(err)
		}
	}
	want := res.alloc.Layout()
	if len(l.Segments) != len(want.Segments) || l.Figures() != want.Figures() {
		t.Fatalf("events rebuild %+v, allocator has %+v", l.Figures(), want.Figures())
	}
	return res
}

func smallTrain() Train {
	w := DefaultTrain()
	w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 4, 512, 8192, 4, 256, 3
	return w
}

func TestTrainDeterministicAndStamped(t *testing.T) {
	a := runWorkload(t, smallTrain(), 8<<30, "")
	b := runWorkload(t, smallTrain(), 8<<30, "")
	if a.err != nil {
		t.Fatal(a.err)
	}
	if len(a.events) != len(b.events) {
		t.Fatalf("same seed, %d then %d events", len(a.events), len(b.events))
	}
	for i := range a.events {
		if a.events[i] != b.events[i] {
			t.Fatalf("same seed, event %d differs: %v vs %v", i, a.events[i], b.events[i])
		}
	}
	// The attention's qkv projection: nn.Linear's forward called from
	// model.py line 30, under the allocator's own frame.
	found := false
	for _, st := range a.stacks.stacks {
		if len(st) > 4 && gpu.KindOf(st[0]) == gpu.FrameRecorder && st[1].Name == "forward" && strings.HasSuffix(st[1].Filename, "torch/nn/modules/linear.py") &&
			st[4] == (gpu.Frame{Name: "forward", Filename: "model.py", Line: 30}) {
			found = true
		}
	}
	if !found {
		t.Error("no event stamped linear.py forward / model.py:30 forward")
	}
	for _, e := range a.events {
		if (e.Action == gpu.ActionAlloc) && e.Stack == 0 {
			t.Fatalf("alloc without a stack: %v", e)
		}
	}
}

func TestTrainCheckpointingLowersPeak(t *testing.T) {
	plain := runWorkload(t, smallTrain(), 8<<30, "")
	w := smallTrain()
	w.Checkpointing = true
	ckpt := runWorkload(t, w, 8<<30, "")
	if ckpt.err != nil || plain.err != nil {
		t.Fatal(ckpt.err, plain.err)
	}
	p, c := plain.alloc.Stats().AllocatedBytes[0].Peak, ckpt.alloc.Stats().AllocatedBytes[0].Peak
	if c >= p {
		t.Errorf("checkpointing peak %d not below %d", c, p)
	}
}

func TestTrainOOMStopsTheRun(t *testing.T) {
	r := runWorkload(t, smallTrain(), 256<<20, "")
	var oom *caching.OutOfMemoryError
	if !errors.As(r.err, &oom) {
		t.Fatalf("want an OOM on a 256 MiB device, got %v", r.err)
	}
	if last := r.events[len(r.events)-1]; last.Action != gpu.ActionOOM {
		t.Errorf("last event %v, want oom", last)
	}
}

func TestFragFailsAndExpandableSucceeds(t *testing.T) {
	for _, capacity := range []uint64{4 << 30, 16 << 30} {
		plain := runWorkload(t, DefaultFrag(), capacity, "")
		var oom *caching.OutOfMemoryError
		if !errors.As(plain.err, &oom) {
			t.Fatalf("capacity %d: want OOM, got %v", capacity, plain.err)
		}
		f := plain.alloc.Layout().Figures()
		if f.CachedFree < 2*oom.Requested/2 || f.LargestFree >= oom.Requested {
			t.Errorf("not a fragmentation OOM: %s free, largest %s, asked %s",
				gpu.FormatBytes(f.CachedFree), gpu.FormatBytes(f.LargestFree), gpu.FormatBytes(oom.Requested))
		}
		if f.CachedFree+oom.DeviceFree <= oom.Requested {
			t.Errorf("free total %s is not larger than the request %s", gpu.FormatBytes(f.CachedFree+oom.DeviceFree), gpu.FormatBytes(oom.Requested))
		}
		exp := runWorkload(t, DefaultFrag(), capacity, "expandable_segments:True")
		if exp.err != nil {
			t.Fatalf("capacity %d with expandable segments: %v", capacity, exp.err)
		}
		if !strings.Contains(exp.env.Notes[0], "fit") {
			t.Errorf("note %q", exp.env.Notes[0])
		}
	}
}

func TestServeKVPagedWastesLess(t *testing.T) {
	small := func(kv string) ServeKV {
		w := DefaultServeKV()
		w.KV, w.Layers, w.Hidden, w.Vocab, w.Requests, w.MaxPrompt, w.MaxOutput = kv, 4, 1024, 32000, 24, 512, 128
		return w
	}
	paged := runWorkload(t, small(KVPaged), 16<<30, "")
	contig := runWorkload(t, small(KVContiguous), 16<<30, "")
	if paged.err != nil || contig.err != nil {
		t.Fatal(paged.err, contig.err)
	}
	if !strings.Contains(paged.env.Notes[0], "paged") || !strings.Contains(contig.env.Notes[0], "contiguous") {
		t.Fatalf("notes %q %q", paged.env.Notes, contig.env.Notes)
	}
	if paged.env.Metrics["kv_waste_mean_bytes"] >= contig.env.Metrics["kv_waste_mean_bytes"] {
		t.Errorf("paged waste %v not below contiguous %v", paged.env.Metrics, contig.env.Metrics)
	}
	if err := (ServeKV{KV: "ring"}).Run(context.Background(), paged.env); err == nil {
		t.Error("an unknown --kv was accepted")
	}
}
