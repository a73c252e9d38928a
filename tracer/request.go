// Package tracer drives a caching allocator with workloads (training,
// KV-cache serving, fragmentation stress) and with recorded request streams
// (RMM logs, stored traces, PyTorch snapshots); every allocator event goes to
// a sink such as the SQLite store.
package tracer

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
	var res Result
	live := make(map[int64]uint64, 1024)
	for i, r := range reqs {
		if setTime != nil {
			setTime(r.TimeUS)
		}
		switch r.Op {
		case OpMalloc:
			p, err := a.Malloc(r.Size, r.Stream, r.Stack)
			if err != nil {
				var oom *caching.OutOfMemoryError
				if errors.As(err, &oom) {
					res.OOMs = append(res.OOMs, OOM{Index: i, Size: r.Size, Message: oom.Message, Err: oom})
					continue
				}
				return res, fmt.Errorf("request %d: malloc(%d): %w", i, r.Size, err)
			}
			live[r.ID] = p
		case OpFree:
			p, ok := live[r.ID]
			if !ok {
				res.UnmatchedFrees++
				continue
			}
			delete(live, r.ID)
			if err := a.Free(p); err != nil {
				return res, fmt.Errorf("request %d: %w", i, err)
			}
		case OpRecordStream:
			if p, ok := live[r.ID]; ok {
				if err := a.RecordStream(p, r.Stream); err != nil {
					return res, fmt.Errorf("request %d: %w", i, err)
				}
			}
		case OpEmptyCache:
			if err := a.EmptyCache(); err != nil {
				return res, fmt.Errorf("request %d: %w", i, err)
			}
		}
	}
	a.Flush()
	st := a.Stats()
	res.PeakReserved = uint64(st.ReservedBytes[0].Peak)
	res.PeakAllocated = uint64(st.AllocatedBytes[0].Peak)
	return res, nil
}

// FromEvents turns a recorded event stream (a stored trace or a PyTorch
// snapshot's trace) back into the requests that made it: alloc becomes
// malloc, free_requested becomes free. Allocations live before the first
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
		}
	}
	return reqs
}
