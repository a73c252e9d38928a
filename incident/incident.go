// Package incident explains an out-of-memory error: what was asked, what
// was free and where, which live allocations pinned the segments that could
// not be released, a plain verdict (fragmentation or a real shortage), and
// what-if replays under other allocator settings.
package incident

import (
	"fmt"
	"sort"
	"strings"

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
	// Capacity is the device's memory where the recording says it (0:
	// it does not; a PyTorch snapshot does not), and Outside what of it
	// neither this allocator reserved nor was free at the OOM: held
	// outside it (the CUDA context, another process or library).
	Capacity uint64 `json:"capacity_bytes,omitempty"`
	Outside  uint64 `json:"outside_bytes,omitempty"`

	gpu.Figures
	// Room is what the allocator had for the request; Kind reads it.
	Room Room `json:"room"`
	// NotAllocated is Room's every byte not allocated: cached, and what
	// could still be reserved.
	NotAllocated uint64 `json:"not_allocated_bytes"`
	// LimitUnder, when not 0, says a per-process limit refused the
	// request, not the device, which had the memory: the limit was under
	// what the allocator held plus the segment it asked for.
	LimitUnder uint64 `json:"limit_under_bytes,omitempty"`
	// LimitInferred: Room.Limit is read from the recording's OOMs (the
	// most it can have been), not recorded.
	LimitInferred bool `json:"limit_inferred,omitempty"`

	Pools   []PoolFree      `json:"pools"`
	Pinned  []PinnedSegment `json:"pinned_segments"`
	Pinners []StackGroup    `json:"pinners"`

	Kind    string `json:"kind"` // KindFragmentation or KindShortage
	Verdict string `json:"verdict"`
	// Device says what the recording knows of the device at the OOM;
	// Limit the per-process limit the room was read under ("" for none).
	Device string `json:"device_text"`
	Limit  string `json:"limit_text,omitempty"`
}

// Device is what is known of where an OOM happened.
type Device struct {
	// Capacity is the device's memory, 0 when the recording does not say.
	Capacity uint64
	// Limit is the per-process limit the allocator ran under (0: none);
	// LimitInferred says it was read from the OOMs (replay.Stream.LimitBytes):
	// the most it can have been, and LimitLow the least.
	Limit         uint64
	LimitInferred bool
	LimitLow      uint64
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
// the allocator held when it gave up) and what is known of the device.
func Analyze(l *gpu.Layout, oom gpu.Event, dev Device) Report {
	r := Report{Seq: oom.Seq, TimeUS: oom.TimeUS, Stream: oom.Stream, Requested: oom.Size, DeviceFree: oom.DeviceFree, Capacity: dev.Capacity}
	r.SegmentSize = gpu.AllocationSize(oom.Size)
	if l.Rules.Expandable {
		page := uint64(gpu.LargeBuffer)
		if oom.Size <= gpu.SmallSize {
			page = gpu.SmallBuffer
		}
		r.SegmentSize = (oom.Size + page - 1) / page * page
	}
	r.Figures = l.Figures()
	limit, low := dev.Limit, dev.LimitLow
	if ask, ok := replay.LimitRefused(oom, l.Rules.Expandable); ok {
		r.LimitUnder = r.Reserved + ask
		if limit == 0 || limit >= r.LimitUnder {
			// Nothing better known: the most the limit can have been, and
			// at least what the allocator held.
			limit, low, dev.LimitInferred = r.LimitUnder-1, r.Reserved, true
		}
	}
	r.LimitInferred = limit > 0 && dev.LimitInferred
	if !r.LimitInferred {
		low = 0
	}
	r.Room = RoomOf(l, r.Requested, r.DeviceFree, limit, low)
	r.NotAllocated = r.Room.NotAllocated()
	if r.Capacity > 0 {
		r.Outside = r.Capacity - min(r.Capacity, r.Reserved+r.DeviceFree)
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

	r.Kind = r.Room.Kind()
	r.Verdict = r.verdict(oom)
	r.Device = r.deviceText()
	switch {
	case r.Room.Limit > 0 && r.LimitInferred:
		low, high := gpu.FormatApart(gpu.FormatBytes, r.Room.LimitLow, r.Room.Limit)
		r.Limit = "between " + low + " and " + high + ", inferred from the recording (set_per_process_memory_fraction is not recorded); the what-if replays under the most it can have been"
	case r.Room.Limit > 0:
		r.Limit = gpu.FormatBytes(r.Room.Limit) + ", as recorded"
	}
	return r
}

// verdict says the kind of OOM and why, in figures.
func (r *Report) verdict(oom gpu.Event) string {
	room := r.Room
	need, notAllocated := gpu.FormatApart(gpu.FormatBytes, room.Need, room.NotAllocated())
	var pieces []string
	if room.Cached > 0 || room.Headroom == 0 {
		c := gpu.FormatBytes(room.Cached) + " cached"
		if room.Cached > 0 {
			c += " (the largest free block " + gpu.FormatBytes(room.Largest) + ")"
		}
		pieces = append(pieces, c)
	}
	if room.Headroom > 0 {
		pieces = append(pieces, r.headroomText())
	}
	in := strings.Join(pieces, " and ")
	pinned := ""
	if n := len(r.Pinned); n > 0 {
		pinned = fmt.Sprintf(" %d split %s could not be released.", n, plural(n, "segment", "segments"))
	}
	var v string
	switch r.Kind {
	case KindFragmentation:
		v = fmt.Sprintf("Fragmentation: %s was asked for and %s was not allocated, but in pieces: %s. No piece held the request.%s", need, notAllocated, in, pinned)
	case KindShortage:
		v = fmt.Sprintf("A real shortage: %s was asked for and only %s was not allocated (%s): even in one piece it would not fit. "+
			"Less must be allocated by then, or more memory allowed.", need, notAllocated, in)
	default:
		low, high := gpu.FormatApart(gpu.FormatBytes, room.LimitLow, room.Limit)
		v = fmt.Sprintf("Fragmentation or a real shortage, as the per-process limit was: %s was asked for with %s cached (the largest free block %s), "+
			"and the limit, which the recording does not say, was between %s and %s. From a limit of %s up, the cached memory and what the limit left "+
			"unreserved add up to the request: the memory was there, in pieces (fragmentation); under it, a real shortage.%s",
			gpu.FormatBytes(room.Need), gpu.FormatBytes(room.Cached), gpu.FormatBytes(room.Largest), low, high, gpu.FormatBytes(room.Threshold()), pinned)
	}
	switch {
	case r.LimitUnder > 0 && !r.LimitInferred:
		v += fmt.Sprintf(" The per-process limit of %s refused the new %s segment, not the device, which had %s free.",
			gpu.FormatBytes(r.Room.Limit), gpu.FormatBytes(gpu.AllocationSize(oom.Size)), gpu.FormatBytes(r.DeviceFree))
	case r.LimitUnder > 0 && r.Kind != KindEither:
		v += fmt.Sprintf(" A per-process limit refused the new %s segment, not the device, which had %s free: "+
			"the limit (set_per_process_memory_fraction, which the recording does not say) was under %s.",
			gpu.FormatBytes(gpu.AllocationSize(oom.Size)), gpu.FormatBytes(r.DeviceFree), gpu.FormatBytes(r.LimitUnder))
	}
	return v
}

// headroomText is what could still have been reserved, in words.
func (r *Report) headroomText() string {
	h := gpu.FormatBytes(r.Room.Headroom)
	switch {
	case r.Room.Limit == 0:
		return h + " free on the device"
	case r.LimitInferred:
		// The limit is the most it can have been: what it left, the most
		// it can have left.
		return "up to " + h + " never reserved under the per-process limit"
	}
	return h + " never reserved under the per-process limit of " + gpu.FormatBytes(r.Room.Limit)
}

// deviceText says what the recording knows of the device at the OOM: what
// this allocator reserved, what was free, and the rest, held outside the
// allocator, where the device's size is known.
func (r *Report) deviceText() string {
	s := fmt.Sprintf("This allocator had reserved %s and the device had %s free at the OOM", gpu.FormatBytes(r.Reserved), gpu.FormatBytes(r.DeviceFree))
	if r.Capacity == 0 {
		return s + fmt.Sprintf(". The recording does not say the device's size: whatever it has beyond these %s was held outside this allocator (the CUDA context, another process or library).",
			gpu.FormatBytes(r.Reserved+r.DeviceFree))
	}
	if r.Outside == 0 {
		return s + fmt.Sprintf(", the whole of the %s device: nothing else held it.", gpu.FormatBytes(r.Capacity))
	}
	return s + fmt.Sprintf("; the rest of the %s device, %s, was held outside this allocator (the CUDA context, another process or library).",
		gpu.FormatBytes(r.Capacity), gpu.FormatBytes(r.Outside))
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
