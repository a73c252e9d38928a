// Package predict answers what a job needs at a batch size or sequence
// length it was not recorded at. The same program makes the same requests
// in the same order whatever its batch: recordings of it at two batch
// sizes (three sequence lengths) are aligned request by request, each
// request's size is fitted as a + b·batch (a + b·s + c·s²), and the
// stream at any other value is replayed through the allocator: its peaks,
// the memory it needs, and the largest value that fits a device.
package predict

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/replay"
)

// Dim is what the recordings vary: it sets the degree of the sizes'
// polynomial.
type Dim int

const (
	Batch Dim = 1 // a + b·batch: two recordings
	Seq   Dim = 2 // a + b·s + c·s²: three recordings (attention scores)
)

// Recordings is how many recordings a fit along d takes.
func (d Dim) Recordings() int { return int(d) + 1 }

// String names d as a user does.
func (d Dim) String() string {
	if d == Seq {
		return "sequence length"
	}
	return "batch"
}

// Formula is the size's polynomial in d.
func (d Dim) Formula() string {
	if d == Seq {
		return "a + b·s + c·s²"
	}
	return "a + b·batch"
}

// ErrSameValue refuses two recordings given at one value.
var ErrSameValue = errors.New("a fit takes distinct values")

// Recording is one recording of the job and the value it was recorded at.
type Recording struct {
	Name   string // how the user knows it: a file, a trace id
	At     int
	Stream replay.Stream
}

// maxSize bounds a predicted request: beyond any device, and far from
// overflowing the allocator's arithmetic.
const maxSize = 1 << 50

// What a base request's size rests on.
const (
	fitted   = iota // its sizes follow the formula exactly
	unfitted        // paired in every recording, but not following it
	unpaired        // absent from some recording: kept as recorded
)

// Model is a job's request stream as a function of d: the first
// recording's requests with each malloc's size a polynomial of d.
type Model struct {
	Dim   Dim
	Names []string // the recordings fitted, first the one the stream follows
	At    []int
	// Requests counts the first recording's requests (its starting
	// layout's live blocks first); Paired those that pair up in every
	// recording fitted.
	Requests, Paired int
	// Unfit names the requests that rest on guesses, the most bytes
	// first; UnpairedBytes is what they requested in the recordings.
	Unfit         []Unfit
	UnpairedBytes uint64
	// Grows: some request's size depends on d (else any value needs the
	// same).
	Grows bool
	// Notes say what the recordings' differences, or their sameness,
	// mean for the fit: recordings that make the same requests, or that
	// ran under different allocator settings.
	Notes []string

	base replay.Stream
	reqs []replay.Request
	coef [][3]int64  // per request: the polynomial (fitted)
	kind []uint8     // per request
	pts  [][]float64 // per unfitted request: its sizes, for a guess
}

// Unfit is a kind of request whose size does not follow the formula, or
// that only some recordings make: its stack, why, how many, and the sizes
// of the first of them in each recording (0 where absent).
type Unfit struct {
	Stack gpu.Stack `json:"frames"`
	Why   string    `json:"why"`
	Count int       `json:"count"`
	Sizes []uint64  `json:"sizes"`
	Bytes uint64    `json:"bytes"`
}

// Fit aligns recs (d.Recordings() of them, at distinct positive values)
// and fits each request's size. The stream it predicts follows recs[0]:
// a request only recs[0] makes keeps its size there, one it lacks is
// named but not replayed. Recordings that are not of the same program are
// refused.
func Fit(d Dim, recs []Recording) (*Model, error) {
	if len(recs) != d.Recordings() {
		return nil, fmt.Errorf("a fit along %s takes %d recordings, got %d", d, d.Recordings(), len(recs))
	}
	for i, r := range recs {
		if r.At <= 0 {
			return nil, fmt.Errorf("%s: %s %d: want a positive value", r.Name, d, r.At)
		}
		for _, o := range recs[:i] {
			if o.At == r.At {
				return nil, fmt.Errorf("%s and %s are both at %s %d: %w", o.Name, r.Name, d, r.At, ErrSameValue)
			}
		}
	}
	var table gpu.StackTable
	preps := make([]prepared, len(recs))
	for i, r := range recs {
		preps[i] = prepare(r.Stream, &table)
	}
	base := preps[0]
	ix := indexOf(base)
	als := make([]alignment, len(recs))
	for j := 1; j < len(recs); j++ {
		als[j] = align(base, ix, preps[j])
		if err := sameProgram(recs[0].Name, base, recs[j].Name, preps[j], als[j]); err != nil {
			return nil, err
		}
	}
	m := &Model{Dim: d, Requests: len(base.reqs), base: recs[0].Stream.Unplaced(), reqs: base.reqs,
		coef: make([][3]int64, len(base.reqs)), kind: make([]uint8, len(base.reqs))}
	m.base.Initial, m.base.Requests, m.base.Annotations = nil, nil, nil
	for _, r := range recs {
		m.Names = append(m.Names, r.Name)
		m.At = append(m.At, r.At)
	}
	xs := make([]int64, len(recs))
	for j, r := range recs {
		xs[j] = int64(r.At)
	}
	ys := make([]int64, len(recs))
	type kindOf struct {
		why   string
		rec   int // whose stack ids
		stack gpu.StackID
	}
	unfit := map[kindOf]*Unfit{}
	// name counts a request that rests on a guess under its kind; sizes
	// are its sizes in each recording (0 where absent).
	name := func(why string, rec int, stack gpu.StackID, sizes []uint64) {
		k := kindOf{why, rec, stack}
		u := unfit[k]
		if u == nil {
			u = &Unfit{Why: why, Sizes: slices.Clone(sizes)}
			if stacks := recs[rec].Stream.Stacks; stack > 0 && int(stack) <= len(stacks) {
				u.Stack = stacks[stack-1]
			}
			unfit[k] = u
		}
		u.Count++
		for _, s := range sizes {
			u.Bytes += s
			m.UnpairedBytes += s
		}
	}
	sizes := make([]uint64, len(recs))
	for i, r := range base.reqs {
		all := true
		for j := 1; j < len(recs); j++ {
			all = all && als[j].partner[i] >= 0
		}
		if all {
			m.Paired++
		}
		if r.Op != replay.OpMalloc {
			continue
		}
		sizes[0] = r.Size
		for j := 1; j < len(recs); j++ {
			sizes[j] = 0
			if p := als[j].partner[i]; p >= 0 {
				sizes[j] = preps[j].reqs[p].Size
			}
		}
		if !all {
			in := recs[0].Name
			for j := 1; j < len(recs); j++ {
				if als[j].partner[i] >= 0 {
					in += " and " + recs[j].Name
				}
			}
			m.kind[i] = unpaired
			m.coef[i][0] = int64(r.Size)
			name("only in "+in, 0, r.Stack, sizes)
			continue
		}
		for j, s := range sizes {
			ys[j] = int64(s)
		}
		c, ok := interpolate(xs, ys)
		if !ok {
			m.kind[i] = unfitted
			pts := make([]float64, len(ys))
			for j := range ys {
				pts[j] = float64(ys[j])
			}
			m.pts = append(m.pts, pts)
			m.coef[i][0] = int64(len(m.pts) - 1)
			m.Grows = true
			name("sizes do not follow "+d.Formula(), 0, r.Stack, sizes)
			continue
		}
		m.coef[i] = c
		m.Grows = m.Grows || c[1] != 0 || c[2] != 0
	}
	// What only the others make: named, and their bytes counted.
	for j := 1; j < len(recs); j++ {
		for _, o := range als[j].lone {
			r := preps[j].reqs[o]
			clear(sizes)
			sizes[j] = r.Size
			name("only in "+recs[j].Name, j, r.Stack, sizes)
		}
	}
	for _, u := range unfit {
		m.Unfit = append(m.Unfit, *u)
	}
	m.Notes = notes(d, recs, m.Grows)
	slices.SortFunc(m.Unfit, func(a, b Unfit) int {
		return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), cmp.Compare(b.Count, a.Count), cmp.Compare(a.Why, b.Why))
	})
	return m, nil
}

// interpolate is the polynomial of degree len(xs)-1 through the points,
// as integer coefficients (constant first); ok is false when it has none
// (the sizes do not follow it exactly).
func interpolate(xs, ys []int64) (c [3]int64, ok bool) {
	div := func(n, d int64) (int64, bool) { return n / d, n%d == 0 }
	switch len(xs) {
	case 2:
		b, ok := div(ys[1]-ys[0], xs[1]-xs[0])
		return [3]int64{ys[0] - b*xs[0], b, 0}, ok
	case 3:
		f01, ok1 := div(ys[1]-ys[0], xs[1]-xs[0])
		f12, ok2 := div(ys[2]-ys[1], xs[2]-xs[1])
		c2, ok3 := div(f12-f01, xs[2]-xs[0])
		b := f01 - c2*(xs[0]+xs[1])
		return [3]int64{ys[0] - b*xs[0] - c2*xs[0]*xs[0], b, c2}, ok1 && ok2 && ok3
	}
	return c, false
}

// size is base request i's size at x.
func (m *Model) size(i int, x int64) uint64 {
	c := m.coef[i]
	switch m.kind[i] {
	case unpaired:
		return uint64(c[0])
	case unfitted:
		return clampSize(newton(m.At, m.pts[c[0]], float64(x)))
	}
	f := float64(c[0]) + float64(c[1])*float64(x) + float64(c[2])*float64(x)*float64(x)
	if f > maxSize || f < 0 {
		return clampSize(f)
	}
	return uint64(c[0] + c[1]*x + c[2]*x*x)
}

// newton is the polynomial through (at[j], ys[j]) at x, in floating
// point: a guess for sizes that follow no integer polynomial, rounded up.
func newton(at []int, ys []float64, x float64) float64 {
	n := len(ys)
	d := slices.Clone(ys)
	for k := 1; k < n; k++ {
		for j := n - 1; j >= k; j-- {
			d[j] = (d[j] - d[j-1]) / float64(at[j]-at[j-k])
		}
	}
	v := d[n-1]
	for j := n - 2; j >= 0; j-- {
		v = v*(x-float64(at[j])) + d[j]
	}
	return math.Ceil(v - 1e-6)
}

func clampSize(f float64) uint64 {
	switch {
	case f <= 0 || math.IsNaN(f):
		return 0
	case f >= maxSize:
		return maxSize
	}
	return uint64(f)
}

// Stream is the job's request stream at x, starting on an empty device,
// with the first recording's settings, device and stacks; guessed is how
// many of its bytes rest on requests that are not fitted.
func (m *Model) Stream(x int) (s replay.Stream, guessed uint64) {
	s = m.base
	s.Requests = slices.Clone(m.reqs)
	for i := range s.Requests {
		r := &s.Requests[i]
		r.OOM = false // a request that failed when recorded is the program's all the same
		if r.Op != replay.OpMalloc {
			continue
		}
		r.Size = m.size(i, int64(x))
		if m.kind[i] != fitted {
			guessed += r.Size
		}
	}
	return s, guessed
}

// notes says what a fit of recs cannot show by itself: recordings that
// make the same requests (nothing grows along d, or they were recorded at
// one value), and recordings under other allocator settings than the first
// (whose settings every prediction replays under).
func notes(d Dim, recs []Recording, grows bool) []string {
	var out []string
	if !grows {
		var at []string
		for _, r := range recs {
			at = append(at, fmt.Sprintf("%s at %s %d", r.Name, d, r.At))
		}
		out = append(out, fmt.Sprintf("%s make the same requests, every size alike: nothing in them grows with the %s, so every %s is predicted to need the same memory. "+
			"Recordings made at one %s would look so too.", joinAnd(at), d, d, d))
	}
	first := settingsOf(recs[0].Stream.Settings)
	for _, r := range recs[1:] {
		if s := settingsOf(r.Stream.Settings); s != first {
			out = append(out, fmt.Sprintf("%s ran under other allocator settings (%s) than %s (%s): the sizes fit across both, and every prediction replays under %s's.",
				r.Name, s, recs[0].Name, first, recs[0].Name))
		}
	}
	return out
}

// settingsOf writes allocator settings as the allocator reads them, "the
// defaults" for none.
func settingsOf(conf string) string {
	if c, err := caching.ParseConfig(conf); err == nil {
		conf = c.String()
	}
	if conf == "" {
		return "the defaults"
	}
	return conf
}

// joinAnd joins "a", "b" and "c" as "a, b and c".
func joinAnd(xs []string) string {
	if len(xs) < 2 {
		return strings.Join(xs, "")
	}
	return strings.Join(xs[:len(xs)-1], ", ") + " and " + xs[len(xs)-1]
}
