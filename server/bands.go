package server

import (
	"net/http"

	"github.com/go-chi/chi/v5"
)

// apiBands is the stacked timeline of a window, answered per pixel column.
func (s *Server) apiBands(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	t0, t1, cols := window(p, "w", 1000, 8000)
	h := p.intIn("h", 300, 10, 10000)
	if !p.check(w) {
		return
	}
	out, err := s.opt.DB.Bands(chi.URLParam(r, "id"), t0, t1, cols, int(h))
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
