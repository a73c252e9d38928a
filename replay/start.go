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
//     block, with filler allocations. A plain segment is made by its live
//     first block's own request, or by the first block's filler, when that
//     asks for a segment of its size, else by one malloc its size, freed
//     at once; the blocks of an expandable one map its pages, and the
//     unmapped pages before it in its reservation (which a first small
//     malloc, freed at once, finds) are filled too. While a segment
//     fills, every earlier one is full, so best fit can only take the
//     front of the new one.
//  2. Last to first, each live block's fillers are freed and its own
//     request takes the hole they leave, the only free space of its pool
//     and stream that can hold it, and gets its id (see liveBlocks). A
//     free block it leaves over is held by a request that takes it whole
//     till the others are placed.
//  3. The fillers of the unmapped gaps are freed and empty_cache() unmaps
//     them: no other free block holds a whole page then.
//  4. The fillers of free blocks are freed; they merge as the layout's
//     free blocks did.
//
// A free block no requests of its pool tile (in an expandable segment, one
// smaller than any large request: the remainder of a split, or the part of
// a page an unmap left; under roundup_power2_divisions, a size between the
// rounded ones) is filled with what comes before it, the live block whose
// request leaves it over in step 2 or the gap whose unmapping leaves it in
// step 3. A pending-free block stays allocated: the stream does not know
// the streams that held it, and frees it where its free_completed was
// recorded.
//
// Under the recorded settings and the recorded addresses (Stream.Device),
// the allocator's layout is then l. Under other settings the same calls
// make the layout those settings would have made of them.
func (p *Replayer) restore(l *gpu.Layout) error {
	if l == nil || len(l.Segments) == 0 {
		return nil
	}
	a := p.a
	rules := a.Config().Rules
	type at struct{ seg, block int }
	ids := map[at]int64{}
	liveBlocks(l, func(id int64, si, bi int) { ids[at{si, bi}] = id })
	placed := map[at]bool{}                        // live blocks whose own request made their segment
	leftover := map[at]uint64{}                    // the untiled free block filled with a live one
	fillers := make([][][]uint64, len(l.Segments)) // per segment, per block
	var gaps []uint64
	filled := map[regionKey]uint64{} // how far each expandable segment is filled
	for si := range l.Segments {
		s := &l.Segments[si]
		small := s.Pool == gpu.PoolSmall
		// untiled says a free block no requests of its pool tile, filled
		// with what comes before it.
		untiled := func(bi int) bool {
			if bi >= len(s.Blocks) || s.Blocks[bi].State != gpu.BlockFree {
				return false
			}
			_, ok := pieces(rules, s.Blocks[bi].Size, small)
			return !ok
		}
		bi := 0
		if s.Expandable {
			k := regionKey{s.Stream, s.Pool}
			from, ok := filled[k]
			if !ok {
				probe := uint64(gpu.MinBlockSize)
				if !small {
					probe = largestRequest(rules, 2*gpu.SmallSize)
				}
				ptr, err := a.Malloc(probe, s.Stream, 0)
				if err != nil {
					return restoreErr(l, s, err)
				}
				if err := a.Free(ptr); err != nil {
					return err
				}
				from = min(ptr, s.Addr)
			}
			if gap := s.Addr - from; gap > 0 {
				if untiled(0) {
					gap += s.Blocks[0].Size
					bi++
				}
				ptrs, err := p.fill(gap, s.Stream, small)
				if err != nil {
					return restoreErr(l, s, err)
				}
				gaps = append(gaps, ptrs...)
			}
			filled[k] = s.End()
		} else if first := &s.Blocks[0]; first.State != gpu.BlockFree && gpu.AllocationSize(rules.RoundSize(request(first))) == s.Size {
			// The live first block's own request makes the segment, as it
			// must have (under max_split_size no other could split it).
			ptr, err := a.Malloc(request(first), s.Stream, first.Stack)
			if err != nil {
				return restoreErr(l, s, err)
			}
			if got, _, _ := a.Live(ptr); got == first.Size {
				p.live.put(ids[at{si, 0}], ptr)
				placed[at{si, 0}] = true
				bi++
			} else if err := a.Free(ptr); err != nil {
				return err
			}
		} else if gpu.AllocationSize(rules.RoundSize(largestRequest(rules, first.Size))) != s.Size {
			ptr, err := a.Malloc(largestRequest(rules, segmentLimit(s.Size, small)), s.Stream, 0)
			if err != nil {
				return restoreErr(l, s, err)
			}
			if err := a.Free(ptr); err != nil {
				return err
			}
		}
		fillers[si] = make([][]uint64, len(s.Blocks))
		for ; bi < len(s.Blocks); bi++ {
			size, next := s.Blocks[bi].Size, untiled(bi+1)
			if next {
				size += s.Blocks[bi+1].Size
				leftover[at{si, bi}] = s.Blocks[bi+1].Size
			}
			ptrs, err := p.fill(size, s.Stream, small)
			if err != nil {
				return restoreErr(l, s, err)
			}
			fillers[si][bi] = ptrs
			if next {
				bi++
			}
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
	var lives []at
	var guards []uint64
	liveBlocks(l, func(_ int64, si, bi int) { lives = append(lives, at{si, bi}) })
	for i := len(lives) - 1; i >= 0; i-- {
		v := lives[i]
		if placed[v] {
			continue
		}
		s, b := &l.Segments[v.seg], &l.Segments[v.seg].Blocks[v.block]
		if err := free(fillers[v.seg][v.block]); err != nil {
			return err
		}
		fillers[v.seg][v.block] = nil
		ptr, err := a.Malloc(request(b), s.Stream, b.Stack)
		if err != nil {
			return restoreErr(l, s, err)
		}
		p.live.put(ids[v], ptr)
		// The free block left over after it must not serve the live
		// blocks still to place: a request that takes it whole (its
		// rest too small to split off) holds it till they are.
		if rest := leftover[v]; rest > gpu.SmallSize && !s.Expandable {
			g, err := a.Malloc(largestRequest(rules, rest), s.Stream, 0)
			if err != nil {
				return restoreErr(l, s, err)
			}
			guards = append(guards, g)
		}
	}
	if err := free(guards); err != nil {
		return err
	}
	if len(gaps) > 0 {
		if err := free(gaps); err != nil {
			return err
		}
		if err := a.EmptyCache(); err != nil {
			return err
		}
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

// request is what a live block of a layout was asked for.
func request(b *gpu.Block) uint64 {
	if b.Requested == 0 { // old snapshots leave it out
		return b.Size
	}
	return b.Requested
}

// restoreErr says which segment of the starting layout could not be made.
func restoreErr(l *gpu.Layout, s *gpu.Segment, err error) error {
	return fmt.Errorf("the starting layout (%s reserved) does not fit: segment %#x of %s: %w",
		gpu.FormatBytes(l.Figures().Reserved), s.Addr, gpu.FormatBytes(s.Size), err)
}

// fill allocates size bytes of the free block that best fit will pick
// next, as blocks of the right pool (see pieces); what cannot be tiled so
// is left free.
func (p *Replayer) fill(size uint64, stream int64, small bool) ([]uint64, error) {
	a := p.a
	reqs, _ := pieces(a.Config().Rules, size, small)
	var ptrs []uint64
	for _, req := range reqs {
		ptr, err := a.Malloc(req, stream, 0)
		if err != nil {
			return ptrs, err
		}
		ptrs = append(ptrs, ptr)
	}
	return ptrs, nil
}

// pieces returns requests whose rounded sizes under rules add up to size,
// each of the pool's sizes (at most 1 MiB for the small pool, more for the
// large one), the fewest it finds: one, under the default rounding. In the
// small pool the largest that fits, again and again, always does (any 512
// bytes round to themselves); in the large pool a short search looks for
// pieces that leave no rest of 1 MiB or less. ok is false when none do;
// reqs then covers what it can.
func pieces(rules gpu.Rules, size uint64, small bool) (reqs []uint64, ok bool) {
	const tries = 8 // candidate first pieces tried at each step
	var walk func(size uint64, depth int) bool
	walk = func(size uint64, depth int) bool {
		if size == 0 {
			return true
		}
		if depth == 0 {
			return false
		}
		limit := size
		if small {
			limit = min(limit, gpu.SmallSize)
		}
		for range tries {
			req := largestRequest(rules, limit)
			r := rules.RoundSize(req)
			if req == 0 || !small && r <= gpu.SmallSize {
				return false
			}
			reqs = append(reqs, req)
			if walk(size-r, depth-1) {
				return true
			}
			reqs = reqs[:len(reqs)-1]
			limit = r - 1
		}
		return false
	}
	if !small && walk(size, 3) {
		return reqs, true
	}
	// The greedy cover, short of the rest.
	reqs = reqs[:0]
	for size > 0 {
		limit := size
		if small {
			limit = min(limit, gpu.SmallSize)
		}
		req := largestRequest(rules, limit)
		if req == 0 || !small && rules.RoundSize(req) <= gpu.SmallSize {
			break
		}
		reqs = append(reqs, req)
		size -= rules.RoundSize(req)
	}
	return reqs, size == 0
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
