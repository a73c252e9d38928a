// Package incident explains an out-of-memory error: what was asked, what
// was free and where, which live allocations pinned the segments that could
// not be released, a plain verdict (fragmentation or a real shortage), and
// what-if replays under other allocator settings.
package incident

import (
	"fmt"
	"sort"

	"vramscope/gpu"
	"vramscope/replay"
)

// Report is one OOM, explained from the layout at that moment.
type Report struct {
	Seq    int64 `json:"seq"`
	TimeUS int64 `json:"time_us"`
	Stream int64 `json:"stream"`
	// Requested is the rounded request; SegmentSize what the allocator tried
	// to get from the driver for it ("Tried to allocate" in PyTorch's message).
	// Its JSON name is not requested_bytes: that is gpu.Figures' total of
	// what callers asked for, which the same name here would hide.
	Requested   uint64 `json:"request_bytes"`
	SegmentSize uint64 `json:"segment_bytes"`
	DeviceFree  uint64 `json:"device_free_bytes"`
	Capacity    uint64 `json:"capacity_bytes,omitempty"`

	gpu.Figures
	// NotAllocated is what the device and the cache held free together;
	// under a per-process limit, what the cache held.
	NotAllocated uint64 `json:"not_allocated_bytes"`
	// LimitUnder, when not 0, says a per-process limit refused the
	// request, not the device, which had the memory: the limit was under
	// what the allocator held plus the segment it asked for.
	LimitUnder uint64 `json:"limit_under_bytes,omitempty"`

	Pools   []PoolFree      `json:"pools"`
	Pinned  []PinnedSegment `json:"pinned_segments"`
	Pinners []StackGroup    `json:"pinners"`

	Kind    string `json:"kind"` // "fragmentation" or "shortage"
	Verdict string `json:"verdict"`
}

// PoolFree is the free memory of one pool and stream.
type PoolFree struct {
	Pool        string `json:"pool"`
	Stream      int64  `json:"stream"`
	Segments    int    `json:"segments"`
	Reserved    uint64 `json:"reserved_bytes"`
	Free        uint64 `json:"free_bytes"`
	LargestFree uint64 `json:"largest_free_bytes"`
}

// PinnedSegment is a segment that could not be given back to the driver
// because live blocks split it; its free pieces are stranded.
type PinnedSegment struct {
	Addr        uint64 `json:"address"`
	Size        uint64 `json:"size"`
	Free        uint64 `json:"free_bytes"`
	LargestFree uint64 `json:"largest_free_bytes"`
	Live        int    `json:"live_blocks"`
	LiveBytes   uint64 `json:"live_bytes"`
	Pool        string `json:"pool"`
	Stream      int64  `json:"stream"`
}

// StackGroup is the live allocations with one stack that pin segments.
type StackGroup struct {
	Stack     gpu.StackID `json:"stack"`
	Count     int         `json:"count"`
	Bytes     uint64      `json:"bytes"`
	Segments  int         `json:"segments"`
	Addresses []uint64    `json:"addresses"` // a few, to highlight in the map
}

// Analyze explains the oom event oom given the layout right after it (what
// the allocator held when it gave up) and the device capacity (0 if unknown).
func Analyze(l *gpu.Layout, oom gpu.Event, capacity uint64) Report {
	r := Report{Seq: oom.Seq, TimeUS: oom.TimeUS, Stream: oom.Stream, Requested: oom.Size, DeviceFree: oom.DeviceFree, Capacity: capacity}
	r.SegmentSize = gpu.AllocationSize(oom.Size)
	if l.Rules.Expandable {
		page := uint64(gpu.LargeBuffer)
		if oom.Size <= gpu.SmallSize {
			page = gpu.SmallBuffer
		}
		r.SegmentSize = (oom.Size + page - 1) / page * page
	}
	r.Figures = l.Figures()
	r.NotAllocated = r.DeviceFree + r.CachedFree
	if ask, ok := replay.LimitRefused(oom, l.Rules.Expandable); ok {
		r.LimitUnder = r.Reserved + ask
		r.NotAllocated = r.CachedFree
	}

	type poolKey struct {
		pool   gpu.Pool
		stream int64
	}
	pools := map[poolKey]*PoolFree{}
	groups := map[gpu.StackID]*StackGroup{}
	groupSegs := map[gpu.StackID]map[uint64]bool{}
	for i := range l.Segments {
		s := &l.Segments[i]
		k := poolKey{s.Pool, s.Stream}
		p := pools[k]
		if p == nil {
			p = &PoolFree{Pool: s.Pool.String(), Stream: s.Stream}
			pools[k] = p
		}
		p.Segments++
		p.Reserved += s.Size
		var free, largest, liveBytes uint64
		live := 0
		for _, b := range s.Blocks {
			if b.State == gpu.BlockFree {
				free += b.Size
				largest = max(largest, b.Size)
			} else {
				live++
				liveBytes += b.Size
			}
		}
		p.Free += free
		p.LargestFree = max(p.LargestFree, largest)
		if free == 0 || live == 0 {
			continue // fully used, or fully free (releasable)
		}
		r.Pinned = append(r.Pinned, PinnedSegment{Addr: s.Addr, Size: s.Size, Free: free, LargestFree: largest,
			Live: live, LiveBytes: liveBytes, Pool: s.Pool.String(), Stream: s.Stream})
		for _, b := range s.Blocks {
			if b.State == gpu.BlockFree {
				continue
			}
			g := groups[b.Stack]
			if g == nil {
				g = &StackGroup{Stack: b.Stack}
				groups[b.Stack] = g
				groupSegs[b.Stack] = map[uint64]bool{}
			}
			g.Count++
			g.Bytes += b.Size
			if len(g.Addresses) < 16 {
				g.Addresses = append(g.Addresses, b.Addr)
			}
			groupSegs[b.Stack][s.Addr] = true
		}
	}
	for _, p := range pools {
		r.Pools = append(r.Pools, *p)
	}
	sort.Slice(r.Pools, func(i, j int) bool {
		if r.Pools[i].Free != r.Pools[j].Free {
			return r.Pools[i].Free > r.Pools[j].Free
		}
		return r.Pools[i].Pool < r.Pools[j].Pool
	})
	sort.Slice(r.Pinned, func(i, j int) bool { return r.Pinned[i].Free > r.Pinned[j].Free })
	for id, g := range groups {
		g.Segments = len(groupSegs[id])
		r.Pinners = append(r.Pinners, *g)
	}
	sort.Slice(r.Pinners, func(i, j int) bool {
		if r.Pinners[i].Segments != r.Pinners[j].Segments {
			return r.Pinners[i].Segments > r.Pinners[j].Segments
		}
		return r.Pinners[i].Stack < r.Pinners[j].Stack
	})

	need := r.Requested
	if r.NotAllocated >= need {
		r.Kind = "fragmentation"
		r.Verdict = fmt.Sprintf("Fragmentation: %s cached free, largest hole %s, %s needed",
			gpu.FormatBytes(r.CachedFree), gpu.FormatBytes(r.LargestFree), gpu.FormatBytes(need))
		if r.DeviceFree > 0 && r.LimitUnder == 0 {
			r.Verdict += fmt.Sprintf(" (and %s free on the device)", gpu.FormatBytes(r.DeviceFree))
		}
		r.Verdict += fmt.Sprintf(". %d split segments could not be released.", len(r.Pinned))
	} else {
		r.Kind = "shortage"
		r.Verdict = fmt.Sprintf("A real shortage: only %s not allocated, %s needed.",
			gpu.FormatBytes(r.NotAllocated), gpu.FormatBytes(need))
	}
	if r.LimitUnder > 0 {
		r.Verdict += fmt.Sprintf(" A per-process limit refused the new %s segment, not the device, which had %s free: "+
			"the limit (set_per_process_memory_fraction, which the recording does not say) was under %s.",
			gpu.FormatBytes(gpu.AllocationSize(oom.Size)), gpu.FormatBytes(r.DeviceFree), gpu.FormatBytes(r.LimitUnder))
	}
	return r
}
