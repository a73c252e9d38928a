package server

import (
	"errors"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"vramscope/attrib"
	"vramscope/compare"
	"vramscope/gpu"
	"vramscope/store"
	"vramscope/web"
)

// Two traces compared (package compare): the page, drawn by compare.js
// from the JSON the API answers.

// neededWait is how long a comparison waits for the what-if replays that
// find the memory needed; the page asks again while they run.
const neededWait = 2 * time.Second

// compareOptions reads a comparison's parameters: align, group, n
// (timeline columns), x0 and x1 (its window on the aligned axis), at (a
// chosen instant on it) and rows (per moment).
func (s *Server) compareOptions(p *params) compare.Options {
	q := p.r.URL.Query()
	al, err := compare.ParseAlign(q.Get("align"))
	if err != nil {
		p.fail("align", "%v", err)
	}
	g, err := attrib.ParseGrouping(q.Get("group"))
	if err != nil {
		p.fail("group", "%v", err)
	}
	o := compare.Options{Align: al, Group: g, Cats: s.cats, Needed: compare.FromJobs(s.whatifs, min(s.whatifWait, neededWait))}
	o.Columns = int(p.intIn("n", compare.DefaultColumns, 1, compare.MaxColumns))
	o.X0, o.X1 = p.int64("x0", 0), p.int64("x1", 0)
	if p.err == nil && q.Has("x1") && o.X1 <= o.X0 {
		p.fail("x1", "must be greater than x0 (%d)", o.X0)
	}
	if q.Has("at") {
		at := p.required("at")
		o.At = &at
	}
	o.Rows = int(p.intIn("rows", compare.DefaultRows, 1, 100000))
	return o
}

func (s *Server) apiCompare(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	o := s.compareOptions(p)
	if !p.check(w) {
		return
	}
	res, err := compare.Compare(s.opt.DB, chi.URLParam(r, "a"), chi.URLParam(r, "b"), o)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// tracePair reads the traces {a} and {b} of a page's URL; false when one
// is missing or unreadable, which it has answered.
func (s *Server) tracePair(w http.ResponseWriter, r *http.Request) ([2]gpu.Trace, bool) {
	var ts [2]gpu.Trace
	for i, k := range []string{"a", "b"} {
		t, err := s.opt.DB.Trace(chi.URLParam(r, k))
		if errors.Is(err, store.ErrNotFound) {
			render(w, r, http.StatusNotFound, web.NotFound(page("Not found"), "There is no trace "+chi.URLParam(r, k)+"."))
			return ts, false
		}
		if err != nil {
			s.storeError(w, r, err)
			return ts, false
		}
		ts[i] = t
	}
	return ts, true
}

// pageCompare is the comparison page: a frame that compare.js fills.
func (s *Server) pageCompare(w http.ResponseWriter, r *http.Request) {
	ts, ok := s.tracePair(w, r)
	if !ok {
		return
	}
	render(w, r, http.StatusOK, web.CompareView(s.pageOf(ts[0].Title()+" vs "+ts[1].Title(), ts[:], "A", "B"), ts[0], ts[1]))
}
