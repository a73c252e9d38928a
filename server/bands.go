package server

import (
	"encoding/binary"
	"math"
	"net/http"

	"github.com/go-chi/chi/v5"

	"vramscope/store"
)

// apiBands is the stacked timeline of a window, answered per pixel column:
// t0, t1 and w columns, h rows showing the memory range [m0, m1) (the
// whole range when both are absent). format=bin asks for the binary form.
func (s *Server) apiBands(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	t0, t1, cols := window(p, "w", 1000, 8000)
	h := p.intIn("h", 300, 10, 10000)
	m0, m1 := memRange(p)
	bin := format(p)
	if !p.check(w) {
		return
	}
	out, err := s.opt.DB.Bands(chi.URLParam(r, "id"), store.BandsQuery{T0: t0, T1: t1, W: cols, H: int(h), M0: m0, M1: m1})
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	if bin {
		writeBinary(w, bandsBinary(out))
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// memRange reads m0 and m1, the visible memory range in bytes: both or neither.
func memRange(p *params) (m0, m1 uint64) {
	q := p.r.URL.Query()
	if q.Has("m0") != q.Has("m1") {
		p.fail("m1", "m0 and m1 go together")
		return 0, 0
	}
	if !q.Has("m1") {
		return 0, 0
	}
	a := p.intIn("m0", 0, 0, 1<<62)
	b := p.intIn("m1", 0, 0, 1<<62)
	if p.err == nil && b <= a {
		p.fail("m1", "must be greater than m0 (%d)", a)
	}
	return uint64(a), uint64(b)
}

// format reads format: json (the default) or bin.
func format(p *params) bool {
	switch f := p.r.URL.Query().Get("format"); f {
	case "", "json":
		return false
	case "bin":
		return true
	default:
		p.fail("format", "%q is neither json nor bin", f)
		return false
	}
}

func writeBinary(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	w.Write(b)
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
// bands ("VSB1"): w, bands, runs, dropped, samples, flags (1: sampled at
// checkpoints), 0; t0, t1, m0, m1, y_max, min_bytes, allocated[w], then per
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

func usageBinary(u usageJSON) []byte {
	n := len(u.Events)
	b := &binWriter{b: make([]byte, 0, 8+8*(2+7*n))}
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

func bandsBinary(o *store.Bands) []byte {
	runs := 0
	for i := range o.Bands {
		runs += len(o.Bands[i].Runs) / 2
	}
	nb := len(o.Bands)
	b := &binWriter{b: make([]byte, 0, 32+8*(6+o.W+4*nb+runs)+4*(4*nb+1+runs))}
	b.b = append(b.b, "VSB1"...)
	flags := uint32(0)
	if o.Sampled == "checkpoints" {
		flags = 1
	}
	b.u32(uint32(o.W), uint32(nb), uint32(runs), uint32(o.Dropped), uint32(o.Samples), flags, 0) // 0 pads to 32 bytes
	for _, v := range []float64{float64(o.T0), float64(o.T1), float64(o.M0), float64(o.M1), float64(o.YMax), float64(o.MinBytes)} {
		b.f64(v)
	}
	for _, v := range o.Allocated {
		b.f64(float64(v))
	}
	for _, field := range []func(*store.Band) float64{
		func(x *store.Band) float64 { return float64(x.Seq) },
		func(x *store.Band) float64 { return float64(x.Addr) },
		func(x *store.Band) float64 { return float64(x.Size) },
		func(x *store.Band) float64 { return float64(x.Requested) },
	} {
		for i := range o.Bands {
			b.f64(field(&o.Bands[i]))
		}
	}
	for i := range o.Bands {
		for r := 1; r < len(o.Bands[i].Runs); r += 2 {
			b.f64(float64(o.Bands[i].Runs[r]))
		}
	}
	for _, field := range []func(*store.Band) uint32{
		func(x *store.Band) uint32 { return uint32(x.Stack) },
		func(x *store.Band) uint32 { return uint32(x.C0) },
		func(x *store.Band) uint32 { return uint32(x.C1) },
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
	return b.b
}
