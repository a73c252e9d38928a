// Package sim is a simulated GPU: a capacity, driver-like addresses, VMM
// pages, streams whose work a test can hold back, fault injection and call
// counters. Every run with the same calls gives the same addresses, so
// allocator tests and demo traces are deterministic.
package sim

import (
	"errors"
	"fmt"
	"sort"
	"sync"

	"vramscope/gpu"
)

const (
	// Granularity is the page size: Malloc places at this alignment, and
	// Reserve, Map and Unmap take multiples of it (cuMemGetAllocationGranularity).
	Granularity = 2 << 20
	// MallocBase is the lowest address Malloc hands out; it hands them out
	// from the top of its range down (see Malloc).
	MallocBase = 0x7f0000000000
	// ReserveBase is the lowest address Reserve hands out, low in the
	// address space as the driver's are (the 2.11 recordings' first was at
	// 0x302000000); reservations go upward from it. The reservation range
	// ends where the Malloc range begins, so the two never overlap. Its
	// 127 TiB hold hundreds of reservations on the largest device a search
	// tries (each 9/8 of the device, as PyTorch reserves for an expandable
	// segment).
	ReserveBase = 0x300000000
	mallocEnd   = 0x800000000000
	reserveEnd  = MallocBase
	// chunk is the unit in which the driver takes address space for
	// cudaMalloc'd segments and aligns reservations (see Malloc, Reserve).
	chunk = 32 << 20
)

// Counts are the calls a Device has served. Failed calls are not counted,
// except in OOMs, which counts calls refused with gpu.ErrOutOfMemory.
type Counts struct {
	Mallocs, Frees, Reserves, Unreserves, Maps, Unmaps int
	Fences, Waits, Syncs, OOMs                         int
}

// span is an address range; placed is the size it occupies in the address
// space (size rounded up to Granularity).
type span struct{ addr, size, placed uint64 }

func (s span) end() uint64 { return s.addr + s.placed }

// Device is a simulated gpu.Device. It is safe for concurrent use.
type Device struct {
	mu       sync.Mutex
	capacity uint64
	ordinal  int
	name     string

	mallocs  []span            // sorted by addr
	reserves []span            // sorted by addr
	mapped   map[uint64]uint64 // mapped Granularity-page address -> where its Map page begins
	used     uint64            // bytes malloc'd + bytes mapped

	// Where the driver's own placement keeps its state (see Malloc,
	// Reserve): the chunk runs that hold the mallocs, the end of the last
	// Malloc (where the next one's search starts) and where the last
	// Reserve ended.
	runs        []chunkRun // sorted by base
	cursor      uint64
	reserveNext uint64

	failMalloc map[int]bool // 1-based Malloc call numbers that fail
	failMap    map[int]bool // 1-based Map call numbers that fail
	failAbove  uint64       // Malloc/Map requests above this fail; 0: no limit
	mallocCall int
	mapCall    int

	// A recording's addresses (see Recorded): queued by size for Malloc,
	// in order for Reserve; above is where other calls are placed.
	recMallocs  map[uint64][]uint64
	recReserves []Span
	recorded    bool
	above       uint64

	fenceSeq uint64
	holdSeq  uint64
	holds    map[int64]uint64    // held stream -> its hold id
	pending  map[uint64]struct{} // hold ids whose work has not finished

	counts Counts
}

var _ gpu.Device = (*Device)(nil)

// Option configures a Device.
type Option func(*Device)

// WithOrdinal sets the device index (0 by default).
func WithOrdinal(n int) Option { return func(d *Device) { d.ordinal = n } }

// WithName sets the name ("simulated" by default).
func WithName(name string) Option { return func(d *Device) { d.name = name } }

// FailMalloc makes the given Malloc calls (1-based, counting every call)
// fail with gpu.ErrOutOfMemory.
func FailMalloc(calls ...int) Option {
	return func(d *Device) {
		for _, n := range calls {
			d.failMalloc[n] = true
		}
	}
}

// FailMap makes the given Map calls (1-based, counting every call) fail
// with gpu.ErrOutOfMemory.
func FailMap(calls ...int) Option {
	return func(d *Device) {
		for _, n := range calls {
			d.failMap[n] = true
		}
	}
}

// FailAbove makes every Malloc or Map of more than size bytes fail with
// gpu.ErrOutOfMemory, whatever the free memory.
func FailAbove(size uint64) Option { return func(d *Device) { d.failAbove = size } }

// Span is an address range a recording's driver handed out. For a
// reservation, Page is the step by which it may start lower and Below,
// when not 0, where it must end (see Recorded).
type Span struct{ Addr, Size, Page, Below uint64 }

// Recorded makes the device hand out a recording's addresses. The n-th
// Malloc of a size gets the address of the n-th span of that size in
// mallocs, when that range is still free. The n-th Reserve gets
// reserves[n].Addr, whose Size says how far the recording used the
// reservation; when the range it asks for would pass Below (the next
// reservation the recording held at the same time: this device's
// reservations can be larger than the recording's) or is taken, it starts
// lower by whole Pages, as high as fits while it still covers the
// recorded range. Every other call gets the lowest 2 MiB-aligned address
// at least a page above every recorded range and a page away from every
// range handed out, first fit: deterministic, and never where the
// recording put something.
func Recorded(mallocs, reserves []Span) Option {
	return func(d *Device) {
		d.recorded = true
		d.recMallocs = map[uint64][]uint64{}
		var top uint64
		for _, s := range mallocs {
			d.recMallocs[s.Size] = append(d.recMallocs[s.Size], s.Addr)
			top = max(top, s.Addr+roundUp(s.Size))
		}
		d.recReserves = append([]Span(nil), reserves...)
		for _, s := range reserves {
			top = max(top, s.Addr+roundUp(s.Size))
		}
		d.above = roundUp(top) + Granularity
	}
}

// New returns a simulated device with capacity bytes of memory.
func New(capacity uint64, opts ...Option) *Device {
	d := &Device{
		capacity:   capacity,
		name:       "simulated",
		mapped:     map[uint64]uint64{},
		failMalloc: map[int]bool{},
		failMap:    map[int]bool{},
		holds:      map[int64]uint64{},
		pending:    map[uint64]struct{}{},
	}
	for _, o := range opts {
		o(d)
	}
	return d
}

func (d *Device) Name() string { return d.name }
func (d *Device) Ordinal() int { return d.ordinal }

// Capacity is the device's total memory.
func (d *Device) Capacity() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.capacity
}

// SetCapacity changes the device's memory from now on; what is handed
// out stays.
func (d *Device) SetCapacity(capacity uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.capacity = capacity
}

// MemInfo reports capacity minus the bytes malloc'd and mapped.
func (d *Device) MemInfo() (free, total uint64, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.capacity - d.used, d.capacity, nil
}

// Used is the bytes malloc'd plus the bytes mapped.
func (d *Device) Used() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.used
}

// Counts returns the calls served so far.
func (d *Device) Counts() Counts {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.counts
}

func roundUp(n uint64) uint64 { return (n + Granularity - 1) &^ (Granularity - 1) }

// oom reports whether a request of size bytes must fail, and counts it.
func (d *Device) oom(size uint64, injected bool) bool {
	if injected || (d.failAbove > 0 && size > d.failAbove) || d.used > d.capacity || size > d.capacity-d.used {
		d.counts.OOMs++
		return true
	}
	return false
}

// fit finds the lowest address in [base, end) where placed bytes fit
// between the sorted spans, keeping gap bytes after each span.
func fit(spans []span, base, end, placed, gap uint64) (uint64, int, bool) {
	at := uint64(base)
	for i, s := range spans {
		if s.addr >= at && s.addr-at >= placed {
			return at, i, true
		}
		at = s.end() + gap
	}
	if at <= end && end-at >= placed {
		return at, len(spans), true
	}
	return 0, 0, false
}

// Where the CUDA driver puts a cudaMalloc, as the PyTorch 2.11 recordings
// of an H200 show it (every segment_alloc after start-up: see
// recorded_test.go). The caching allocator breaks ties between free blocks
// of one size by address, so placement decides real figures: the
// bisections of the real allocator over a fragmenting stream agree with
// this placement, not with first fit.
//
// The driver takes address space for segments in whole 32 MiB chunks: a
// segment that finds no room gets a run of fresh chunks of its own, as
// high as they fit, and starts at the run's base. The run's room (the
// unused tail of its last chunk, and what segments freed in it leave)
// takes later segments of any size for as long as any segment in it
// lives; with its last one the run goes back. A segment of any size looks
// for room next fit: from the end of the previous cudaMalloc upward
// through the runs' rooms, then from the lowest run up, and takes the
// first room it fits in, at the room's start (at the search's start when
// that lies inside the room). A room ends where its run does: a segment
// never takes room from two runs.
//
// What the recordings do not decide: whether the search starts at the end
// of the previous cudaMalloc or at the start of the room that lies in
// (they agree on every recorded placement; a next-fit search starts where
// it left off); what a small segment that finds no room does (none did
// after start-up: it gets a fresh chunk, as any other segment); and room
// above the topmost run, where the driver's own start-up memory lay in
// every recording: nothing goes there but fresh chunks, highest first.
// That memory, and what the driver hands out later for itself (code of
// kernels loaded on first use, pinned host buffers), is not simulated: a
// process's first placements land among it, and a later one leaves gaps.

// chunkRun is a run of whole chunks of the Malloc range and the number of
// segments living in it.
type chunkRun struct{ base, size, live uint64 }

func (r chunkRun) end() uint64 { return r.base + r.size }

// driverPlace places placed bytes as the driver does (see chunkRun) and
// books them: the address, or false when the Malloc range is full.
func (d *Device) driverPlace(placed uint64) (uint64, bool) {
	if i, at, ok := d.nextFit(placed); ok {
		d.runs[i].live++
		d.cursor = at + placed
		return at, true
	}
	size := (placed + chunk - 1) / chunk * chunk
	hi := uint64(mallocEnd)
	for i := len(d.runs); i >= 0; i-- {
		lo := uint64(MallocBase)
		if i > 0 {
			lo = d.runs[i-1].end()
		}
		if hi-lo >= size {
			r := chunkRun{hi - size, size, 1}
			d.runs = append(d.runs, chunkRun{})
			copy(d.runs[i+1:], d.runs[i:])
			d.runs[i] = r
			d.cursor = r.base + placed
			return r.base, true
		}
		if i > 0 {
			hi = d.runs[i-1].base
		}
	}
	return 0, false
}

// nextFit finds the first room of a run, from the cursor on and then from
// the lowest run, that placed bytes fit: the run's index and the address.
func (d *Device) nextFit(placed uint64) (int, uint64, bool) {
	n := len(d.runs)
	if n == 0 {
		return 0, 0, false
	}
	first := sort.Search(n, func(i int) bool { return d.runs[i].end() > d.cursor })
	for k := range n + 1 {
		i := (first + k) % n
		from := d.runs[i].base
		if k == 0 && first < n {
			from = max(from, d.cursor) // the rest of the run the cursor is in
		} else if k == n && first == n {
			break // every run tried
		}
		if at, ok := d.roomIn(d.runs[i], from, placed); ok {
			return i, at, true
		}
	}
	return 0, 0, false
}

// roomIn is the start of the first room of r at or after from where
// placed bytes fit between its segments.
func (d *Device) roomIn(r chunkRun, from, placed uint64) (uint64, bool) {
	j := sort.Search(len(d.mallocs), func(j int) bool { return d.mallocs[j].end() > from })
	at := from
	for ; j < len(d.mallocs) && d.mallocs[j].addr < r.end(); j++ {
		if d.mallocs[j].addr >= at+placed {
			return at, true
		}
		at = max(at, d.mallocs[j].end())
	}
	return at, at+placed <= r.end()
}

// driverFree books the end of the segment at addr: its run goes back with
// its last segment.
func (d *Device) driverFree(addr uint64) {
	i := sort.Search(len(d.runs), func(i int) bool { return d.runs[i].end() > addr })
	if i == len(d.runs) || d.runs[i].base > addr {
		return
	}
	if d.runs[i].live--; d.runs[i].live == 0 {
		d.runs = append(d.runs[:i], d.runs[i+1:]...)
	}
}

// insertSpan adds s to the sorted spans.
func insertSpan(spans *[]span, s span) {
	i := sort.Search(len(*spans), func(i int) bool { return (*spans)[i].addr >= s.addr })
	*spans = append(*spans, span{})
	copy((*spans)[i+1:], (*spans)[i:])
	(*spans)[i] = s
}

// popMalloc takes the next recorded address of a Malloc of size bytes, 0
// when the recording has none left.
func (d *Device) popMalloc(size uint64) uint64 {
	q := d.recMallocs[size]
	if len(q) == 0 {
		return 0
	}
	d.recMallocs[size] = q[1:]
	return q[0]
}

// vacant reports whether [addr, addr+placed) overlaps nothing handed out.
func (d *Device) vacant(addr, placed uint64) bool {
	for _, spans := range [2][]span{d.mallocs, d.reserves} {
		i := sort.Search(len(spans), func(i int) bool { return spans[i].end() > addr })
		if i < len(spans) && spans[i].addr < addr+placed {
			return false
		}
	}
	return true
}

// recordedPlace is where a call of a device with a recording's addresses
// goes: want when it is a recorded address still free, else first fit
// above the recording, a page away from both kinds of ranges.
func (d *Device) recordedPlace(want, placed uint64) uint64 {
	if want != 0 && d.vacant(want, placed) {
		return want
	}
	return d.firstFit(placed)
}

// firstFit is the lowest page-aligned address above the recording where
// placed bytes are a page away from every handed-out range. It walks both
// lists in address order at once, past each range in its way: a replay
// under other settings places many ranges there.
func (d *Device) firstFit(placed uint64) uint64 {
	at := d.above
	past := func(spans []span) int { // the first range ending after at-Granularity
		return sort.Search(len(spans), func(i int) bool { return spans[i].end() > at-Granularity })
	}
	m, r := past(d.mallocs), past(d.reserves)
	for {
		for m < len(d.mallocs) && d.mallocs[m].end() <= at-Granularity {
			m++
		}
		for r < len(d.reserves) && d.reserves[r].end() <= at-Granularity {
			r++
		}
		var next *span // the lowest of the two
		if m < len(d.mallocs) {
			next = &d.mallocs[m]
		}
		if r < len(d.reserves) && (next == nil || d.reserves[r].addr < next.addr) {
			next = &d.reserves[r]
		}
		if next == nil || next.addr >= at+placed+Granularity {
			return at
		}
		at = roundUp(next.end()) + Granularity
	}
}

// recordedReserve places a Reserve of size bytes of a device with a
// recording's addresses (see Recorded).
func (d *Device) recordedReserve(size uint64) uint64 {
	if len(d.recReserves) == 0 {
		return d.recordedPlace(0, size)
	}
	r := d.recReserves[0]
	d.recReserves = d.recReserves[1:]
	for at := r.Addr; at+size >= r.Addr+r.Size; at -= r.Page {
		if (r.Below == 0 || at+size <= r.Below) && d.vacant(at, size) {
			return at
		}
		if r.Page == 0 || at < r.Page {
			break
		}
	}
	return d.recordedPlace(0, size)
}

func find(spans []span, addr uint64) (int, bool) {
	i := sort.Search(len(spans), func(i int) bool { return spans[i].addr >= addr })
	return i, i < len(spans) && spans[i].addr == addr
}

// Malloc places size bytes in the Malloc range as the driver does (see
// chunkRun), or at a recording's address (see Recorded), and charges
// size bytes.
func (d *Device) Malloc(size uint64) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mallocCall++
	if size == 0 {
		return 0, errors.New("sim: malloc of 0 bytes")
	}
	if d.oom(size, d.failMalloc[d.mallocCall]) {
		return 0, fmt.Errorf("sim: malloc of %d bytes: %w", size, gpu.ErrOutOfMemory)
	}
	placed := roundUp(size)
	var addr uint64
	if d.recorded {
		addr = d.recordedPlace(d.popMalloc(size), placed)
	} else {
		var ok bool
		if addr, ok = d.driverPlace(placed); !ok {
			return 0, fmt.Errorf("sim: malloc of %d bytes: address space exhausted", size)
		}
	}
	insertSpan(&d.mallocs, span{addr, size, placed})
	d.used += size
	d.counts.Mallocs++
	return addr, nil
}

// Free releases an address returned by Malloc; anything else is an error.
func (d *Device) Free(addr uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	i, ok := find(d.mallocs, addr)
	if !ok {
		return fmt.Errorf("sim: free of unknown address %#x", addr)
	}
	d.used -= d.mallocs[i].size
	d.mallocs = append(d.mallocs[:i], d.mallocs[i+1:]...)
	if !d.recorded {
		d.driverFree(addr)
	}
	d.counts.Frees++
	return nil
}

// Reserve hands out size bytes (a multiple of Granularity) of address space
// from the reservation range as the driver did in the 2.11 recordings (or
// at a recording's address, see Recorded): upward from ReserveBase, each
// at the next 32 MiB boundary after the end of the one before, so a range
// given back is not used again by a later one. The recordings do not say
// whether a reservation may start right where the one before ends: here
// it keeps at least a page away, so two reservations are never
// contiguous. Where the range has no room left above, it takes the lowest
// place that keeps a page away from the others. It charges no memory.
func (d *Device) Reserve(size uint64) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if size == 0 || size%Granularity != 0 {
		return 0, fmt.Errorf("sim: reserve of %d bytes: not a positive multiple of %d", size, Granularity)
	}
	var addr uint64
	if d.recorded {
		addr = d.recordedReserve(size)
	} else {
		addr = max(ReserveBase, (d.reserveNext+chunk-1)/chunk*chunk)
		if addr > reserveEnd || reserveEnd-addr < size || !d.vacant(addr-Granularity, size+2*Granularity) {
			// Each one keeps a page of gap before the next (hence
			// size+Granularity to fit).
			var ok bool
			if addr, _, ok = fit(d.reserves, ReserveBase, reserveEnd, size+Granularity, Granularity); !ok {
				return 0, fmt.Errorf("sim: reserve of %d bytes: address space exhausted", size)
			}
		}
		d.reserveNext = addr + size + Granularity
	}
	insertSpan(&d.reserves, span{addr, size, size})
	d.counts.Reserves++
	return addr, nil
}

// Unreserve gives back a whole reservation, which must have no page mapped.
func (d *Device) Unreserve(addr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	i, ok := find(d.reserves, addr)
	if !ok || d.reserves[i].size != size {
		return fmt.Errorf("sim: unreserve [%#x, +%d): not a reservation", addr, size)
	}
	for p := addr; p < addr+size; p += Granularity {
		if _, m := d.mapped[p]; m {
			return fmt.Errorf("sim: unreserve [%#x, +%d): page %#x is still mapped", addr, size, p)
		}
	}
	d.reserves = append(d.reserves[:i], d.reserves[i+1:]...)
	d.counts.Unreserves++
	return nil
}

// checkPages validates a page-aligned range inside one reservation.
func (d *Device) checkPages(op string, addr, size uint64) error {
	if size == 0 || addr%Granularity != 0 || size%Granularity != 0 {
		return fmt.Errorf("sim: %s [%#x, +%d): not page-aligned (page %d)", op, addr, size, Granularity)
	}
	i := sort.Search(len(d.reserves), func(i int) bool { return d.reserves[i].addr > addr }) - 1
	if i < 0 || addr+size > d.reserves[i].addr+d.reserves[i].size {
		return fmt.Errorf("sim: %s [%#x, +%d): outside every reservation", op, addr, size)
	}
	return nil
}

// Map backs [addr, addr+size) with memory in allocations of page bytes,
// charging size bytes. The range must be page-aligned, inside a
// reservation and unmapped; page a multiple of Granularity dividing size.
func (d *Device) Map(addr, size, page uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mapCall++
	if err := d.checkPages("map", addr, size); err != nil {
		return err
	}
	if page == 0 || page%Granularity != 0 || size%page != 0 {
		return fmt.Errorf("sim: map [%#x, +%d): not a whole number of %d-byte pages", addr, size, page)
	}
	for p := addr; p < addr+size; p += Granularity {
		if _, m := d.mapped[p]; m {
			return fmt.Errorf("sim: map [%#x, +%d): page %#x is already mapped", addr, size, p)
		}
	}
	if d.oom(size, d.failMap[d.mapCall]) {
		return fmt.Errorf("sim: map of %d bytes: %w", size, gpu.ErrOutOfMemory)
	}
	for p := addr; p < addr+size; p += Granularity {
		d.mapped[p] = p - (p-addr)%page
	}
	d.used += size
	d.counts.Maps++
	return nil
}

// Unmap releases the pages of [addr, addr+size), which must all be mapped
// and be whole pages of Map calls: as the driver, it unmaps only whole
// physical allocations.
func (d *Device) Unmap(addr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.checkPages("unmap", addr, size); err != nil {
		return err
	}
	for p := addr; p < addr+size; p += Granularity {
		if _, m := d.mapped[p]; !m {
			return fmt.Errorf("sim: unmap [%#x, +%d): page %#x is not mapped", addr, size, p)
		}
	}
	end := addr + size
	if start, m := d.mapped[end]; d.mapped[addr] != addr || (m && start != end) {
		return fmt.Errorf("sim: unmap [%#x, +%d): cuts a mapped page in two", addr, size)
	}
	for p := addr; p < addr+size; p += Granularity {
		delete(d.mapped, p)
	}
	d.used -= size
	d.counts.Unmaps++
	return nil
}

// Touch checks that [addr, addr+size) is memory the device has handed out:
// inside one Malloc'd allocation or on mapped pages.
func (d *Device) Touch(addr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if size == 0 {
		return nil
	}
	i := sort.Search(len(d.mallocs), func(i int) bool { return d.mallocs[i].addr > addr }) - 1
	if i >= 0 && addr+size <= d.mallocs[i].addr+d.mallocs[i].size {
		return nil
	}
	for p := addr &^ (Granularity - 1); p < addr+size; p += Granularity {
		if _, m := d.mapped[p]; !m {
			return fmt.Errorf("sim: touch [%#x, +%d): %#x is not allocated", addr, size, max(p, addr))
		}
	}
	return nil
}

// A fence packs a sequence number (high 32 bits) and the id of the hold it
// was recorded under (low 32 bits; 0 when its stream was not held), so no
// per-fence state is kept.
const holdBits = 32

// Hold makes the work on stream pending: fences recorded on it from now on
// are not done until Release (or a wait) lets the work finish.
func (d *Device) Hold(stream int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.holds[stream]; ok {
		return
	}
	d.holdSeq++
	d.holds[stream] = d.holdSeq
	d.pending[d.holdSeq] = struct{}{}
}

// Release lets the held work on stream finish: its fences become done.
func (d *Device) Release(stream int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if h, ok := d.holds[stream]; ok {
		delete(d.holds, stream)
		delete(d.pending, h)
	}
}

// RecordFence marks the end of stream's work; it is done at once unless the
// stream is held.
func (d *Device) RecordFence(stream int64) (gpu.Fence, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fenceSeq++
	d.counts.Fences++
	return gpu.Fence(d.fenceSeq<<holdBits | d.holds[stream]), nil
}

// FenceDone reports whether the hold f was recorded under has been released.
func (d *Device) FenceDone(f gpu.Fence) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if f>>holdBits == 0 || uint64(f>>holdBits) > d.fenceSeq {
		return false, fmt.Errorf("sim: unknown fence %#x", uint64(f))
	}
	_, pending := d.pending[uint64(f)&(1<<holdBits-1)]
	return !pending, nil
}

// WaitFence lets the work before f finish and returns. Waiting on a real
// device ends when the work is done, so the simulation finishes it instead
// of blocking: the stream f was recorded on is released.
func (d *Device) WaitFence(f gpu.Fence) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if f>>holdBits == 0 || uint64(f>>holdBits) > d.fenceSeq {
		return fmt.Errorf("sim: unknown fence %#x", uint64(f))
	}
	h := uint64(f) & (1<<holdBits - 1)
	for s, sh := range d.holds {
		if sh == h {
			delete(d.holds, s)
		}
	}
	delete(d.pending, h)
	d.counts.Waits++
	return nil
}

// Synchronize lets all held work finish: every stream is released.
func (d *Device) Synchronize() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.holds)
	clear(d.pending)
	d.counts.Syncs++
	return nil
}
