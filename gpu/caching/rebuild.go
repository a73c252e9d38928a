package caching

import "vramscope/gpu"

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

// Apply counts one event and moves the layout past it.
func (c *StatCounter) Apply(e gpu.Event) {
	st := &c.st
	seg := c.l.SegmentAt(e.Addr)
	pool := statLarge
	if seg != nil {
		pool = poolIndex(seg)
	} else if e.Pool == gpu.PoolSmall {
		pool = statSmall
	}
	n0, b0 := inactiveSplit(seg)
	// A free_completed with no free_requested before it ends the allocation too.
	unrequested := false
	if b := c.l.BlockAt(e.Addr); e.Action == gpu.ActionFreeCompleted && b != nil && b.Addr == e.Addr && b.State == gpu.BlockAllocated {
		unrequested = true
	}
	if err := c.l.Apply(e); err != nil {
		return // a stored trace replays; a mismatch leaves the counts as they are
	}
	seg = c.l.SegmentAt(e.Addr)
	if seg != nil {
		pool = poolIndex(seg)
	}
	n1, b1 := inactiveSplit(seg)
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
}

// Stats returns the statistics counted so far.
func (c *StatCounter) Stats() *Stats { return &c.st }
