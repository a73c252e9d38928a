package replay

import (
	"fmt"
	"sort"

	"vramscope/gpu"
)

// restore brings a fresh allocator to layout l, free blocks and all, with
// nothing but mallocs, frees and one empty_cache(), so the allocator's
// own rules place everything:
//
//  1. Each segment in address order is made and then filled, block by
//     block, with filler allocations. A plain segment is made by one
//     malloc its size (freed at once); the blocks of an expandable one
//     map its pages, and the unmapped pages between two of its segments
//     (since its reservation began at bases[pool, stream]) are filled too.
//     While a segment fills, every earlier one is full, so best fit can
//     only take the front of the new one.
//  2. The fillers of the unmapped gaps are freed and empty_cache() unmaps
//     them: nothing else is free then.
//  3. Each live block's fillers are freed and its own request takes the
//     hole they leave, the only free space of its pool and stream, and
//     gets its id (see liveBlocks).
//  4. The fillers of free blocks are freed; they merge as the layout's
//     free blocks did.
//
// A pending-free block stays allocated: the stream does not know the
// streams that held it, and frees it where its free_completed was recorded.
//
// Under the recorded settings and the recorded addresses (Stream.Device),
// the allocator's layout is then l. Under other settings the same calls
// make the layout those settings would have made of them.
func (p *Replayer) restore(l *gpu.Layout, bases map[regionKey]uint64) error {
	if l == nil || len(l.Segments) == 0 {
		return nil
	}
	a := p.a
	fillers := make([][][]uint64, len(l.Segments)) // per segment, per block
	var gaps []uint64
	filled := map[regionKey]uint64{} // how far each expandable segment is filled
	for si := range l.Segments {
		s := &l.Segments[si]
		small := s.Pool == gpu.PoolSmall
		if s.Expandable {
			k := regionKey{s.Stream, s.Pool}
			at, ok := filled[k]
			if !ok {
				at = s.Addr
				if base, ok := bases[k]; ok {
					at = min(at, base)
				}
			}
			if at < s.Addr {
				ptrs, err := p.fill(s.Addr-at, s.Stream, small)
				if err != nil {
					return err
				}
				gaps = append(gaps, ptrs...)
			}
			filled[k] = s.End()
		} else {
			ptr, err := a.Malloc(largestRequest(a.Config().Rules, segmentLimit(s.Size, small)), s.Stream, 0)
			if err != nil {
				return restoreErr(l, s, err)
			}
			if err := a.Free(ptr); err != nil {
				return err
			}
		}
		fillers[si] = make([][]uint64, len(s.Blocks))
		for bi, b := range s.Blocks {
			ptrs, err := p.fill(b.Size, s.Stream, small)
			if err != nil {
				return restoreErr(l, s, err)
			}
			fillers[si][bi] = ptrs
		}
	}
	free := func(ptrs []uint64) error {
		for _, ptr := range ptrs {
			if err := a.Free(ptr); err != nil {
				return err
			}
		}
		return nil
	}
	if len(gaps) > 0 {
		if err := free(gaps); err != nil {
			return err
		}
		if err := a.EmptyCache(); err != nil {
			return err
		}
	}
	var err error
	liveBlocks(l, func(id int64, si, bi int) {
		if err != nil {
			return
		}
		s, b := &l.Segments[si], &l.Segments[si].Blocks[bi]
		if err = free(fillers[si][bi]); err != nil {
			return
		}
		fillers[si][bi] = nil
		size := b.Requested
		if size == 0 { // old snapshots leave it out
			size = b.Size
		}
		var ptr uint64
		if ptr, err = a.Malloc(size, s.Stream, b.Stack); err != nil {
			err = restoreErr(l, s, err)
			return
		}
		p.live.put(id, ptr)
	})
	if err != nil {
		return err
	}
	for si := range fillers {
		for _, ptrs := range fillers[si] {
			if err := free(ptrs); err != nil {
				return err
			}
		}
	}
	return nil
}

// restoreErr says which segment of the starting layout could not be made.
func restoreErr(l *gpu.Layout, s *gpu.Segment, err error) error {
	return fmt.Errorf("the starting layout (%s reserved) does not fit: segment %#x of %s: %w",
		gpu.FormatBytes(l.Figures().Reserved), s.Addr, gpu.FormatBytes(s.Size), err)
}

// fill allocates size bytes of the free block that best fit will pick
// next, as blocks of the right pool: the fewest requests whose rounded
// sizes add up to it (one, under the default rounding). A block whose
// pool cannot hold a piece that small is left partly free.
func (p *Replayer) fill(size uint64, stream int64, small bool) ([]uint64, error) {
	a := p.a
	rules := a.Config().Rules
	var ptrs []uint64
	for size > 0 {
		limit := size
		if small {
			limit = min(limit, gpu.SmallSize)
		}
		req := largestRequest(rules, limit)
		if req == 0 || !small && rules.RoundSize(req) <= gpu.SmallSize {
			break
		}
		ptr, err := a.Malloc(req, stream, 0)
		if err != nil {
			return ptrs, err
		}
		ptrs = append(ptrs, ptr)
		got, _, _ := a.Live(ptr)
		if got >= size {
			break
		}
		size -= got
	}
	return ptrs, nil
}

// segmentLimit is the largest rounded request that still asks the driver
// for a segment of size bytes: a 2 MiB small segment comes from any small
// request, a large one from a request rounded to its size.
func segmentLimit(size uint64, small bool) uint64 {
	if small {
		return gpu.SmallSize
	}
	return size
}

// largestRequest is the largest request that rounds to at most limit
// bytes under rules, 0 when none does.
func largestRequest(rules gpu.Rules, limit uint64) uint64 {
	if limit < gpu.MinBlockSize {
		return 0
	}
	// RoundSize never decreases and never rounds down.
	n := sort.Search(int(min(limit, 1<<62)), func(x int) bool { return rules.RoundSize(uint64(x)+1) > limit })
	return uint64(n)
}
