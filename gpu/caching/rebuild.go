package caching

import (
	"encoding/binary"
	"errors"
	"sort"

	"vramscope/gpu"
)

// StatCounter rebuilds the allocator's statistics (memory_stats(), and so
// memory_summary()) from its events, for a stored trace at any instant:
// start from the layout before the first event, then Apply each event. It
// follows the counting rules of the allocator itself (allocated and
// requested bytes drop at free_requested, active bytes at free_completed,
// reserved bytes at segment_free and segment_unmap). Blocks live before the
// trace began count as allocated once at its start.
type StatCounter struct {
	st    Stats
	l     *gpu.Layout
	rules gpu.Rules
}

func poolIndex(s *gpu.Segment) int {
	p := s.Pool
	if p == gpu.PoolUnknown && len(s.Blocks) > 0 {
		p = gpu.PoolFor(s.Size)
		if s.Size == gpu.SmallBuffer {
			p = gpu.PoolSmall
		}
	}
	if p == gpu.PoolSmall {
		return statSmall
	}
	return statLarge
}

// inactiveSplit is a segment's free blocks that are split off others. The
// allocator does not count those of expandable segments.
func inactiveSplit(s *gpu.Segment) (n, bytes int64) {
	if s == nil || s.Expandable || len(s.Blocks) < 2 {
		return 0, 0
	}
	for _, b := range s.Blocks {
		if b.State == gpu.BlockFree {
			n++
			bytes += int64(b.Size)
		}
	}
	return n, bytes
}

func hasBlockAddr(a gpu.Action) bool {
	return a == gpu.ActionAlloc || a == gpu.ActionFreeRequested || a == gpu.ActionFreeCompleted
}

// blockIndex is the index of the block of s holding addr, or -1.
func blockIndex(s *gpu.Segment, addr uint64) int {
	k := sort.Search(len(s.Blocks), func(i int) bool { return s.Blocks[i].End() > addr })
	if k == len(s.Blocks) || s.Blocks[k].Addr > addr {
		return -1
	}
	return k
}

// freeIn counts the free blocks of s inside [lo, hi).
func freeIn(s *gpu.Segment, lo, hi uint64) (n, bytes int64) {
	for k := blockIndex(s, lo); k >= 0 && k < len(s.Blocks) && s.Blocks[k].Addr < hi; k++ {
		if s.Blocks[k].State == gpu.BlockFree {
			n++
			bytes += int64(s.Blocks[k].Size)
		}
	}
	return n, bytes
}

// NewStatCounter starts from layout l (which it then owns and moves).
func NewStatCounter(l *gpu.Layout, rules gpu.Rules) *StatCounter {
	c := &StatCounter{l: l, rules: rules}
	c.st.MaxSplitSize = -1
	if rules.MaxSplitSize != gpu.Unlimited && rules.MaxSplitSize != 0 {
		c.st.MaxSplitSize = int64(rules.MaxSplitSize)
	}
	for i := range l.Segments {
		sg := &l.Segments[i]
		p := poolIndex(sg)
		if !sg.Expandable { // expandable segments are not counted as segments
			c.st.Segment.increase(p, 1)
		}
		c.st.ReservedBytes.increase(p, int64(sg.Size))
		n, b := inactiveSplit(sg)
		c.st.InactiveSplit.increase(p, n)
		c.st.InactiveSplitBytes.increase(p, b)
		for _, b := range sg.Blocks {
			if b.State == gpu.BlockFree {
				continue
			}
			c.st.Active.increase(p, 1)
			c.st.ActiveBytes.increase(p, int64(b.Size))
			if b.State == gpu.BlockAllocated {
				c.st.Allocation.increase(p, 1)
				c.st.AllocatedBytes.increase(p, int64(b.Size))
				c.st.RequestedBytes.increase(p, int64(b.Requested))
			}
		}
	}
	return c
}

func (c *StatCounter) oversize(size uint64) bool {
	return c.st.MaxSplitSize >= 0 && size >= uint64(c.st.MaxSplitSize)
}

// ResumeStatCounter continues counting from statistics st taken with
// layout l (which it then owns and moves): a checkpoint of both.
func ResumeStatCounter(l *gpu.Layout, rules gpu.Rules, st Stats) *StatCounter {
	return &StatCounter{st: st, l: l, rules: rules}
}

// Apply counts one event and moves the layout past it.
func (c *StatCounter) Apply(e gpu.Event) { c.Step(e, c.l.Apply) }

// Step counts one event; apply moves the counter's layout past it. A
// caller that moves that same layout itself (the store's writer, which
// shares its layout with the counter) passes its own apply and gets its
// error back. An event the layout refuses leaves the counts as they are.
func (c *StatCounter) Step(e gpu.Event, apply func(gpu.Event) error) error {
	st := &c.st
	seg := c.l.SegmentAt(e.Addr)
	pool := statLarge
	if seg != nil {
		pool = poolIndex(seg)
	} else if e.Pool == gpu.PoolSmall {
		pool = statSmall
	}
	// The inactive split blocks an event changes: an alloc or free only
	// splits or merges the block at its address with its neighbours, so
	// counting the free blocks of that address range before and after is
	// enough, where the segment keeps at least two blocks either way (four
	// before: a free can merge three blocks into one). Other events, and
	// small segments, are counted whole.
	lo, hi, local := uint64(0), uint64(0), false
	var n0, b0 int64
	if seg != nil && len(seg.Blocks) >= 4 && !seg.Expandable && hasBlockAddr(e.Action) {
		if k := blockIndex(seg, e.Addr); k >= 0 {
			lo, hi, local = seg.Blocks[max(k-1, 0)].Addr, seg.Blocks[min(k+1, len(seg.Blocks)-1)].End(), true
			n0, b0 = freeIn(seg, lo, hi)
		}
	}
	if !local {
		n0, b0 = inactiveSplit(seg)
	}
	// A free_completed with no free_requested before it ends the allocation too.
	unrequested := false
	if e.Action == gpu.ActionFreeCompleted {
		b := c.l.BlockAt(e.Addr)
		unrequested = b != nil && b.Addr == e.Addr && b.State == gpu.BlockAllocated
	}
	if err := apply(e); err != nil {
		return err
	}
	if !local { // an alloc or free leaves its segment where it was
		seg = c.l.SegmentAt(e.Addr)
	}
	if seg != nil {
		pool = poolIndex(seg)
	}
	var n1, b1 int64
	if local {
		n1, b1 = freeIn(seg, lo, hi)
	} else {
		n1, b1 = inactiveSplit(seg)
	}
	st.InactiveSplit.change(pool, n1-n0)
	st.InactiveSplitBytes.change(pool, b1-b0)
	switch e.Action {
	case gpu.ActionAlloc:
		size := int64(e.BlockSize)
		if b := c.l.BlockAt(e.Addr); b != nil {
			size = int64(b.Size)
		}
		st.Allocation.increase(pool, 1)
		st.AllocatedBytes.increase(pool, size)
		st.RequestedBytes.increase(pool, int64(e.Size))
		st.Active.increase(pool, 1)
		st.ActiveBytes.increase(pool, size)
		if c.oversize(uint64(size)) {
			st.OversizeAllocations.increase(1)
		}
	case gpu.ActionFreeRequested, gpu.ActionFreeCompleted:
		if e.Action == gpu.ActionFreeCompleted {
			st.Active.decrease(pool, 1)
			st.ActiveBytes.decrease(pool, int64(e.BlockSize))
			st.RequestedBytes.decrease(pool, int64(e.Size))
			if !unrequested {
				break
			}
		}
		st.Allocation.decrease(pool, 1)
		st.AllocatedBytes.decrease(pool, int64(e.BlockSize))
		if c.oversize(e.BlockSize) {
			st.OversizeAllocations.decrease(1)
		}
	case gpu.ActionSegmentAlloc, gpu.ActionSegmentMap:
		st.ReservedBytes.increase(pool, int64(e.Size))
		st.NumDeviceAlloc++
		if e.Action == gpu.ActionSegmentAlloc {
			st.Segment.increase(pool, 1)
			if c.oversize(e.Size) {
				st.OversizeSegments.increase(1)
			}
		}
	case gpu.ActionSegmentFree, gpu.ActionSegmentUnmap:
		st.ReservedBytes.decrease(pool, int64(e.Size))
		st.NumDeviceFree++
		if e.Action == gpu.ActionSegmentFree {
			st.Segment.decrease(pool, 1)
			if c.oversize(e.Size) {
				st.OversizeSegments.decrease(1)
			}
		}
	case gpu.ActionOOM:
		st.NumOOMs++
	}
	return nil
}

// Layout is the layout after the events counted so far.
func (c *StatCounter) Layout() *gpu.Layout { return c.l }

// Stats returns the statistics counted so far.
func (c *StatCounter) Stats() *Stats { return &c.st }

// AppendBinary encodes the statistics as varints, in field order, for the
// store's checkpoints.
func (s *Stats) AppendBinary(b []byte) ([]byte, error) {
	for _, v := range s.fields() {
		b = binary.AppendVarint(b, *v)
	}
	return b, nil
}

// UnmarshalBinary reads what AppendBinary wrote.
func (s *Stats) UnmarshalBinary(b []byte) error {
	for _, v := range s.fields() {
		x, n := binary.Varint(b)
		if n <= 0 {
			return errors.New("caching: corrupt statistics")
		}
		*v, b = x, b[n:]
	}
	if len(b) != 0 {
		return errors.New("caching: corrupt statistics: bytes left over")
	}
	return nil
}

// fields lists every counter of s.
func (s *Stats) fields() []*int64 {
	var out []*int64
	stat := func(st *Stat) { out = append(out, &st.Current, &st.Peak, &st.Allocated, &st.Freed) }
	for _, a := range []*StatArray{&s.Allocation, &s.Segment, &s.Active, &s.InactiveSplit, &s.AllocatedBytes,
		&s.ReservedBytes, &s.ActiveBytes, &s.InactiveSplitBytes, &s.RequestedBytes} {
		for i := range a {
			stat(&a[i])
		}
	}
	stat(&s.OversizeAllocations)
	stat(&s.OversizeSegments)
	return append(out, &s.NumAllocRetries, &s.NumOOMs, &s.NumSyncAllStreams, &s.NumDeviceAlloc, &s.NumDeviceFree, &s.MaxSplitSize)
}
