package predict

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/replay"
	"vramscope/tracer"
)

// stacks interns a workload's stacks as a store would.
type stacks struct {
	table gpu.StackTable
	list  []gpu.Stack
}

func (s *stacks) Stack(st gpu.Stack) gpu.StackID {
	id, fresh := s.table.Intern(st)
	if fresh {
		s.list = append(s.list, append(gpu.Stack(nil), st...))
	}
	return id
}

// recorded is a run of the training workload on the simulated device: its
// recording and what its allocator measured.
type recorded struct {
	rec                         gpu.Recording
	peakAllocated, peakReserved uint64
	oom                         bool
}

// record runs w on a simulated device of capacity bytes under the default
// settings, as vramscope trace does.
func record(t testing.TB, w tracer.Workload, capacity uint64) recorded {
	t.Helper()
	return recordUnder(t, w, capacity, 0)
}

// recordUnder is record with PyTorch's per-process limit of limit bytes
// (set_per_process_memory_fraction; 0: none).
func recordUnder(t testing.TB, w tracer.Workload, capacity, limit uint64) recorded {
	t.Helper()
	var out recorded
	clk := &tracer.Clock{}
	cfg := caching.DefaultConfig()
	cfg.Limit = limit
	a, err := caching.New(sim.New(capacity), cfg, caching.WithClock(clk.Now),
		caching.WithSink(gpu.SinkFunc(func(b []gpu.Event) { out.rec.Events = append(out.rec.Events, b...) })))
	if err != nil {
		t.Fatal(err)
	}
	st := &stacks{}
	err = tracer.Run(context.Background(), w, &tracer.Env{Alloc: a, Clock: clk, Stacks: st})
	var oom *caching.OutOfMemoryError
	switch {
	case errors.As(err, &oom):
		out.oom = true
	case err != nil:
		t.Fatal(err)
	}
	out.rec.Capacity, out.rec.Stacks = capacity, st.list
	stats := a.Stats()
	out.peakAllocated, out.peakReserved = uint64(stats.AllocatedBytes[0].Peak), uint64(stats.ReservedBytes[0].Peak)
	return out
}

// job is the training workload whose memory the tests predict: about
// 0.4 B parameters, each sample of 1024 tokens adding some 0.8 GiB, so a
// 16 GiB device fits a batch in the tens and an 80 GiB one in the
// hundreds at most.
func job(batch, seq int) tracer.Train {
	w := tracer.DefaultTrain()
	w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 8, 1024, 50304, batch, seq, 2
	return w
}

const big = 512 << 30 // no OOM at any batch the tests record

var (
	recOnce sync.Once
	recs    map[[2]int]recorded
	recMu   sync.Mutex
)

// at records the job at batch and seq once per test binary.
func at(t testing.TB, batch, seq int) recorded {
	recMu.Lock()
	defer recMu.Unlock()
	recOnce.Do(func() { recs = map[[2]int]recorded{} })
	k := [2]int{batch, seq}
	if r, ok := recs[k]; ok {
		return r
	}
	r := record(t, job(batch, seq), big)
	if r.oom {
		t.Fatalf("batch %d, seq %d does not fit %s", batch, seq, gpu.FormatBytes(big))
	}
	recs[k] = r
	return r
}

func stream(r recorded) replay.Stream { return replay.FromRecording(r.rec) }

// checkNeeds runs w itself (not a replay of a stream) under PyTorch's
// per-process limit of need bytes on a larger device, as the real
// allocator is measured (frag_default.json): what "needs" means is that
// it runs there and runs out of memory 2 MiB lower.
func checkNeeds(t *testing.T, what string, w tracer.Workload, need uint64) {
	t.Helper()
	switch {
	case need <= replay.CapacityStep:
		t.Errorf("%s: needs %d bytes", what, need)
	case recordUnder(t, w, big, need).oom:
		t.Errorf("%s: said to need %d bytes, it runs out of memory under that limit", what, need)
	case !recordUnder(t, w, big, need-replay.CapacityStep).oom:
		t.Errorf("%s: said to need %d bytes, it runs under %d too", what, need, need-replay.CapacityStep)
	}
}

// largestByRecording is the largest value (a multiple of step) at which
// the job, recorded on a device of capacity bytes, ends without an OOM.
func largestByRecording(t *testing.T, capacity uint64, step int, job func(x int) tracer.Train) int {
	t.Helper()
	largest := 0
	for x := step; ; x += step {
		if record(t, job(x), capacity).oom {
			return largest
		}
		largest = x
	}
}

func TestBatchPredictsItsOwnTraces(t *testing.T) {
	const seq = 1024
	m, err := Fit(Batch, []Recording{{"A", 2, stream(at(t, 2, seq))}, {"B", 4, stream(at(t, 4, seq))}})
	if err != nil {
		t.Fatal(err)
	}
	if m.Paired != m.Requests || len(m.Unfit) != 0 || m.UnpairedBytes != 0 {
		t.Fatalf("the same program at two batch sizes: %d of %d requests paired, unfit %+v (%d bytes)", m.Paired, m.Requests, m.Unfit, m.UnpairedBytes)
	}
	if !m.Grows {
		t.Fatal("the activations grow with the batch, but the model says nothing does")
	}
	preds, err := m.PredictAll([]int{8, 16, 32}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range preds {
		r := at(t, p.At, seq)
		// The stream itself: request by request, the recording's.
		s, guessed := m.Stream(p.At)
		want := stream(r).Requests
		if guessed != 0 || len(s.Requests) != len(want) {
			t.Fatalf("batch %d: %d requests (%d bytes guessed), the recording has %d", p.At, len(s.Requests), guessed, len(want))
		}
		for i := range want {
			if g, w := s.Requests[i], want[i]; g.Op != w.Op || g.Size != w.Size || g.ID != w.ID {
				t.Fatalf("batch %d, request %d: predicted %+v, recorded %+v", p.At, i, g, w)
			}
		}
		if p.PeakAllocated != r.peakAllocated || p.PeakReserved != r.peakReserved {
			t.Errorf("batch %d: predicted peaks allocated %d, reserved %d; the run's allocator measured %d, %d",
				p.At, p.PeakAllocated, p.PeakReserved, r.peakAllocated, r.peakReserved)
		}
		checkNeeds(t, fmt.Sprintf("batch %d", p.At), job(p.At, seq), p.CapacityNeeded)
		t.Logf("batch %d: peak allocated %s, peak reserved %s, needs %s", p.At, gpu.FormatBytes(p.PeakAllocated),
			gpu.FormatBytes(p.PeakReserved), gpu.FormatBytes(p.CapacityNeeded))
	}
	for _, capacity := range []uint64{16 << 30, 80 << 30} {
		got, err := m.Largest(capacity, "", 1)
		if err != nil {
			t.Fatal(err)
		}
		want := largestByRecording(t, capacity, 1, func(b int) tracer.Train { return job(b, seq) })
		if want < 2 {
			t.Fatalf("on %s the job fits batch %d only: the test needs a device that fits more", gpu.FormatBytes(capacity), want)
		}
		if got != want {
			t.Errorf("largest batch on %s: predicted %d, recording every batch size finds %d", gpu.FormatBytes(capacity), got, want)
		}
		t.Logf("largest batch on %s: %d", gpu.FormatBytes(capacity), got)
	}
}

func TestThirdRecordingChecksTheModel(t *testing.T) {
	const seq = 1024
	m, err := Fit(Batch, []Recording{{"A", 2, stream(at(t, 2, seq))}, {"B", 4, stream(at(t, 4, seq))}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.Check(Recording{"C", 16, stream(at(t, 16, seq))}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Predicted.PeakAllocated != c.Recorded.PeakAllocated || c.Predicted.PeakReserved != c.Recorded.PeakReserved ||
		c.Predicted.CapacityNeeded != c.Recorded.CapacityNeeded || c.Recorded.CapacityNeeded == 0 {
		t.Errorf("batch 16: predicted %+v, recorded %+v", c.Predicted, c.Recorded)
	}
}

// The workload's attention is quadratic in the sequence length at
// multiples of 128 (its backward's size is heads·s/hidden in whole
// units), so the lengths are such multiples.
func TestSeqPredictsItsOwnTraces(t *testing.T) {
	const batch = 2
	m, err := Fit(Seq, []Recording{{"A", 256, stream(at(t, batch, 256))}, {"B", 512, stream(at(t, batch, 512))}, {"C", 768, stream(at(t, batch, 768))}})
	if err != nil {
		t.Fatal(err)
	}
	if m.Paired != m.Requests || len(m.Unfit) != 0 {
		t.Fatalf("%d of %d requests paired, unfit %+v", m.Paired, m.Requests, m.Unfit)
	}
	var quadratic bool
	for _, c := range m.coef {
		quadratic = quadratic || c[2] != 0
	}
	if !quadratic {
		t.Fatal("no request grows with s²: the attention scores do")
	}
	preds, err := m.PredictAll([]int{1024, 2048}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range preds {
		r := at(t, batch, p.At)
		if p.PeakAllocated != r.peakAllocated || p.PeakReserved != r.peakReserved {
			t.Errorf("seq %d: predicted %d allocated, %d reserved; recorded %d, %d", p.At,
				p.PeakAllocated, p.PeakReserved, r.peakAllocated, r.peakReserved)
		}
		checkNeeds(t, fmt.Sprintf("seq %d", p.At), job(batch, p.At), p.CapacityNeeded)
	}
	for _, capacity := range []uint64{16 << 30, 80 << 30} {
		got, err := m.Largest(capacity, "", 128)
		if err != nil {
			t.Fatal(err)
		}
		want := largestByRecording(t, capacity, 128, func(s int) tracer.Train { return job(batch, s) })
		if got != want || want < 256 {
			t.Errorf("largest sequence length (of 128s) on %s: predicted %d, recording each finds %d", gpu.FormatBytes(capacity), got, want)
		}
		t.Logf("largest sequence length on %s: %d", gpu.FormatBytes(capacity), got)
	}
}

func TestDifferentProgramsRefused(t *testing.T) {
	train := stream(at(t, 2, 1024))
	var frag replay.Stream
	{
		r := record(t, tracer.DefaultFrag(), 8<<30)
		frag = stream(r)
	}
	_, err := Fit(Batch, []Recording{{"train.pickle", 2, train}, {"frag.pickle", 4, frag}})
	if err == nil || !strings.Contains(err.Error(), "not recordings of the same program") || !strings.Contains(err.Error(), "train.pickle") {
		t.Fatalf("a training loop and a fragmentation stress: %v", err)
	}
	t.Log(err)
	// The same model with another depth: the layers' requests are not all there.
	deeper := job(4, 1024)
	deeper.Layers = 16
	_, err = Fit(Batch, []Recording{{"8 layers", 2, train}, {"16 layers", 4, stream(record(t, deeper, big))}})
	if err == nil || !strings.Contains(err.Error(), "not recordings of the same program") {
		t.Fatalf("8 layers against 16: %v", err)
	}
	t.Log(err)
}

func TestUnfitRequestsNamed(t *testing.T) {
	a, b := stream(at(t, 2, 1024)), stream(at(t, 4, 1024))
	// One allocation of B a little larger than the line allows, one only
	// A makes.
	b.Requests = append([]replay.Request(nil), b.Requests...)
	var grown, dropped int
	for i, r := range b.Requests {
		if r.Op == replay.OpMalloc && r.Size == 512 && grown == 0 { // the loss
			b.Requests[i].Size = 513
			grown = i
		}
	}
	a.Requests = append([]replay.Request(nil), a.Requests...)
	last := a.Requests[len(a.Requests)-1]
	dropped = len(a.Requests)
	a.Requests = append(a.Requests, replay.Request{Op: replay.OpMalloc, ID: 1 << 40, Size: 3 << 20, Stack: last.Stack},
		replay.Request{Op: replay.OpFree, ID: 1 << 40, Stack: last.Stack})
	m, err := Fit(Batch, []Recording{{"A", 2, a}, {"B", 4, b}})
	if err != nil {
		t.Fatal(err)
	}
	if grown == 0 || len(m.Unfit) != 2 {
		t.Fatalf("want the loss and the extra allocation named, got %+v", m.Unfit)
	}
	var why []string
	for _, u := range m.Unfit {
		why = append(why, u.Why)
		if len(u.Stack) == 0 || u.Count != 1 {
			t.Errorf("%+v: want its stack and one request", u)
		}
	}
	if why[0] != "only in A" || why[1] != "sizes do not follow a + b·batch" {
		t.Errorf("named %q", why)
	}
	if m.UnpairedBytes != 3<<20+512+513 {
		t.Errorf("unpaired bytes %d", m.UnpairedBytes)
	}
	s, guessed := m.Stream(8)
	if s.Requests[dropped].Size != 3<<20 || guessed != 3<<20+515 {
		t.Errorf("at batch 8: the extra allocation is %d bytes, %d bytes guessed", s.Requests[dropped].Size, guessed)
	}
}

func TestInterpolate(t *testing.T) {
	for _, c := range []struct {
		xs, ys []int64
		want   [3]int64
		ok     bool
	}{
		{[]int64{2, 4}, []int64{10, 14}, [3]int64{6, 2, 0}, true},
		{[]int64{2, 4}, []int64{10, 15}, [3]int64{}, false},
		{[]int64{4, 2}, []int64{14, 10}, [3]int64{6, 2, 0}, true},
		{[]int64{1, 2, 3}, []int64{6, 17, 34}, [3]int64{1, 2, 3}, true}, // 1 + 2s + 3s²
		{[]int64{1, 2, 3}, []int64{6, 17, 35}, [3]int64{}, false},
		{[]int64{256, 512, 1024}, []int64{7, 7, 7}, [3]int64{7, 0, 0}, true},
	} {
		got, ok := interpolate(c.xs, c.ys)
		if ok != c.ok || ok && got != c.want {
			t.Errorf("interpolate(%v, %v) = %v, %v; want %v, %v", c.xs, c.ys, got, ok, c.want, c.ok)
		}
	}
	if g := newton([]int{2, 4}, []float64{10, 15}, 8); g != 25 {
		t.Errorf("the guess through (2, 10) and (4, 15) at 8: %v, want 25", g)
	}
}

func TestBatchInName(t *testing.T) {
	for _, c := range []struct {
		name  string
		batch int
		job   string
		ok    bool
	}{
		{"gpt batch 8", 8, "gpt", true},
		{"gpt-2 bs=16 (bf16)", 16, "gpt-2 (bf16)", true},
		{"llama batch_size:4", 4, "llama", true},
		{"BS32 run", 32, "run", true},
		{"train", 0, "", false},
		{"subs8", 0, "", false},
		{"batchnorm 8", 0, "", false},
		{"batch 0", 0, "", false},
	} {
		b, job, ok := BatchInName(c.name)
		if b != c.batch || job != c.job || ok != c.ok {
			t.Errorf("BatchInName(%q) = %d, %q, %v; want %d, %q, %v", c.name, b, job, ok, c.batch, c.job, c.ok)
		}
	}
}

// Two real PyTorch runs of one program (the same GPT, the second under
// expandable segments) pair up request for request by stack and
// occurrence, and the stream predicted at the first's value, replayed,
// peaks where the real allocator did (train_default.json's
// memory_stats()). They were both recorded at batch 8: the fit is given
// two values only to have a line, along which nothing grows.
func TestRealRunsPairUp(t *testing.T) {
	var recs []Recording
	for i, name := range []string{"train_default.pickle", "train_expandable.pickle"} {
		traces, err := pytorch.DecodeFile(testkit.SnapshotOf(t, "pytorch-2.11", name))
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, Recording{Name: name, At: 8 * (i + 1), Stream: replay.FromRecording(traces[0].Recording())})
	}
	m, err := Fit(Batch, recs)
	if err != nil {
		t.Fatal(err)
	}
	if m.Paired != m.Requests || m.Requests < 6000 || len(m.Unfit) != 0 || m.Grows {
		t.Fatalf("%d of %d requests paired, unfit %+v, grows %v", m.Paired, m.Requests, m.Unfit, m.Grows)
	}
	p, err := m.Predict(8, nil)
	if err != nil {
		t.Fatal(err)
	}
	const peakAllocated, peakReserved = 5_865_110_528, 6_717_177_856 // allocated_bytes.all.peak, reserved_bytes.all.peak
	if p.PeakAllocated != peakAllocated || p.PeakReserved != peakReserved {
		t.Errorf("predicted peaks %d allocated, %d reserved; PyTorch's %d, %d", p.PeakAllocated, p.PeakReserved, peakAllocated, peakReserved)
	}
}
