package server

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"vramscope/gpu"
	"vramscope/incident"
	"vramscope/predict"
	"vramscope/replay"
	"vramscope/web"
)

// Predictions (package predict): the memory a job needs at other batch
// sizes, from two traces of it. The compare page of two traces asks for
// one; an incident page asks which batch would have fit.

// predictWait is how long the Predict page or the API waits for a
// prediction before saying it is still running (the page reads itself
// again); an incident page waits fitWait, as it has more to show.
const (
	predictWait = 3 * time.Second
	fitWait     = time.Second
)

// predictKeep is how many predictions the server keeps.
const predictKeep = 16

// predictions runs fits in the background, one replay at a time with the
// what-if replays (the server's replay slot), and keeps the last few.
type predictions struct {
	mu    sync.Mutex
	jobs  map[string]*predictJob
	order []string // oldest first
}

type predictJob struct {
	done chan struct{}
	res  *predict.Result
	err  error
}

// prediction returns the job of key, starting run for it when there is
// none.
func (s *Server) prediction(key string, run func() (*predict.Result, error)) *predictJob {
	p := &s.predicts
	p.mu.Lock()
	defer p.mu.Unlock()
	if j, ok := p.jobs[key]; ok {
		return j
	}
	if p.jobs == nil {
		p.jobs = map[string]*predictJob{}
	}
	j := &predictJob{done: make(chan struct{})}
	p.jobs[key] = j
	p.order = append(p.order, key)
	if len(p.order) > predictKeep {
		delete(p.jobs, p.order[0])
		p.order = p.order[1:]
	}
	go func() {
		defer close(j.done)
		s.replaySlots <- struct{}{}
		defer func() { <-s.replaySlots }()
		defer func() {
			if v := recover(); v != nil {
				j.err = fmt.Errorf("the prediction failed: %v", v)
			}
		}()
		j.res, j.err = run()
	}()
	return j
}

// wait waits up to d for j; false when it is still running.
func (j *predictJob) wait(r *http.Request, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-j.done:
		return true
	case <-t.C:
	case <-r.Context().Done():
	}
	return false
}

// fitTraces fits the stored traces ids at the values at and answers o.
func (s *Server) fitTraces(ids []string, at []int, o predict.Options) (*predict.Result, error) {
	names, err := s.traceNames(ids)
	if err != nil {
		return nil, err
	}
	recs := make([]predict.Recording, len(ids))
	for i, id := range ids {
		rec, err := s.opt.DB.Recording(id)
		if err != nil {
			return nil, err
		}
		st := replay.FromRecording(rec)
		st.Use(0, replay.DefaultCapacity)
		recs[i] = predict.Recording{Name: names[i], At: at[i], Stream: st}
	}
	return predict.Answer(predict.Batch, recs, o)
}

// traceNames names traces ids as their pages do, in quotes; two of one
// name are told apart by their ids.
func (s *Server) traceNames(ids []string) ([]string, error) {
	titles := make([]string, len(ids))
	seen := map[string]int{}
	for i, id := range ids {
		t, err := s.opt.DB.Trace(id)
		if err != nil {
			return nil, err
		}
		titles[i] = t.Title()
		seen[titles[i]]++
	}
	names := make([]string, len(ids))
	for i, t := range titles {
		names[i] = strconv.Quote(t)
		if seen[t] > 1 {
			names[i] += " (" + ids[i] + ")"
		}
	}
	return names, nil
}

// predictQuery reads a prediction's parameters: batch_a and batch_b (the
// traces' batch sizes), at (a list), capacity (a size) and whatif (1).
func predictQuery(r *http.Request) (q web.PredictQuery, o predict.Options, err error) {
	v := r.URL.Query()
	q = web.PredictQuery{BatchA: v.Get("batch_a"), BatchB: v.Get("batch_b"), At: v.Get("at"), Capacity: v.Get("capacity"), WhatIf: v.Get("whatif") == "1"}
	if q.BatchA == "" && q.BatchB == "" {
		return q, o, nil // the form, not filled in yet
	}
	for _, f := range []struct{ name, val string }{{"batch_a", q.BatchA}, {"batch_b", q.BatchB}} {
		if n, err := strconv.Atoi(f.val); err != nil || n <= 0 {
			return q, o, fmt.Errorf("parameter %s: %q is not a batch size (a positive whole number)", f.name, f.val)
		}
	}
	if q.At != "" {
		for _, f := range strings.Split(q.At, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 || n > 1<<24 {
				return q, o, fmt.Errorf("parameter at: %q is not a batch size (a positive whole number)", f)
			}
			o.At = append(o.At, n)
		}
		if len(o.At) > 32 {
			return q, o, fmt.Errorf("parameter at: %d batch sizes, at most 32", len(o.At))
		}
	}
	if q.Capacity != "" {
		if o.Capacity, err = gpu.ParseBytes(q.Capacity); err != nil || o.Capacity < gpu.SmallBuffer {
			return q, o, fmt.Errorf("parameter capacity: %q is not a device's memory (as in 80GiB)", q.Capacity)
		}
	}
	if q.WhatIf {
		o.Variants = incident.Variants
	}
	return q, o, nil
}

// predictOf starts (or finds) the prediction the request asks of traces
// a and b.
func (s *Server) predictOf(a, b string, q web.PredictQuery, o predict.Options) *predictJob {
	ba, _ := strconv.Atoi(q.BatchA)
	bb, _ := strconv.Atoi(q.BatchB)
	key := fmt.Sprintf("compare\x00%s\x00%s\x00%d\x00%d\x00%v\x00%d\x00%v", a, b, ba, bb, o.At, o.Capacity, q.WhatIf)
	return s.prediction(key, func() (*predict.Result, error) { return s.fitTraces([]string{a, b}, []int{ba, bb}, o) })
}

// apiPredict answers GET /api/compare/{a}/{b}/predict: the fit and its
// predictions as JSON (what vramscope fit --json prints), 202 while it
// runs.
func (s *Server) apiPredict(w http.ResponseWriter, r *http.Request) {
	a, b := chi.URLParam(r, "a"), chi.URLParam(r, "b")
	q, o, err := predictQuery(r)
	if err == nil && q.BatchA == "" {
		err = errors.New("parameters batch_a and batch_b: the batch sizes of the two traces are needed")
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	for _, id := range []string{a, b} {
		if _, err := s.opt.DB.Trace(id); err != nil {
			s.storeError(w, r, err)
			return
		}
	}
	j := s.predictOf(a, b, q, o)
	if !j.wait(r, predictWait) {
		writeJSON(w, http.StatusAccepted, map[string]string{"status": "running"})
		return
	}
	switch {
	case errors.Is(j.err, predict.ErrNotSameProgram), errors.Is(j.err, predict.ErrSameValue):
		writeError(w, http.StatusUnprocessableEntity, "%v", j.err)
	case j.err != nil:
		writeError(w, http.StatusInternalServerError, "prediction: %v", j.err)
	default:
		writeJSON(w, http.StatusOK, j.res)
	}
}

// pagePredict is the Predict page of two traces: the compare page's form
// and, once asked, the predictions.
func (s *Server) pagePredict(w http.ResponseWriter, r *http.Request) {
	ts, ok := s.tracePair(w, r)
	if !ok {
		return
	}
	q, o, err := predictQuery(r)
	v := web.PredictState{A: ts[0], B: ts[1], Query: q}
	switch {
	case err != nil:
		v.Err = err.Error()
	case q.BatchA == "":
		v.Query = web.PredictDefaults(ts[0], ts[1])
	default:
		j := s.predictOf(ts[0].ID, ts[1].ID, q, o)
		if !j.wait(r, predictWait) {
			v.Running = true
		} else if j.err != nil {
			v.Err = j.err.Error()
		} else {
			v.Result = j.res
		}
	}
	status := http.StatusOK
	if err != nil {
		status = http.StatusBadRequest
	}
	render(w, r, status, web.PredictPage(s.pageOf("Predict: "+ts[0].Title()+" vs "+ts[1].Title(), ts[:], "A", "B"), v))
}

// batchPair finds, for a trace that ran out of memory, two complete
// traces of the same job at other batch sizes without an OOM, as their
// names say ("gpt batch 2", "gpt batch 4" for "gpt batch 32"): the two
// largest batches below t's. ok is false when there are none.
func (s *Server) batchPair(t gpu.Trace) (pair [2]gpu.Trace, at [2]int, ok bool) {
	batch, job, named := predict.BatchInName(t.Name)
	if !named {
		return pair, at, false
	}
	all, err := s.opt.DB.Traces()
	if err != nil {
		return pair, at, false
	}
	type cand struct {
		t     gpu.Trace
		batch int
	}
	var cands []cand
	for _, o := range all {
		n, j, ok := predict.BatchInName(o.Name)
		if !ok || j != job || n >= batch || o.OOMs > 0 || o.Status != gpu.StatusComplete || o.DeviceOrdinal != t.DeviceOrdinal {
			continue
		}
		if slices.ContainsFunc(cands, func(c cand) bool { return c.batch == n }) {
			continue
		}
		cands = append(cands, cand{o, n})
	}
	if len(cands) < 2 {
		return pair, at, false
	}
	slices.SortFunc(cands, func(x, y cand) int { return cmp.Compare(y.batch, x.batch) })
	// The smaller first: the prediction follows its requests.
	return [2]gpu.Trace{cands[1].t, cands[0].t}, [2]int{cands[1].batch, cands[0].batch}, true
}

// batchFit is the sentence an incident page says of which batch would
// have fit trace t's device, "" when no pair of its job's traces says.
func (s *Server) batchFit(r *http.Request, t gpu.Trace) string {
	pair, at, ok := s.batchPair(t)
	if !ok {
		return ""
	}
	batch, _, _ := predict.BatchInName(t.Name)
	key := fmt.Sprintf("incident\x00%s\x00%s\x00%s", t.ID, pair[0].ID, pair[1].ID)
	j := s.prediction(key, func() (*predict.Result, error) {
		capacity, err := s.deviceOf(t)
		if err != nil {
			return nil, err
		}
		return s.fitTraces([]string{pair[0].ID, pair[1].ID}, at[:], predict.Options{At: []int{batch}, Capacity: capacity})
	})
	from := fmt.Sprintf("Predicted from the traces %q and %q, recorded at batch %d and %d.", pair[0].Title(), pair[1].Title(), at[0], at[1])
	if !j.wait(r, fitWait) {
		return "Which batch size would have fit is being worked out from " + pair[0].Title() + " and " + pair[1].Title() + ": reload in a moment."
	}
	if j.err != nil {
		return "Which batch size would have fit could not be worked out from " + pair[0].Title() + " and " + pair[1].Title() + ": " + j.err.Error()
	}
	res := j.res
	device := gpu.FormatBytes(res.Capacity)
	switch l := res.Largest; {
	case l == predict.Unbounded:
		return "Nothing this job asks for grows with the batch size. " + from
	case l == 0:
		return fmt.Sprintf("No batch size would have fit this %s device, not even 1. %s", device, from)
	case l < batch:
		return fmt.Sprintf("Batch %d would have fit this %s device; batch %d needs %s. %s", l, device, batch, needText(res.Predictions[0].CapacityNeeded), from)
	default:
		return fmt.Sprintf("Batch %d itself fits a %s device by the prediction (it needs %s): the allocator's settings or what else held the device made the difference. %s",
			batch, device, needText(res.Predictions[0].CapacityNeeded), from)
	}
}

// deviceOf is the memory of the device trace t ran on: recorded, else
// what its OOM implies (a PyTorch snapshot does not say), else a default.
func (s *Server) deviceOf(t gpu.Trace) (uint64, error) {
	if t.Capacity > 0 {
		return t.Capacity, nil
	}
	rec, err := s.opt.DB.Recording(t.ID)
	if err != nil {
		return 0, err
	}
	st := replay.FromRecording(rec)
	st.Use(0, replay.DefaultCapacity)
	return st.Capacity.Bytes, nil
}

func needText(n uint64) string {
	if n == 0 {
		return "more than " + gpu.FormatBytes(replay.MaxCapacityNeeded)
	}
	return gpu.FormatBytes(n)
}
