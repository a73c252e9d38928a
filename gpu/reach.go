package gpu

import "fmt"

// Same reports whether l and o hold the same segments and blocks: extents,
// streams, block states and requested sizes (not stacks or sequence
// numbers, which say where a block came from, not what it is).
func (l *Layout) Same(o *Layout) bool {
	if len(l.Segments) != len(o.Segments) {
		return false
	}
	for i := range l.Segments {
		a, b := &l.Segments[i], &o.Segments[i]
		if !sameExtent(a, b) || len(a.Blocks) != len(b.Blocks) {
			return false
		}
		for j := range a.Blocks {
			if !sameBlock(&a.Blocks[j], &b.Blocks[j]) {
				return false
			}
		}
	}
	return true
}

func sameExtent(a, b *Segment) bool {
	return a.Addr == b.Addr && a.Size == b.Size && a.Stream == b.Stream && a.Expandable == b.Expandable
}

func sameBlock(a, b *Block) bool {
	return a.Addr == b.Addr && a.Size == b.Size && a.State == b.State && (a.State == BlockFree || a.Requested == b.Requested)
}

// EventsTo returns events that take l to layout to: the live blocks and
// segments to doesn't have are freed and released, then to's segments and
// blocks that l lacks are made. They stand in for events that were lost
// (a live job's ring overwritten between two reads); a block made here
// keeps to's stack id. Times and sequence numbers are the caller's to set.
func (l *Layout) EventsTo(to *Layout) ([]Event, error) {
	cur := l.Clone()
	var out []Event
	emit := func(e Event) error {
		if err := cur.Apply(e); err != nil {
			return err
		}
		out = append(out, e)
		return nil
	}
	target := make(map[uint64]*Segment, len(to.Segments))
	for i := range to.Segments {
		target[to.Segments[i].Addr] = &to.Segments[i]
	}
	// Away with what to does not hold, from a copy: cur changes meanwhile.
	for _, s := range l.Clone().Segments {
		t := target[s.Addr]
		keep := t != nil && sameExtent(&s, t)
		for _, b := range s.Blocks {
			if b.State == BlockFree || keep && segmentHas(t, &b) {
				continue
			}
			if err := emit(Event{Action: ActionFreeCompleted, Addr: b.Addr, Size: b.Requested, Stream: s.Stream, BlockSize: b.Size}); err != nil {
				return nil, err
			}
		}
		if keep {
			continue
		}
		a := ActionSegmentFree
		if s.Expandable {
			a = ActionSegmentUnmap
		}
		if err := emit(Event{Action: a, Addr: s.Addr, Size: s.Size, Stream: s.Stream, Pool: s.Pool}); err != nil {
			return nil, err
		}
	}
	// Then what it holds that cur lacks.
	for _, t := range to.Segments {
		if c := cur.SegmentAt(t.Addr); c == nil || !sameExtent(c, &t) {
			a := ActionSegmentAlloc
			if t.Expandable {
				a = ActionSegmentMap
			}
			if err := emit(Event{Action: a, Addr: t.Addr, Size: t.Size, Stream: t.Stream, Pool: t.Pool}); err != nil {
				return nil, err
			}
		}
		// A block that starts inside a free block is reached by filling
		// the free space before it, freed again once the blocks are made.
		var fillers []Event
		for _, b := range t.Blocks {
			if b.State == BlockFree {
				continue
			}
			c := cur.BlockAt(b.Addr)
			if c != nil && sameBlock(c, &b) {
				continue
			}
			if c != nil && c.State == BlockFree && c.Addr < b.Addr {
				f := Event{Action: ActionAlloc, Addr: c.Addr, Size: b.Addr - c.Addr, BlockSize: b.Addr - c.Addr, Stream: t.Stream}
				if err := emit(f); err != nil {
					return nil, err
				}
				fillers = append(fillers, f)
			}
			if err := emit(Event{Action: ActionAlloc, Addr: b.Addr, Size: b.Requested, BlockSize: b.Size, Stream: t.Stream, Stack: b.Stack}); err != nil {
				return nil, err
			}
			if b.State == BlockPendingFree {
				if err := emit(Event{Action: ActionFreeRequested, Addr: b.Addr, Size: b.Requested, Stream: t.Stream, BlockSize: b.Size}); err != nil {
					return nil, err
				}
			}
		}
		for _, f := range fillers {
			f.Action = ActionFreeCompleted
			if err := emit(f); err != nil {
				return nil, err
			}
		}
	}
	if !cur.Same(to) {
		return nil, fmt.Errorf("the events found do not reach the layout asked for")
	}
	return out, nil
}

func segmentHas(s *Segment, b *Block) bool {
	if j := blockAt(s, b.Addr); j >= 0 {
		return sameBlock(&s.Blocks[j], b)
	}
	return false
}
