package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
	"vramscope/internal/testkit"
	"vramscope/predict"
	"vramscope/store"
	"vramscope/tracer"
)

// gpt is the training workload at a batch size, small enough to record
// quickly: a 16 GiB device fits batch 12 of it, not 32.
func gpt(batch int) tracer.Train {
	w := tracer.DefaultTrain()
	w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 4, 1024, 50304, batch, 1024, 2
	return w
}

// recordGPT records gpt at batch on a device of capacity bytes, named as
// a user names such runs.
func recordGPT(t *testing.T, db *store.DB, batch int, capacity uint64) string {
	return testkit.Record(t, db, fmt.Sprintf("gpt batch %d", batch), gpt(batch), capacity, "")
}

// The API's prediction of two traces is what vramscope fit answers, the
// recorded batch sizes as recorded.
func TestAPIPredict(t *testing.T) {
	f := newFixture(t, Options{})
	a, b, c := recordGPT(t, f.db, 2, 80<<30), recordGPT(t, f.db, 4, 80<<30), recordGPT(t, f.db, 8, 80<<30)
	var res struct {
		Paired      int `json:"paired"`
		Requests    int `json:"requests"`
		Predictions []struct {
			Batch          int    `json:"batch"`
			PeakAllocated  uint64 `json:"peak_allocated"`
			PeakReserved   uint64 `json:"peak_reserved"`
			CapacityNeeded uint64 `json:"capacity_needed"`
		} `json:"predictions"`
		Largest  int    `json:"largest_batch"`
		Capacity uint64 `json:"capacity_bytes"`
	}
	if err := json.Unmarshal(predicted(t, f.srv.URL+"/api/compare/"+a+"/"+b+"/predict?batch_a=2&batch_b=4&at=8,32&capacity=16GiB", http.StatusOK), &res); err != nil {
		t.Fatal(err)
	}
	if res.Paired == 0 || res.Paired != res.Requests || len(res.Predictions) != 2 || res.Capacity != 16<<30 {
		t.Fatalf("%+v", res)
	}
	tr, err := f.db.Trace(c)
	if err != nil {
		t.Fatal(err)
	}
	if p := res.Predictions[0]; p.Batch != 8 || p.PeakAllocated != tr.PeakAllocated || p.PeakReserved != tr.PeakReserved {
		t.Errorf("batch 8 predicted %+v; recorded %d allocated, %d reserved", p, tr.PeakAllocated, tr.PeakReserved)
	}
	if p := res.Predictions[1]; res.Largest < 8 || res.Largest >= 32 || p.CapacityNeeded <= 16<<30 {
		t.Errorf("largest batch on 16 GiB %d; batch 32 needs %d", res.Largest, p.CapacityNeeded)
	}

	for _, c := range []struct {
		query string
		code  int
		want  string
	}{
		{"", http.StatusBadRequest, "batch_a and batch_b"},
		{"batch_a=2&batch_b=x", http.StatusBadRequest, `parameter batch_b: \"x\" is not a batch size`},
		{"batch_a=2&batch_b=4&at=8,-1", http.StatusBadRequest, `parameter at: \"-1\"`},
		{"batch_a=2&batch_b=4&capacity=16", http.StatusBadRequest, "parameter capacity"},
	} {
		body := f.get(t, "/api/compare/"+a+"/"+b+"/predict?"+c.query, c.code)
		if !strings.Contains(string(body), c.want) {
			t.Errorf("%q: %s", c.query, body)
		}
	}
	// Two programs: refused, saying so.
	body := predicted(t, f.srv.URL+"/api/compare/"+a+"/"+f.id+"/predict?batch_a=2&batch_b=4", http.StatusUnprocessableEntity)
	var e struct{ Error string }
	if json.Unmarshal(body, &e); !strings.Contains(e.Error, "are not recordings of the same program") {
		t.Errorf("two programs: %s", body)
	}
	f.get(t, "/api/compare/"+a+"/nosuch/predict?batch_a=2&batch_b=4", http.StatusNotFound)
}

// The Predict page shows the predictions in a table, and the compare page
// links to it with the form filled from the traces' names.
func TestPredictPage(t *testing.T) {
	f := newFixture(t, Options{})
	a, b := recordGPT(t, f.db, 2, 80<<30), recordGPT(t, f.db, 4, 80<<30)
	page := string(f.get(t, "/compare/"+a+"/"+b, http.StatusOK))
	for _, want := range []string{`action="/compare/` + a + `/` + b + `/predict"`, `name="batch_a" min="1" required value="2"`, `name="batch_b" min="1" required value="4"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the compare page lacks %s", want)
		}
	}
	page = pageDone(t, f.srv.URL+"/compare/"+a+"/"+b+"/predict?batch_a=2&batch_b=4&at=8,16&capacity=16GiB", `data-running="1"`)
	if !strings.Contains(page, "<td class=\"num\">16</td>") {
		t.Errorf("the predict page lacks the row of batch 16")
	}
	// Every request of the first recording (its mallocs and frees, as
	// stored) pairs up with the second's: the same program at another
	// batch size.
	rec, err := f.db.Recording(a)
	if err != nil {
		t.Fatal(err)
	}
	requests := 0
	for _, e := range rec.Events {
		if e.Action == gpu.ActionAlloc || e.Action == gpu.ActionFreeRequested {
			requests++
		}
	}
	want := fmt.Sprintf("%d of %d requests pair up by stack and occurrence", requests, requests)
	if !strings.Contains(page, want) {
		t.Errorf("the predict page does not say %q: %.300q", want, regexp.MustCompile(`\d+ of \d+ requests[^.]*`).FindString(page))
	}
	if !regexp.MustCompile(`The largest batch that fits 16.00 GiB \(asked for\): [1-9][0-9]\.`).MatchString(page) {
		t.Error("the predict page does not say the largest batch")
	}
	page = pageDone(t, f.srv.URL+"/compare/"+a+"/"+f.id+"/predict?batch_a=2&batch_b=4", `data-running="1"`)
	if !strings.Contains(page, "are not recordings of the same program") {
		t.Error("the predict page of two programs does not say they are not one")
	}
	f.get(t, "/compare/"+a+"/"+b+"/predict?batch_a=0&batch_b=4", http.StatusBadRequest)
}

// The incident page of an OOM at batch 32 on a 16 GiB device, with the
// job recorded at batch 2 and 4, says which batch would have fit.
func TestIncidentSaysWhichBatchFits(t *testing.T) {
	f := newFixture(t, Options{})
	recordGPT(t, f.db, 2, 80<<30)
	recordGPT(t, f.db, 4, 80<<30)
	oom := recordGPT(t, f.db, 32, 16<<30)
	tr, err := f.db.Trace(oom)
	if err != nil || tr.OOMs == 0 {
		t.Fatalf("batch 32 on 16 GiB: %d OOMs, %v", tr.OOMs, err)
	}
	// What recording every batch size on that device finds.
	largest := 0
	for b := 8; ; b++ {
		id := testkit.Record(t, f.db, "probe", gpt(b), 16<<30, "")
		if pt, _ := f.db.Trace(id); pt.OOMs > 0 {
			break
		}
		largest = b
	}
	page := pageDone(t, f.srv.URL+"/traces/"+oom+"/incidents/1", "is being worked out")
	want := fmt.Sprintf(`<p id="batch-fit" class="note">Batch %d would have fit this 16.00 GiB device; batch 32 needs `, largest)
	if !strings.Contains(page, want) {
		i := strings.Index(page, `id="batch-fit"`)
		t.Fatalf("want %q; the page says %q", want, page[max(i, 0):min(len(page), max(i, 0)+300)])
	}
	// A trace whose name states no batch says nothing of it.
	if _, _, ok := predict.BatchInName(f.trace.Name); ok {
		t.Fatal("the fixture's name states a batch")
	}
}

// predicted GETs url until it is no longer 202 (a machine's replays
// queue behind others), and wants status then.
func predicted(t *testing.T, url string, want int) []byte {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		res, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		switch {
		case res.StatusCode == http.StatusAccepted && want != http.StatusAccepted && time.Now().Before(deadline):
			continue
		case res.StatusCode != want:
			t.Fatalf("GET %s: %d, want %d: %s", url, res.StatusCode, want, body)
		}
		return body
	}
}

// pageDone GETs the page at url until it no longer says running.
func pageDone(t *testing.T, url, running string) string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		page := string(predicted(t, url, http.StatusOK))
		if !strings.Contains(page, running) || time.Now().After(deadline) {
			return page
		}
	}
}

// While the replays wait for the server's replay slot, the API answers
// 202, the Predict page says so and reads itself again, and the incident
// page says it is being worked out; once free, each has its answer.
func TestPredictRunning(t *testing.T) {
	db := testkit.OpenDB(t)
	a, b := recordGPT(t, db, 2, 80<<30), recordGPT(t, db, 4, 80<<30)
	oom := recordGPT(t, db, 32, 16<<30)
	s := New(Options{DB: db, Logger: quietLogger()})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)

	s.replaySlots <- struct{}{}
	var body struct{ Status string }
	if err := json.Unmarshal(predicted(t, srv.URL+"/api/compare/"+a+"/"+b+"/predict?batch_a=2&batch_b=4&at=8", http.StatusAccepted), &body); err != nil || body.Status != "running" {
		t.Fatalf("while the slot is held: %+v, %v", body, err)
	}
	page := string(predicted(t, srv.URL+"/compare/"+a+"/"+b+"/predict?batch_a=2&batch_b=4&at=8", http.StatusOK))
	if !strings.Contains(page, `data-running="1"`) || !strings.Contains(page, "Replaying the job at each batch size") {
		t.Error("the Predict page does not say it is running")
	}
	page = string(predicted(t, srv.URL+"/traces/"+oom+"/incidents/1", http.StatusOK))
	if !strings.Contains(page, `Which batch size would have fit is being worked out from gpt batch 2 and gpt batch 4: reload in a moment.`) {
		t.Error("the incident page does not say the batch is being worked out")
	}
	<-s.replaySlots
	page = pageDone(t, srv.URL+"/compare/"+a+"/"+b+"/predict?batch_a=2&batch_b=4&at=8", `data-running="1"`)
	if !strings.Contains(page, `id="predictions"`) {
		t.Error("no predictions once the slot is free")
	}
	if page = pageDone(t, srv.URL+"/traces/"+oom+"/incidents/1", "is being worked out"); !strings.Contains(page, " would have fit this 16.00 GiB device") {
		t.Error("no sentence once the slot is free")
	}
}

// A trace that does not say its device's memory (as a PyTorch snapshot
// does not) is read for what its OOM implies.
func TestIncidentBatchOnAnUnknownDevice(t *testing.T) {
	f := newFixture(t, Options{})
	recordGPT(t, f.db, 2, 80<<30)
	recordGPT(t, f.db, 4, 80<<30)
	wr, err := f.db.CreateTrace(gpu.TraceMeta{Name: "gpt batch 32", Source: gpu.SourceTrace}, gpu.NewLayout(gpu.DefaultRules()))
	if err != nil {
		t.Fatal(err)
	}
	clk := &tracer.Clock{US: 1}
	a, err := caching.New(sim.New(16<<30), caching.DefaultConfig(), caching.WithSink(wr), caching.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	if err := tracer.Run(context.Background(), gpt(32), &tracer.Env{Alloc: a, Clock: clk, Stacks: wr}); err == nil {
		t.Fatal("batch 32 fits 16 GiB")
	}
	if err := wr.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	page := pageDone(t, f.srv.URL+"/traces/"+wr.ID()+"/incidents/1", "is being worked out")
	if !strings.Contains(page, " would have fit this 16.00 GiB device; batch 32 needs ") {
		i := strings.Index(page, `id="batch-fit"`)
		t.Errorf("the page says %q", page[max(i, 0):min(len(page), max(i, 0)+300)])
	}
}
