package sim

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"vramscope/gpu"
)

const mib = 1 << 20

func mustMalloc(t *testing.T, d *Device, size uint64) uint64 {
	t.Helper()
	a, err := d.Malloc(size)
	if err != nil {
		t.Fatalf("Malloc(%d): %v", size, err)
	}
	return a
}

func checkFree(t *testing.T, d *Device, want uint64) {
	t.Helper()
	free, total, err := d.MemInfo()
	if err != nil || free != want || total != d.Capacity() {
		t.Fatalf("MemInfo = %d, %d, %v; want free %d, total %d", free, total, err, want, d.Capacity())
	}
}

func TestIdentity(t *testing.T) {
	d := New(mib)
	if d.Name() != "simulated" || d.Ordinal() != 0 {
		t.Fatalf("Name, Ordinal = %q, %d", d.Name(), d.Ordinal())
	}
	d = New(mib, WithOrdinal(3), WithName("sim H200"))
	if d.Name() != "sim H200" || d.Ordinal() != 3 {
		t.Fatalf("Name, Ordinal = %q, %d", d.Name(), d.Ordinal())
	}
}

// Malloc places as the CUDA driver did in the PyTorch 2.11 recordings
// (checked against them by TestPlacementAsRecorded): each detail of the
// rule once, on addresses worked out by hand.
func TestMallocLikeTheDriver(t *testing.T) {
	d := New(1 << 40)
	top := uint64(mallocEnd)
	free := func(addr uint64) {
		t.Helper()
		if err := d.Free(addr); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		what       string
		size, want uint64
	}{
		// Whole 32 MiB chunks, as high as they fit: two for 36 MiB.
		{"36 MiB: a run of fresh chunks at the top", 36 * mib, top - 64*mib},
		{"24 MiB: the tail of the 36 MiB one's run", 24 * mib, top - 28*mib},
		{"240 MiB: 4 MiB of room left, so fresh chunks below", 240 * mib, top - 320*mib},
		{"2 MiB: next fit, right after the previous cudaMalloc", 2 * mib, top - 80*mib},
		{"20 MiB: no room of 20 MiB anywhere, so one fresh chunk", 20 * mib, top - 352*mib},
		{"1000 B: next fit again, a whole page", 1000, top - 332*mib},
	}
	var at []uint64
	for _, st := range steps {
		got := mustMalloc(t, d, st.size)
		if got != st.want {
			t.Fatalf("%s: at top-%d MiB, want top-%d MiB", st.what, (top-got)/mib, (top-st.want)/mib)
		}
		at = append(at, got)
	}
	// The run of the 36 MiB segment keeps its room while the 24 MiB one
	// lives: the next segment that fits it takes it, although the search
	// starts above the 20 MiB segment and passes the 240 MiB one's tail.
	free(at[0])
	if got := mustMalloc(t, d, 30*mib); got != top-64*mib {
		t.Fatalf("30 MiB in a freed segment's room: at top-%d MiB, want top-64 MiB", (top-got)/mib)
	}
	// With its last segment the run goes back: fresh chunks take its place.
	free(top - 64*mib)
	free(at[1])
	if got := mustMalloc(t, d, 60*mib); got != top-64*mib {
		t.Fatalf("60 MiB where a run went back: at top-%d MiB, want top-64 MiB", (top-got)/mib)
	}
	// Rooms of two runs side by side do not add up: 14 MiB at the tail of
	// the 240 MiB one's run and the 40 MiB below a 20 MiB segment in the
	// run above do not take 50 MiB; it gets fresh chunks below the rest.
	free(top - 64*mib)
	k := mustMalloc(t, d, 40*mib)
	if l := mustMalloc(t, d, 20*mib); k != top-64*mib || l != top-24*mib {
		t.Fatalf("40 and 20 MiB at top-%d, top-%d MiB, want top-64, top-24", (top-k)/mib, (top-l)/mib)
	}
	free(k)
	if got := mustMalloc(t, d, 50*mib); got != top-416*mib {
		t.Fatalf("50 MiB across two runs' rooms: at top-%d MiB, want fresh chunks at top-416 MiB", (top-got)/mib)
	}
	if got := d.Counts(); got.Mallocs != 11 || got.Frees != 5 {
		t.Fatalf("counts %+v", got)
	}
}

func TestMallocDeterministic(t *testing.T) {
	run := func() []uint64 {
		d := New(1 << 30)
		var out []uint64
		for i := uint64(1); i <= 20; i++ {
			a := mustMalloc(t, d, i*777777)
			out = append(out, a)
			if i%3 == 0 {
				if err := d.Free(out[i/2]); err != nil {
					t.Fatal(err)
				}
			}
		}
		return out
	}
	a, b := run(), run()
	for i := range a {
		if a[i] != b[i] || a[i]%Granularity != 0 {
			t.Fatalf("run differs or unaligned at %d: %#x vs %#x", i, a[i], b[i])
		}
	}
}

func TestFreeErrors(t *testing.T) {
	d := New(10 * mib)
	a := mustMalloc(t, d, mib)
	for _, addr := range []uint64{0, a + 512, 0x1234} {
		if err := d.Free(addr); err == nil {
			t.Errorf("Free(%#x) of an unknown address: no error", addr)
		}
	}
	if err := d.Free(a); err != nil {
		t.Fatal(err)
	}
	if err := d.Free(a); err == nil {
		t.Error("double Free: no error")
	}
	if _, err := d.Malloc(0); err == nil || errors.Is(err, gpu.ErrOutOfMemory) {
		t.Errorf("Malloc(0) = %v, want a non-OOM error", err)
	}
	checkFree(t, d, 10*mib)
}

func TestCapacityNeverExceeded(t *testing.T) {
	d := New(60 * mib)
	var addrs []uint64
	for range 3 {
		addrs = append(addrs, mustMalloc(t, d, 20*mib))
	}
	checkFree(t, d, 0)
	if _, err := d.Malloc(1); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Fatalf("Malloc on a full device = %v, want ErrOutOfMemory", err)
	}
	r, err := d.Reserve(40 * mib)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Map(r, 2*mib, 2*mib); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Fatalf("Map on a full device = %v, want ErrOutOfMemory", err)
	}
	if err := d.Free(addrs[1]); err != nil {
		t.Fatal(err)
	}
	if err := d.Map(r, 20*mib, 20*mib); err != nil {
		t.Fatal(err)
	}
	if err := d.Map(r+20*mib, 2*mib, 2*mib); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Fatalf("Map past capacity = %v, want ErrOutOfMemory", err)
	}
	if _, err := d.Malloc(mib); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Fatalf("Malloc past capacity = %v, want ErrOutOfMemory", err)
	}
	if d.Used() != 60*mib {
		t.Fatalf("Used = %d", d.Used())
	}
	if c := d.Counts(); c.OOMs != 4 || c.Mallocs != 3 || c.Maps != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// Reservations go upward from ReserveBase, each at the next 32 MiB
// boundary after the one before (a page away at least), and a range given
// back is not taken again while there is room above: as the driver placed
// them in the 2.11 recordings (TestReservationsAsRecorded).
func TestReserveUpward(t *testing.T) {
	d := New(mib) // reservations charge nothing
	reserve := func(size uint64) uint64 {
		t.Helper()
		a, err := d.Reserve(size)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	var got []uint64
	for _, size := range []uint64{20 * mib, 2 * mib, 30 * mib, 32 * mib} {
		got = append(got, reserve(size)-ReserveBase)
	}
	// 30 MiB ends at 94 MiB: the next starts at 96, a page away.
	if want := []uint64{0, 32 * mib, 64 * mib, 96 * mib}; !slices.Equal(got, want) {
		t.Fatalf("reservations at ReserveBase+%v MiB, want +%v", div(got, mib), div(want, mib))
	}
	if err := d.Unreserve(ReserveBase+32*mib, 2*mib); err != nil {
		t.Fatal(err)
	}
	if e := reserve(2*mib) - ReserveBase; e != 160*mib {
		t.Fatalf("after one was given back: at ReserveBase+%d MiB, want +160 MiB", e/mib)
	}
	// With no room left above, the lowest place a page away from the others.
	rest := uint64(reserveEnd - ReserveBase - 192*mib)
	if f := reserve(rest) - ReserveBase; f != 192*mib {
		t.Fatalf("the rest of the range at ReserveBase+%d MiB, want +192 MiB", f/mib)
	}
	if g := reserve(2*mib) - ReserveBase; g != 22*mib {
		t.Fatalf("a full range: at ReserveBase+%d MiB, want +22 MiB (a page past the first)", g/mib)
	}
	if _, err := d.Reserve(64 * mib); err == nil {
		t.Error("Reserve(64 MiB) in a full range: no error")
	}
	for _, size := range []uint64{0, mib, 3 * mib} {
		if _, err := d.Reserve(size); err == nil {
			t.Errorf("Reserve(%d): no error", size)
		}
	}
	checkFree(t, d, mib)
}

func div(xs []uint64, by uint64) []uint64 {
	out := make([]uint64, len(xs))
	for i, x := range xs {
		out[i] = x / by
	}
	return out
}

func TestMapUnmap(t *testing.T) {
	d := New(100 * mib)
	r, err := d.Reserve(40 * mib)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Map(r, 20*mib, 2*mib); err != nil {
		t.Fatal(err)
	}
	if err := d.Map(r+20*mib, 4*mib, 2*mib); err != nil {
		t.Fatal(err)
	}
	checkFree(t, d, 76*mib)
	if err := d.Touch(r+mib, 22*mib); err != nil {
		t.Errorf("Touch of mapped pages: %v", err)
	}
	if err := d.Touch(r+23*mib, 2*mib); err == nil {
		t.Error("Touch past the mapped pages: no error")
	}

	bad := []struct {
		name             string
		addr, size, page uint64
	}{
		{"unaligned address", r + mib, 2 * mib, 2 * mib},
		{"unaligned size", r + 30*mib, mib, mib},
		{"zero size", r + 30*mib, 0, 2 * mib},
		{"zero page", r + 30*mib, 2 * mib, 0},
		{"size not whole pages", r + 30*mib, 6 * mib, 4 * mib},
		{"unaligned page", r + 30*mib, 6 * mib, 3 * mib},
		{"past the reservation", r + 38*mib, 4 * mib, 2 * mib},
		{"outside any reservation", MallocBase, 2 * mib, 2 * mib},
		{"already mapped", r + 18*mib, 4 * mib, 2 * mib},
	}
	for _, c := range bad {
		if err := d.Map(c.addr, c.size, c.page); err == nil || errors.Is(err, gpu.ErrOutOfMemory) {
			t.Errorf("Map %s = %v, want a non-OOM error", c.name, err)
		}
	}
	if err := d.Unmap(r+24*mib, 2*mib); err == nil {
		t.Error("Unmap of an unmapped page: no error")
	}
	if err := d.Unmap(r+mib, 2*mib); err == nil {
		t.Error("Unmap of an unaligned range: no error")
	}
	if err := d.Unreserve(r, 40*mib); err == nil {
		t.Error("Unreserve with pages mapped: no error")
	}
	if err := d.Unreserve(r, 20*mib); err == nil {
		t.Error("Unreserve of the wrong size: no error")
	}
	checkFree(t, d, 76*mib)

	// Unmap in pieces other than the ones mapped: pages are independent.
	if err := d.Unmap(r+18*mib, 6*mib); err != nil {
		t.Fatal(err)
	}
	if err := d.Unmap(r, 18*mib); err != nil {
		t.Fatal(err)
	}
	checkFree(t, d, 100*mib)
	if err := d.Unreserve(r, 40*mib); err != nil {
		t.Fatal(err)
	}
	if err := d.Map(r, 2*mib, 2*mib); err == nil {
		t.Error("Map after Unreserve: no error")
	}
	if c := d.Counts(); c.Maps != 2 || c.Unmaps != 2 || c.Reserves != 1 || c.Unreserves != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// A Map's pages are its physical allocations: Unmap releases whole ones,
// in any grouping, and refuses to cut one, as the driver does.
func TestMapPages(t *testing.T) {
	d := New(100 * mib)
	r, err := d.Reserve(80 * mib)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Map(r, 60*mib, 20*mib); err != nil {
		t.Fatal(err)
	}
	checkFree(t, d, 40*mib)
	for _, c := range []struct{ addr, size uint64 }{{r, 2 * mib}, {r + 42*mib, 18 * mib}, {r + 10*mib, 20 * mib}, {r, 40*mib - 2*mib}} {
		if err := d.Unmap(c.addr, c.size); err == nil || !strings.Contains(err.Error(), "cuts a mapped page") {
			t.Errorf("Unmap [%#x, +%d) = %v, want a page cut", c.addr, c.size, err)
		}
	}
	checkFree(t, d, 40*mib)
	if err := d.Unmap(r+20*mib, 20*mib); err != nil {
		t.Fatal(err)
	}
	if err := d.Unmap(r+20*mib, 20*mib); err == nil {
		t.Error("Unmap of an unmapped page: no error")
	}
	if err := d.Map(r+20*mib, 20*mib, 2*mib); err != nil {
		t.Fatal(err)
	}
	// Pages of separate calls, and of different sizes, unmap together.
	if err := d.Unmap(r, 60*mib); err != nil {
		t.Fatal(err)
	}
	checkFree(t, d, 100*mib)
	if c := d.Counts(); c.Maps != 2 || c.Unmaps != 2 {
		t.Fatalf("counts %+v", c)
	}
}

func TestTouchMalloc(t *testing.T) {
	d := New(10 * mib)
	a := mustMalloc(t, d, 3*mib)
	if err := d.Touch(a+mib, 2*mib); err != nil {
		t.Error(err)
	}
	// The placement rounds to 4 MiB, but only 3 MiB are the allocation's.
	if err := d.Touch(a+2*mib, 2*mib); err == nil {
		t.Error("Touch past the allocation: no error")
	}
	if err := d.Touch(0x1000, 1); err == nil {
		t.Error("Touch of unallocated memory: no error")
	}
}

func TestFaultInjection(t *testing.T) {
	d := New(100*mib, FailMalloc(2, 4), FailMap(1), FailAbove(30*mib))
	var errs []error
	for range 5 {
		_, err := d.Malloc(mib)
		errs = append(errs, err)
	}
	for i, err := range errs {
		wantOOM := i == 1 || i == 3
		if errors.Is(err, gpu.ErrOutOfMemory) != wantOOM || (err != nil) != wantOOM {
			t.Errorf("Malloc call %d: %v", i+1, err)
		}
	}
	if _, err := d.Malloc(31 * mib); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Errorf("Malloc above the limit = %v", err)
	}
	if _, err := d.Malloc(30 * mib); err != nil {
		t.Errorf("Malloc at the limit = %v", err)
	}
	r, err := d.Reserve(64 * mib)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Map(r, 2*mib, 2*mib); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Errorf("first Map = %v, want ErrOutOfMemory", err)
	}
	if err := d.Map(r, 2*mib, 2*mib); err != nil {
		t.Errorf("second Map = %v", err)
	}
	if err := d.Map(r+2*mib, 32*mib, 2*mib); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Errorf("Map above the limit = %v", err)
	}
	c := d.Counts()
	if c.Mallocs != 4 || c.OOMs != 5 || c.Maps != 1 {
		t.Errorf("counts %+v", c)
	}
	checkFree(t, d, 100*mib-3*mib-30*mib-2*mib)
}

func done(t *testing.T, d *Device, f gpu.Fence) bool {
	t.Helper()
	ok, err := d.FenceDone(f)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestFences(t *testing.T) {
	d := New(mib)
	f0, _ := d.RecordFence(1)
	if f0 == 0 || !done(t, d, f0) {
		t.Fatal("a fence on a free-running stream is not done at once")
	}
	d.Hold(2)
	f1, _ := d.RecordFence(2)
	f2, _ := d.RecordFence(2)
	g, _ := d.RecordFence(1)
	if f1 == f2 {
		t.Fatal("two fences are equal")
	}
	if done(t, d, f1) || done(t, d, f2) {
		t.Fatal("fence on a held stream is done")
	}
	if !done(t, d, g) {
		t.Fatal("holding stream 2 held stream 1")
	}
	d.Release(2)
	if !done(t, d, f1) || !done(t, d, f2) {
		t.Fatal("fence not done after Release")
	}
	f3, _ := d.RecordFence(2)
	if !done(t, d, f3) {
		t.Fatal("a released stream is still held")
	}

	// Hold again: new fences are pending, the old ones stay done.
	d.Hold(2)
	d.Hold(2) // idempotent
	f4, _ := d.RecordFence(2)
	if done(t, d, f4) || !done(t, d, f1) {
		t.Fatal("second hold")
	}
	if err := d.WaitFence(f4); err != nil {
		t.Fatal(err)
	}
	if !done(t, d, f4) {
		t.Fatal("fence not done after WaitFence")
	}

	d.Hold(3)
	d.Hold(4)
	h3, _ := d.RecordFence(3)
	h4, _ := d.RecordFence(4)
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !done(t, d, h3) || !done(t, d, h4) {
		t.Fatal("fences not done after Synchronize")
	}
	if _, err := d.FenceDone(0); err == nil {
		t.Error("FenceDone(0): no error")
	}
	if err := d.WaitFence(gpu.Fence(1 << 60)); err == nil {
		t.Error("WaitFence of an unknown fence: no error")
	}
	if c := d.Counts(); c.Fences != 8 || c.Waits != 1 || c.Syncs != 1 {
		t.Errorf("counts %+v", c)
	}
}

// A recording's addresses: mallocs by size in recorded order, a taken one
// or an unrecorded call above every recorded range.
func TestRecordedMallocs(t *testing.T) {
	const base = 0x7f3a00000000
	d := New(1<<30, Recorded([]Span{{Addr: base + 40*mib, Size: 20 * mib}, {Addr: base, Size: 20 * mib}, {Addr: base + 100*mib, Size: 2 * mib}}, nil))
	if a := mustMalloc(t, d, 20*mib); a != base+40*mib {
		t.Fatalf("first 20 MiB at %#x", a)
	}
	if a := mustMalloc(t, d, 2*mib); a != base+100*mib {
		t.Fatalf("2 MiB at %#x", a)
	}
	// No recorded 6 MiB segment: above the recording, a page away.
	above := uint64(base + 102*mib + Granularity)
	if a := mustMalloc(t, d, 6*mib); a != above {
		t.Fatalf("unrecorded malloc at %#x, want %#x", a, above)
	}
	if err := d.Free(base + 40*mib); err != nil {
		t.Fatal(err)
	}
	// The second recorded 20 MiB address; then none are left.
	if a := mustMalloc(t, d, 20*mib); a != base {
		t.Fatalf("second 20 MiB at %#x", a)
	}
	if a := mustMalloc(t, d, 20*mib); a < above+6*mib+Granularity {
		t.Fatalf("third 20 MiB at %#x, inside what was handed out", a)
	}
	checkFree(t, d, 1<<30-48*mib)
}

// A recorded address still taken (a run under other settings) goes above.
func TestRecordedAddressTaken(t *testing.T) {
	const base = 0x7f3a00000000
	d := New(1<<30, Recorded([]Span{{Addr: base, Size: 20 * mib}, {Addr: base, Size: 20 * mib}}, nil))
	first := mustMalloc(t, d, 20*mib)
	second := mustMalloc(t, d, 20*mib)
	if first != base || second < base+20*mib+Granularity {
		t.Fatalf("at %#x then %#x", first, second)
	}
}

// Reservations go to their recorded address, lower by whole pages when the
// one recorded above (held at the same time) would be overlapped.
func TestRecordedReserves(t *testing.T) {
	const base = 0x7e1000000000
	d := New(1<<30, Recorded(nil, []Span{
		{Addr: base + 200*mib, Size: 60 * mib, Page: 20 * mib, Below: base + 1200*mib},
		{Addr: base + 1200*mib, Size: 2 * mib, Page: 2 * mib},
	}))
	// 1.2 GiB does not fit between the two: it starts 200 MiB lower.
	a, err := d.Reserve(1200 * mib)
	if err != nil || a != base {
		t.Fatalf("Reserve = %#x, %v; want %#x", a, err, uint64(base))
	}
	b, err := d.Reserve(4 * mib)
	if err != nil || b != base+1200*mib {
		t.Fatalf("Reserve = %#x, %v", b, err)
	}
	if err := d.Map(a, 20*mib, 20*mib); err != nil {
		t.Fatal(err)
	}
	checkFree(t, d, 1<<30-20*mib)
}

// SetCapacity changes what later calls may take; what is out stays.
func TestSetCapacity(t *testing.T) {
	d := New(10 * mib)
	mustMalloc(t, d, 8*mib)
	d.SetCapacity(4 * mib)
	if _, err := d.Malloc(mib); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Fatalf("malloc over a lowered capacity: %v", err)
	}
	d.SetCapacity(20 * mib)
	mustMalloc(t, d, 10*mib)
	checkFree(t, d, 2*mib)
}

// pageByPageFit is where an unrecorded call of placed bytes goes: the
// first page-aligned address above the recording, one after the other,
// where it is a page away from every handed-out range.
func pageByPageFit(d *Device, placed uint64) uint64 {
	at := d.above
	for !d.vacant(at-Granularity, placed+2*Granularity) {
		at += Granularity
	}
	return at
}

// Unrecorded mallocs and reservations of random sizes, given back in
// random order, land where a page-by-page scan above the recording
// puts them.
func TestRecordedFirstFitProperty(t *testing.T) {
	const base = 0x7f3a00000000
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 3))
		// Recorded ranges of sizes the calls never ask, but the first
		// reservation, which takes the recorded one.
		d := New(1<<40, Recorded([]Span{{Addr: base, Size: 100 * mib}}, []Span{{Addr: base + 200*mib, Size: 40 * mib, Page: 2 * mib}}))
		reserved := false
		type held struct {
			addr, size uint64
			reserve    bool
		}
		var out []held
		for step := range 2000 {
			if len(out) > 0 && r.IntN(5) < 2 {
				i := r.IntN(len(out))
				h := out[i]
				out = append(out[:i], out[i+1:]...)
				var err error
				if h.reserve {
					err = d.Unreserve(h.addr, h.size)
				} else {
					err = d.Free(h.addr)
				}
				if err != nil {
					t.Fatal(err)
				}
				continue
			}
			size := uint64(1+r.IntN(12)) * Granularity
			if r.IntN(4) == 0 {
				size -= uint64(r.IntN(int(Granularity))) // a malloc rounded up to pages
			}
			reserve := r.IntN(3) == 0 && size%Granularity == 0
			want := pageByPageFit(d, roundUp(size))
			var got uint64
			var err error
			if reserve {
				got, err = d.Reserve(size)
			} else {
				got, err = d.Malloc(size)
			}
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, held{got, size, reserve})
			if reserve && !reserved {
				reserved = true
				continue
			}
			if got != want {
				t.Fatalf("seed %d step %d: %d bytes at %#x, first fit %#x", seed, step, size, got, want)
			}
		}
	}
}

// driverRef is the driver's placement as the issue that found it states
// it in prose, written without the device's code or constants: chunk
// runs as sets of the segments in them, next fit as the first of the
// addresses where a room can begin (the search's start, a run's base, a
// segment's end) tried in order from the previous cudaMalloc's end, and
// fresh chunks as the first free run of them tried from the top down.
type driverRef struct {
	lo, hi uint64             // the range
	runs   map[uint64]*refRun // by base
	segs   map[uint64]uint64  // address -> bytes it takes
	runOf  map[uint64]*refRun // segment address -> its run
	cursor uint64
}

type refRun struct{ base, size, live uint64 }

func (r *driverRef) place(size uint64) uint64 {
	const chunk, page = 32 << 20, 2 << 20
	placed := (size + page - 1) / page * page
	fits := func(at uint64) *refRun {
		for _, run := range r.runs {
			if at < run.base || at+placed > run.base+run.size {
				continue
			}
			for a, n := range r.segs {
				if a < at+placed && at < a+n {
					return nil
				}
			}
			return run
		}
		return nil
	}
	starts := []uint64{r.cursor}
	for _, run := range r.runs {
		starts = append(starts, run.base)
	}
	for a, n := range r.segs {
		starts = append(starts, a+n)
	}
	slices.Sort(starts)
	// From the cursor on, then from the lowest.
	i, _ := slices.BinarySearch(starts, r.cursor)
	for _, at := range append(starts[i:], starts[:i]...) {
		if run := fits(at); run != nil {
			return r.put(at, placed, run)
		}
	}
	need := (placed + chunk - 1) / chunk * chunk
	for top := r.hi; top-need >= r.lo; top -= chunk {
		taken := false
		for _, run := range r.runs {
			taken = taken || run.base < top && top-need < run.base+run.size
		}
		if !taken {
			run := &refRun{base: top - need, size: need}
			r.runs[run.base] = run
			return r.put(run.base, placed, run)
		}
	}
	return 0
}

func (r *driverRef) put(at, placed uint64, run *refRun) uint64 {
	r.segs[at] = placed
	r.runOf[at] = run
	run.live++
	r.cursor = at + placed
	return at
}

func (r *driverRef) free(at uint64) {
	run := r.runOf[at]
	delete(r.segs, at)
	delete(r.runOf, at)
	if run.live--; run.live == 0 {
		delete(r.runs, run.base)
	}
}

// Random mallocs and frees land where driverRef puts them. That checks
// the device against the rule as stated, not against the recordings:
// TestPlacementAsRecorded does that.
func TestMallocDriverProperty(t *testing.T) {
	sizes := []uint64{512, mib, 2 * mib, 12 * mib, 20 * mib, 24 * mib, 36 * mib, 64 * mib, 250 * mib}
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 7))
		d := New(1 << 40)
		ref := &driverRef{lo: 0x7f0000000000, hi: 0x800000000000, runs: map[uint64]*refRun{}, segs: map[uint64]uint64{}, runOf: map[uint64]*refRun{}}
		var live []uint64
		for step := range 600 {
			if len(live) > 0 && r.IntN(2) == 0 {
				i := r.IntN(len(live))
				if err := d.Free(live[i]); err != nil {
					t.Fatal(err)
				}
				ref.free(live[i])
				live = append(live[:i], live[i+1:]...)
				continue
			}
			size := sizes[r.IntN(len(sizes))] + uint64(r.IntN(3))*512
			want := ref.place(size)
			if got := mustMalloc(t, d, size); got != want {
				t.Fatalf("seed %d step %d: %d bytes at %#x, want %#x", seed, step, size, got, want)
			}
			live = append(live, want)
		}
	}
}
