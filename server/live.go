package server

import (
	"errors"
	"net/http"

	"github.com/go-chi/chi/v5"

	"vramscope/gpu"
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

// apiComplete asks the job streaming a trace to read every entry of its
// next steps (POST ?steps=N, 10 when not given): 202 once asked, the read
// to come later; 409 when no job streams the trace to this server, or its
// stream reads every entry already.
func (s *Server) apiComplete(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	steps := p.intIn("steps", 10, 1, live.MaxCompleteSteps)
	if !p.check(w) {
		return
	}
	id := chi.URLParam(r, "id")
	tr, err := s.opt.DB.Trace(id)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	switch err := s.hub.Complete(id, int(steps)); {
	case errors.Is(err, live.ErrNotStreaming):
		why := "its stream has ended"
		if tr.Status == gpu.StatusLive {
			why = "it streams to another server of the team, or its job is reconnecting: ask again in a moment, or on that server"
		}
		writeError(w, http.StatusConflict, "trace %s: %v (%s)", id, err, why)
	case err != nil:
		writeError(w, http.StatusConflict, "trace %s: %v", id, err)
	default:
		writeJSON(w, http.StatusAccepted, map[string]any{"trace": id, "steps": steps})
	}
}
