package predict

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"vramscope/replay"
)

// Options are what Answer predicts.
type Options struct {
	// At are the values to predict at; none: the values recorded and 2,
	// 4 and 8 times the largest.
	At []int
	// Capacity is the device Largest fits; 0: the first recording's.
	Capacity uint64
	// Variants are settings set on top of the recorded ones
	// (incident.Variants): the memory each needs too, and the largest
	// value each fits.
	Variants []string
	// Step: Largest looks at multiples of it (0: 1).
	Step int
	// Workers replay the predictions at once (0: GOMAXPROCS).
	Workers int
}

// Result is a fit and what it predicts.
type Result struct {
	Dim        Dim
	Recordings []Named
	// Requests counts the first recording's requests, Paired those that
	// pair up in every recording fitted.
	Requests, Paired int
	UnpairedBytes    uint64
	Unfit            []Unfit
	Predictions      []Prediction
	// Capacity is the device Largest fits and where its size came from.
	Capacity     uint64
	CapacityFrom string
	Largest      int // Unbounded: no value is too large
	// LargestWhatIf is Largest under each variant.
	LargestWhatIf []Largest
	// Checks are the recordings beyond those fitted, predicted and as
	// recorded.
	Checks []Check
	// Notes are the fit's (Model.Notes).
	Notes []string
}

// Named is a recording as a Result names it.
type Named struct {
	Name string `json:"name"`
	At   int    `json:"at"`
}

// Largest is the largest value that fits under one setting.
type Largest struct {
	Variant string `json:"alloc_conf"`
	At      int    `json:"largest"`
	Err     string `json:"error,omitempty"`
}

// MarshalJSON writes r with the dimension's keys: "largest_batch" or
// "largest_seq" (null when no value is too large).
func (r Result) MarshalJSON() ([]byte, error) {
	var largest any = r.Largest
	if r.Largest == Unbounded {
		largest = nil
	}
	unfit := r.Unfit
	if unfit == nil {
		unfit = []Unfit{}
	}
	out := map[string]any{"by": r.Dim.Key(), "recordings": r.Recordings, "requests": r.Requests, "paired": r.Paired,
		"unpaired_bytes": r.UnpairedBytes, "unfit": unfit, "predictions": r.Predictions, "capacity_bytes": r.Capacity,
		"capacity_from": r.CapacityFrom, "largest_" + r.Dim.Key(): largest}
	if r.LargestWhatIf != nil {
		out["largest_whatif"] = r.LargestWhatIf
	}
	if r.Checks != nil {
		out["checks"] = r.Checks
	}
	if r.Notes != nil {
		out["notes"] = r.Notes
	}
	return json.Marshal(out)
}

// Answer fits d over the first d.Recordings() of recs, checks the model
// against the rest, and predicts what o asks.
func Answer(d Dim, recs []Recording, o Options) (*Result, error) {
	if len(recs) < d.Recordings() {
		return nil, fmt.Errorf("a fit along %s takes %d recordings, got %d", d, d.Recordings(), len(recs))
	}
	m, err := Fit(d, recs[:d.Recordings()])
	if err != nil {
		return nil, err
	}
	for _, c := range recs[d.Recordings():] {
		for _, o := range recs[:d.Recordings()] {
			if o.At == c.At {
				return nil, fmt.Errorf("%s and %s are both at %s %d: %w", o.Name, c.Name, d, c.At, ErrSameValue)
			}
		}
	}
	r := &Result{Dim: d, Requests: m.Requests, Paired: m.Paired, UnpairedBytes: m.UnpairedBytes, Unfit: m.Unfit, Capacity: o.Capacity, Notes: m.Notes}
	for _, rec := range recs {
		r.Recordings = append(r.Recordings, Named{rec.Name, rec.At})
	}
	if r.Capacity == 0 {
		c := m.Capacity()
		r.Capacity, r.CapacityFrom = c.Bytes, c.From()
	} else {
		r.CapacityFrom = "asked for"
	}
	if r.Capacity == 0 {
		r.Capacity, r.CapacityFrom = replay.DefaultCapacity, "a default: the recording does not say"
	}
	at := o.At
	if len(at) == 0 {
		at = DefaultAt(m.At)
	}
	step := max(o.Step, 1)

	var wg sync.WaitGroup
	var largestErr error
	wg.Go(func() {
		r.Largest, largestErr = m.Largest(r.Capacity, "", step)
		for _, v := range o.Variants {
			l := Largest{Variant: v}
			var err error
			if l.At, err = m.Largest(r.Capacity, v, step); err != nil {
				l.Err = err.Error()
			}
			r.LargestWhatIf = append(r.LargestWhatIf, l)
		}
	})
	r.Predictions, err = m.PredictAll(at, o.Variants, o.Workers)
	wg.Wait()
	if err != nil {
		return nil, err
	}
	if largestErr != nil {
		return nil, largestErr
	}
	for _, c := range recs[d.Recordings():] {
		ch, err := m.Check(c, o.Variants)
		if err != nil {
			return nil, fmt.Errorf("checking against %s: %w", c.Name, err)
		}
		r.Checks = append(r.Checks, ch)
	}
	return r, nil
}

// DefaultAt are the values recorded and 2, 4 and 8 times the largest, in
// order.
func DefaultAt(recorded []int) []int {
	top := slices.Max(recorded)
	at := append(slices.Clone(recorded), 2*top, 4*top, 8*top)
	slices.Sort(at)
	return slices.Compact(at)
}
