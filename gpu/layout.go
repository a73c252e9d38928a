package gpu

import (
	"fmt"
	"sort"
)

// BlockState is a block's state, spelled in snapshots as PyTorch does.
type BlockState uint8

const (
	BlockFree        BlockState = iota // cached free space ("inactive")
	BlockAllocated                     // a live allocation ("active_allocated")
	BlockPendingFree                   // freed, waiting for other streams ("active_pending_free")
)

func (s BlockState) String() string {
	switch s {
	case BlockAllocated:
		return "active_allocated"
	case BlockPendingFree:
		return "active_pending_free"
	}
	return "inactive"
}

// ParseBlockState reads a snapshot state; "active_awaiting_free" is the
// spelling of PyTorch's docstring.
func ParseBlockState(s string) (BlockState, bool) {
	switch s {
	case "active_allocated":
		return BlockAllocated, true
	case "active_pending_free", "active_awaiting_free":
		return BlockPendingFree, true
	case "inactive":
		return BlockFree, true
	}
	return BlockFree, false
}

// Block is a piece of a segment. Requested is the caller's byte count (zero
// for free blocks); Seq is the sequence number of the event that allocated
// it, or -1 when that happened before the trace began.
type Block struct {
	Addr      uint64     `json:"address"`
	Size      uint64     `json:"size"`
	Requested uint64     `json:"requested_size"`
	State     BlockState `json:"-"`
	Stack     StackID    `json:"stack,omitempty"`
	Seq       int64      `json:"seq"`
}

// End is the first address after the block.
func (b *Block) End() uint64 { return b.Addr + b.Size }

// Segment is one cudaMalloc result, or one contiguous mapped range of an
// expandable segment. Its blocks tile it exactly, in address order.
type Segment struct {
	Addr       uint64  `json:"address"`
	Size       uint64  `json:"total_size"`
	Stream     int64   `json:"stream"`
	Pool       Pool    `json:"-"`
	Expandable bool    `json:"is_expandable"`
	Blocks     []Block `json:"blocks"`
}

// End is the first address after the segment.
func (s *Segment) End() uint64 { return s.Addr + s.Size }

// Layout is the allocator's segments and blocks at one instant. Apply moves
// it forward by one event, Undo backward; both re-derive block sizes from
// Rules, because events carry only requested sizes.
type Layout struct {
	Rules    Rules
	Segments []Segment // sorted by address
}

// NewLayout returns an empty layout under rules.
func NewLayout(rules Rules) *Layout { return &Layout{Rules: rules} }

// Clone returns a deep copy.
func (l *Layout) Clone() *Layout {
	c := &Layout{Rules: l.Rules, Segments: make([]Segment, len(l.Segments))}
	for i, s := range l.Segments {
		s.Blocks = append([]Block(nil), s.Blocks...)
		c.Segments[i] = s
	}
	return c
}

// MismatchError says that an event does not fit the layout it is applied to.
type MismatchError struct {
	Event  Event
	Reason string
}

func (e *MismatchError) Error() string {
	if e.Event.Action == ActionNone { // about a layout, not an event
		return e.Reason
	}
	return fmt.Sprintf("event %d (%s at %#x, %d bytes): %s", e.Event.Seq, e.Event.Action, e.Event.Addr, e.Event.Size, e.Reason)
}

func mismatch(e Event, format string, args ...any) error {
	return &MismatchError{Event: e, Reason: fmt.Sprintf(format, args...)}
}

// segmentAt returns the index of the segment containing addr, or -1.
func (l *Layout) segmentAt(addr uint64) int {
	i := sort.Search(len(l.Segments), func(i int) bool { return l.Segments[i].End() > addr })
	if i < len(l.Segments) && l.Segments[i].Addr <= addr {
		return i
	}
	return -1
}

// SegmentAt returns the segment containing addr, or nil.
func (l *Layout) SegmentAt(addr uint64) *Segment {
	if i := l.segmentAt(addr); i >= 0 {
		return &l.Segments[i]
	}
	return nil
}

// blockAt returns the index of the block of s containing addr.
func blockAt(s *Segment, addr uint64) int {
	i := sort.Search(len(s.Blocks), func(i int) bool { return s.Blocks[i].End() > addr })
	if i < len(s.Blocks) && s.Blocks[i].Addr <= addr {
		return i
	}
	return -1
}

// holding finds the segment and block that hold e.Addr, or says there is
// no segment there.
func (l *Layout) holding(e Event) (si, j int, err error) {
	si = l.segmentAt(e.Addr)
	if si < 0 {
		return 0, 0, mismatch(e, "no segment holds the address")
	}
	return si, blockAt(&l.Segments[si], e.Addr), nil
}

// BlockAt returns the block containing addr, or nil.
func (l *Layout) BlockAt(addr uint64) *Block {
	s := l.SegmentAt(addr)
	if s == nil {
		return nil
	}
	if j := blockAt(s, addr); j >= 0 {
		return &s.Blocks[j]
	}
	return nil
}

func (l *Layout) insertSegment(s Segment) error {
	i := sort.Search(len(l.Segments), func(i int) bool { return l.Segments[i].Addr >= s.Addr })
	if i > 0 && l.Segments[i-1].End() > s.Addr || i < len(l.Segments) && l.Segments[i].Addr < s.End() {
		return fmt.Errorf("segment [%#x, %#x) overlaps another", s.Addr, s.End())
	}
	l.Segments = append(l.Segments, Segment{})
	copy(l.Segments[i+1:], l.Segments[i:])
	l.Segments[i] = s
	return nil
}

func (l *Layout) removeSegment(i int) {
	l.Segments = append(l.Segments[:i], l.Segments[i+1:]...)
}

// GuessPool is the pool of a segment event: its own when it says, else
// the one its size suggests (PyTorch's traces do not say: small-pool
// segments and pages are 2 MiB, or a few of them).
func GuessPool(e Event) Pool {
	if e.Pool != PoolUnknown {
		return e.Pool
	}
	if e.Size%LargeBuffer != 0 && e.Size <= SmallBuffer*8 && e.Size%SmallBuffer == 0 && e.Size < MinLargeAlloc {
		return PoolSmall
	}
	return PoolLarge
}

func freeSegment(e Event, expandable bool) Segment {
	return Segment{Addr: e.Addr, Size: e.Size, Stream: e.Stream, Pool: GuessPool(e), Expandable: expandable,
		Blocks: []Block{{Addr: e.Addr, Size: e.Size, Seq: -1}}}
}

// Apply moves the layout forward by e.
func (l *Layout) Apply(e Event) error {
	switch e.Action {
	case ActionSegmentAlloc:
		if err := l.insertSegment(freeSegment(e, false)); err != nil {
			return mismatch(e, "%v", err)
		}
	case ActionSegmentFree:
		return l.dropWholeFreeSegment(e)
	case ActionSegmentMap:
		return l.addMapped(e)
	case ActionSegmentUnmap:
		return l.removeFreeRange(e)
	case ActionAlloc:
		return l.alloc(e)
	case ActionFreeRequested:
		b := l.BlockAt(e.Addr)
		if b == nil || b.Addr != e.Addr || b.State != BlockAllocated {
			return mismatch(e, "no allocated block starts there")
		}
		b.State = BlockPendingFree
	case ActionFreeCompleted:
		return l.release(e, func(b *Block) error {
			if b.State == BlockFree {
				return mismatch(e, "no live block starts there")
			}
			return nil
		})
	}
	return nil
}

// release frees the block starting at e.Addr, after check approves it, and
// merges it with free neighbours.
func (l *Layout) release(e Event, check func(*Block) error) error {
	si, j, err := l.holding(e)
	if err != nil {
		return err
	}
	s := &l.Segments[si]
	if j < 0 || s.Blocks[j].Addr != e.Addr {
		return mismatch(e, "no block starts there")
	}
	if err := check(&s.Blocks[j]); err != nil {
		return err
	}
	s.Blocks[j].State = BlockFree
	s.Blocks[j].Requested = 0
	s.mergeFree(j)
	return nil
}

// Undo moves the layout backward over e, which must be the event that led to it.
func (l *Layout) Undo(e Event) error {
	switch e.Action {
	case ActionSegmentAlloc:
		return l.dropWholeFreeSegment(e)
	case ActionSegmentFree:
		if err := l.insertSegment(freeSegment(e, false)); err != nil {
			return mismatch(e, "%v", err)
		}
	case ActionSegmentMap:
		return l.removeFreeRange(e)
	case ActionSegmentUnmap:
		return l.addMapped(e)
	case ActionAlloc:
		return l.release(e, func(b *Block) error {
			if b.State != BlockAllocated {
				return mismatch(e, "no allocated block starts there")
			}
			if b.Requested != e.Size {
				return mismatch(e, "the block there was requested with %d bytes", b.Requested)
			}
			return nil
		})
	case ActionFreeRequested:
		b := l.BlockAt(e.Addr)
		if b == nil || b.Addr != e.Addr || b.State != BlockPendingFree {
			return mismatch(e, "no pending-free block starts there")
		}
		b.State = BlockAllocated
	case ActionFreeCompleted:
		return l.carve(e, BlockPendingFree)
	}
	return nil
}

// dropWholeFreeSegment removes a segment that must be exactly [Addr, Addr+Size)
// and entirely free.
func (l *Layout) dropWholeFreeSegment(e Event) error {
	i := l.segmentAt(e.Addr)
	if i < 0 || l.Segments[i].Addr != e.Addr {
		return mismatch(e, "no segment starts there")
	}
	s := &l.Segments[i]
	if s.Size != e.Size {
		return mismatch(e, "the segment there has %d bytes", s.Size)
	}
	if len(s.Blocks) != 1 || s.Blocks[0].State != BlockFree {
		return mismatch(e, "the segment still holds live blocks")
	}
	l.removeSegment(i)
	return nil
}

// addMapped adds [Addr, Addr+Size) as free expandable memory, joining the
// segments that end or start there.
func (l *Layout) addMapped(e Event) error {
	end := e.Addr + e.Size
	if l.segmentAt(e.Addr) >= 0 || (e.Size > 0 && l.segmentAt(end-1) >= 0) {
		return mismatch(e, "the range is already mapped")
	}
	i := sort.Search(len(l.Segments), func(i int) bool { return l.Segments[i].Addr >= e.Addr })
	joinLeft := i > 0 && l.Segments[i-1].Expandable && l.Segments[i-1].End() == e.Addr && l.Segments[i-1].Stream == e.Stream
	joinRight := i < len(l.Segments) && l.Segments[i].Expandable && l.Segments[i].Addr == end && l.Segments[i].Stream == e.Stream
	fresh := Block{Addr: e.Addr, Size: e.Size, Seq: -1}
	switch {
	case joinLeft && joinRight:
		left, right := &l.Segments[i-1], &l.Segments[i]
		left.Blocks = append(left.Blocks, fresh)
		left.Blocks = append(left.Blocks, right.Blocks...)
		left.Size += e.Size + right.Size
		j := len(left.Blocks) - len(right.Blocks) - 1
		l.removeSegment(i)
		l.Segments[i-1].mergeFree(j)
	case joinLeft:
		left := &l.Segments[i-1]
		left.Blocks = append(left.Blocks, fresh)
		left.Size += e.Size
		left.mergeFree(len(left.Blocks) - 1)
	case joinRight:
		right := &l.Segments[i]
		right.Blocks = append([]Block{fresh}, right.Blocks...)
		right.Addr = e.Addr
		right.Size += e.Size
		right.mergeFree(0)
	default:
		s := freeSegment(e, true)
		if err := l.insertSegment(s); err != nil {
			return mismatch(e, "%v", err)
		}
	}
	return nil
}

// removeFreeRange unmaps [Addr, Addr+Size), which must lie inside one free
// block, splitting its segment in two when the range is in the middle.
func (l *Layout) removeFreeRange(e Event) error {
	i, j, err := l.holding(e)
	if err != nil {
		return err
	}
	s := &l.Segments[i]
	b := s.Blocks[j]
	end := e.Addr + e.Size
	if b.State != BlockFree || b.End() < end {
		return mismatch(e, "the range is not inside one free block")
	}
	var left, right []Block
	left = append(left, s.Blocks[:j]...)
	if b.Addr < e.Addr {
		left = append(left, Block{Addr: b.Addr, Size: e.Addr - b.Addr, Seq: -1})
	}
	if end < b.End() {
		right = append(right, Block{Addr: end, Size: b.End() - end, Seq: -1})
	}
	right = append(right, s.Blocks[j+1:]...)
	proto := *s
	l.removeSegment(i)
	for _, part := range [][]Block{left, right} {
		if len(part) == 0 {
			continue
		}
		seg := proto
		seg.Blocks = part
		seg.Addr = part[0].Addr
		seg.Size = part[len(part)-1].End() - seg.Addr
		_ = l.insertSegment(seg)
	}
	return nil
}

// alloc hands out the front of the free block starting at e.Addr, split as
// the allocator would split it.
func (l *Layout) alloc(e Event) error {
	si, j, err := l.holding(e)
	if err != nil {
		return err
	}
	s := &l.Segments[si]
	b := s.Blocks[j]
	if b.Addr != e.Addr || b.State != BlockFree {
		return mismatch(e, "no free block starts there")
	}
	size := e.BlockSize
	if size == 0 {
		size = l.Rules.RoundSize(e.Size)
		rules := l.Rules
		rules.Expandable = rules.Expandable || s.Expandable
		if size <= b.Size && !rules.ShouldSplit(s.Pool, b.Size, size) {
			size = b.Size
		}
	}
	if size > b.Size {
		return mismatch(e, "the free block there has only %d bytes", b.Size)
	}
	s.splitFront(j, size)
	s.Blocks[j] = Block{Addr: e.Addr, Size: size, Requested: e.Size, State: BlockAllocated, Stack: e.Stack, Seq: e.Seq}
	return nil
}

// carve undoes a free: the block that was freed at e.Addr becomes live again
// inside the free block that now holds it. Its size is what the allocator
// would have handed out; where the rest of the free block is too small to
// have been split off, the block took all of it.
func (l *Layout) carve(e Event, state BlockState) error {
	si, j, err := l.holding(e)
	if err != nil {
		return err
	}
	s := &l.Segments[si]
	b := s.Blocks[j]
	if b.State != BlockFree {
		return mismatch(e, "the address is in a live block")
	}
	size := e.BlockSize
	if size == 0 {
		size = l.Rules.RoundSize(e.Size)
		rules := l.Rules
		rules.Expandable = rules.Expandable || s.Expandable
		if rest := b.End() - e.Addr; size <= rest && !rules.ShouldSplit(s.Pool, rest, size) {
			size = rest
		}
	}
	if e.Addr+size > b.End() {
		return mismatch(e, "the free block there ends %d bytes too early", e.Addr+size-b.End())
	}
	if b.Addr < e.Addr {
		s.splitFront(j, e.Addr-b.Addr)
		j++
	}
	s.splitFront(j, size)
	s.Blocks[j] = Block{Addr: e.Addr, Size: size, Requested: e.Size, State: state, Stack: e.Stack, Seq: -1}
	return nil
}

// splitFront cuts block j after size bytes; the remainder stays free.
func (s *Segment) splitFront(j int, size uint64) {
	b := s.Blocks[j]
	if size >= b.Size {
		return
	}
	rest := Block{Addr: b.Addr + size, Size: b.Size - size, Seq: -1}
	s.Blocks = append(s.Blocks, Block{})
	copy(s.Blocks[j+2:], s.Blocks[j+1:])
	s.Blocks[j].Size = size
	s.Blocks[j+1] = rest
}

// mergeFree merges free block j with free neighbours.
func (s *Segment) mergeFree(j int) {
	if j+1 < len(s.Blocks) && s.Blocks[j+1].State == BlockFree {
		s.Blocks[j].Size += s.Blocks[j+1].Size
		s.Blocks = append(s.Blocks[:j+1], s.Blocks[j+2:]...)
	}
	if j > 0 && s.Blocks[j-1].State == BlockFree {
		s.Blocks[j-1].Size += s.Blocks[j].Size
		s.Blocks = append(s.Blocks[:j], s.Blocks[j+1:]...)
		j--
	}
	s.Blocks[j].Seq = -1
	s.Blocks[j].Stack = 0
}
