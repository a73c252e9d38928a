package incident

import "vramscope/gpu"

// The two kinds of OOM.
const (
	KindFragmentation = "fragmentation"
	KindShortage      = "shortage"
)

// Room is what the allocator had for a request it refused: the memory it
// held cached (reserved, not allocated) and, beyond what it reserved, the
// headroom: what it could still have reserved, which is the device's free
// memory, or under a per-process limit what the limit left unreserved
// (never more than the device had).
type Room struct {
	// Need is the request, rounded as the allocator rounds it.
	Need uint64 `json:"need_bytes"`
	// Cached is the reserved memory in free blocks, Largest the largest
	// of them.
	Cached  uint64 `json:"cached_bytes"`
	Largest uint64 `json:"largest_cached_bytes"`
	// Headroom is what could still have been reserved; Limit the
	// per-process limit it was read under (0: none, the device's free
	// memory is the headroom).
	Headroom uint64 `json:"headroom_bytes"`
	Limit    uint64 `json:"limit_bytes,omitempty"`
}

// RoomOf is the room of a layout l right after an OOM asking need bytes,
// with deviceFree free on the device and a per-process limit of limit
// bytes (0: none).
func RoomOf(l *gpu.Layout, need, deviceFree, limit uint64) Room {
	f := l.Figures()
	r := Room{Need: need, Cached: f.CachedFree, Largest: f.LargestFree, Headroom: deviceFree, Limit: limit}
	if limit > 0 {
		r.Headroom = min(deviceFree, limit-min(limit, f.Reserved))
	}
	return r
}

// NotAllocated is every byte the request could have had: cached and
// never reserved.
func (r Room) NotAllocated() uint64 { return r.Cached + r.Headroom }

// Kind is the one rule that tells fragmentation from a shortage, for the
// verdict and the what-if alike: a request is a shortage only if it could
// not be served even with every byte not allocated (cached, and what could
// still be reserved) in one piece; otherwise the memory was there, in
// pieces, and it is fragmentation.
func (r Room) Kind() string {
	if r.NotAllocated() < r.Need {
		return KindShortage
	}
	return KindFragmentation
}
