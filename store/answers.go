package store

import (
	"encoding/binary"
	"encoding/json"
	"math"

	"vramscope/gpu"
)

// UsageColumns is a usage timeline in columns, the form pages read: bucket
// i starts at StartUS + i*BucketUS, and each series holds min,max pairs.
type UsageColumns struct {
	BucketUS  int64    `json:"bucket_us"`
	StartUS   int64    `json:"start_us"`
	Events    []int64  `json:"events"`
	Reserved  []uint64 `json:"reserved"`
	Allocated []uint64 `json:"allocated"`
	Active    []uint64 `json:"active"`
}

// Columns lays u out in columns.
func (u Usage) Columns() UsageColumns {
	n := len(u.Buckets)
	out := UsageColumns{BucketUS: u.BucketUS, Events: make([]int64, n),
		Reserved: make([]uint64, 0, 2*n), Allocated: make([]uint64, 0, 2*n), Active: make([]uint64, 0, 2*n)}
	if n > 0 {
		out.StartUS = u.Buckets[0].StartUS
	}
	for i, b := range u.Buckets {
		out.Events[i] = b.Events
		out.Reserved = append(out.Reserved, b.Reserved.Min, b.Reserved.Max)
		out.Allocated = append(out.Allocated, b.Allocated.Min, b.Allocated.Max)
		out.Active = append(out.Active, b.Active.Min, b.Active.Max)
	}
	return out
}

// LayoutColumns is the segment map at one instant, in flat columns so
// that a hundred thousand blocks stay a compact answer: each segment is
// SegmentColumns numbers (address, size, stream, pool: 0 unknown, 1 small,
// 2 large; expandable 0/1; index of its first block; block count), each
// block BlockColumns (address, size, requested size, state: 0 cached
// free, 1 allocated, 2 pending free; alloc seq, -1 unknown; stack id).
type LayoutColumns struct {
	TimeUS       int64       `json:"t"`
	Seq          int64       `json:"seq"`
	Figures      gpu.Figures `json:"figures"`
	LargestFree  uint64      `json:"largest_free_address"`
	Segments     []int64     `json:"segments"`
	Blocks       []int64     `json:"blocks"`
	SegmentCount int         `json:"segment_count"`
	BlockCount   int         `json:"block_count"`
	// Pools are the segments of private pools (a CUDA graph's, a
	// MemPool's): address, pool owner and id, for the map to show apart.
	Pools [][3]int64 `json:"pools,omitempty"`
}

// MarkPools names the private pool of each segment of c that a snapshot
// put in one (segs): the segment the snapshot dumped at its address, if
// it is the same size (a private pool's segments are never resized or
// split) and its life had begun by c's instant; an earlier segment at the
// same address was another one.
func (c *LayoutColumns) MarkPools(segs []PoolSegment) {
	if len(segs) == 0 {
		return
	}
	private := make(map[uint64]PoolSegment, len(segs))
	for _, s := range segs {
		private[s.Addr] = s
	}
	for i := 0; i < len(c.Segments); i += SegmentColumns {
		addr, size := uint64(c.Segments[i]), uint64(c.Segments[i+1])
		if p, ok := private[addr]; ok && p.Size == size && p.Since <= c.Seq {
			c.Pools = append(c.Pools, [3]int64{int64(addr), p.Pool[0], p.Pool[1]})
		}
	}
}

// SegmentColumns and BlockColumns are how many numbers a segment and a
// block take in a LayoutColumns.
const SegmentColumns, BlockColumns = 7, 6

// NewLayoutColumns lays out l, the layout right after event seq at time t.
func NewLayoutColumns(l *gpu.Layout, t, seq int64) LayoutColumns {
	out := LayoutColumns{TimeUS: t, Seq: seq, Figures: l.Figures(), SegmentCount: len(l.Segments),
		Segments: []int64{}, Blocks: []int64{}}
	var largest uint64
	for i := range l.Segments {
		sg := &l.Segments[i]
		exp := int64(0)
		if sg.Expandable {
			exp = 1
		}
		out.Segments = append(out.Segments, int64(sg.Addr), int64(sg.Size), sg.Stream, int64(sg.Pool), exp,
			int64(len(out.Blocks)/BlockColumns), int64(len(sg.Blocks)))
		for _, b := range sg.Blocks {
			state := int64(0)
			switch b.State {
			case gpu.BlockAllocated:
				state = 1
			case gpu.BlockPendingFree:
				state = 2
			default:
				if b.Size > largest {
					largest, out.LargestFree = b.Size, b.Addr
				}
			}
			out.Blocks = append(out.Blocks, int64(b.Addr), int64(b.Size), int64(b.Requested), state, b.Seq, int64(b.Stack))
		}
	}
	out.BlockCount = len(out.Blocks) / BlockColumns
	return out
}

// The binary forms hold the JSON answers' numbers as little-endian arrays
// the page maps onto typed arrays without parsing: a 4-byte tag, uint32
// counts, then every float64 array, then every uint32 array. Byte counts,
// addresses and times are float64, exact up to 2^53 as in JSON read by a
// browser.
//
// usage ("VSU1"): n; bucket_us, start_us, events[n], then min,max pairs of
// reserved[2n], allocated[2n], active[2n].
//
// bands ("VSB1"): w, bands, runs, dropped, samples, flags (1: a dense
// window's columns), 0; t0, t1, m0, m1, y_max, min_bytes, allocated[w], then per
// band seq, address, size, requested (each an array of the band count),
// then the run offsets; uint32 stack, c0, c1 per band, the index of each
// band's first run (one more entry than bands), then the run columns.

type binWriter struct{ b []byte }

func (b *binWriter) u32(v ...uint32) {
	for _, x := range v {
		b.b = binary.LittleEndian.AppendUint32(b.b, x)
	}
}

func (b *binWriter) f64(v float64) { b.b = binary.LittleEndian.AppendUint64(b.b, math.Float64bits(v)) }

// AppendBinary appends the binary form of u.
func (u UsageColumns) AppendBinary(buf []byte) []byte {
	n := len(u.Events)
	b := &binWriter{b: buf}
	b.b = append(b.b, "VSU1"...)
	b.u32(uint32(n))
	b.f64(float64(u.BucketUS))
	b.f64(float64(u.StartUS))
	for _, v := range u.Events {
		b.f64(float64(v))
	}
	for _, s := range [][]uint64{u.Reserved, u.Allocated, u.Active} {
		for _, v := range s {
			b.f64(float64(v))
		}
	}
	return b.b
}

// AppendBinary appends the binary form of u: the usage form, its bucket
// the columns' width in events, and the columns' times after it.
func (u EventUsage) AppendBinary(buf []byte) []byte {
	b := &binWriter{b: u.UsageColumns.AppendBinary(buf)}
	copy(b.b[len(buf):], "VSU2")
	binary.LittleEndian.PutUint64(b.b[len(buf)+8:], math.Float64bits(u.Width))
	for _, t := range u.Times {
		b.f64(float64(t))
	}
	return b.b
}

// AppendBinary appends the binary form of o: a header ("VSB2", then
// w, bands, runs, dropped, samples, flags (1 dense, 2 events),
// folds, groups' bytes, each a uint32), the float64 columns (t0, t1, m0,
// m1, y_max, min_bytes, allocated[w], the bands' seq, address, size,
// requested size, the runs' offsets, the folds' offset, size, and their
// representatives' seq, address, size, requested size), the uint32
// columns (the bands' stack, c0, c1, first run (one more: the runs' end),
// the runs' columns, the folds' c0, c1, group, count and representatives'
// stack), then the groups' names as a JSON array.
func (o *Bands) AppendBinary(buf []byte) []byte {
	runs := 0
	for i := range o.Bands {
		runs += len(o.Bands[i].Runs) / 2
	}
	groups, _ := json.Marshal(o.Groups)
	nb, nf := len(o.Bands), len(o.Folds)
	b := &binWriter{b: buf}
	b.b = append(b.b, "VSB2"...)
	flags := uint32(0)
	if o.Sampled == "dense" {
		flags |= 1
	}
	if o.Events {
		flags |= 2
	}
	b.u32(uint32(o.W), uint32(nb), uint32(runs), uint32(o.Dropped), uint32(o.Samples), flags, uint32(nf), uint32(len(groups)), 0) // 0 pads to 40 bytes
	for _, v := range []float64{float64(o.T0), float64(o.T1), float64(o.M0), float64(o.M1), float64(o.YMax), float64(o.MinBytes)} {
		b.f64(v)
	}
	for _, v := range o.Allocated {
		b.f64(float64(v))
	}
	bandF64 := []func(*Band) float64{
		func(x *Band) float64 { return float64(x.Seq) },
		func(x *Band) float64 { return float64(x.Addr) },
		func(x *Band) float64 { return float64(x.Size) },
		func(x *Band) float64 { return float64(x.Requested) },
	}
	for _, field := range bandF64 {
		for i := range o.Bands {
			b.f64(field(&o.Bands[i]))
		}
	}
	for i := range o.Bands {
		for r := 1; r < len(o.Bands[i].Runs); r += 2 {
			b.f64(float64(o.Bands[i].Runs[r]))
		}
	}
	for _, field := range []func(*Fold) float64{
		func(x *Fold) float64 { return float64(x.Offset) },
		func(x *Fold) float64 { return float64(x.Size) },
	} {
		for i := range o.Folds {
			b.f64(field(&o.Folds[i]))
		}
	}
	for _, field := range bandF64 {
		for i := range o.Folds {
			b.f64(field(&o.Folds[i].Rep))
		}
	}
	for _, field := range []func(*Band) uint32{
		func(x *Band) uint32 { return uint32(x.Stack) },
		func(x *Band) uint32 { return uint32(x.C0) },
		func(x *Band) uint32 { return uint32(x.C1) },
	} {
		for i := range o.Bands {
			b.u32(field(&o.Bands[i]))
		}
	}
	first := 0
	for i := range o.Bands {
		b.u32(uint32(first))
		first += len(o.Bands[i].Runs) / 2
	}
	b.u32(uint32(first))
	for i := range o.Bands {
		for r := 0; r < len(o.Bands[i].Runs); r += 2 {
			b.u32(uint32(o.Bands[i].Runs[r]))
		}
	}
	for _, field := range []func(*Fold) uint32{
		func(x *Fold) uint32 { return uint32(x.C0) },
		func(x *Fold) uint32 { return uint32(x.C1) },
		func(x *Fold) uint32 { return x.Group },
		func(x *Fold) uint32 { return uint32(x.Count) },
		func(x *Fold) uint32 { return uint32(x.Rep.Stack) },
	} {
		for i := range o.Folds {
			b.u32(field(&o.Folds[i]))
		}
	}
	b.b = append(b.b, groups...)
	return b.b
}
