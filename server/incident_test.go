package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"vramscope/gpu"
	"vramscope/incident"
	"vramscope/internal/testkit"
	"vramscope/replay"
	"vramscope/store"
	"vramscope/tracer"
)

const MiB = testkit.MiB

// fragCapacity is the simulated device of the frag workload: small, so the
// trace is short, and large enough for its tensor sizes.
const fragCapacity = 2 << 30

// serve starts a server over db.
func serve(t *testing.T, db *store.DB) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(New(Options{DB: db, Logger: quietLogger()}).Handler())
	t.Cleanup(srv.Close)
	return srv
}

func getJSON(t *testing.T, url string, want int, v any) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(res.Body)
	if res.StatusCode != want {
		t.Fatalf("GET %s: status %d, want %d: %s", url, res.StatusCode, want, buf.Bytes())
	}
	if v != nil {
		if err := json.Unmarshal(buf.Bytes(), v); err != nil {
			t.Fatalf("GET %s: %v: %s", url, err, buf.Bytes())
		}
	}
}

// whatIf asks for an incident's what-if table until it is done: each
// request waits up to whatifWait, then answers 202 while the replays run.
func whatIf(t *testing.T, base string) whatifJSON {
	t.Helper()
	for {
		res, err := http.Get(base + "/whatif")
		if err != nil {
			t.Fatal(err)
		}
		var w whatifJSON
		err = json.NewDecoder(res.Body).Decode(&w)
		res.Body.Close()
		if err != nil {
			t.Fatalf("what-if: %v", err)
		}
		switch {
		case res.StatusCode == http.StatusOK && w.Status == "done":
			return w
		case res.StatusCode == http.StatusAccepted && w.Status == "running":
			continue
		}
		t.Fatalf("what-if: status %d, %+v", res.StatusCode, w)
	}
}

func row(rows []incident.WhatIf, conf string) *incident.WhatIf {
	for i := range rows {
		if strings.Contains(rows[i].AllocConf, conf) {
			return &rows[i]
		}
	}
	return nil
}

func TestIncidentFragmentation(t *testing.T) { testkit.EachBackend(t, testIncidentFragmentation) }

func testIncidentFragmentation(t *testing.T) {
	db := testkit.OpenDB(t)
	id := testkit.Record(t, db, "frag", tracer.DefaultFrag(), fragCapacity, "")
	srv := serve(t, db)

	var list struct {
		Incidents []struct {
			gpu.Incident
			URL string `json:"url"`
		}
	}
	getJSON(t, srv.URL+"/api/traces/"+id+"/incidents", http.StatusOK, &list)
	if len(list.Incidents) != 1 || list.Incidents[0].URL != "/traces/"+id+"/incidents/1" {
		t.Fatalf("incidents: %+v", list.Incidents)
	}
	in := list.Incidents[0]

	base := srv.URL + "/api/traces/" + id + "/incidents/1"
	var d incidentJSON
	getJSON(t, base, http.StatusOK, &d)
	r := d.Report
	if r.Kind != "fragmentation" || !strings.HasPrefix(r.Verdict, "Fragmentation: ") {
		t.Fatalf("verdict %s: %s", r.Kind, r.Verdict)
	}
	// Frag asks for half the device: more than the device has free and more
	// than the largest hole, less than the two together.
	if r.Requested != fragCapacity/2 || r.Requested != in.Size || r.DeviceFree != in.DeviceFree ||
		r.DeviceFree >= r.Requested || r.LargestFree >= r.Requested || r.NotAllocated < r.Requested {
		t.Fatalf("report %+v", r)
	}
	if r.Capacity != fragCapacity || d.Count != 1 || d.Incident.Seq != in.Seq {
		t.Fatalf("capacity %d, count %d, seq %d", r.Capacity, d.Count, d.Incident.Seq)
	}
	if len(r.Pinned) == 0 || len(r.Pinners) == 0 || len(r.Pools) == 0 {
		t.Fatalf("nothing pinned: %+v", r)
	}
	// The pinners are the small long-lived tensors, with their frames.
	top := d.Stacks[itoa(int64(r.Pinners[0].Stack))]
	if len(top) == 0 || top[0].Name != "register_buffer" || top[0].Filename != "stress.py" {
		t.Fatalf("top pinning stack %v of %+v", top, r.Pinners[0])
	}
	if d.Window.T0 >= in.TimeUS || d.Window.T1 <= in.TimeUS {
		t.Fatalf("window [%d, %d] does not end just after the OOM at %d", d.Window.T0, d.Window.T1, in.TimeUS)
	}

	// The map the page draws is the one analyzed: right after the oom event.
	var l store.LayoutColumns
	getJSON(t, srv.URL+"/api/traces/"+id+"/layout?seq="+itoa(in.Seq), http.StatusOK, &l)
	if l.Seq != in.Seq || l.TimeUS != in.TimeUS || l.Figures != r.Figures {
		t.Fatalf("layout at the OOM: seq %d t %d %+v, report %+v", l.Seq, l.TimeUS, l.Figures, r.Figures)
	}

	w := whatIf(t, base)
	if w.Capacity != fragCapacity || w.Requests == 0 || len(w.Rows) != 1+len(incident.Variants) {
		t.Fatalf("what-if: %+v", w)
	}
	if len(w.Rows[0].OOMs) != 1 || len(w.Rows[0].Avoided) != 0 || w.Rows[0].FragmentationAtOOM[0] <= 0 {
		t.Fatalf("the original settings should replay the OOM: %+v", w.Rows[0])
	}
	if w.Incident == nil || len(w.OOMs) != 1 || w.Incident.Index != w.OOMs[0].Index || w.Incident.Size != in.Size {
		t.Fatalf("what-if of incident 1: %+v, original OOMs %+v", w.Incident, w.OOMs)
	}
	if e := row(w.Rows[1:], "expandable_segments:True"); e == nil || !e.Serves(w.Incident.Index) || len(e.OOMs) != 0 {
		t.Fatalf("expandable segments should avoid the OOM: %+v", w.Rows)
	}
	// Per incident, in words: who served it, and what the run needs.
	says := strings.Join(w.Incident.Sentences, " ")
	if !strings.Contains(says, "expandable_segments:True would have served this request.") ||
		!strings.Contains(says, "Needs ") || !strings.Contains(says, " with the recorded settings") {
		t.Fatalf("incident 1 says %q", says)
	}
	if w.Rows[0].CapacityNeeded <= fragCapacity || w.Rows[0].CapacityNeeded%(2*MiB) != 0 {
		t.Fatalf("the original settings need %d bytes on a %d device that ran out", w.Rows[0].CapacityNeeded, fragCapacity)
	}

	// Pages: the incident page, its absence, and the list's link to it.
	page := string(getPage(t, srv.URL+"/traces/"+id+"/incidents/1", http.StatusOK))
	if !strings.Contains(page, `data-seq="`+itoa(in.Seq)+`"`) || !strings.Contains(page, "incident.js") {
		t.Fatalf("incident page: %s", page)
	}
	if p := string(getPage(t, srv.URL+"/traces/"+id+"/incidents/2", http.StatusNotFound)); !strings.Contains(p, "has no incident 2") {
		t.Fatalf("missing incident page: %s", p)
	}
	if p := string(getPage(t, srv.URL+"/", http.StatusOK)); !strings.Contains(p, `href="/traces/`+id+`/incidents/1"`) {
		t.Fatalf("the trace list does not link the OOM count to the incident: %s", p)
	}
	getJSON(t, srv.URL+"/api/traces/"+id+"/incidents/2", http.StatusNotFound, nil)
	getJSON(t, srv.URL+"/api/traces/"+id+"/incidents/x", http.StatusBadRequest, nil)
	getJSON(t, srv.URL+"/api/traces/nosuchtrace/incidents", http.StatusNotFound, nil)
}

func TestIncidentShortageIsNotFragmentation(t *testing.T) {
	testkit.EachBackend(t, testIncidentShortageIsNotFragmentation)
}

func testIncidentShortageIsNotFragmentation(t *testing.T) {
	db := testkit.OpenDB(t)
	reqs := []replay.Request{
		{Op: replay.OpMalloc, ID: 1, Size: 40 * MiB},
		{Op: replay.OpMalloc, ID: 2, Size: 18 * MiB},
		{Op: replay.OpMalloc, ID: 3, Size: 10 * MiB},
	}
	id := testkit.Record(t, db, "shortage", testkit.Replaying(reqs), 60*MiB, "")
	srv := serve(t, db)
	base := srv.URL + "/api/traces/" + id + "/incidents/1"
	var d incidentJSON
	getJSON(t, base, http.StatusOK, &d)
	if d.Report.Kind != "shortage" || strings.Contains(d.Report.Verdict, "ragmentation") {
		t.Fatalf("a real shortage called %s: %s", d.Report.Kind, d.Report.Verdict)
	}
	w := whatIf(t, base)
	for _, r := range w.Rows {
		if len(r.Avoided) != 0 || len(r.OOMs) != 1 {
			t.Errorf("nothing avoids a real shortage: %+v", r)
		}
	}
	// Three segments of their own sizes; or four 20 MiB pages.
	if w.Rows[0].CapacityNeeded != 68*MiB || row(w.Rows[1:], "expandable").CapacityNeeded != 80*MiB {
		t.Errorf("needed %d and %d with expandable segments", w.Rows[0].CapacityNeeded, row(w.Rows[1:], "expandable").CapacityNeeded)
	}
	if got := strings.Join(w.Incident.Sentences, " "); !strings.HasPrefix(got, "None of the settings tried would have served this request.") {
		t.Errorf("the shortage says %q", got)
	}
}

func TestIncidentOfUploadedSnapshot(t *testing.T) {
	testkit.EachBackend(t, testIncidentOfUploadedSnapshot)
}

func testIncidentOfUploadedSnapshot(t *testing.T) {
	data, err := os.ReadFile(testkit.Snapshot(t, "oom_nonexpandable.json"))
	if err != nil {
		t.Fatal(err)
	}
	db := testkit.OpenDB(t)
	srv := serve(t, db)
	code, b := post(t, srv.URL+"/api/traces?name=oom_nonexpandable.json", bytes.NewReader(data))
	if code != http.StatusCreated {
		t.Fatalf("upload: %d %s", code, b)
	}
	var up uploadJSON
	json.Unmarshal(b, &up)
	found := false
	for _, tr := range up.Traces {
		if tr.OOMs == 0 {
			continue
		}
		found = true
		base := srv.URL + "/api/traces/" + tr.ID + "/incidents/1"
		var d incidentJSON
		getJSON(t, base, http.StatusOK, &d)
		r := d.Report
		t.Logf("%s: %s", tr.Name, r.Verdict)
		if r.Verdict == "" || r.Requested != d.Incident.Size || r.DeviceFree != d.Incident.DeviceFree || r.Requested == 0 {
			t.Fatalf("report %+v of incident %+v", r, d.Incident)
		}
		// A snapshot does not say its device's capacity: none is given as
		// the card's, and the what-if replays on what the OOM implies.
		if r.Capacity != 0 || r.Outside != 0 || !strings.Contains(r.Device, "The recording does not say the device's size") {
			t.Fatalf("capacity %d, outside %d: %q", r.Capacity, r.Outside, r.Device)
		}
		// The request did not fit in any hole, or it would not have failed.
		if r.LargestFree >= r.Requested {
			t.Fatalf("%s yet the largest hole fits", r.Verdict)
		}
		if r.Kind == "fragmentation" && len(r.Pinned) == 0 {
			t.Fatalf("fragmentation without a pinned segment: %+v", r)
		}
		w := whatIf(t, base)
		if w.Capacity != r.Reserved+r.DeviceFree || !strings.HasPrefix(w.CapacityFrom, "inferred from the OOM at event") ||
			len(w.Rows) != 1+len(incident.Variants) || len(w.Rows[0].OOMs) != 1 || len(w.Rows[0].NewOOMs) != 0 {
			t.Fatalf("what-if: %+v", w)
		}
	}
	if !found {
		t.Fatalf("the snapshot's OOM made no incident: %s", b)
	}
}

func getPage(t *testing.T, url string, want int) []byte {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(res.Body)
	if res.StatusCode != want {
		t.Fatalf("GET %s: status %d, want %d: %s", url, res.StatusCode, want, buf.Bytes())
	}
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Fatalf("GET %s: %s, want a page", url, ct)
	}
	return buf.Bytes()
}

// While the replays run, the what-if answers 202 and the page asks again;
// the table is computed once and then served from memory.
func TestWhatIfRunsOnceInTheBackground(t *testing.T) {
	testkit.EachBackend(t, testWhatIfRunsOnceInTheBackground)
}

func testWhatIfRunsOnceInTheBackground(t *testing.T) {
	db := testkit.OpenDB(t)
	id := testkit.Record(t, db, "frag", tracer.DefaultFrag(), fragCapacity, "")
	s := New(Options{DB: db, Logger: quietLogger()})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	base := srv.URL + "/api/traces/" + id + "/incidents/1"

	// Hold the one replay slot, so the job cannot start yet.
	s.replaySlots <- struct{}{}
	s.whatifWait = time.Millisecond
	var w whatifJSON
	getJSON(t, base+"/whatif", http.StatusAccepted, &w)
	if w.Status != "running" || w.Table != nil {
		t.Fatalf("while running: %+v", w)
	}
	<-s.replaySlots
	s.whatifWait = whatifWait
	first := whatIf(t, base)
	if e := row(first.Rows, "expandable_segments:True"); e == nil || !e.Serves(first.Incident.Index) {
		t.Fatalf("what-if: %+v", first)
	}
	// A second request is answered from the cache: the same job.
	jobs := s.whatifs.Len()
	whatIf(t, base)
	if jobs != 1 || s.whatifs.Len() != 1 {
		t.Fatalf("%d then %d what-if jobs for one incident", jobs, s.whatifs.Len())
	}
	// The trace's own what-if is the same table.
	trace := whatIf(t, srv.URL+"/api/traces/"+id)
	if s.whatifs.Len() != 1 || trace.Incident != nil || trace.Needed != first.Needed || !strings.HasPrefix(trace.Needed, "Needs ") {
		t.Fatalf("the trace's what-if: %+v (%d jobs)", trace, s.whatifs.Len())
	}
}

// A trace without an OOM still gets the memory it needs.
func TestWhatIfWithoutOOM(t *testing.T) { testkit.EachBackend(t, testWhatIfWithoutOOM) }

func testWhatIfWithoutOOM(t *testing.T) {
	db := testkit.OpenDB(t)
	reqs := []replay.Request{
		{Op: replay.OpMalloc, ID: 1, Size: 30 * MiB},
		{Op: replay.OpMalloc, ID: 2, Size: 6 * MiB},
		{Op: replay.OpFree, ID: 1},
		{Op: replay.OpMalloc, ID: 3, Size: 12 * MiB},
	}
	id := testkit.Record(t, db, "fits", testkit.Replaying(reqs), 80*MiB, "")
	srv := serve(t, db)
	w := whatIf(t, srv.URL+"/api/traces/"+id)
	// 30 MiB then 6 MiB (a 20 MiB segment): 50 MiB; the 12 MiB reuse the
	// freed 30 MiB segment. Expandable: a limit is asked for the 30 MiB
	// alone, then two 20 MiB pages are mapped, which the 6 MiB share.
	if len(w.OOMs) != 0 || w.Rows[0].CapacityNeeded != 50*MiB || w.Needed != "Needs 50.00 MiB with the recorded settings"+
		", 30.00 MiB with expandable_segments:True (as a per-process limit). Replayed on the recorded device of 80.00 MiB." {
		t.Fatalf("what-if: %+v, %q", w.Rows[0], w.Needed)
	}
	getJSON(t, srv.URL+"/api/traces/nosuchtrace/whatif", http.StatusNotFound, nil)
}
