// Package replay runs recorded allocator traffic again: any recording (an
// RMM log, a PyTorch snapshot's trace, a stored trace) becomes a Stream of
// requests from a starting layout, which a Replayer drives through a
// caching allocator, under the original settings or others. replay,
// whatif, trace --workload replay and the incident pages all go through it.
package replay

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

	"vramscope/gpu"
	"vramscope/gpu/caching"
)

// Op is what a request asks of the allocator.
type Op uint8

const (
	OpMalloc       Op = iota + 1
	OpFree            // free the allocation made by request ID
	OpRecordStream    // the allocation ID is also used on Stream
	OpEmptyCache
	// OpFreeDone: the other streams that used allocation ID, freed by a
	// Deferred OpFree, are done with it, and the allocator takes it back
	// then, with the frames of the call that did (its free_completed's).
	OpFreeDone
)

// Request is one call into the allocator. ID names an allocation across
// its malloc and free (pointers are remapped: the replayed allocator hands
// out its own addresses).
type Request struct {
	Op     Op
	ID     int64
	Size   uint64
	Stream int64
	// Stack is where the call was made (0: no frames): a malloc's events
	// carry it, and so do a free's and an empty_cache's, as PyTorch
	// records them.
	Stack  gpu.StackID
	TimeUS int64
	// OOM marks a malloc that failed when the stream was recorded.
	OOM bool
	// Pool is the private pool a malloc was served from (a graph
	// capture's, a MemPool's; zero: the default pools), read from where
	// the recording put it.
	Pool caching.PoolID
	// Deferred marks a free whose block other streams still used
	// (record_stream, DistributedDataParallel's buckets): it stays
	// pending until the stream's OpFreeDone of the same ID.
	Deferred bool
}

// OOM is a request the allocator refused.
type OOM struct {
	Index   int                       `json:"index"` // position of the request in the stream (data row for RMM logs)
	Size    uint64                    `json:"size"`
	Message string                    `json:"message"`
	Err     *caching.OutOfMemoryError `json:"-"`
}

// Result is what a replay ends with.
type Result struct {
	OOMs []OOM
	// UnmatchedFrees counts frees of allocations the stream never made (a
	// log that starts mid-run) or that failed with OOM.
	UnmatchedFrees int
	// PeakReserved and PeakAllocated are the most the allocator held from
	// the first request on (rebuilding the starting layout not counted).
	PeakReserved  uint64
	PeakAllocated uint64
}

// Replay runs reqs through a. An allocation that fails with OOM is recorded
// and skipped, and a later free of it is ignored; any other error stops the
// replay. setTime, when not nil, is told each request's time first.
func Replay(a *caching.Allocator, reqs []Request, setTime func(int64)) (Result, error) {
	r := NewReplayer(a)
	r.SetTime = setTime
	return r.Run(reqs)
}

// Replayer replays requests one at a time, so callers can look at the
// allocator between them.
type Replayer struct {
	a       *caching.Allocator
	live    liveSet
	res     Result
	SetTime func(int64)
}

// NewReplayer returns a replayer driving a.
func NewReplayer(a *caching.Allocator) *Replayer {
	p := &Replayer{a: a}
	p.measure()
	return p
}

// measure takes the allocator's figures into the peaks. Within a call
// reserved memory only grows, after it shrinks (a release before a
// retry), so measuring between calls finds the peaks.
func (p *Replayer) measure() {
	p.res.PeakReserved = max(p.res.PeakReserved, p.a.Reserved())
	p.res.PeakAllocated = max(p.res.PeakAllocated, p.a.Allocated())
}

// Run runs reqs, a whole stream, one after the other.
func (p *Replayer) Run(reqs []Request) (Result, error) {
	for i := range reqs {
		if err := p.Step(i, reqs[i]); err != nil {
			return p.Result(), err
		}
	}
	return p.Result(), nil
}

// Step runs request r, the i-th of its stream.
func (p *Replayer) Step(i int, r Request) error {
	if p.SetTime != nil {
		p.SetTime(r.TimeUS)
	}
	defer p.measure()
	a := p.a
	switch r.Op {
	case OpMalloc:
		ptr, err := a.MallocIn(r.Pool, r.Size, r.Stream, r.Stack)
		if err != nil {
			var oom *caching.OutOfMemoryError
			if errors.As(err, &oom) {
				p.res.OOMs = append(p.res.OOMs, OOM{Index: i, Size: r.Size, Message: oom.Message, Err: oom})
				return nil
			}
			return fmt.Errorf("request %d: malloc(%d): %w", i, r.Size, err)
		}
		p.live.put(r.ID, ptr)
	case OpFree:
		ptr, ok := p.live.take(r.ID)
		if !ok {
			p.res.UnmatchedFrees++
			return nil
		}
		if h, ok := a.Device().(holder); ok && r.Deferred {
			// Another stream holds the block until OpFreeDone: one
			// stream of the simulated device's own per deferred free.
			s := deferStream(r.ID)
			h.Hold(s)
			if err := a.RecordStream(ptr, s); err != nil {
				return fmt.Errorf("request %d: %w", i, err)
			}
		}
		if err := a.FreeFrom(ptr, r.Stack); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
	case OpFreeDone:
		if h, ok := a.Device().(holder); ok {
			h.Release(deferStream(r.ID))
			// Where the recording completed it: before a malloc, inside
			// an empty_cache(), wherever.
			if err := a.ProcessEventsFrom(r.Stack); err != nil {
				return fmt.Errorf("request %d: %w", i, err)
			}
		}
	case OpRecordStream:
		if ptr, ok := p.live.get(r.ID); ok {
			if err := a.RecordStream(ptr, r.Stream); err != nil {
				return fmt.Errorf("request %d: %w", i, err)
			}
		}
	case OpEmptyCache:
		if err := a.EmptyCacheFrom(r.Stack); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
	}
	return nil
}

// holder is a device whose streams' work can be held back: the
// simulated device.
type holder interface {
	Hold(stream int64)
	Release(stream int64)
}

// deferStream is the stream that holds the block of the deferred free of
// allocation id: below any stream id CUDA gives.
func deferStream(id int64) int64 { return math.MinInt64/2 + id }

// OOMs are the requests refused so far.
func (p *Replayer) OOMs() []OOM { return p.res.OOMs }

// Result flushes the allocator's events and returns what the replay found.
func (p *Replayer) Result() Result {
	p.a.Flush()
	return p.res
}

// liveSet maps allocation ids to pointers. Ids are small and dense in
// every stream this package makes, so a slice serves them; others go to a
// map.
type liveSet struct {
	dense  []uint64 // index id: ptr+1, 0 where absent (so new room needs no filling)
	sparse map[int64]uint64
}

func (l *liveSet) put(id int64, ptr uint64) {
	if id >= 0 && id < int64(2*len(l.dense)+1024) && ptr != ^uint64(0) {
		if id >= int64(len(l.dense)) {
			l.reserve(int(id) + 1)
		}
		l.dense[id] = ptr + 1
		return
	}
	if l.sparse == nil {
		l.sparse = map[int64]uint64{}
	}
	l.sparse[id] = ptr
}

// reserve makes room for ids below n, at least doubling it: a stream's
// requests make room for their ids at once, as pages of zeros that cost
// only once a replay gets that far.
func (l *liveSet) reserve(n int) {
	if n <= len(l.dense) {
		return
	}
	dense := make([]uint64, max(n, 2*len(l.dense)))
	copy(dense, l.dense)
	l.dense = dense
}

func (l *liveSet) get(id int64) (uint64, bool) {
	if id >= 0 && id < int64(len(l.dense)) && l.dense[id] != 0 {
		return l.dense[id] - 1, true
	}
	ptr, ok := l.sparse[id]
	return ptr, ok
}

func (l *liveSet) take(id int64) (uint64, bool) {
	if id >= 0 && id < int64(len(l.dense)) && l.dense[id] != 0 {
		ptr := l.dense[id] - 1
		l.dense[id] = 0
		return ptr, true
	}
	ptr, ok := l.sparse[id]
	if ok {
		delete(l.sparse, id)
	}
	return ptr, ok
}

// liveBlocks calls fn for each live block of l (allocated or pending
// free), in address order, with the id the stream's requests know it by:
// 1, 2, ... FromEvents and Replayer.restore agree through it.
func liveBlocks(l *gpu.Layout, fn func(id int64, seg, block int)) {
	if l == nil {
		return
	}
	var id int64
	for i := range l.Segments {
		for j, b := range l.Segments[i].Blocks {
			if b.State != gpu.BlockFree {
				id++
				fn(id, i, j)
			}
		}
	}
}

// FromEvents turns a recorded event stream (a stored trace or a PyTorch
// snapshot's trace) back into the requests that made it: alloc becomes
// malloc, free_requested becomes free, an oom becomes the malloc that
// failed (with its rounded size, all the event keeps), and segments
// released outside any malloc become empty_cache() calls (see
// inferRuns). The live blocks of initial, the layout before the first
// event, keep ids 1..n in address order: a Replayer started on initial
// knows them by those ids. Its pending-free blocks are freed where their
// free_completed comes. A free has the frames of the recorded free call
// (free_requested's, or a pending block's free_completed's); its
// free_completed, which follows at once, has the same, as PyTorch's do.
func FromEvents(initial *gpu.Layout, events []gpu.Event) []Request {
	return fromEvents(initial, events, inferRuns(initial, events, runContext{rules: gpu.DefaultRules()}).emptyCache, nil)
}

// fromEvents is FromEvents with the empty_cache() calls inferred and the
// private pools of the allocations (see allocPools).
func fromEvents(initial *gpu.Layout, events []gpu.Event, emptyCache map[int]bool, pools map[int]caching.PoolID) []Request {
	n := len(emptyCache) // the requests, counted first: a slice of millions grown as they come is copied over and over
	for i := range events {
		switch events[i].Action {
		case gpu.ActionAlloc, gpu.ActionFreeRequested, gpu.ActionOOM:
			n++
		}
	}
	ids := make(map[uint64]int64)
	served := make(map[int]int64) // alloc events that serve the request of an oom before them, to its id
	pending := make(map[uint64]int64)
	waiting := make(map[uint64]int64) // deferred frees, by address, until their free_completed
	var next int64
	liveBlocks(initial, func(id int64, seg, block int) {
		b := &initial.Segments[seg].Blocks[block]
		if b.State == gpu.BlockPendingFree {
			pending[b.Addr] = id
		} else {
			ids[b.Addr] = id
		}
		next = id
	})
	reqs := make([]Request, 0, n+len(pending))
	for i, e := range events {
		if emptyCache[i] {
			reqs = append(reqs, Request{Op: OpEmptyCache, Stream: e.Stream, Stack: e.Stack, TimeUS: e.TimeUS})
		}
		switch e.Action {
		case gpu.ActionAlloc:
			if id, ok := served[i]; ok {
				ids[e.Addr] = id
				continue
			}
			next++
			ids[e.Addr] = next
			reqs = append(reqs, Request{Op: OpMalloc, ID: next, Size: e.Size, Stream: e.Stream, Stack: e.Stack, TimeUS: e.TimeUS, Pool: pools[i]})
		case gpu.ActionFreeRequested:
			id, ok := ids[e.Addr]
			if !ok {
				id = -1 // allocated before the trace and unknown to the initial layout
			}
			delete(ids, e.Addr)
			// A free whose free_completed does not follow at once, or
			// follows from another call (other frames), waited for other
			// streams.
			deferred := id >= 0 && (i+1 >= len(events) || events[i+1].Action != gpu.ActionFreeCompleted || events[i+1].Addr != e.Addr ||
				events[i+1].Stack != e.Stack)
			if deferred {
				waiting[e.Addr] = id
			}
			reqs = append(reqs, Request{Op: OpFree, ID: id, Stream: e.Stream, Stack: e.Stack, TimeUS: e.TimeUS, Deferred: deferred})
		case gpu.ActionFreeCompleted:
			if id, ok := pending[e.Addr]; ok {
				delete(pending, e.Addr)
				reqs = append(reqs, Request{Op: OpFree, ID: id, Stream: e.Stream, Stack: e.Stack, TimeUS: e.TimeUS})
			} else if id, ok := waiting[e.Addr]; ok {
				delete(waiting, e.Addr)
				reqs = append(reqs, Request{Op: OpFreeDone, ID: id, Stream: e.Stream, Stack: e.Stack, TimeUS: e.TimeUS})
			}
		case gpu.ActionOOM:
			// The request that failed: replayed, it may succeed under other settings.
			next++
			size := e.Size
			if j := servedAfter(events, i); j >= 0 {
				// then served (see servedAfter): its free frees it
				served[j], size = next, events[j].Size
			}
			reqs = append(reqs, Request{Op: OpMalloc, ID: next, Size: size, Stream: e.Stream, Stack: e.Stack, TimeUS: e.TimeUS, OOM: true})
		}
	}
	return reqs
}

// servedAfter returns the index of the alloc event that serves the
// request of the oom at events[i] (an estimate's requests, run through
// the allocator, go on after the first oom as on a larger device: see
// package pytorch), or -1: the first event after it other than the
// segments taken for it, when it is an alloc on the same stream with the
// same frames and a size the oom's rounded size covers.
func servedAfter(events []gpu.Event, i int) int {
	oom := &events[i]
	for j := i + 1; j < len(events); j++ {
		switch e := &events[j]; e.Action {
		case gpu.ActionSegmentAlloc, gpu.ActionSegmentMap:
			continue
		case gpu.ActionAlloc:
			if e.Stream == oom.Stream && e.Stack == oom.Stack && e.Size <= oom.Size {
				return j
			}
		}
		return -1
	}
	return -1
}

// allocPools reads which private pool served each alloc of a recording
// whose final segments are in pools (by address): the pool of the
// segment holding its address, when that segment lasts to the end (a
// private pool's segments are released only with the pool). Others are
// the default pools'. nil when the recording has no private pool.
func allocPools(initial *gpu.Layout, events []gpu.Event, pools map[uint64][2]int64) map[int]caching.PoolID {
	if len(pools) == 0 {
		return nil
	}
	type seg struct {
		addr, end uint64
		pool      caching.PoolID
	}
	var live []seg // by address
	add := func(addr, size uint64, lasts bool) {
		s := seg{addr: addr, end: addr + size}
		if lasts {
			s.pool = pools[addr]
		}
		k := sort.Search(len(live), func(i int) bool { return live[i].addr >= addr })
		live = slices.Insert(live, k, s)
	}
	// lasts[i]: the segment event i allocates is not released later.
	freedAfter := map[uint64]bool{}
	lasts := make(map[int]bool)
	for i := len(events) - 1; i >= 0; i-- {
		switch e := &events[i]; e.Action {
		case gpu.ActionSegmentFree:
			freedAfter[e.Addr] = true
		case gpu.ActionSegmentAlloc:
			lasts[i] = !freedAfter[e.Addr]
			delete(freedAfter, e.Addr)
		}
	}
	if initial != nil {
		for _, s := range initial.Segments {
			add(s.Addr, s.Size, !freedAfter[s.Addr])
		}
	}
	out := map[int]caching.PoolID{}
	for i := range events {
		switch e := &events[i]; e.Action {
		case gpu.ActionSegmentAlloc:
			add(e.Addr, e.Size, lasts[i])
		case gpu.ActionSegmentFree:
			k := sort.Search(len(live), func(i int) bool { return live[i].addr >= e.Addr })
			if k < len(live) && live[k].addr == e.Addr {
				live = slices.Delete(live, k, k+1)
			}
		case gpu.ActionAlloc:
			k := sort.Search(len(live), func(i int) bool { return live[i].end > e.Addr })
			if k < len(live) && live[k].addr <= e.Addr && live[k].pool != (caching.PoolID{}) {
				out[i] = live[k].pool
			}
		}
	}
	return out
}
