package replay

import (
	"errors"

	"vramscope/gpu"
	"vramscope/gpu/caching"
)

// CapacityStep is the granularity of CapacityNeeded: the driver's 2 MiB
// pages.
const CapacityStep = 2 << 20

// MaxCapacityNeeded is where CapacityNeeded gives up: no single GPU has
// more, and an expandable segment reserves 9/8 of it in the simulated
// device's address space.
const MaxCapacityNeeded = 512 << 30

// Needed is the memory a stream needs under one configuration: the
// smallest per-process limit (in CapacityStep steps) under which it runs
// without an OOM. The allocator is not always monotone in it: with
// expandable segments it asks a limit for a whole segment where it maps
// fewer pages, so a run can fit under one limit and fail under the next
// one up. Steady is the limit from which every limit tried up runs;
// Lowest, when less, is a lower one that runs too, with a limit between
// them that does not (FailsAt).
type Needed struct {
	Steady  uint64 `json:"steady"`
	Lowest  uint64 `json:"lowest"`
	FailsAt uint64 `json:"fails_at,omitempty"`
}

// Allowed is what the allocator may reserve in the recording: the
// device's capacity, or the per-process limit under it.
func (s *Stream) Allowed() uint64 {
	if l, _ := s.LimitBytes(); l > 0 && l < s.Capacity.Bytes {
		return l
	}
	return s.Capacity.Bytes
}

// LimitBytes is the per-process limit the recording ran under (0: none):
// the one its OOMs imply (inferred true: the most it can have been), else
// the memory fraction its settings record of the device it recorded.
func (s *Stream) LimitBytes() (limit uint64, inferred bool) {
	if s.Limit.Bytes > 0 {
		return s.Limit.Bytes, true
	}
	if s.Capacity.Source != CapacityRecorded {
		return 0, false
	}
	c, err := caching.ParseConfig(s.Settings)
	if err != nil || c.MemoryFraction <= 0 || c.MemoryFraction >= 1 {
		return 0, false
	}
	return uint64(c.MemoryFraction * float64(s.Capacity.Bytes)), false
}

// CapacityNeeded searches the memory s needs under cfg (Needed; Steady 0
// when no limit up to MaxCapacityNeeded is enough: a request larger than
// any device). Each limit L is tried as PyTorch's per-process limit is
// (cfg.Limit), on a device of at least L bytes, as the real allocator is
// measured. known is a replay of s under cfg allowed knownAt bytes, where
// the search starts: with an OOM, limits double from it until one is
// enough.
//
// The search bisects between that and the most memory the stream's live
// requests ever add up to (no limit below serves them all), then looks
// at the limits next to the answer for a non-monotone edge.
func (s *Stream) CapacityNeeded(cfg caching.Config, known Result, knownAt uint64) (Needed, error) {
	// Under another limit a run departs from the recording: the driver
	// places its segments anew, not at the recording's addresses.
	u := s.Unplaced()
	s = &u
	lo := s.liveFloor(cfg.Rules)
	if cfg.Expandable {
		// A limit is asked for alloc_size, and a map can then take up to
		// a page more: the live bytes can pass it by that much.
		lo -= min(lo, gpu.LargeBuffer)
	}
	lo /= CapacityStep
	if len(known.OOMs) > 0 && knownAt > 0 {
		lo = max(lo, knownAt/CapacityStep+1) // knownAt was too small
	}
	// hi: a limit known to fit. A run without an OOM reserved at most
	// its peak, but a limit is asked for whole segments: the peak is tried
	// first, then knownAt. Without such a run, one with no limit on the
	// largest device is made, as the real allocator is measured (record.py
	// bisects down from what a run with no limit reserved: where the
	// allocator is not monotone, the start decides which edge a bisection
	// finds). Where that run cannot be made, or its peak is below what a
	// known OOM says, limits double until one fits.
	peak, fitsAt := known.PeakReserved, knownAt // a run that fit, and where
	if len(known.OOMs) > 0 || knownAt == 0 {
		peak, fitsAt = 0, 0
		free := cfg
		free.Limit = 0
		switch _, res, err := s.Run(free, MaxCapacityNeeded); {
		case err == nil && len(res.OOMs) > 0:
			return Needed{}, nil // more than any device
		case err == nil:
			peak, fitsAt = res.PeakReserved, MaxCapacityNeeded
		}
	}
	var hi uint64
	if fitsAt > 0 {
		hi = ceilDiv(peak, CapacityStep)
		if ok, err := s.fits(cfg, hi*CapacityStep); err != nil {
			return Needed{}, err
		} else if !ok {
			hi = ceilDiv(fitsAt, CapacityStep)
		}
	}
	if hi == 0 || hi < lo {
		for c := max(2*knownAt, 2*lo*CapacityStep, CapacityStep); ; c *= 2 {
			c = min(c, MaxCapacityNeeded)
			ok, err := s.fits(cfg, c)
			if err != nil {
				return Needed{}, err
			}
			if ok {
				hi = ceilDiv(c, CapacityStep)
				break
			}
			if c == MaxCapacityNeeded {
				return Needed{}, nil
			}
		}
	}
	lo = min(lo, hi)
	top, floor := hi, lo
	for lo < hi {
		mid := lo + (hi-lo)/2
		ok, err := s.fits(cfg, mid*CapacityStep)
		if err != nil {
			return Needed{}, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return s.edge(cfg, hi, top, hi > floor)
}

// edge looks at the limits next to hi, the bisection's answer (top
// fits; hi-1 does not when below is set): up from hi while they fail,
// for the limit from which they run; else two steps down, for a lower one
// that runs.
func (s *Stream) edge(cfg caching.Config, hi, top uint64, below bool) (Needed, error) {
	n := Needed{Steady: hi * CapacityStep, Lowest: hi * CapacityStep}
	for k := hi + 1; k < top; k++ {
		ok, err := s.fits(cfg, k*CapacityStep)
		if err != nil {
			return Needed{}, err
		}
		if ok {
			break
		}
		n.FailsAt, n.Steady = k*CapacityStep, (k+1)*CapacityStep
	}
	if n.FailsAt == 0 && below && hi >= 2 {
		ok, err := s.fits(cfg, (hi-2)*CapacityStep)
		if err != nil {
			return Needed{}, err
		}
		if ok {
			n.Lowest, n.FailsAt = (hi-2)*CapacityStep, (hi-1)*CapacityStep
		}
	}
	return n, nil
}

func ceilDiv(n, d uint64) uint64 { return (n + d - 1) / d }

// fits replays s under cfg with a per-process limit of limit bytes, on a
// device of at least that much, until the first OOM, and says whether
// there was none.
func (s *Stream) fits(cfg caching.Config, limit uint64) (bool, error) {
	cfg.Limit = limit
	return s.Fits(cfg, max(limit, s.Capacity.Bytes))
}

// Fits replays s under cfg on s.Device(capacity) until the first OOM, and
// says whether there was none (a starting layout that does not fit is
// one).
func (s *Stream) Fits(cfg caching.Config, capacity uint64) (bool, error) {
	a, err := caching.New(s.Device(capacity), cfg)
	if err != nil {
		return false, err
	}
	p, err := s.Start(a)
	if err != nil {
		if errors.Is(err, gpu.ErrOutOfMemory) {
			return false, nil
		}
		return false, err
	}
	for i := range s.Requests {
		if err := p.Step(i, s.Requests[i]); err != nil {
			return false, err
		}
		if len(p.OOMs()) > 0 {
			return false, nil
		}
	}
	return true, nil
}

// liveFloor is the most the stream's live requests, each rounded as rules
// round it, ever add up to, starting with the live blocks of its initial
// layout: every allocation served, no device holds less.
func (s *Stream) liveFloor(rules gpu.Rules) uint64 {
	var sizes liveSet
	var live, peak uint64
	liveBlocks(s.Initial, func(id int64, seg, block int) {
		n := rules.RoundSize(request(&s.Initial.Segments[seg].Blocks[block]))
		sizes.put(id, n)
		live += n
	})
	peak = live
	for _, r := range s.Requests {
		switch r.Op {
		case OpMalloc:
			if r.Size == 0 {
				continue
			}
			n := rules.RoundSize(r.Size)
			sizes.put(r.ID, n)
			live += n
			peak = max(peak, live)
		case OpFree:
			if n, ok := sizes.take(r.ID); ok {
				live -= n
			}
		}
	}
	return peak
}
