package gpu

import "fmt"

// Action is what an allocator did; the names are PyTorch's trace actions.
type Action uint8

const (
	ActionNone Action = iota
	ActionAlloc
	ActionFreeRequested
	ActionFreeCompleted
	ActionSegmentAlloc
	ActionSegmentFree
	ActionSegmentMap
	ActionSegmentUnmap
	ActionSnapshot
	ActionOOM
	numActions
)

var actionNames = [numActions]string{
	"", "alloc", "free_requested", "free_completed", "segment_alloc",
	"segment_free", "segment_map", "segment_unmap", "snapshot", "oom",
}

func (a Action) String() string {
	if a < numActions {
		return actionNames[a]
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// ParseAction maps a PyTorch action name to its Action.
func ParseAction(s string) (Action, bool) {
	for i, n := range actionNames {
		if i > 0 && n == s {
			return Action(i), true
		}
	}
	return ActionNone, false
}

// Pool says which of the allocator's two default pools a segment belongs to.
type Pool uint8

const (
	PoolUnknown Pool = iota
	PoolSmall        // requests of at most 1 MiB, 2 MiB segments
	PoolLarge
)

func (p Pool) String() string {
	switch p {
	case PoolSmall:
		return "small"
	case PoolLarge:
		return "large"
	}
	return "unknown"
}

// StackID names an interned stack; 0 means no stack was recorded.
type StackID uint32

// Event is one allocator action. Size is the requested size for alloc and
// free_*, the segment or mapped bytes for segment_*, the rounded request for
// oom, and the bytes allocated for snapshot. For oom, DeviceFree holds the
// free bytes the driver reported and Addr is zero. BlockSize is the size of
// the block an alloc or free_* event concerns, when the source knows it (our
// allocator does; PyTorch's traces do not, and Layout re-derives it).
type Event struct {
	Seq        int64
	TimeUS     int64
	Action     Action
	Pool       Pool // for segment_* events; PoolUnknown when the source does not say
	Stream     int64
	Addr       uint64
	Size       uint64
	DeviceFree uint64
	BlockSize  uint64
	Stack      StackID
}

func (e Event) String() string {
	if e.Action == ActionOOM {
		return fmt.Sprintf("#%d %s size=%d device_free=%d stream=%d", e.Seq, e.Action, e.Size, e.DeviceFree, e.Stream)
	}
	return fmt.Sprintf("#%d %s addr=%#x size=%d stream=%d", e.Seq, e.Action, e.Addr, e.Size, e.Stream)
}

// Sink receives events in batches. The batch slice is reused by the caller
// after Emit returns, so a sink that keeps events must copy them.
type Sink interface {
	Emit(batch []Event)
}

// SinkFunc adapts a function to Sink.
type SinkFunc func([]Event)

func (f SinkFunc) Emit(b []Event) { f(b) }

// Frame is one stack frame, innermost first in a Stack. Line is unsigned
// because PyTorch writes 2^64-1 for an unknown C++ line. Extra is how a
// snapshot wrote the frame beyond these fields, as JSON: its key order
// when not name, filename, line, and other keys (the FX fields of newer
// PyTorch). It is empty for most frames.
type Frame struct {
	Name     string `json:"name"`
	Filename string `json:"filename"`
	Line     uint64 `json:"line"`
	Extra    string `json:"extra,omitempty"`
}

// Stack is a call stack, innermost frame first (PyTorch's order).
type Stack []Frame
