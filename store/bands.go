package store

import (
	"math"
	"sort"

	"vramscope/gpu"
)

// The stacked "active memory timeline" (memory_viz's), answered per pixel
// column: allocations at least a pixel tall and a column wide are bands,
// stacked in allocation order (each sits on those allocated before it and
// slides down when one below is freed); everything else folds into one
// "small allocations" band at the bottom. The cost follows the columns and
// the bands kept, never the length of the trace.

const (
	// maxBands caps the bands of one answer; the rest fold into the small band.
	maxBands = 1500
	// maxRuns caps the (column, offset) runs of one answer; past it the
	// band count is halved until it fits.
	maxRuns = 40_000
)

// Band is one allocation drawn as a band. Runs holds pairs
// (column, offset): from that column on, up to the next pair or past C1,
// the band spans [offset, offset+size) bytes.
type Band struct {
	Seq       int64   `json:"seq"`
	Addr      uint64  `json:"address"`
	Size      uint64  `json:"size"`
	Requested uint64  `json:"requested_size"`
	Stack     uint32  `json:"stack,omitempty"`
	AllocUS   int64   `json:"alloc_us"`
	FreeUS    int64   `json:"free_us"`
	C0        int     `json:"c0"`
	C1        int     `json:"c1"`
	Runs      []int64 `json:"runs"`
}

type Bands struct {
	T0 int64 `json:"t0"`
	T1 int64 `json:"t1"`
	W  int   `json:"w"`
	// Allocated is the greatest allocated bytes in each column; Small the
	// bytes of the folded band (its bottom is 0).
	Allocated []uint64 `json:"allocated"`
	Small     []uint64 `json:"small"`
	YMax      uint64   `json:"y_max"`
	MinBytes  uint64   `json:"min_bytes"`
	Bands     []Band   `json:"bands"`
	Total     int64    `json:"total"`
	Folded    int64    `json:"folded"`
}

// Bands lays out the stacked timeline of [t0, t1] over cols pixel columns
// of a plot h pixels tall.
func (db *DB) Bands(id string, t0, t1 int64, cols, h int) (*Bands, error) {
	out := &Bands{T0: t0, T1: t1, W: cols, Allocated: make([]uint64, cols), Small: make([]uint64, cols), Bands: []Band{}}
	dt := float64(t1-t0) / float64(cols)
	colOf := func(t int64) int { return int(math.Floor(float64(t-t0) / dt)) }

	// Greatest allocated and reserved bytes per column, from the usage pyramid.
	u, err := db.Usage(id, t0, t1, cols)
	if err != nil {
		return nil, err
	}
	var resMax uint64
	for _, b := range u.Buckets {
		resMax = max(resMax, b.Reserved.Max)
		c0 := max(0, colOf(b.StartUS))
		c1 := min(cols-1, colOf(b.StartUS+u.BucketUS-1))
		for c := c0; c <= c1; c++ {
			out.Allocated[c] = max(out.Allocated[c], b.Allocated.Max)
		}
	}
	out.YMax = resMax
	if resMax == 0 {
		return out, nil
	}
	out.MinBytes = uint64(math.Ceil(float64(resMax) / float64(h)))

	as, err := db.Allocations(id, t0, t1, out.MinBytes, maxBands)
	if err != nil {
		return nil, err
	}
	out.Total = as.Total
	// A band must also be at least a column wide.
	kept := as.Allocations[:0:0]
	for _, a := range as.Allocations {
		if float64(min(a.FreeUS, t1)-max(a.AllocUS, t0)) >= dt {
			kept = append(kept, a)
		}
	}
	sort.Slice(kept, func(i, j int) bool {
		if kept[i].Seq != kept[j].Seq {
			return kept[i].Seq < kept[j].Seq
		}
		return kept[i].Addr < kept[j].Addr
	})
	for {
		bands, runs := stack(out, kept, colOf)
		if runs <= maxRuns || len(kept) < 2 {
			out.Bands = bands
			break
		}
		// Too many runs: keep the larger half.
		bySize := append([]gpu.Allocation(nil), kept...)
		sort.Slice(bySize, func(i, j int) bool { return bySize[i].Size > bySize[j].Size })
		cut := bySize[len(bySize)/2].Size
		next := kept[:0:0]
		for _, a := range kept {
			if a.Size > cut {
				next = append(next, a)
			}
		}
		if len(next) == len(kept) {
			next = next[:len(next)/2]
		}
		kept = next
	}
	out.Folded = out.Total - int64(len(out.Bands))
	return out, nil
}

// stack lays kept out (sorted by seq) over the columns, filling out.Small,
// and returns the bands and their run count.
func stack(out *Bands, kept []gpu.Allocation, colOf func(int64) int) ([]Band, int) {
	cols := out.W
	span := func(a *gpu.Allocation) (int, int) {
		c0 := max(0, colOf(max(a.AllocUS, out.T0)))
		end := min(a.FreeUS, out.T1)
		c1 := min(cols-1, colOf(end))
		if c1 > c0 && float64(end-out.T0) == float64(c1)*float64(out.T1-out.T0)/float64(cols) {
			c1-- // freed exactly on a column's start: not alive in it
		}
		return c0, c1
	}
	// The small band holds what the kept bands do not.
	sum := make([]uint64, cols)
	for i := range kept {
		c0, c1 := span(&kept[i])
		for c := c0; c <= c1; c++ {
			sum[c] += kept[i].Size
		}
	}
	acc := make([]uint64, cols)
	for c := range cols {
		if out.Allocated[c] > sum[c] {
			out.Small[c] = out.Allocated[c] - sum[c]
		} else {
			out.Small[c] = 0
		}
		acc[c] = out.Small[c]
	}
	bands := make([]Band, len(kept))
	runs := 0
	for i := range kept {
		a := &kept[i]
		c0, c1 := span(a)
		b := Band{Seq: a.Seq, Addr: a.Addr, Size: a.Size, Requested: a.Requested, Stack: uint32(a.Stack),
			AllocUS: a.AllocUS, FreeUS: a.FreeUS, C0: c0, C1: c1}
		last := uint64(math.MaxUint64)
		for c := c0; c <= c1; c++ {
			if acc[c] != last {
				last = acc[c]
				b.Runs = append(b.Runs, int64(c), int64(last))
			}
			acc[c] += a.Size
		}
		runs += len(b.Runs) / 2
		bands[i] = b
	}
	return bands, runs
}
