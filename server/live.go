package server

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"vramscope/live"
	"vramscope/live/python"
	"vramscope/server/guard"
)

// mountLive adds live watching: the ingest and viewer websockets, which
// must sit outside the timeout and compression middleware, and the Python
// helper a PyTorch job imports.
func (s *Server) mountLive(r chi.Router) {
	lo := s.opt.Live
	lo.Logger = s.log
	hub := live.NewHub(s.opt.DB, lo)
	s.hub = hub
	ingest := guard.RequireToken(s.opt.Token)(http.HandlerFunc(hub.ServeIngest))
	if s.opt.Token == "" && !guard.Loopback(s.opt.Addr) {
		// Beyond loopback anyone could write traces: ingest needs a token.
		ingest = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			writeError(w, http.StatusUnauthorized, "this server listens beyond loopback without a token, so it takes no live streams: start it with --token")
		})
	}
	r.Method(http.MethodGet, "/ws/ingest", ingest)
	r.Get("/ws/traces/{id}", func(w http.ResponseWriter, r *http.Request) {
		tr, err := s.opt.DB.Trace(chi.URLParam(r, "id"))
		if err != nil {
			s.storeError(w, r, err)
			return
		}
		hub.ServeViewer(w, r, tr)
	})
	for name, src := range map[string][]byte{python.FileName: python.Source, python.EstimateFileName: python.EstimateSource} {
		r.Get("/"+name, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/x-python; charset=utf-8")
			w.Write(src)
		})
	}
}
