package server

import (
	"fmt"
	"net/http"

	"github.com/go-chi/chi/v5"

	"vramscope/attrib"
	"vramscope/store"
)

// What was live at an instant and what it was (package attrib): the live
// set grouped as a tree and a table, its pprof profile, the trace's steps
// and phases, and the categories of a window's bands.

// instant reads the instant a request names: seq (right after that event)
// or t (after the last event at or before that time).
func instant(p *params) attrib.Instant {
	if p.r.URL.Query().Has("seq") {
		return attrib.Instant{BySeq: true, Seq: p.intIn("seq", 0, -1, 1<<62)}
	}
	return attrib.Instant{TimeUS: p.required("t")}
}

// apiLive is the live set at an instant (t or seq), grouped by first user
// frame, by stack or by category (group), with hidden frames when
// frames=all; the table holds the first limit rows.
func (s *Server) apiLive(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	at := instant(p)
	g, err := attrib.ParseGrouping(r.URL.Query().Get("group"))
	if err != nil {
		p.fail("group", "%v", err)
	}
	limit := int(p.intIn("limit", 100, 1, 10000))
	all := frames(p)
	if !p.check(w) {
		return
	}
	l, err := s.liveAt(chi.URLParam(r, "id"), at)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, l.Answer(g, all, limit))
}

// liveAt is the live set of trace id at an instant, with its categories.
func (s *Server) liveAt(id string, at attrib.Instant) (*attrib.Live, error) {
	c, err := s.cats.Categorizer(s.opt.DB, id)
	if err != nil {
		return nil, err
	}
	return c.At(at)
}

// frames reads frames: "all" keeps the frames views hide, "" does not.
func frames(p *params) bool {
	switch v := p.r.URL.Query().Get("frames"); v {
	case "":
		return false
	case "all":
		return true
	default:
		p.fail("frames", "%q is not all", v)
		return false
	}
}

// apiLiveProfile is the live set at an instant as a pprof profile
// (vramscope export --format pprof).
func (s *Server) apiLiveProfile(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	at := instant(p)
	all := frames(p)
	if !p.check(w) {
		return
	}
	id := chi.URLParam(r, "id")
	t, err := s.opt.DB.Trace(id)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	l, err := s.liveAt(id, at)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="%s-live-%d.pb.gz"`, t.ID, l.Seq))
	w.Header().Set("Cache-Control", "no-store")
	if err := attrib.WriteProfile(w, l, t, all); err != nil {
		s.log.Error("pprof", "path", r.URL.Path, "err", err)
	}
}

// apiSteps lists the trace's annotated regions (steps and phases), its
// steps with their peaks (from the from-th step on, limit of them: the
// peaks cost the steps' events), and where user_metadata changes.
func (s *Server) apiSteps(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	from := int(p.intIn("from", 0, 0, 1<<31))
	limit := int(p.intIn("limit", 200, 1, 2000))
	if !p.check(w) {
		return
	}
	c, err := s.cats.Categorizer(s.opt.DB, chi.URLParam(r, "id"))
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	out, err := c.StepPeaks(from, limit)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// apiBandCategories is the category of each band of a window, in the
// order of /bands with the same parameters: the timeline colours bands by
// it and stacks the bytes of each category.
func (s *Server) apiBandCategories(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	q := bandsQuery(p)
	if !p.check(w) {
		return
	}
	id := chi.URLParam(r, "id")
	bands, err := s.opt.DB.Bands(id, q)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	c, err := s.cats.Categorizer(s.opt.DB, id)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	out, err := c.BandCategories(bands)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// apiCategoryAreas is the live bytes of each category in n columns of
// [t0, t1] (of events with axis=event), each at its peak: the timeline's
// stacked areas by category.
func (s *Server) apiCategoryAreas(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	t0, t1, n := window(p, "n", 100, 2000)
	events := eventAxis(p)
	if !p.check(w) {
		return
	}
	c, err := s.cats.Categorizer(s.opt.DB, chi.URLParam(r, "id"))
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	a, err := c.Areas(store.BandsQuery{T0: t0, T1: t1, W: n, Events: events})
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, a)
}
