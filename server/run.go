package server

import (
	"errors"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/go-chi/chi/v5"

	"vramscope/gpu"
	"vramscope/store"
	"vramscope/web"
)

// Runs: a page per run (the heatmap of its ranks over time, drawn by
// run.js), its JSON, its heatmap and its removal.

// runOfPage reads the run a page is about; ok is false after answering.
func (s *Server) runOfPage(w http.ResponseWriter, r *http.Request) (gpu.Run, bool) {
	run, err := s.opt.DB.Run(chi.URLParam(r, "id"))
	if errors.Is(err, store.ErrNotFound) {
		render(w, r, http.StatusNotFound, web.NotFound(page("Not found"), "There is no run "+chi.URLParam(r, "id")+"."))
		return run, false
	}
	if err != nil {
		s.storeError(w, r, err)
		return run, false
	}
	return run, true
}

func (s *Server) pageRun(w http.ResponseWriter, r *http.Request) {
	if run, ok := s.runOfPage(w, r); ok {
		t0, t1 := store.RunWindow(run)
		render(w, r, http.StatusOK, web.RunView(page(run.Name), run, t0, t1))
	}
}

func (s *Server) apiRun(w http.ResponseWriter, r *http.Request) {
	run, err := s.opt.DB.Run(chi.URLParam(r, "id"))
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, run)
}

func (s *Server) apiDeleteRun(w http.ResponseWriter, r *http.Request) {
	s.deleted(w, r, s.opt.DB.DeleteRun(chi.URLParam(r, "id")))
}

// maxHeatmapColumns caps a heatmap's buckets.
const maxHeatmapColumns = 4000

// apiRunHeatmap answers ?series=allocated|reserved (allocated), n columns
// (1000) over [t0, t1] (the whole run when absent).
func (s *Server) apiRunHeatmap(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	series := r.URL.Query().Get("series")
	if series == "" {
		series = "allocated"
	}
	if _, ok := store.HeatmapSeries[series]; !ok {
		p.fail("series", "%q is not one of %s", series, strings.Join(slices.Sorted(maps.Keys(store.HeatmapSeries)), ", "))
	}
	n := int(p.intIn("n", 1000, 1, maxHeatmapColumns))
	run, err := s.opt.DB.Run(chi.URLParam(r, "id"))
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	t0, t1 := store.RunWindow(run)
	t0, t1 = p.int64("t0", t0), p.int64("t1", t1)
	if p.err == nil && t1 < t0 {
		p.fail("t1", "must not be less than t0 (%d)", t0)
	}
	if !p.check(w) {
		return
	}
	h, err := s.opt.DB.RunHeatmap(run, t0, t1, n, series)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, h)
}
