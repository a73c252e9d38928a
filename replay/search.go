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

// CapacityNeeded is the smallest device capacity, in CapacityStep steps,
// on which s runs without an OOM under cfg; 0 when none up to
// MaxCapacityNeeded does (a request larger than any device). known is a
// replay of s under cfg on a device of knownAt bytes, where the search
// starts: without an OOM, its peak reservation is enough; with one,
// capacities double from it until one is.
//
// The search bisects between that and the most memory the stream's live
// requests ever add up to (no device with less can serve them all), so it
// assumes what is nearly always true: a device with more memory never
// fails where a smaller one succeeds.
func (s *Stream) CapacityNeeded(cfg caching.Config, known Result, knownAt uint64) (uint64, error) {
	lo := s.liveFloor(cfg.Rules) / CapacityStep
	// hi: a capacity known to fit. Without a memory fraction, a run with
	// no OOM fits on its peak reservation: its device calls never failed,
	// so they succeed the same on any device at least that large. With
	// one, the limit moves with the capacity: the peak is tried first.
	var hi uint64
	if len(known.OOMs) > 0 && knownAt > 0 {
		lo = max(lo, knownAt/CapacityStep+1) // knownAt was too small
	}
	if len(known.OOMs) > 0 || knownAt == 0 {
		for c := max(2*knownAt, 2*lo*CapacityStep, CapacityStep); ; c *= 2 {
			c = min(c, MaxCapacityNeeded)
			_, res, err := s.Run(cfg, c)
			if err != nil && !errors.Is(err, gpu.ErrOutOfMemory) {
				return 0, err
			}
			if err == nil && len(res.OOMs) == 0 {
				known, knownAt = res, c
				break
			}
			if c == MaxCapacityNeeded {
				return 0, nil
			}
		}
	}
	hi = ceilDiv(known.PeakReserved, CapacityStep)
	if cfg.MemoryFraction > 0 {
		if ok, err := s.fits(cfg, hi*CapacityStep); err != nil {
			return 0, err
		} else if !ok {
			hi = ceilDiv(knownAt, CapacityStep)
		}
	}
	lo = min(lo, hi)
	for lo < hi {
		mid := lo + (hi-lo)/2
		ok, err := s.fits(cfg, mid*CapacityStep)
		if err != nil {
			return 0, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return hi * CapacityStep, nil
}

func ceilDiv(n, d uint64) uint64 { return (n + d - 1) / d }

// fits replays s under cfg on capacity bytes until the first OOM, and
// says whether there was none.
func (s *Stream) fits(cfg caching.Config, capacity uint64) (bool, error) {
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
