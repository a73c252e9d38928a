package replay

import (
	"sort"

	"vramscope/gpu"
)

// evidence is what a recording's segment events say of its device and of
// the calls behind them.
type evidence struct {
	// emptyCache marks the event indexes where segments were released
	// outside any malloc: an empty_cache() call.
	emptyCache map[int]bool
	// capacity from the first oom entry, else from the retries; Bytes 0
	// when neither says.
	capacity Capacity
	// limit is a per-process limit the OOMs imply: the device had the
	// memory they asked for (Bytes 0: none).
	limit Limit
}

// runContext is what is known of a recording's device and settings
// before its events are read.
type runContext struct {
	rules gpu.Rules
	// capacity is the device's memory, 0 when unknown; limit what the
	// allocator may reserve of it (less under a memory fraction).
	capacity, limit uint64
	// gc: garbage collection may release segments in malloc; gcAbove,
	// when the capacity is known, is the reservation above which it does.
	gc      bool
	gcAbove uint64
	// addr, when known, says where the reservations of expandable
	// segments began.
	addr *addresses
}

// inferRuns reads the runs of segment_free and segment_unmap events. The
// allocator releases cached segments in two places: in malloc, when the
// driver refused a new segment (a free-and-retry path: the run is followed
// by the segment_alloc or segment_map that then succeeded, or by the oom
// when it failed), and in empty_cache() (followed by anything else, by a
// malloc that a cached block could serve before the release, by a release
// that does not begin where release_available_cached_blocks would, or by
// a segment the driver would not have refused). A retry says the device
// was short before the release: capacity < reserved before it + the
// segment then allocated. Every segment allocated says capacity >=
// reserved after it. So, with the capacity unknown, a "retry" whose bound
// falls below the recording's peak reservation was an empty_cache() call
// followed by a malloc that needed a new segment anyway. Garbage
// collection also releases segments in malloc before asking the driver:
// a run it may have made is left to the replay, which does the same.
func inferRuns(initial *gpu.Layout, events []gpu.Event, ctx runContext) evidence {
	ev := evidence{emptyCache: map[int]bool{}}
	var tot gpu.Totals
	// The layout tells whether a cached block could serve a malloc; nil
	// once an event does not fit it.
	l := gpu.NewLayout(ctx.rules)
	if initial != nil {
		tot.Reserved = initial.Figures().Reserved
		l = initial.Clone()
	}
	peak, peakSeq := tot.Reserved, int64(-1)
	var retries []retry
	var limits []Limit // one per OOM the device had room for
	released := func(a gpu.Action) bool { return a == gpu.ActionSegmentFree || a == gpu.ActionSegmentUnmap }
	for i := 0; i < len(events); i++ {
		e := &events[i]
		switch {
		case e.Action == gpu.ActionOOM:
			if ev.capacity.Source == CapacityUnknown {
				ev.capacity = Capacity{Bytes: tot.Reserved + e.DeviceFree, Source: CapacityOOM, OOMSeq: e.Seq}
			}
			if need, ok := LimitRefused(*e, ctx.rules.Expandable); ok && ctx.limit == 0 {
				limits = append(limits, Limit{High: tot.Reserved + need - 1, HighSeq: e.Seq, Asked: need, Reserved: tot.Reserved, DeviceFree: e.DeviceFree})
			}
		case released(e.Action) && (i == 0 || !released(events[i-1].Action)):
			before, j := tot.Reserved, i
			for j < len(events) && released(events[j].Action) {
				j++
			}
			// need: what the malloc after the run first asked of the
			// driver. A segment; with expandable segments, the pages it
			// would map (the release may unmap free pages it then maps
			// again, or leave a free block it then takes whole).
			req := nextMalloc(events[j:])
			base := uint64(0)
			if ctx.addr != nil && req != nil {
				base, _ = ctx.addr.base(regionKey{req.Stream, gpu.PoolFor(ctx.rules.RoundSize(req.Size))}, i)
			}
			var need uint64
			switch {
			case req == nil:
			case ctx.rules.Expandable && l != nil && (i == 0 || events[i-1].Action != gpu.ActionSegmentMap):
				need = firstMap(l, req, base)
			default:
				for k := j; k < len(events) && (events[k].Action == gpu.ActionSegmentAlloc || events[k].Action == gpu.ActionSegmentMap); k++ {
					need += events[k].Size
					if events[k].Action == gpu.ActionSegmentAlloc {
						break // one cudaMalloc per malloc
					}
				}
			}
			// Garbage collection releases only whole large segments, and
			// only above its threshold.
			gc := ctx.gc && (ctx.capacity == 0 || before > ctx.gcAbove)
			for _, r := range events[i:j] {
				gc = gc && r.Action == gpu.ActionSegmentFree && gpu.GuessPool(r) == gpu.PoolLarge
			}
			asRetry, asEmpty := true, true
			if l != nil && req != nil {
				asRetry, asEmpty = after(l, events[i:j], events[j:], req, base)
			}
			switch {
			case j < len(events) && events[j].Action == gpu.ActionOOM:
			case need == 0 || !asRetry || l != nil && (cached(l, req) || !ctx.oversizeFits(l, req, events[i:j], before, need)):
				ev.emptyCache[i] = true
			case !asEmpty: // the malloc's own release
			case ctx.limit > 0 && before+need > ctx.limit: // refused
			case gc:
			case ctx.limit > 0:
				ev.emptyCache[i] = true
			default:
				retries = append(retries, retry{i, before + need - 1})
			}
		}
		tot.Apply(e, false)
		if tot.Reserved > peak {
			peak, peakSeq = tot.Reserved, e.Seq
		}
		if l != nil && l.Apply(*e) != nil {
			l = nil
		}
	}
	if len(limits) > 0 {
		// The retries bounded the limit, not the device.
		ev.limit, retries = inferLimit(limits, retries, peak, peakSeq, ev.emptyCache)
	}
	c := Capacity{Source: CapacityRetries, Low: peak, High: ^uint64(0), PeakReserved: peak}
	for _, r := range retries {
		// A driver that had the memory did not refuse: empty_cache().
		if r.high < peak || ev.capacity.Source == CapacityOOM && r.high < ev.capacity.Bytes {
			ev.emptyCache[r.at] = true
			continue
		}
		c.Retries++
		c.High = min(c.High, r.high)
	}
	if ev.capacity.Source == CapacityOOM {
		ev.capacity.PeakReserved = peak
	} else if c.Retries > 0 {
		c.Bytes = c.High
		ev.capacity = c
	} else {
		ev.capacity = Capacity{PeakReserved: peak}
	}
	return ev
}

// LimitRefused reports whether the oom event e was a per-process limit's
// refusal, not the device's: the allocator asks a limit for the whole
// segment (alloc_size, returned as ask), and the device for that or, with
// expandable segments, for whole pages; a device with that much free did
// not refuse.
func LimitRefused(e gpu.Event, expandable bool) (ask uint64, ok bool) {
	ask = gpu.AllocationSize(e.Size)
	device := ask
	if expandable {
		page := uint64(gpu.LargeBuffer)
		if gpu.PoolFor(e.Size) == gpu.PoolSmall {
			page = gpu.SmallBuffer
		}
		device = max(ask, (e.Size+page-1)/page*page)
	}
	return ask, e.DeviceFree >= device
}

// retry is a free-and-retry path: the driver (or a limit) refused a
// segment with the reservation then, so what it allowed was at most high.
type retry struct {
	at   int
	high uint64
}

// inferLimit reads a per-process limit from the OOMs the device had room
// for: each says the limit was below what the allocator held then plus
// the segment it asked for; the retries at or above the peak reservation
// bound it the same way (those below it were empty_cache() calls, marked
// in emptyCache); every segment allocated says it was at least the peak.
// The limit replayed is the highest all of them allow: every call that
// succeeded succeeds under it, and every refusal is refused.
func inferLimit(ooms []Limit, retries []retry, peak uint64, peakSeq int64, emptyCache map[int]bool) (Limit, []retry) {
	l := ooms[0]
	for _, o := range ooms[1:] {
		if o.High < l.High {
			l = o
		}
	}
	l.Low, l.LowSeq = peak, peakSeq
	for _, r := range retries {
		if r.high < peak {
			emptyCache[r.at] = true
			continue
		}
		l.Retries++
		l.High = min(l.High, r.high)
	}
	if l.High < l.Low {
		// No single limit explains the recording: leave it to the
		// device.
		return Limit{}, retries
	}
	l.Bytes = l.High
	return l, nil
}

// oversizeFits reports whether a run of releases can be malloc's under
// max_split_size: release_available_cached_blocks frees the request's
// stream's oversize segments first, where empty_cache() goes by stream
// and size from the smallest; and when they add up to the request and
// make room on a device of known size, malloc retries at once instead of
// releasing more.
func (ctx runContext) oversizeFits(l *gpu.Layout, req *gpu.Event, run []gpu.Event, before, need uint64) bool {
	segs, released, retries := oversizeRelease(l, req)
	if len(segs) == 0 {
		return true
	}
	if len(run) < len(segs) {
		return false
	}
	for k, s := range segs {
		if run[k].Addr != s.Addr {
			return false
		}
	}
	if retries && ctx.limit > 0 && before-released+need <= ctx.limit {
		return len(run) == len(segs)
	}
	return true
}

// after reports whether what follows a run of releases fits a malloc's
// own free-and-retry path (retry) and an empty_cache() call then the
// malloc (empty), on the layout l before the run. After its release a
// retry asks the driver at once: a new segment, or with expandable
// segments the pages find_expandable_block maps (none when a free block
// it finds is large enough). After empty_cache() the malloc first looks
// for a cached block, and asks the driver only when none serves it.
func after(l *gpu.Layout, run, next []gpu.Event, req *gpu.Event, base uint64) (retry, empty bool) {
	rel := l.Clone()
	for _, e := range run {
		if rel.Apply(e) != nil {
			return true, true
		}
	}
	asks := next[0].Action == gpu.ActionSegmentAlloc || next[0].Action == gpu.ActionSegmentMap
	driver := true // what the malloc asks of the driver when it goes there
	if rel.Rules.Expandable {
		driver = firstMap(rel, req, base) > 0
	}
	retry = driver == asks
	empty = !asks
	if !cached(rel, req) {
		empty = driver == asks
	}
	return retry, empty
}

// nextMalloc is the alloc that ends the malloc next begins with (after
// the segments it mapped or allocated), nil when next begins otherwise.
func nextMalloc(next []gpu.Event) *gpu.Event {
	for k := range next {
		if a := next[k].Action; a == gpu.ActionAlloc {
			return &next[k]
		} else if a != gpu.ActionSegmentAlloc && a != gpu.ActionSegmentMap {
			return nil
		}
	}
	return nil
}

// region returns the expandable segments of l on stream in pool, in
// address order.
func region(l *gpu.Layout, stream int64, pool gpu.Pool) []*gpu.Segment {
	var segs []*gpu.Segment
	for i := range l.Segments {
		if s := &l.Segments[i]; s.Expandable && s.Stream == stream && s.Pool == pool {
			segs = append(segs, s)
		}
	}
	return segs
}

// firstMap is what the expandable segment of req's stream and pool,
// whose reservation began at base (0: at its first mapped range), would
// map first for it in l: find_expandable_block takes the first unmapped
// range (with the free block before it) whose run of free and unmapped
// memory reaches the request, and maps it range by range, each as far as
// needed in whole pages; the first of those maps is the one a driver
// short of memory refuses before any other (the others would leave their
// segment_map events before the release). 0 when the free block alone
// holds the request.
func firstMap(l *gpu.Layout, req *gpu.Event, base uint64) uint64 {
	size := l.Rules.RoundSize(req.Size)
	pool := gpu.PoolFor(size)
	page := uint64(gpu.LargeBuffer)
	if pool == gpu.PoolSmall {
		page = gpu.SmallBuffer
	}
	pages := func(n uint64) uint64 { return (n + page - 1) / page * page }
	segs := region(l, req.Stream, pool)
	if len(segs) == 0 {
		return pages(size)
	}
	// Each unmapped range in address order: before the first mapped one
	// (from base), then after each.
	for i := -1; i < len(segs); i++ {
		var have uint64
		if i < 0 {
			if base == 0 || base >= segs[0].Addr {
				continue
			}
		} else if last := segs[i].Blocks[len(segs[i].Blocks)-1]; last.State == gpu.BlockFree {
			have = last.Size
			if have >= size {
				return 0
			}
		}
		first := uint64(0)
		for k := i; ; k++ {
			end := base
			if k >= 0 {
				end = segs[k].End()
			}
			// After the last segment: the rest of the reservation.
			last := k+1 == len(segs)
			var gap uint64
			if !last {
				gap = segs[k+1].Addr - end
			}
			if first == 0 {
				first = pages(size - have)
				if !last {
					first = min(first, gap)
				}
			}
			if last || have+gap >= size {
				return first
			}
			have += gap
			n := segs[k+1]
			if n.Blocks[0].State != gpu.BlockFree {
				break
			}
			if have += n.Blocks[0].Size; have >= size {
				return first
			}
			if len(n.Blocks) > 1 {
				break
			}
		}
	}
	return 0
}

// cached reports whether a cached block of l could serve the malloc
// whose alloc is req: get_free_block's best fit on its stream and pool, with its walk over
// expandable blocks and max_split_size's rules. Malloc releases segments
// only when none could.
func cached(l *gpu.Layout, req *gpu.Event) bool {
	if req == nil {
		return false
	}
	rules := l.Rules
	size := rules.RoundSize(req.Size)
	type free struct {
		size, addr, grows uint64 // grows: the unmapped space after it
		expandable        bool
	}
	var blocks []free
	for i := range l.Segments {
		s := &l.Segments[i]
		if s.Stream != req.Stream || s.Pool != gpu.PoolFor(size) || s.Expandable && !rules.Expandable {
			continue
		}
		for j, b := range s.Blocks {
			if b.State != gpu.BlockFree {
				continue
			}
			f := free{size: b.Size, addr: b.Addr, expandable: s.Expandable}
			if s.Expandable && j == len(s.Blocks)-1 {
				// Unmapped up to the next mapped range of its reservation,
				// or to the reservation's end.
				f.grows = ^uint64(0) - b.End()
				for k := i + 1; k < len(l.Segments); k++ {
					if n := &l.Segments[k]; n.Expandable && n.Stream == s.Stream && n.Pool == s.Pool {
						f.grows = n.Addr - b.End()
						break
					}
				}
			}
			blocks = append(blocks, f)
		}
	}
	sort.Slice(blocks, func(i, j int) bool {
		return blocks[i].size < blocks[j].size || blocks[i].size == blocks[j].size && blocks[i].addr < blocks[j].addr
	})
	k := sort.Search(len(blocks), func(i int) bool { return blocks[i].size >= size })
	if k == len(blocks) {
		return false
	}
	reach := func(f free) uint64 { return f.size + min(f.grows, ^uint64(0)-f.size) }
	for blocks[k].expandable && k+1 < len(blocks) && reach(blocks[k+1]) < reach(blocks[k]) {
		k++
	}
	best := blocks[k]
	maxSplit := rules.MaxSplitSize
	if maxSplit == 0 {
		maxSplit = gpu.Unlimited
	}
	return !(size < maxSplit && best.size >= maxSplit) && !(size >= maxSplit && best.size >= size+rules.MaxNonSplitRounding)
}

// oversizeRelease is what release_available_cached_blocks frees for req
// in l under max_split_size: the smallest whole free oversize segment of
// its stream large enough for it, else the oversize ones from the largest
// down until they add up to it; nil without max_split_size. released is
// their bytes; retries says malloc then asks the driver again (they were
// enough).
func oversizeRelease(l *gpu.Layout, req *gpu.Event) (segs []*gpu.Segment, released uint64, retries bool) {
	rules := l.Rules
	maxSplit := rules.MaxSplitSize
	if req == nil || maxSplit == 0 || maxSplit == gpu.Unlimited {
		return nil, 0, false
	}
	size := rules.RoundSize(req.Size)
	key := max(size, maxSplit)
	var fit *gpu.Segment
	var below []*gpu.Segment
	for i := range l.Segments {
		s := &l.Segments[i]
		if s.Expandable || s.Stream != req.Stream || s.Pool != gpu.PoolFor(size) || len(s.Blocks) != 1 || s.Blocks[0].State != gpu.BlockFree || s.Size < maxSplit {
			continue
		}
		if s.Size >= key {
			if fit == nil || s.Size < fit.Size {
				fit = s
			}
		} else {
			below = append(below, s)
		}
	}
	if fit != nil {
		return []*gpu.Segment{fit}, fit.Size, true
	}
	// Largest first; of equal sizes the highest address first.
	sort.Slice(below, func(i, j int) bool {
		return below[i].Size > below[j].Size || below[i].Size == below[j].Size && below[i].Addr > below[j].Addr
	})
	for _, s := range below {
		if released >= key {
			break
		}
		segs = append(segs, s)
		released += s.Size
	}
	return segs, released, released >= key
}
