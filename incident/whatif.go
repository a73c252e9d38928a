package incident

import (
	"fmt"

	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
	"vramscope/replay"
)

// WhatIf is one replay of the request stream under other settings.
type WhatIf struct {
	AllocConf          string  `json:"alloc_conf"`
	OOMs               int     `json:"ooms"`
	PeakReserved       uint64  `json:"peak_reserved"`
	FragmentationAtOOM float64 `json:"fragmentation_at_oom"`
	// Avoided: the original run had an OOM and this one has none.
	Avoided bool   `json:"avoided"`
	Err     string `json:"error,omitempty"`
}

// Variants are the settings tried besides the original, each applied on top
// of it: the usual cures for fragmentation.
var Variants = []string{
	"expandable_segments:True",
	"max_split_size_mb:32",
	"max_split_size_mb:128",
	"max_split_size_mb:512",
	"garbage_collection_threshold:0.6,per_process_memory_fraction:1",
	"roundup_power2_divisions:4",
}

// withVariant applies the keys of variant on top of the original settings.
func withVariant(original caching.Config, variant string) (caching.Config, error) {
	v, err := caching.ParseConfig(variant)
	if err != nil {
		return caching.Config{}, err
	}
	c := original
	def := caching.DefaultConfig()
	if v.Expandable {
		c.Expandable = true
	}
	if v.MaxSplitSize != def.MaxSplitSize {
		c.MaxSplitSize = v.MaxSplitSize
	}
	if v.GarbageCollectionThreshold > 0 {
		c.GarbageCollectionThreshold = v.GarbageCollectionThreshold
	}
	if v.MemoryFraction > 0 {
		c.MemoryFraction = v.MemoryFraction
	}
	if v.RoundupDivisions != def.RoundupDivisions {
		c.RoundupDivisions = v.RoundupDivisions
	}
	return c, nil
}

// Table is the what-if answer for a request stream.
type Table struct {
	Capacity          uint64   `json:"capacity_bytes"`
	CapacityEstimated bool     `json:"capacity_estimated,omitempty"`
	Requests          int      `json:"requests"`
	Rows              []WhatIf `json:"rows"`
}

// Answer replays s under its own settings and each of Variants on a
// simulated device of s.Capacity bytes. Fragmentation is measured at the
// request of original OOM number incident (from 1), or at the first OOM
// when incident is 0.
func Answer(s replay.Stream, incident int) (Table, error) {
	reqs := s.Requests
	if incident > 0 {
		reqs = append([]replay.Request(nil), reqs...)
		k := 0
		for i := range reqs {
			if reqs[i].OOM {
				k++
				reqs[i].OOM = k == incident
			}
		}
	}
	rows, err := WhatIfs(reqs, s.Capacity, s.Settings, Variants)
	if err != nil {
		return Table{}, err
	}
	return Table{Capacity: s.Capacity, CapacityEstimated: s.CapacityEstimated, Requests: len(reqs), Rows: rows}, nil
}

// WhatIfs replays reqs on a simulated device of capacity bytes under the
// original settings and under each variant. The original comes first.
// Fragmentation is measured just before the request that first failed in
// the original replay (or, when none did, at the end).
func WhatIfs(reqs []replay.Request, capacity uint64, original string, variants []string) ([]WhatIf, error) {
	orig, err := caching.ParseConfig(original)
	if err != nil {
		return nil, fmt.Errorf("the trace's settings: %w", err)
	}
	first := -1
	for i, r := range reqs {
		if r.OOM {
			first = i
			break
		}
	}
	base := replayOne(reqs, capacity, orig, first)
	base.AllocConf = orig.String()
	if first < 0 && base.OOMs > 0 {
		// The recording had no OOM marked (an RMM log): measure at the
		// original replay's first failure instead.
		first = base.firstOOM
		base = replayOne(reqs, capacity, orig, first)
		base.AllocConf = orig.String()
	}
	out := []WhatIf{base.WhatIf}
	for _, v := range variants {
		cfg, err := withVariant(orig, v)
		if err != nil {
			return nil, fmt.Errorf("variant %q: %w", v, err)
		}
		w := replayOne(reqs, capacity, cfg, first)
		w.AllocConf = cfg.String()
		w.Avoided = base.OOMs > 0 && w.OOMs == 0 && w.Err == ""
		out = append(out, w.WhatIf)
	}
	return out, nil
}

type replayed struct {
	WhatIf
	firstOOM int
}

func replayOne(reqs []replay.Request, capacity uint64, cfg caching.Config, at int) replayed {
	res := replayed{firstOOM: -1}
	a, err := caching.New(sim.New(capacity), cfg)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	p := replay.NewReplayer(a)
	measured := false
	for i, r := range reqs {
		if i == at {
			res.FragmentationAtOOM = a.Layout().Figures().Fragmentation
			measured = true
		}
		if err := p.Step(i, r); err != nil {
			res.Err = err.Error()
			break
		}
	}
	out := p.Result()
	if !measured {
		res.FragmentationAtOOM = a.Layout().Figures().Fragmentation
	}
	res.OOMs = len(out.OOMs)
	if len(out.OOMs) > 0 {
		res.firstOOM = out.OOMs[0].Index
	}
	res.PeakReserved = out.PeakReserved
	return res
}
