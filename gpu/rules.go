package gpu

import (
	"math"
	"math/bits"
)

// The caching allocator's size constants (PyTorch CUDACachingAllocator).
const (
	MinBlockSize     = 512            // every request rounds up to a multiple of 512 B
	SmallSize        = 1 << 20        // rounded sizes up to 1 MiB use the small pool
	SmallBuffer      = 2 << 20        // small-pool segment size and small expandable page
	LargeBuffer      = 20 << 20       // segment for large requests under 10 MiB; large expandable page
	MinLargeAlloc    = 10 << 20       // requests from 10 MiB get their own segment
	RoundLarge       = 2 << 20        // own segments round up to 2 MiB
	Unlimited        = math.MaxUint64 // max_split_size when none is set
	roundupStart     = 20             // log2(1 MiB): first roundup interval
	RoundupIntervals = 16             // 1 MiB ... 64 GiB
)

// Rules are the parts of the allocator's settings that decide a block's size
// from a request. The allocator uses them, and Layout uses them to re-derive
// block sizes from events, which carry only the requested size.
type Rules struct {
	// MaxSplitSize: blocks this large or larger are never split; Unlimited by default.
	MaxSplitSize uint64
	// MaxNonSplitRounding: how much larger than an oversize request a cached
	// oversize block may be; LargeBuffer by default.
	MaxNonSplitRounding uint64
	// RoundupDivisions per power-of-two interval from 1 MiB (index 0 also
	// covers everything smaller; index 15 everything from 32 GiB).
	RoundupDivisions [RoundupIntervals]uint64
	// Expandable: expandable_segments is on.
	Expandable bool
}

// DefaultRules are PyTorch's defaults.
func DefaultRules() Rules {
	return Rules{MaxSplitSize: Unlimited, MaxNonSplitRounding: LargeBuffer}
}

// Divisions returns the roundup_power2_divisions entry for size.
func (r *Rules) Divisions(size uint64) uint64 {
	if size == 0 {
		return r.RoundupDivisions[0]
	}
	logSize := 63 - bits.LeadingZeros64(size)
	idx := 0
	if logSize > roundupStart {
		idx = logSize - roundupStart
	}
	if idx > RoundupIntervals-1 {
		idx = RoundupIntervals - 1
	}
	return r.RoundupDivisions[idx]
}

// RoundSize is round_size: the block size a request of size bytes needs.
func (r *Rules) RoundSize(size uint64) uint64 {
	if size < MinBlockSize {
		return MinBlockSize
	}
	if d := r.Divisions(size); d > 1 && size > MinBlockSize*d {
		return roundupPower2NextDivision(size, d)
	}
	return (size + MinBlockSize - 1) / MinBlockSize * MinBlockSize
}

func roundupPower2NextDivision(size, divisions uint64) uint64 {
	if size&(size-1) == 0 {
		return size
	}
	floor2 := uint64(1) << (63 - bits.LeadingZeros64(size))
	step := floor2 >> bits.TrailingZeros64(divisions)
	if step == 0 {
		return floor2 << 1
	}
	if size%step == 0 {
		return size
	}
	return size/step*step + step
}

// PoolFor is get_pool: the pool a rounded size goes to.
func PoolFor(rounded uint64) Pool {
	if rounded <= SmallSize {
		return PoolSmall
	}
	return PoolLarge
}

// AllocationSize is get_allocation_size: the segment size cudaMalloc is asked
// for when no cached block fits a rounded request.
func AllocationSize(rounded uint64) uint64 {
	switch {
	case rounded <= SmallSize:
		return SmallBuffer
	case rounded < MinLargeAlloc:
		return LargeBuffer
	}
	return (rounded + RoundLarge - 1) / RoundLarge * RoundLarge
}

// ShouldSplit is should_split: whether handing size bytes out of a free block
// of blockSize bytes leaves a remainder worth keeping as its own block.
func (r *Rules) ShouldSplit(pool Pool, blockSize, size uint64) bool {
	remaining := blockSize - size
	if pool == PoolSmall || r.Expandable {
		return remaining >= MinBlockSize
	}
	return size < r.maxSplit() && remaining > SmallSize
}

func (r *Rules) maxSplit() uint64 {
	if r.MaxSplitSize == 0 {
		return Unlimited
	}
	return r.MaxSplitSize
}
