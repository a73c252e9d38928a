package server

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"vramscope/gpu"
	"vramscope/incident"
	"vramscope/replay"
	"vramscope/store"
	"vramscope/web"
)

// maxPinnerStacks bounds the stacks sent with an incident: the groups are
// sorted by how many segments they pin, and the tail matters little.
const maxPinnerStacks = 50

// whatifWait is how long a what-if request waits for the replays before
// answering 202 "running"; the page asks again.
const whatifWait = 10 * time.Second

// incidentJSON is one OOM explained, with the frames of its pinning stacks
// and the window the page shows first.
type incidentJSON struct {
	Trace    string          `json:"trace"`
	N        int             `json:"n"`
	Count    int             `json:"count"`
	Incident gpu.Incident    `json:"incident"`
	Report   incident.Report `json:"report"`
	// CapacityEstimated: the trace lacks its device's capacity (snapshots
	// do), so Report.Capacity is what the allocator held plus what the
	// device had free at this OOM.
	CapacityEstimated bool                 `json:"capacity_estimated"`
	Stacks            map[string]gpu.Stack `json:"stacks"`
	Window            struct {
		T0 int64 `json:"t0"`
		T1 int64 `json:"t1"`
	} `json:"window"`
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
	out, err := s.explain(chi.URLParam(r, "id"), n)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// explain analyzes incident n from the layout right after its oom event.
func (s *Server) explain(id string, n int) (incidentJSON, error) {
	db := s.opt.DB
	var out incidentJSON
	t, err := db.Trace(id)
	if err != nil {
		return out, err
	}
	all, err := db.Incidents(id)
	if err != nil {
		return out, err
	}
	if n > len(all) {
		return out, fmt.Errorf("trace %q has no incident %d: %w", id, n, store.ErrNotFound)
	}
	in := all[n-1]
	evs, err := db.Events(id, in.Seq, in.Seq+1)
	if err != nil {
		return out, err
	}
	if len(evs) != 1 || evs[0].Action != gpu.ActionOOM {
		return out, fmt.Errorf("trace %q: incident %d (event %d) is not an oom event", id, n, in.Seq)
	}
	l, _, err := db.LayoutAtSeq(id, in.Seq)
	if err != nil {
		return out, err
	}
	capacity := t.Capacity
	if capacity == 0 {
		capacity = l.Figures().Reserved + in.DeviceFree
		out.CapacityEstimated = true
	}
	out.Trace, out.N, out.Count, out.Incident = id, n, len(all), in
	out.Report = incident.Analyze(l, evs[0], capacity)
	out.Stacks = map[string]gpu.Stack{}
	for i, g := range out.Report.Pinners {
		if i == maxPinnerStacks {
			break
		}
		if g.Stack == 0 {
			continue
		}
		st, err := db.Stack(id, g.Stack)
		if err != nil {
			return out, err
		}
		out.Stacks[strconv.FormatUint(uint64(g.Stack), 10)] = st
	}
	// The time leading up to the OOM, ending just after it.
	lead := max((t.LastUS-t.FirstUS)/4, 2_000_000)
	out.Window.T0 = max(t.FirstUS, in.TimeUS-lead)
	out.Window.T1 = in.TimeUS + max((in.TimeUS-out.Window.T0)/20, 10)
	out.WhatIfURL = "/api/traces/" + id + "/incidents/" + strconv.Itoa(n) + "/whatif"
	return out, nil
}

// whatifJSON is the what-if table of one incident.
type whatifJSON struct {
	Status string `json:"status"` // "done" or "running"
	*incident.Table
}

type whatifKey struct {
	id      string
	n       int
	lastSeq int64 // a live trace that grew gets a new replay
}

// whatifJob is one computation; done closes when out or err is set.
type whatifJob struct {
	done chan struct{}
	out  whatifJSON
	err  error
}

// whatifCache holds recent what-if tables in memory, and runs one replay
// at a time: they are CPU-bound and can take a while on big traces.
type whatifCache struct {
	mu   sync.Mutex
	max  int
	wait time.Duration // whatifWait
	jobs map[whatifKey]*whatifJob
	keys []whatifKey
	run  chan struct{}
}

func newWhatifCache(n int) *whatifCache {
	return &whatifCache{max: n, wait: whatifWait, jobs: map[whatifKey]*whatifJob{}, run: make(chan struct{}, 1)}
}

// get returns the job for k, starting it with compute when there is none.
func (c *whatifCache) get(k whatifKey, compute func() (whatifJSON, error)) *whatifJob {
	c.mu.Lock()
	defer c.mu.Unlock()
	if j, ok := c.jobs[k]; ok {
		return j
	}
	if len(c.keys) >= c.max {
		delete(c.jobs, c.keys[0])
		c.keys = c.keys[1:]
	}
	j := &whatifJob{done: make(chan struct{})}
	c.jobs[k] = j
	c.keys = append(c.keys, k)
	go func() {
		c.run <- struct{}{}
		defer func() { <-c.run }()
		defer close(j.done)
		j.out, j.err = compute()
		if j.err != nil {
			// A failure is not kept: the next request tries again.
			c.mu.Lock()
			if c.jobs[k] == j {
				delete(c.jobs, k)
			}
			c.mu.Unlock()
		}
	}()
	return j
}

func (s *Server) apiWhatIf(w http.ResponseWriter, r *http.Request) {
	n, ok := incidentN(w, r)
	if !ok {
		return
	}
	id := chi.URLParam(r, "id")
	t, err := s.opt.DB.Trace(id)
	if err == nil {
		_, err = s.opt.DB.IncidentN(id, n)
	}
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	j := s.whatifs.get(whatifKey{id, n, t.LastSeq}, func() (whatifJSON, error) { return s.whatIf(t, n) })
	timer := time.NewTimer(s.whatifs.wait)
	defer timer.Stop()
	select {
	case <-j.done:
	case <-timer.C:
		writeJSON(w, http.StatusAccepted, whatifJSON{Status: "running"})
		return
	case <-r.Context().Done():
		return
	}
	if j.err != nil {
		if errors.Is(j.err, store.ErrNotFound) {
			s.storeError(w, r, j.err)
			return
		}
		s.log.Error("what-if", "trace", id, "incident", n, "err", j.err)
		writeError(w, http.StatusInternalServerError, "what-if replay: %v", j.err)
		return
	}
	writeJSON(w, http.StatusOK, j.out)
}

// whatIf replays the whole trace as `vramscope whatif TRACE` does, with
// fragmentation measured at incident n's request.
func (s *Server) whatIf(t gpu.Trace, n int) (whatifJSON, error) {
	rec, err := s.opt.DB.Recording(t.ID)
	if err != nil {
		return whatifJSON{}, err
	}
	table, err := incident.Answer(replay.FromRecording(rec), n)
	return whatifJSON{Status: "done", Table: &table}, err
}

// pageIncident is the incident page: a frame that incident.js fills from
// the API.
func (s *Server) pageIncident(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	t, err := s.opt.DB.Trace(id)
	var all []gpu.Incident
	if err == nil {
		all, err = s.opt.DB.Incidents(id)
	}
	if errors.Is(err, store.ErrNotFound) {
		render(w, r, http.StatusNotFound, web.NotFound(page("Not found"), "There is no trace "+id+"."))
		return
	}
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	n, err := strconv.Atoi(chi.URLParam(r, "n"))
	if err != nil || n < 1 || n > len(all) {
		msg := "Trace " + id + " has no incident " + chi.URLParam(r, "n") + "."
		if len(all) == 0 {
			msg = "Trace " + id + " had no out-of-memory error."
		}
		render(w, r, http.StatusNotFound, web.NotFound(page("Not found"), msg))
		return
	}
	title := t.Name
	if title == "" {
		title = t.ID
	}
	render(w, r, http.StatusOK, web.IncidentPage(page(title+" · incident "+strconv.Itoa(n)), t, all, n))
}
