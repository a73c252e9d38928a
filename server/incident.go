package server

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/incident"
	"vramscope/store"
	"vramscope/web"
)

// whatifWait is how long a what-if request waits for the replays before
// answering 202 "running"; the page asks again.
const whatifWait = 10 * time.Second

// incidentJSON is one OOM explained, and where its what-if table is.
type incidentJSON struct {
	incident.Explanation
	WhatIfURL string `json:"whatif_url"`
}

// incidentN reads the {n} of a route; ok is false after answering 400.
func incidentN(w http.ResponseWriter, r *http.Request) (int, bool) {
	n, err := strconv.Atoi(chi.URLParam(r, "n"))
	if err != nil || n < 1 {
		writeError(w, http.StatusBadRequest, "parameter n: %q is not an incident number (1, 2, ...)", chi.URLParam(r, "n"))
		return 0, false
	}
	return n, true
}

func (s *Server) apiIncidents(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	ins, err := s.opt.DB.Incidents(id)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	type item struct {
		gpu.Incident
		URL string `json:"url"`
	}
	out := make([]item, len(ins))
	for i, in := range ins {
		out[i] = item{in, incidentURL(id, in.N)}
	}
	writeJSON(w, http.StatusOK, map[string]any{"incidents": out})
}

func incidentURL(id string, n int) string { return "/traces/" + id + "/incidents/" + strconv.Itoa(n) }

func (s *Server) apiIncident(w http.ResponseWriter, r *http.Request) {
	n, ok := incidentN(w, r)
	if !ok {
		return
	}
	id := chi.URLParam(r, "id")
	ex, err := incident.Explain(s.opt.DB, id, n)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, incidentJSON{ex, "/api" + incidentURL(id, n) + "/whatif"})
}

// whatifJSON is the what-if table of a trace; for an incident, read for
// its OOM too.
type whatifJSON struct {
	Status string `json:"status"` // "done" or "running"
	// Needed says what device the whole run needs (incident.Table.Needed).
	Needed   string           `json:"needed,omitempty"`
	Incident *incident.ForOOM `json:"incident,omitempty"`
	*incident.Table
}

// apiWhatIf answers incident n's what-if: the trace's table, and what it
// says of that OOM.
func (s *Server) apiWhatIf(w http.ResponseWriter, r *http.Request) {
	n, ok := incidentN(w, r)
	if !ok {
		return
	}
	id := chi.URLParam(r, "id")
	if _, err := s.opt.DB.IncidentN(id, n); err != nil {
		s.storeError(w, r, err)
		return
	}
	s.whatIf(w, r, id, func(out *whatifJSON) {
		if f, ok := out.Table.ForOOM(n - 1); ok {
			out.Incident = &f
		}
	})
}

// apiTraceWhatIf answers a trace's what-if: the table and the memory the
// run needs, OOM or not.
func (s *Server) apiTraceWhatIf(w http.ResponseWriter, r *http.Request) {
	s.whatIf(w, r, chi.URLParam(r, "id"), func(*whatifJSON) {})
}

// whatIf waits up to whatifWait for trace id's table, then answers with
// it (read by fill) or with 202 "running".
func (s *Server) whatIf(w http.ResponseWriter, r *http.Request, id string, fill func(*whatifJSON)) {
	t, err := s.opt.DB.Trace(id)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	// Imports check settings; a database from before they did may hold
	// some no replay can run under.
	if _, err := caching.ParseConfig(t.Settings); err != nil {
		writeError(w, http.StatusUnprocessableEntity, "this trace's allocator settings %q do not parse, so no what-if can run: %v", t.Settings, err)
		return
	}
	j := s.whatifs.WhatIf(id, t.LastSeq)
	timer := time.NewTimer(s.whatifWait)
	defer timer.Stop()
	select {
	case <-j.Done:
	case <-timer.C:
		writeJSON(w, http.StatusAccepted, whatifJSON{Status: "running"})
		return
	case <-r.Context().Done():
		return
	}
	if j.Err != nil {
		if errors.Is(j.Err, store.ErrNotFound) {
			s.storeError(w, r, j.Err)
			return
		}
		s.log.Error("what-if", "trace", id, "err", j.Err)
		writeError(w, http.StatusInternalServerError, "what-if replay: %v", j.Err)
		return
	}
	out := whatifJSON{Status: "done", Needed: j.Table.Needed(), Table: &j.Table}
	fill(&out)
	writeJSON(w, http.StatusOK, out)
}

// pageIncident is the incident page: a frame that incident.js fills from
// the API.
func (s *Server) pageIncident(w http.ResponseWriter, r *http.Request) {
	t, ok := s.traceOfPage(w, r)
	if !ok {
		return
	}
	all, err := s.opt.DB.Incidents(t.ID)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	n, err := strconv.Atoi(chi.URLParam(r, "n"))
	if err != nil || n < 1 || n > len(all) {
		msg := "Trace " + t.ID + " has no incident " + chi.URLParam(r, "n") + "."
		if len(all) == 0 {
			msg = "Trace " + t.ID + " had no out-of-memory error."
		}
		render(w, r, http.StatusNotFound, web.NotFound(page("Not found"), msg))
		return
	}
	render(w, r, http.StatusOK, web.IncidentPage(s.pageOf(t.Title()+" · incident "+strconv.Itoa(n), []gpu.Trace{t}), t, all, n, s.batchFit(r, t)))
}
