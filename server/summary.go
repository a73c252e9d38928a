package server

import (
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"
)

// apiSummary is memory_summary() at time t, as text.
func (s *Server) apiSummary(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	t := p.required("t")
	abbrev := r.URL.Query().Get("abbreviated")
	if abbrev != "" && abbrev != "0" && abbrev != "1" && abbrev != "true" && abbrev != "false" {
		p.fail("abbreviated", "%q is not a boolean (use 1 or 0)", abbrev)
	}
	if !p.check(w) {
		return
	}
	id := chi.URLParam(r, "id")
	tr, err := s.opt.DB.Trace(id)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	st, seq, err := s.opt.DB.StatsAt(id, t)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Seq", strconv.FormatInt(seq, 10))
	w.Write([]byte(st.Summary(tr.DeviceOrdinal, abbrev == "1" || abbrev == "true")))
}
