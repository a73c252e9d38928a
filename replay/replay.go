// Package replay runs recorded allocator traffic again: any recording (an
// RMM log, a PyTorch snapshot's trace, a stored trace) becomes a stream of
// requests, which a Replayer drives through a caching allocator, under the
// original settings or others. replay, whatif and incident pages use it.
package replay

import (
	"errors"
	"fmt"

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
)

// Request is one call into the allocator. ID names an allocation across
// its malloc and free (pointers are remapped: the replayed allocator hands
// out its own addresses).
type Request struct {
	Op     Op
	ID     int64
	Size   uint64
	Stream int64
	Stack  gpu.StackID
	TimeUS int64
	// OOM marks a malloc that failed when the stream was recorded.
	OOM bool
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
	PeakReserved   uint64
	PeakAllocated  uint64
}

// Replay runs reqs through a. An allocation that fails with OOM is recorded
// and skipped, and a later free of it is ignored; any other error stops the
// replay. setTime, when not nil, is told each request's time first.
func Replay(a *caching.Allocator, reqs []Request, setTime func(int64)) (Result, error) {
	r := NewReplayer(a)
	r.SetTime = setTime
	for i := range reqs {
		if err := r.Step(i, reqs[i]); err != nil {
			return r.Result(), err
		}
	}
	return r.Result(), nil
}

// Replayer replays requests one at a time, so callers can look at the
// allocator between them.
type Replayer struct {
	a       *caching.Allocator
	live    map[int64]uint64
	res     Result
	SetTime func(int64)
}

// NewReplayer returns a replayer driving a.
func NewReplayer(a *caching.Allocator) *Replayer {
	return &Replayer{a: a, live: make(map[int64]uint64, 1024)}
}

// Step runs request r, the i-th of its stream.
func (p *Replayer) Step(i int, r Request) error {
	if p.SetTime != nil {
		p.SetTime(r.TimeUS)
	}
	a := p.a
	switch r.Op {
	case OpMalloc:
		ptr, err := a.Malloc(r.Size, r.Stream, r.Stack)
		if err != nil {
			var oom *caching.OutOfMemoryError
			if errors.As(err, &oom) {
				p.res.OOMs = append(p.res.OOMs, OOM{Index: i, Size: r.Size, Message: oom.Message, Err: oom})
				return nil
			}
			return fmt.Errorf("request %d: malloc(%d): %w", i, r.Size, err)
		}
		p.live[r.ID] = ptr
	case OpFree:
		ptr, ok := p.live[r.ID]
		if !ok {
			p.res.UnmatchedFrees++
			return nil
		}
		delete(p.live, r.ID)
		if err := a.Free(ptr); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
	case OpRecordStream:
		if ptr, ok := p.live[r.ID]; ok {
			if err := a.RecordStream(ptr, r.Stream); err != nil {
				return fmt.Errorf("request %d: %w", i, err)
			}
		}
	case OpEmptyCache:
		if err := a.EmptyCache(); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
	}
	return nil
}

// Result flushes the allocator's events and returns what the replay found.
func (p *Replayer) Result() Result {
	p.a.Flush()
	st := p.a.Stats()
	p.res.PeakReserved = uint64(st.ReservedBytes[0].Peak)
	p.res.PeakAllocated = uint64(st.AllocatedBytes[0].Peak)
	return p.res
}

// FromEvents turns a recorded event stream (a stored trace or a PyTorch
// snapshot's trace) back into the requests that made it: alloc becomes
// malloc, free_requested becomes free, and an oom becomes the malloc that
// failed (with its rounded size, all the event keeps). Allocations live before the first
// event are given as initial: they are allocated first, at time 0.
func FromEvents(initial *gpu.Layout, events []gpu.Event) []Request {
	var reqs []Request
	ids := make(map[uint64]int64)
	var next int64
	if initial != nil {
		for _, s := range initial.Segments {
			for _, b := range s.Blocks {
				if b.State == gpu.BlockFree {
					continue
				}
				next++
				ids[b.Addr] = next
				reqs = append(reqs, Request{Op: OpMalloc, ID: next, Size: b.Requested, Stream: s.Stream, Stack: b.Stack})
				if b.State == gpu.BlockPendingFree {
					reqs = append(reqs, Request{Op: OpFree, ID: next, Stream: s.Stream})
				}
			}
		}
	}
	for _, e := range events {
		switch e.Action {
		case gpu.ActionAlloc:
			next++
			ids[e.Addr] = next
			reqs = append(reqs, Request{Op: OpMalloc, ID: next, Size: e.Size, Stream: e.Stream, Stack: e.Stack, TimeUS: e.TimeUS})
		case gpu.ActionFreeRequested:
			id, ok := ids[e.Addr]
			if !ok {
				id = -1 // allocated before the trace and unknown to the initial layout
			}
			delete(ids, e.Addr)
			reqs = append(reqs, Request{Op: OpFree, ID: id, Stream: e.Stream, TimeUS: e.TimeUS})
		case gpu.ActionOOM:
			// The request that failed: replayed, it may succeed under other settings.
			next++
			reqs = append(reqs, Request{Op: OpMalloc, ID: next, Size: e.Size, Stream: e.Stream, Stack: e.Stack, TimeUS: e.TimeUS, OOM: true})
		}
	}
	return reqs
}
