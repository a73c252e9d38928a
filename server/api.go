package server

import (
	"errors"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"vramscope/attrib"
	"vramscope/gpu"
	"vramscope/store"
)

// maxEvents caps one events answer; clients page with from/to.
const maxEvents = 10000

// apiTraces lists the traces a page at a time: limit (100, at most 1000)
// from offset, sorted and filtered as the list page is (listQuery).
func (s *Server) apiTraces(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	q := listQuery(p)
	q.Limit = int(p.intIn("limit", 100, 1, 1000))
	q.Offset = int(p.intIn("offset", 0, 0, 1<<40))
	if !p.check(w) {
		return
	}
	ts, total, err := s.opt.DB.TraceList(q)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	if ts == nil {
		ts = []gpu.Trace{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"traces": ts, "total": total, "offset": q.Offset, "limit": q.Limit})
}

// listQuery reads the list's filters (name: part of it; source; status)
// and order (sort: a store.ListSorts key; order: asc or desc).
func listQuery(p *params) store.ListQuery {
	v := p.r.URL.Query()
	q := store.ListQuery{Name: v.Get("name"), Source: gpu.TraceSource(v.Get("source")), Status: gpu.TraceStatus(v.Get("status")), Sort: v.Get("sort")}
	if _, ok := store.ListSorts[q.Sort]; q.Sort != "" && !ok {
		p.fail("sort", "%q is not one of %s", q.Sort, strings.Join(slices.Sorted(maps.Keys(store.ListSorts)), ", "))
	}
	switch o := v.Get("order"); o {
	case "asc":
		q.Asc = true
	case "", "desc":
	default:
		p.fail("order", "%q is not asc or desc", o)
	}
	return q
}

// apiDeleteTrace removes a trace: 409 while it is being written, 507 when
// even the reserve left no room to delete on a full disk.
func (s *Server) apiDeleteTrace(w http.ResponseWriter, r *http.Request) {
	s.deleted(w, r, s.opt.DB.DeleteTrace(chi.URLParam(r, "id")))
}

// deleted answers a delete that returned err.
func (s *Server) deleted(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, store.ErrBusy):
		writeError(w, http.StatusConflict, "%v", err)
	case errors.Is(err, store.ErrDiskFull):
		writeError(w, http.StatusInsufficientStorage, "deleting: %v; what is deleted is hidden and its rows go when the server next starts with some room", err)
	default:
		s.storeError(w, r, err)
	}
}

// window reads t0, t1 (microseconds, t0 < t1) and n columns.
func window(p *params, nName string, nDef, nMax int64) (t0, t1 int64, n int) {
	t0 = p.required("t0")
	t1 = p.required("t1")
	if p.err == nil && t1 <= t0 {
		p.fail("t1", "must be greater than t0 (%d)", t0)
	}
	n = int(p.intIn(nName, nDef, 1, nMax))
	return
}

// eventAxis reads axis: time (the default: t0 and t1 are microseconds) or
// event (t0 and t1 are event indexes, each event the same width).
func eventAxis(p *params) bool {
	switch a := p.r.URL.Query().Get("axis"); a {
	case "", "time":
		return false
	case "event":
		return true
	default:
		p.fail("axis", "%q is neither time nor event", a)
		return false
	}
}

// apiUsage is reserved, allocated and active bytes over a window in n
// columns: of time, or with axis=event of events (the columns' times
// follow them).
func (s *Server) apiUsage(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	t0, t1, n := window(p, "n", 1000, 20000)
	bin := format(p)
	events := eventAxis(p)
	if !p.check(w) {
		return
	}
	if events {
		u, err := s.opt.DB.UsageByEvent(chi.URLParam(r, "id"), t0, t1, n)
		if err != nil {
			s.storeError(w, r, err)
		} else if bin {
			writeBinary(w, u.AppendBinary(nil))
		} else {
			writeJSON(w, http.StatusOK, u)
		}
		return
	}
	u, err := s.opt.DB.Usage(chi.URLParam(r, "id"), t0, t1, n)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	out := u.Columns()
	if bin {
		writeBinary(w, out.AppendBinary(nil))
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// apiSeqTimes is where the trace's events fall in time (pairs of seq and
// time, about n of them): what a page needs to place times on an event
// axis beyond the window it has columns of.
func (s *Server) apiSeqTimes(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	n := int(p.intIn("n", 1000, 1, 100000))
	if !p.check(w) {
		return
	}
	out, err := s.opt.DB.SeqTimes(chi.URLParam(r, "id"), n)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// apiSeqAt is the last event at or before time t (-1: none): where a
// window of time begins and ends on the event axis.
func (s *Server) apiSeqAt(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	t := p.required("t")
	if !p.check(w) {
		return
	}
	seq, err := s.opt.DB.SeqAt(chi.URLParam(r, "id"), t)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"seq": seq})
}

func (s *Server) apiLayout(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	// seq asks for the layout right after that event (an incident's oom),
	// which a time cannot name when several events share it.
	var t, seq int64
	var l *gpu.Layout
	var err error
	if r.URL.Query().Has("seq") {
		seq = p.intIn("seq", 0, -1, 1<<62)
		if !p.check(w) {
			return
		}
		l, seq, err = s.opt.DB.LayoutAtSeq(chi.URLParam(r, "id"), seq)
		if err == nil && seq >= 0 {
			var evs []gpu.Event
			if evs, err = s.opt.DB.Events(chi.URLParam(r, "id"), seq, seq+1); len(evs) == 1 {
				t = evs[0].TimeUS
			}
		}
	} else {
		t = p.required("t")
		if !p.check(w) {
			return
		}
		l, seq, err = s.opt.DB.LayoutAt(chi.URLParam(r, "id"), t)
	}
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	out := store.NewLayoutColumns(l, t, seq)
	segs, err := s.opt.DB.PoolSegments(chi.URLParam(r, "id"))
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	out.MarkPools(segs)
	writeJSON(w, http.StatusOK, out)
}

type eventJSON struct {
	Seq        int64  `json:"seq"`
	TimeUS     int64  `json:"time_us"`
	Action     string `json:"action"`
	Stream     int64  `json:"stream"`
	Addr       uint64 `json:"address"`
	Size       uint64 `json:"size"`
	BlockSize  uint64 `json:"block_size,omitempty"`
	DeviceFree uint64 `json:"device_free,omitempty"`
	Stack      uint32 `json:"stack,omitempty"`
}

func toEventJSON(e gpu.Event) eventJSON {
	return eventJSON{Seq: e.Seq, TimeUS: e.TimeUS, Action: e.Action.String(), Stream: e.Stream, Addr: e.Addr,
		Size: e.Size, BlockSize: e.BlockSize, DeviceFree: e.DeviceFree, Stack: uint32(e.Stack)}
}

func (s *Server) apiEvents(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	from := p.intIn("from", 0, 0, 1<<62)
	to := p.intIn("to", from+100, 0, 1<<62)
	if p.err == nil && to < from {
		p.fail("to", "must not be less than from (%d)", from)
	}
	if p.err == nil && to-from > maxEvents {
		p.fail("to", "at most %d events per request (from %d to %d asks for %d)", maxEvents, from, to, to-from)
	}
	if !p.check(w) {
		return
	}
	id := chi.URLParam(r, "id")
	evs, err := s.opt.DB.Events(id, from, to)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	out := make([]eventJSON, len(evs))
	sids := make([]gpu.StackID, len(evs))
	for i, e := range evs {
		out[i] = toEventJSON(e)
		sids[i] = e.Stack
	}
	labels, err := s.opt.DB.Labels(id, sids)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	t, err := s.opt.DB.Trace(id)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	md, _, err := s.opt.DB.UserMetadata(t, from, to, maxEvents)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	meta := make(map[int64]string, len(md))
	for _, m := range md {
		meta[m.Seq] = m.Text
	}
	// labels: the first user frame of each stack the events name;
	// user_metadata: by seq, for the events that have one.
	writeJSON(w, http.StatusOK, map[string]any{"events": out, "labels": labels, "user_metadata": meta})
}

func (s *Server) apiAllocations(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	t0, t1, limit := window(p, "limit", 100, 10000)
	min := p.intIn("min_bytes", 0, 0, 1<<62)
	if !p.check(w) {
		return
	}
	a, err := s.opt.DB.Allocations(chi.URLParam(r, "id"), t0, t1, uint64(min), limit)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	if a.Allocations == nil {
		a.Allocations = []gpu.Allocation{}
	}
	writeJSON(w, http.StatusOK, a)
}

// allocationJSON is one allocation with its stack and the events that
// made and ended it.
type allocationJSON struct {
	gpu.Allocation
	stackJSON
	Events  []eventJSON    `json:"events"`
	Verdict attrib.Verdict `json:"verdict"` // its category, and where one without frames was made
}

func (s *Server) apiAllocation(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	seq, err := strconv.ParseInt(chi.URLParam(r, "seq"), 10, 64)
	if err != nil || seq < 0 {
		writeError(w, http.StatusBadRequest, "parameter seq: %q is not an event sequence number", chi.URLParam(r, "seq"))
		return
	}
	a, st, err := s.opt.DB.Allocation(id, seq)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	out := allocationJSON{Allocation: a, stackJSON: toStackJSON(st), Events: []eventJSON{}}
	evs, err := s.opt.DB.AllocationEvents(id, a)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	for _, e := range evs {
		out.Events = append(out.Events, toEventJSON(e))
	}
	c, err := s.cats.Categorizer(s.opt.DB, id)
	if err == nil {
		out.Verdict, err = c.VerdictOf(a)
	}
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) apiStack(w http.ResponseWriter, r *http.Request) {
	sid, err := strconv.ParseUint(chi.URLParam(r, "sid"), 10, 32)
	if err != nil || sid == 0 {
		writeError(w, http.StatusBadRequest, "parameter sid: %q is not a stack id", chi.URLParam(r, "sid"))
		return
	}
	st, err := s.opt.DB.Stack(chi.URLParam(r, "id"), gpu.StackID(sid))
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "private, max-age=3600") // stacks never change
	writeJSON(w, http.StatusOK, toStackJSON(st))
}
