package caching

import (
	"fmt"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/gpu/sim"
)

const MiB = 1 << 20

// recorder is a sink that keeps every event.
type recorder struct{ events []gpu.Event }

func (r *recorder) Emit(b []gpu.Event) { r.events = append(r.events, b...) }

// harness is an allocator on a simulated device with every event recorded.
type harness struct {
	t   *testing.T
	dev *sim.Device
	a   *Allocator
	rec *recorder
}

func newHarness(t *testing.T, capacity uint64, conf string, opts ...sim.Option) *harness {
	t.Helper()
	cfg, err := ParseConfig(conf)
	if err != nil {
		t.Fatal(err)
	}
	dev := sim.New(capacity, opts...)
	rec := &recorder{}
	a, err := New(dev, cfg, WithSink(rec))
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, dev: dev, a: a, rec: rec}
}

func (h *harness) malloc(size uint64) uint64 {
	h.t.Helper()
	return h.mallocOn(size, 0)
}

func (h *harness) mallocOn(size uint64, stream int64) uint64 {
	h.t.Helper()
	p, err := h.a.Malloc(size, stream, 0)
	if err != nil {
		h.t.Fatalf("malloc(%d): %v", size, err)
	}
	return p
}

func (h *harness) free(p uint64) {
	h.t.Helper()
	if err := h.a.Free(p); err != nil {
		h.t.Fatal(err)
	}
}

// layout renders the snapshot as "[offset size A|F|P(req)]" per segment,
// offsets relative to the segment's address, one segment a line.
func (h *harness) layout() string {
	h.a.Flush()
	var b strings.Builder
	for _, s := range h.a.Snapshot() {
		for _, blk := range s.Blocks {
			st := map[gpu.BlockState]string{gpu.BlockAllocated: "A", gpu.BlockFree: "F", gpu.BlockPendingFree: "P"}[blk.State]
			fmt.Fprintf(&b, "[%d %d %s", blk.Addr-s.Addr, blk.Size, st)
			if blk.State != gpu.BlockFree {
				fmt.Fprintf(&b, "(%d)", blk.Requested)
			}
			b.WriteString("]")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// trace renders the recorded events relative to the first segment's base.
func (h *harness) trace(base uint64) []string {
	h.a.Flush()
	var out []string
	for _, e := range h.rec.events {
		if e.Action == gpu.ActionOOM {
			out = append(out, fmt.Sprintf("oom(%d,%d)", e.DeviceFree, e.Size))
			continue
		}
		out = append(out, fmt.Sprintf("%s(+%d,%d)", e.Action, e.Addr-base, e.Size))
	}
	return out
}

func (h *harness) stat(key string) int64 {
	h.t.Helper()
	m := h.a.stats.Flat()
	v, ok := m[key]
	if !ok {
		h.t.Fatalf("no stat %q", key)
	}
	return v
}

func (h *harness) expectStats(want map[string]int64) {
	h.t.Helper()
	for k, v := range want {
		if got := h.stat(k); got != v {
			h.t.Errorf("%s = %d, want %d", k, got, v)
		}
	}
}

func (h *harness) expectLayout(want string) {
	h.t.Helper()
	if got := h.layout(); got != want {
		h.t.Errorf("layout:\n%swant:\n%s", got, want)
	}
}

// checkInvariants verifies the properties every state must have, and that
// the events replayed through gpu.Layout give the allocator's own snapshot.
func (h *harness) checkInvariants() {
	h.t.Helper()
	h.a.Flush()
	l := h.a.Layout()
	if err := l.CheckTiling(); err != nil {
		h.t.Fatal(err)
	}
	f := l.Figures()
	if int64(f.Reserved) != h.stat("reserved_bytes.all.current") {
		h.t.Fatalf("reserved %d in layout, %d in stats", f.Reserved, h.stat("reserved_bytes.all.current"))
	}
	if int64(f.Allocated) != h.stat("allocated_bytes.all.current") {
		h.t.Fatalf("allocated %d in layout, %d in stats", f.Allocated, h.stat("allocated_bytes.all.current"))
	}
	if int64(f.Active) != h.stat("active_bytes.all.current") {
		h.t.Fatalf("active %d in layout, %d in stats", f.Active, h.stat("active_bytes.all.current"))
	}
	requested := uint64(0) // the stat keeps pending frees' requests until they complete
	for _, s := range l.Segments {
		for _, b := range s.Blocks {
			requested += b.Requested
		}
	}
	if int64(requested) != h.stat("requested_bytes.all.current") {
		h.t.Fatalf("requested %d in layout, %d in stats", requested, h.stat("requested_bytes.all.current"))
	}
	for _, withSizes := range []bool{true, false} {
		replay := gpu.NewLayout(h.a.Config().Rules)
		for _, e := range h.rec.events {
			if !withSizes {
				e.BlockSize = 0 // derive sizes from the rules, as for PyTorch traces
			}
			if err := replay.Apply(e); err != nil {
				h.t.Fatalf("replay (block sizes given: %v): %v", withSizes, err)
			}
		}
		if got, want := renderLayout(replay), renderLayout(l); got != want {
			h.t.Fatalf("replayed layout (block sizes given: %v):\n%s\nallocator:\n%s", withSizes, got, want)
		}
	}
	// Undoing every event from the final state leads back to the empty
	// device (what the snapshot importer does with PyTorch's ring buffer).
	back := l.Clone()
	for i := len(h.rec.events) - 1; i >= 0; i-- {
		if err := back.Undo(h.rec.events[i]); err != nil {
			h.t.Fatalf("undo: %v", err)
		}
	}
	if len(back.Segments) != 0 {
		h.t.Fatalf("undo left %d segments:\n%s", len(back.Segments), renderLayout(back))
	}
}

func renderLayout(l *gpu.Layout) string {
	var b strings.Builder
	for _, s := range l.Segments {
		fmt.Fprintf(&b, "seg %#x %d stream=%d pool=%s exp=%v:", s.Addr, s.Size, s.Stream, s.Pool, s.Expandable)
		for _, blk := range s.Blocks {
			fmt.Fprintf(&b, " [%#x %d %s %d seq=%d]", blk.Addr, blk.Size, blk.State, blk.Requested, blk.Seq)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func TestScenarioA_SmallPoolSplitAndMerge(t *testing.T) {
	h := newHarness(t, 1<<30, "")
	p0 := h.malloc(100)
	h.expectLayout("[0 512 A(100)][512 2096640 F]\n")
	h.expectStats(map[string]int64{
		"segment.small_pool.current": 1, "reserved_bytes.all.current": 2097152,
		"allocated_bytes.all.current": 512, "active_bytes.all.current": 512,
		"requested_bytes.all.current": 100, "allocation.all.current": 1,
		"inactive_split.all.current": 1, "inactive_split_bytes.all.current": 2096640,
		"num_device_alloc": 1,
	})
	p1 := h.malloc(600)
	h.expectLayout("[0 512 A(100)][512 1024 A(600)][1536 2095616 F]\n")
	h.expectStats(map[string]int64{"allocated_bytes.all.current": 1536, "requested_bytes.all.current": 700,
		"inactive_split.all.current": 1, "inactive_split_bytes.all.current": 2095616})
	h.free(p0)
	h.expectLayout("[0 512 F][512 1024 A(600)][1536 2095616 F]\n")
	h.expectStats(map[string]int64{"allocated_bytes.all.current": 1024, "active.all.current": 1,
		"inactive_split.all.current": 2, "inactive_split_bytes.all.current": 2096128})
	h.free(p1)
	h.expectLayout("[0 2097152 F]\n")
	h.expectStats(map[string]int64{"allocated_bytes.all.current": 0, "active.all.current": 0,
		"inactive_split.all.current": 0, "inactive_split_bytes.all.current": 0, "reserved_bytes.all.current": 2097152})
	h.checkInvariants()
	if err := h.a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	h.expectLayout("")
	h.expectStats(map[string]int64{"segment.all.current": 0, "reserved_bytes.all.current": 0,
		"num_device_free": 1, "num_sync_all_streams": 1})
	want := []string{"segment_alloc(+0,2097152)", "alloc(+0,100)", "alloc(+512,600)",
		"free_requested(+0,100)", "free_completed(+0,100)", "free_requested(+512,600)",
		"free_completed(+512,600)", "segment_free(+0,2097152)"}
	if got := h.trace(p0); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("trace:\n%v\nwant:\n%v", got, want)
	}
	h.checkInvariants()
}

func TestScenarioB_LargePool(t *testing.T) {
	h := newHarness(t, 1<<30, "")
	h.malloc(3 * MiB)
	h.expectLayout("[0 3145728 A(3145728)][3145728 17825792 F]\n")
	h.malloc(3 * MiB)
	h.expectLayout("[0 3145728 A(3145728)][3145728 3145728 A(3145728)][6291456 14680064 F]\n")
	// Segments are listed by address, which the driver hands out top-down
	// (see sim.chunkRun): a later segment lies below, or in a run's room.
	h.malloc(15 * MiB)
	h.expectLayout("[0 16777216 A(15728640)]\n" +
		"[0 3145728 A(3145728)][3145728 3145728 A(3145728)][6291456 14680064 F]\n")
	h.expectStats(map[string]int64{"allocated_bytes.all.current": 22 * MiB, "requested_bytes.all.current": 21 * MiB})
	h.malloc(15000000)
	h.expectLayout("[0 16777216 A(15728640)]\n[0 15000064 A(15000000)][15000064 1777152 F]\n" +
		"[0 3145728 A(3145728)][3145728 3145728 A(3145728)][6291456 14680064 F]\n")
	h.malloc(12 * MiB)
	h.expectLayout("[0 16777216 A(15728640)]\n[0 15000064 A(15000000)][15000064 1777152 F]\n" +
		"[0 3145728 A(3145728)][3145728 3145728 A(3145728)][6291456 12582912 A(12582912)][18874368 2097152 F]\n")
	h.malloc(20447232)
	h.expectStats(map[string]int64{"segment.large_pool.current": 4, "reserved_bytes.all.current": 72 * MiB})
	if got := h.layout(); !strings.HasPrefix(got, "[0 20971520 A(20447232)]\n") {
		t.Errorf("19.5 MiB should get its own unsplit 20 MiB segment:\n%s", got)
	}
	h.checkInvariants()
}

func TestScenarioB_CounterExample(t *testing.T) {
	h := newHarness(t, 1<<30, "")
	h.malloc(3 * MiB)
	h.malloc(15 * MiB)
	h.expectLayout("[0 3145728 A(3145728)][3145728 15728640 A(15728640)][18874368 2097152 F]\n")
	h.checkInvariants()
}

func TestScenarioC_Oversize(t *testing.T) {
	h := newHarness(t, 1<<30, "max_split_size_mb:64")
	p := h.malloc(100 * MiB)
	h.expectLayout("[0 104857600 A(104857600)]\n")
	h.expectStats(map[string]int64{"oversize_segments.current": 1, "oversize_allocations.current": 1, "max_split_size": 64 * MiB})
	h.free(p)
	p = h.malloc(90 * MiB)
	h.expectLayout("[0 104857600 A(94371840)]\n")
	h.expectStats(map[string]int64{"allocated_bytes.all.current": 100 * MiB, "requested_bytes.all.current": 90 * MiB})
	h.free(p)
	p = h.malloc(70 * MiB)
	h.expectStats(map[string]int64{"segment.all.current": 2})
	h.free(p)
	p = h.malloc(30 * MiB)
	h.expectLayout("[0 31457280 A(31457280)]\n[0 73400320 F]\n[0 104857600 F]\n")
	h.free(p)
	h.checkInvariants()
}

func TestScenarioC5_ReleaseAvailableCachedBlocks(t *testing.T) {
	// 300 MiB device: cache 100 and 70 MiB oversize segments, hold 100 MiB,
	// then ask for 80 MiB: cudaMalloc fails, and the smallest cached oversize
	// segment of at least max(80, 64) MiB (the 100 MiB one) is released first.
	h := newHarness(t, 300*MiB, "max_split_size_mb:64")
	a := h.malloc(100 * MiB)
	b := h.malloc(70 * MiB)
	h.malloc(100 * MiB)
	h.free(a)
	h.free(b)
	h.malloc(80 * MiB)
	h.expectStats(map[string]int64{"num_device_free": 1, "num_alloc_retries": 0, "num_sync_all_streams": 0, "segment.all.current": 3})
	if got := h.layout(); !strings.Contains(got, "[0 73400320 F]") || strings.Contains(got, "[0 104857600 F]") {
		t.Errorf("expected the 100 MiB cached segment released and the 70 MiB kept:\n%s", got)
	}
	h.checkInvariants()
}

func scenarioD(t *testing.T, conf string) (*harness, error) {
	h := newHarness(t, 60*MiB, conf)
	var p [9]uint64
	for i := range p {
		p[i] = h.malloc(6 * MiB)
	}
	for _, i := range []int{0, 2, 3, 5, 6, 8} {
		h.free(p[i])
	}
	_, err := h.a.Malloc(10*MiB, 0, 0)
	return h, err
}

func TestScenarioD_FragmentationOOM(t *testing.T) {
	h, err := scenarioD(t, "")
	if err == nil {
		t.Fatal("malloc(10 MiB) succeeded; want OOM")
	}
	oom, ok := err.(*OutOfMemoryError)
	if !ok {
		t.Fatalf("error %T: %v", err, err)
	}
	want := "CUDA out of memory. Tried to allocate 10.00 MiB. GPU 0 has a total capacity of 60.00 MiB of which 0 bytes is free. " +
		"Of the allocated memory 18.00 MiB is allocated by PyTorch, and 42.00 MiB is reserved by PyTorch but unallocated. " +
		"If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  " +
		"See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
	if oom.Message != want {
		t.Errorf("message:\n%q\nwant:\n%q", oom.Message, want)
	}
	seg := "[0 6291456 F][6291456 6291456 A(6291456)][12582912 8388608 F]\n"
	h.expectLayout(seg + seg + seg)
	h.expectStats(map[string]int64{"allocated_bytes.all.current": 18 * MiB, "reserved_bytes.all.current": 60 * MiB,
		"inactive_split.all.current": 6, "inactive_split_bytes.all.current": 42 * MiB,
		"num_sync_all_streams": 1, "num_alloc_retries": 1, "num_ooms": 1})
	last := h.rec.events[len(h.rec.events)-1]
	if last.Action != gpu.ActionOOM || last.DeviceFree != 0 || last.Size != 10*MiB {
		t.Errorf("last event %v, want oom(device_free=0, size=10 MiB)", last)
	}
	f := h.a.Layout().Figures()
	if f.CachedFree != 42*MiB || f.LargestFree != 8*MiB {
		t.Errorf("free %d largest %d", f.CachedFree, f.LargestFree)
	}
	h.checkInvariants()
}

func TestScenarioDPrime_ExpandableAvoidsOOM(t *testing.T) {
	h, err := scenarioD(t, "expandable_segments:True")
	if err != nil {
		t.Fatalf("malloc(10 MiB) with expandable segments: %v", err)
	}
	// The 10 MiB comes from the lowest-address 12 MiB hole, not the tail
	// block that could still grow.
	h.expectLayout("[0 6291456 F][6291456 6291456 A(6291456)][12582912 10485760 A(10485760)][23068672 2097152 F]" +
		"[25165824 6291456 A(6291456)][31457280 12582912 F]" +
		"[44040192 6291456 A(6291456)][50331648 12582912 F]\n")
	maps := 0
	for _, e := range h.rec.events {
		if e.Action == gpu.ActionSegmentMap {
			maps++
		}
	}
	if maps != 3 {
		t.Errorf("%d segment_map events, want 3", maps)
	}
	h.expectStats(map[string]int64{"num_device_alloc": 3, "segment.all.current": 0, "reserved_bytes.all.current": 60 * MiB, "num_ooms": 0})
	snap := h.a.Snapshot()
	if len(snap) != 1 || snap[0].Size != 62914560 || !snap[0].Expandable {
		t.Errorf("snapshot: %d segments, first %+v", len(snap), snap[0].Size)
	}
	h.checkInvariants()
}

func TestScenarioE_FlushAndRetry(t *testing.T) {
	h := newHarness(t, 140*MiB, "")
	var ps []uint64
	for i := 0; i < 8; i++ {
		ps = append(ps, h.malloc(16*MiB))
	}
	for _, p := range ps {
		h.free(p)
	}
	for i := 0; i < 4; i++ {
		h.malloc(32 * MiB)
	}
	h.expectStats(map[string]int64{"num_device_free": 8, "num_sync_all_streams": 1, "num_alloc_retries": 1,
		"segment.all.current": 4, "reserved_bytes.all.current": 128 * MiB, "num_ooms": 0})
	h.checkInvariants()
}

func TestScenarioE_Reverse(t *testing.T) {
	h := newHarness(t, 140*MiB, "")
	var ps []uint64
	for i := 0; i < 4; i++ {
		ps = append(ps, h.malloc(32*MiB))
	}
	for _, p := range ps {
		h.free(p)
	}
	for i := 0; i < 8; i++ {
		h.malloc(16 * MiB)
	}
	seg := "[0 16777216 A(16777216)][16777216 16777216 A(16777216)]\n"
	h.expectLayout(seg + seg + seg + seg)
	h.expectStats(map[string]int64{"reserved_bytes.all.current": 128 * MiB})
	h.checkInvariants()
}

func TestScenarioF_CrossStreamFree(t *testing.T) {
	const s1, s2 = 1, 2
	h := newHarness(t, 1<<30, "")
	p := h.mallocOn(MiB, s1)
	h.dev.Hold(s2)
	if err := h.a.RecordStream(p, s2); err != nil {
		t.Fatal(err)
	}
	h.free(p)
	h.expectLayout("[0 1048576 P(1048576)][1048576 1048576 F]\n")
	h.expectStats(map[string]int64{"allocated_bytes.all.current": 0, "active_bytes.all.current": MiB, "requested_bytes.all.current": MiB})
	h.checkInvariants()
	// The held stream keeps the block pending through this malloc ...
	q := h.mallocOn(512, s2)
	if got := h.trace(p)[3]; got != "segment_alloc(+"+fmt.Sprint(q-p)+",2097152)" {
		t.Errorf("a stream-2 malloc must not reuse stream-1 memory; event %s", got)
	}
	h.dev.Release(s2)
	// ... and once its work is done the next malloc completes the free.
	h.mallocOn(512, s1)
	h.a.Flush()
	var completed bool
	for _, e := range h.rec.events {
		completed = completed || (e.Action == gpu.ActionFreeCompleted && e.Addr == p)
	}
	if !completed {
		t.Error("no free_completed after the stream's work finished")
	}
	h.checkInvariants()
}

// TestFreeFromStacks: a free's entries carry the free call's stack, as
// PyTorch's do, none when the call has no frames; a free from no known
// stack (Free) carries the allocation's; a completion that waited for
// another stream carries the stack of the call that completed it (as in
// the 2.11 DDP recording: all 8 of its deferred completions).
func TestFreeFromStacks(t *testing.T) {
	const allocated, freed, completing gpu.StackID = 7, 9, 11
	h := newHarness(t, 1<<30, "")
	seen := 0
	stacks := func(p uint64) map[gpu.Action]gpu.StackID {
		h.a.Flush()
		got := map[gpu.Action]gpu.StackID{}
		for _, e := range h.rec.events[seen:] {
			if e.Addr == p && (e.Action == gpu.ActionFreeRequested || e.Action == gpu.ActionFreeCompleted) {
				got[e.Action] = e.Stack
			}
		}
		seen = len(h.rec.events)
		return got
	}
	for _, c := range []struct {
		from, requested, completed gpu.StackID
		otherStream, unknown       bool
	}{
		{freed, freed, freed, false, false},
		{0, 0, 0, false, false},
		{0, allocated, allocated, false, true},
		{freed, freed, completing, true, false},
	} {
		p, err := h.a.Malloc(MiB, 1, allocated)
		if err != nil {
			t.Fatal(err)
		}
		if c.otherStream {
			h.dev.Hold(2)
			if err := h.a.RecordStream(p, 2); err != nil {
				t.Fatal(err)
			}
		}
		free := func() error { return h.a.FreeFrom(p, c.from) }
		if c.unknown {
			free = func() error { return h.a.Free(p) }
		}
		if err := free(); err != nil {
			t.Fatal(err)
		}
		if c.otherStream {
			h.dev.Release(2)
			if _, err := h.a.Malloc(512, 1, completing); err != nil { // completes the free
				t.Fatal(err)
			}
		}
		want := map[gpu.Action]gpu.StackID{gpu.ActionFreeRequested: c.requested, gpu.ActionFreeCompleted: c.completed}
		if got := stacks(p); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("freed from stack %d (other stream %v, unknown %v): stacks %v, want %v", c.from, c.otherStream, c.unknown, got, want)
		}
	}
	h.checkInvariants()
}

// TestReleaseStacks: the segment_free and segment_unmap entries of an
// empty_cache carry its stack (none from EmptyCache), and those of the
// segments a malloc releases to retry carry the malloc's, as PyTorch
// stamps them with the context of the call.
func TestReleaseStacks(t *testing.T) {
	const allocated, emptied, retried gpu.StackID = 3, 5, 8
	for _, conf := range []string{"", "expandable_segments:True"} {
		h := newHarness(t, 100*MiB, conf)
		seen := 0
		released := func() map[gpu.StackID]int {
			h.a.Flush()
			got := map[gpu.StackID]int{}
			for _, e := range h.rec.events[seen:] {
				if e.Action == gpu.ActionSegmentFree || e.Action == gpu.ActionSegmentUnmap {
					got[e.Stack]++
				}
			}
			seen = len(h.rec.events)
			return got
		}
		cache := func(size uint64, stream int64) {
			p, err := h.a.Malloc(size, stream, allocated)
			if err != nil {
				t.Fatal(err)
			}
			h.free(p)
		}
		cache(30*MiB, 0)
		if err := h.a.EmptyCacheFrom(emptied); err != nil {
			t.Fatal(err)
		}
		if got := released(); len(got) != 1 || got[emptied] == 0 {
			t.Errorf("%q: empty_cache from stack %d released with stacks %v", conf, emptied, got)
		}
		cache(30*MiB, 0)
		if err := h.a.EmptyCache(); err != nil {
			t.Fatal(err)
		}
		if got := released(); len(got) != 1 || got[0] == 0 {
			t.Errorf("%q: empty_cache with no frames released with stacks %v", conf, got)
		}
		cache(60*MiB, 1) // cached for stream 1: 90 MiB for stream 0 do not fit beside it
		if _, err := h.a.Malloc(90*MiB, 0, retried); err != nil {
			t.Fatal(err)
		}
		if got := released(); len(got) != 1 || got[retried] == 0 {
			t.Errorf("%q: a malloc from stack %d released with stacks %v", conf, retried, got)
		}
		h.checkInvariants()
	}
}

func TestOOMWithFractionAndGC(t *testing.T) {
	h := newHarness(t, 100*MiB, "garbage_collection_threshold:0.5,per_process_memory_fraction:0.5")
	a := h.malloc(20 * MiB)
	b := h.malloc(20 * MiB)
	h.free(a)
	h.free(b)
	// 40 MiB reserved > 0.5 * 50 MiB: GC frees the oldest unsplit blocks.
	h.malloc(30 * MiB)
	h.expectStats(map[string]int64{"num_device_free": 2, "num_sync_all_streams": 0})
	_, err := h.a.Malloc(30*MiB, 0, 0)
	oom, ok := err.(*OutOfMemoryError)
	if !ok {
		t.Fatalf("want OOM, got %v", err)
	}
	if !strings.Contains(oom.Message, "of which 70.00 MiB is free. 50.00 MiB allowed; Of the allocated memory 30.00 MiB") {
		t.Errorf("message %q", oom.Message)
	}
	h.checkInvariants()
}

// TestExpandableWithMaxSplit: with expandable segments, freeing cached
// oversize blocks before an OOM skips the expandable ones (they are pages
// of one reservation, not segments), and the request ends in a clean OOM.
func TestExpandableWithMaxSplit(t *testing.T) {
	h := newHarness(t, 1<<30, "expandable_segments:True,max_split_size_mb:40")
	a := h.malloc(100 * MiB)
	h.malloc(900 * MiB)
	h.free(a)
	_, err := h.a.Malloc(150*MiB, 0, 0)
	if _, ok := err.(*OutOfMemoryError); !ok {
		t.Fatalf("want an OOM, got %v", err)
	}
	for _, e := range h.rec.events {
		if e.Action == gpu.ActionSegmentFree {
			t.Fatalf("an expandable block was released as a segment: %v", e)
		}
	}
	h.checkInvariants()
}
