package server

import (
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"

	"vramscope/gpu/caching"
)

// apiSummary is memory_summary() at time t, as text.
func (s *Server) apiSummary(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	// seq asks for the statistics right after that event; t after the
	// last event at or before that time.
	bySeq := r.URL.Query().Has("seq")
	var t, seq int64
	if bySeq {
		seq = p.intIn("seq", 0, -1, 1<<62)
	} else {
		t = p.required("t")
	}
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
	var st *caching.Stats
	if bySeq {
		st, seq, err = s.opt.DB.StatsAtSeq(id, seq)
	} else {
		st, seq, err = s.opt.DB.StatsAt(id, t)
	}
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Seq", strconv.FormatInt(seq, 10))
	w.Write([]byte(st.Summary(tr.DeviceOrdinal, abbrev == "1" || abbrev == "true")))
}
