package predict

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/replay"
)

// Prediction is what the job needs at one value of its dimension, replayed
// on the simulated device.
type Prediction struct {
	Dim Dim
	At  int
	// PeakAllocated and PeakReserved are the most the allocator held on a
	// device large enough for the whole stream.
	PeakAllocated uint64
	PeakReserved  uint64
	// CapacityNeeded is the smallest device on which the stream runs
	// without an OOM (replay.CapacityNeeded): 0 when none up to
	// replay.MaxCapacityNeeded does.
	CapacityNeeded uint64
	// Guessed is how many of the stream's requested bytes rest on
	// requests whose sizes were not fitted.
	Guessed uint64
	// WhatIf is the memory needed under other settings, when asked.
	WhatIf []Needed
}

// Needed is the memory a stream needs under one setting.
type Needed struct {
	Variant        string `json:"alloc_conf"`
	CapacityNeeded uint64 `json:"capacity_needed"`
	Err            string `json:"error,omitempty"`
}

// MarshalJSON names the value by the dimension: "batch" or "seq".
func (p Prediction) MarshalJSON() ([]byte, error) {
	out := map[string]any{p.Dim.Key(): p.At, "peak_allocated": p.PeakAllocated, "peak_reserved": p.PeakReserved,
		"capacity_needed": p.CapacityNeeded, "guessed_bytes": p.Guessed}
	if p.WhatIf != nil {
		out["whatif"] = p.WhatIf
	}
	return json.Marshal(out)
}

// Key is d's name in JSON and URLs.
func (d Dim) Key() string {
	if d == Seq {
		return "seq"
	}
	return "batch"
}

// Predict replays the stream at x under the first recording's settings,
// and under each of variants set on top of them (incident.Variants, say)
// for the memory each needs.
func (m *Model) Predict(x int, variants []string) (Prediction, error) {
	if x <= 0 {
		return Prediction{}, fmt.Errorf("%s %d: want a positive value", m.Dim, x)
	}
	s, guessed := m.Stream(x)
	p, err := Measure(s, variants)
	p.Dim, p.At, p.Guessed = m.Dim, x, guessed
	return p, err
}

// Measure replays s under its settings on a device large enough for it:
// its peaks, and the memory it needs under them and under each variant.
func Measure(s replay.Stream, variants []string) (Prediction, error) {
	var p Prediction
	cfg, err := s.Config("")
	if err != nil {
		return p, err
	}
	p.CapacityNeeded, p.PeakAllocated, p.PeakReserved, err = needed(s, cfg)
	if err != nil {
		return p, err
	}
	for _, v := range variants {
		n := Needed{Variant: v}
		c, _, err := replay.Variant(cfg, v)
		if err == nil {
			n.CapacityNeeded, _, _, err = needed(s, c)
		}
		if err != nil {
			n.Err = err.Error()
		}
		p.WhatIf = append(p.WhatIf, n)
	}
	return p, nil
}

// needed replays s under cfg on the largest device a search tries, then
// searches the memory it needs.
func needed(s replay.Stream, cfg caching.Config) (need, peakAllocated, peakReserved uint64, err error) {
	_, res, err := s.Run(cfg, replay.MaxCapacityNeeded)
	if err != nil && !errors.Is(err, gpu.ErrOutOfMemory) {
		return 0, 0, 0, err
	}
	if err != nil || len(res.OOMs) > 0 {
		return 0, res.PeakAllocated, res.PeakReserved, nil // more than any device
	}
	n, err := s.CapacityNeeded(cfg, res, replay.MaxCapacityNeeded)
	return n.Steady, res.PeakAllocated, res.PeakReserved, err
}

// PredictAll is Predict at each of xs, on up to workers goroutines.
func (m *Model) PredictAll(xs []int, variants []string, workers int) ([]Prediction, error) {
	out := make([]Prediction, len(xs))
	errs := make([]error, len(xs))
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, len(xs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i], errs[i] = m.Predict(xs[i], variants)
			}
		}()
	}
	for i := range xs {
		next <- i
	}
	close(next)
	wg.Wait()
	return out, errors.Join(errs...)
}

// Unbounded is Largest's answer when no value is too large: nothing the
// job asks for depends on it.
const Unbounded = -1

// maxLargest is where Largest stops looking.
const maxLargest = 1 << 30

// Largest is the largest multiple of step (1: any value) at which the
// stream runs without an OOM on a device of capacity bytes under the
// first recording's settings with variant set on top ("" for none): 0
// when even step does not fit, Unbounded when the stream does not grow
// with it. It assumes what is nearly always true: a job that fits at some
// value fits at every smaller one.
func (m *Model) Largest(capacity uint64, variant string, step int) (int, error) {
	if step <= 0 {
		return 0, fmt.Errorf("step %d: want a positive value", step)
	}
	cfg, err := m.base.Config("")
	if err != nil {
		return 0, err
	}
	if cfg, _, err = replay.Variant(cfg, variant); err != nil {
		return 0, err
	}
	fitsAt := func(k int) (bool, error) { // k steps
		s, _ := m.Stream(k * step)
		return s.Fits(cfg, capacity)
	}
	ok, err := fitsAt(1)
	if err != nil || !ok {
		return 0, err
	}
	if !m.Grows {
		return Unbounded, nil
	}
	lo, hi := 1, 2 // in steps: lo fits; hi is tried
	for {
		ok, err := fitsAt(hi)
		if err != nil {
			return 0, err
		}
		if !ok {
			break
		}
		if hi*step >= maxLargest {
			return Unbounded, nil
		}
		lo, hi = hi, 2*hi
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		ok, err := fitsAt(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo * step, nil
}

// Check is a recording the fit did not use, predicted from it and as it
// was recorded (replayed the same way).
type Check struct {
	Name      string     `json:"name"`
	Predicted Prediction `json:"predicted"`
	Recorded  Prediction `json:"recorded"`
}

// Check predicts rec from the model and measures rec itself.
func (m *Model) Check(rec Recording, variants []string) (Check, error) {
	c := Check{Name: rec.Name}
	var err error
	if c.Predicted, err = m.Predict(rec.At, variants); err != nil {
		return c, err
	}
	c.Recorded, err = Measure(rec.Stream, variants)
	c.Recorded.Dim, c.Recorded.At = m.Dim, rec.At
	return c, err
}

// Capacity is the device the first recording ran on (or was given).
func (m *Model) Capacity() replay.Capacity { return m.base.Capacity }

// Settings are the first recording's allocator settings.
func (m *Model) Settings() string { return m.base.Settings }
