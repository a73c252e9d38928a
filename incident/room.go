package incident

import "vramscope/gpu"

// The kinds of OOM. KindEither is an OOM under a per-process limit the
// recording does not say, only bounds: fragmentation under the limits at
// the top of its range, a shortage under those at the bottom.
const (
	KindFragmentation = "fragmentation"
	KindShortage      = "shortage"
	KindEither        = "either"
)

// Room is what the allocator had for a request it refused: the memory it
// held cached (reserved, not allocated) and, beyond what it reserved, the
// headroom: what it could still have reserved, which is the device's free
// memory, or under a per-process limit what the limit left unreserved
// (never more than the device had).
type Room struct {
	// Need is the request, rounded as the allocator rounds it.
	Need uint64 `json:"need_bytes"`
	// Reserved is what the allocator held; Cached the part of it in free
	// blocks, Largest the largest of them.
	Reserved uint64 `json:"reserved_bytes"`
	Cached   uint64 `json:"cached_bytes"`
	Largest  uint64 `json:"largest_cached_bytes"`
	// DeviceFree is what the device had free; Headroom what could still
	// have been reserved: that, or under a per-process limit of Limit
	// bytes what the limit left, if less.
	DeviceFree uint64 `json:"device_free_bytes"`
	Headroom   uint64 `json:"headroom_bytes"`
	Limit      uint64 `json:"limit_bytes,omitempty"`
	// LimitLow, when not 0, says the limit is not known, only bounded:
	// it was between LimitLow and Limit, the most it can have been
	// (inferred from the recording, replay.Limit), which Headroom reads.
	LimitLow uint64 `json:"limit_low_bytes,omitempty"`
}

// RoomOf is the room of a layout l right after an OOM asking need bytes,
// with deviceFree free on the device and a per-process limit of limit
// bytes (0: none), known to be at least limitLow when not 0.
func RoomOf(l *gpu.Layout, need, deviceFree, limit, limitLow uint64) Room {
	f := l.Figures()
	r := Room{Need: need, Reserved: f.Reserved, Cached: f.CachedFree, Largest: f.LargestFree, DeviceFree: deviceFree, Limit: limit}
	r.Headroom = r.headroomUnder(limit)
	if limit > 0 && limitLow > 0 && limitLow < limit {
		r.LimitLow = limitLow
	}
	return r
}

// headroomUnder is what a limit of limit bytes (0: none) leaves.
func (r Room) headroomUnder(limit uint64) uint64 {
	if limit == 0 {
		return r.DeviceFree
	}
	return min(r.DeviceFree, limit-min(limit, r.Reserved))
}

// NotAllocated is every byte the request could have had: cached and
// never reserved.
func (r Room) NotAllocated() uint64 { return r.Cached + r.Headroom }

// Kind is the one rule that tells fragmentation from a shortage, for the
// verdict and the what-if alike: a request is a shortage only if it could
// not be served even with every byte not allocated (cached, and what could
// still be reserved) in one piece; otherwise the memory was there, in
// pieces, and it is fragmentation. Under a limit known only by its bounds
// it is KindEither when the bounds disagree.
func (r Room) Kind() string {
	switch {
	case r.NotAllocated() < r.Need:
		return KindShortage
	case r.LimitLow > 0 && r.Cached+r.headroomUnder(r.LimitLow) < r.Need:
		return KindEither
	}
	return KindFragmentation
}

// Threshold is, under a limit, the least limit under which the request is
// fragmentation: what was reserved, plus what the cached memory lacks of
// the request.
func (r Room) Threshold() uint64 { return r.Reserved + r.Need - min(r.Need, r.Cached) }
