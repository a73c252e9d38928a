package server

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"vramscope/store"
)

// apiBands is the stacked timeline of a window, answered per pixel column:
// t0, t1 and w columns, h rows showing the memory range [m0, m1) (the
// whole range when both are absent). format=bin asks for the binary form.
func (s *Server) apiBands(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	q := bandsQuery(p)
	bin := format(p)
	if !p.check(w) {
		return
	}
	out, err := s.opt.DB.Bands(chi.URLParam(r, "id"), q)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	if bin {
		writeBinary(w, out.AppendBinary(nil))
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// bandsQuery reads a window of the stacked timeline: t0, t1, w columns,
// h rows, the memory range m0, m1, the axis (time or event: t0 and t1
// are then event indexes), and how folded bands are grouped (fold: frame
// or stack).
func bandsQuery(p *params) store.BandsQuery {
	t0, t1, cols := window(p, "w", 1000, 8000)
	h := p.intIn("h", 300, 10, 10000)
	m0, m1 := memRange(p)
	q := store.BandsQuery{T0: t0, T1: t1, W: cols, H: int(h), M0: m0, M1: m1, Events: eventAxis(p)}
	switch f := store.FoldBy(p.r.URL.Query().Get("fold")); f {
	case "", store.FoldByFrame, store.FoldByStack:
		q.Fold = f
	default:
		p.fail("fold", "%q is neither frame nor stack", f)
	}
	return q
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
