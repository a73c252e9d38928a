package gpu

// Figures sums a layout: what the segment map and the incident page show.
type Figures struct {
	Segments    int    `json:"segments"`
	Blocks      int    `json:"blocks"`
	Reserved    uint64 `json:"reserved_bytes"`
	Allocated   uint64 `json:"allocated_bytes"` // active_allocated blocks
	Active      uint64 `json:"active_bytes"`    // allocated + pending free
	Requested   uint64 `json:"requested_bytes"` // what callers asked for
	CachedFree  uint64 `json:"cached_free_bytes"`
	LargestFree uint64 `json:"largest_free_bytes"`
	// Fragmentation is 1 - largest free block / total free, 0 when nothing is free.
	Fragmentation float64 `json:"fragmentation"`
}

// Figures computes the layout's totals.
func (l *Layout) Figures() Figures {
	var f Figures
	f.Segments = len(l.Segments)
	for i := range l.Segments {
		s := &l.Segments[i]
		f.Reserved += s.Size
		f.Blocks += len(s.Blocks)
		for _, b := range s.Blocks {
			switch b.State {
			case BlockAllocated:
				f.Allocated += b.Size
				f.Active += b.Size
				f.Requested += b.Requested
			case BlockPendingFree:
				f.Active += b.Size
			default:
				f.CachedFree += b.Size
				f.LargestFree = max(f.LargestFree, b.Size)
			}
		}
	}
	f.Fragmentation = Fragmentation(f.LargestFree, f.CachedFree)
	return f
}

// Fragmentation is 1 - largest/total, the share of free memory that the
// largest hole cannot serve.
func Fragmentation(largest, total uint64) float64 {
	if total == 0 {
		return 0
	}
	return 1 - float64(largest)/float64(total)
}

// CheckTiling reports the first segment whose blocks do not tile it exactly
// or that has two free neighbours left unmerged.
func (l *Layout) CheckTiling() error {
	var prevEnd uint64
	for i := range l.Segments {
		s := &l.Segments[i]
		if i > 0 && s.Addr < prevEnd {
			return &MismatchError{Reason: "segments overlap at " + hex(s.Addr)}
		}
		prevEnd = s.End()
		at := s.Addr
		for j, b := range s.Blocks {
			if b.Addr != at || b.Size == 0 {
				return &MismatchError{Reason: "blocks do not tile the segment at " + hex(s.Addr)}
			}
			if j > 0 && b.State == BlockFree && s.Blocks[j-1].State == BlockFree {
				return &MismatchError{Reason: "two free neighbours unmerged at " + hex(b.Addr)}
			}
			at = b.End()
		}
		if at != s.End() {
			return &MismatchError{Reason: "blocks do not fill the segment at " + hex(s.Addr)}
		}
	}
	return nil
}

func hex(v uint64) string {
	const digits = "0123456789abcdef"
	buf := []byte("0x0000000000000000")
	for i := 17; i >= 2; i-- {
		buf[i] = digits[v&15]
		v >>= 4
	}
	return string(buf)
}

// Totals are the byte counts a usage timeline draws.
type Totals struct{ Reserved, Allocated, Active uint64 }

// Apply moves t over e. ends says that a free_completed ends its
// allocation, no free_requested having come first (allocated bytes drop
// at the first of the two).
func (t *Totals) Apply(e *Event, ends bool) {
	switch e.Action {
	case ActionSegmentAlloc, ActionSegmentMap:
		t.Reserved += e.Size
	case ActionSegmentFree, ActionSegmentUnmap:
		t.Reserved -= e.Size
	case ActionAlloc:
		t.Allocated += e.BlockSize
		t.Active += e.BlockSize
	case ActionFreeRequested:
		t.Allocated -= e.BlockSize
	case ActionFreeCompleted:
		if ends {
			t.Allocated -= e.BlockSize
		}
		t.Active -= e.BlockSize
	}
}
