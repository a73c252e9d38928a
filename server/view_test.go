package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/internal/testkit"
)

// uploadFile uploads a real snapshot and returns the answer.
func uploadFile(t *testing.T, f *fixture, name string) uploadJSON {
	t.Helper()
	data, err := os.ReadFile(testkit.Snapshot(t, name))
	if err != nil {
		t.Fatal(err)
	}
	code, b := post(t, f.srv.URL+"/api/traces?name="+name, bytes.NewReader(data))
	if code != http.StatusCreated {
		t.Fatalf("upload %s: %d %s", name, code, b)
	}
	var up uploadJSON
	if err := json.Unmarshal(b, &up); err != nil {
		t.Fatal(err)
	}
	return up
}

// A multi-GPU upload is one group: every device's trace lists them all,
// and the upload lands on the device that ran out of memory.
func TestDevicesOfAnUpload(t *testing.T) { testkit.EachBackend(t, testDevicesOfAnUpload) }

func testDevicesOfAnUpload(t *testing.T) {
	f := newFixture(t, Options{})
	up := uploadFile(t, f, "expandable_oom_multigpu.pickle")
	if len(up.Traces) != 3 {
		t.Fatalf("%d traces", len(up.Traces))
	}
	var oom gpu.Trace
	for _, tr := range up.Traces {
		if tr.OOMs > 0 {
			oom = tr
		}
		if tr.Upload == "" || tr.Upload != up.Traces[0].Upload {
			t.Fatalf("trace %s: upload %q, want the group's %q", tr.ID, tr.Upload, up.Traces[0].Upload)
		}
	}
	if oom.DeviceOrdinal != 1 || up.URL != "/traces/"+oom.ID {
		t.Fatalf("the upload lands on %s, want device 1's trace %s", up.URL, oom.ID)
	}
	for _, tr := range up.Traces {
		var got traceJSON
		f.getJSON(t, "/api/traces/"+tr.ID, &got)
		if len(got.Devices) != 3 {
			t.Fatalf("%s: devices %+v", tr.ID, got.Devices)
		}
		for i, d := range got.Devices {
			if d.Device != i || d.ID != up.Traces[i].ID || (d.OOMs > 0) != (i == 1) {
				t.Fatalf("%s: device %d is %+v", tr.ID, i, d)
			}
		}
	}
	// A trace of its own lists itself.
	var one traceJSON
	f.getJSON(t, "/api/traces/"+f.id, &one)
	if len(one.Devices) != 1 || one.Devices[0].ID != f.id {
		t.Fatalf("devices of a recorded trace: %+v", one.Devices)
	}
}

// The snapshot's settings and annotations are kept as written; a snapshot
// without times says so.
func TestExtrasOfSnapshots(t *testing.T) { testkit.EachBackend(t, testExtrasOfSnapshots) }

func testExtrasOfSnapshots(t *testing.T) {
	f := newFixture(t, Options{})
	up := uploadFile(t, f, "uint64_line_annotations.pickle")
	var x struct {
		Conf        string           `json:"conf"`
		Settings    map[string]any   `json:"settings"`
		Annotations []map[string]any `json:"annotations"`
		Metadata    []any            `json:"user_metadata"`
		Total       int64            `json:"user_metadata_total"`
	}
	f.getJSON(t, "/api/traces/"+up.Traces[0].ID+"/extras", &x)
	if len(x.Annotations) != 714 || x.Settings == nil || x.Annotations[0]["stage"] != "START" || x.Annotations[0]["time_us"] == nil {
		t.Fatalf("%d annotations (first %v), settings %v", len(x.Annotations), x.Annotations[0], x.Settings)
	}
	if _, ok := x.Settings["PYTORCH_CUDA_ALLOC_CONF"]; !ok {
		t.Fatalf("settings lack PYTORCH_CUDA_ALLOC_CONF: %v", x.Settings)
	}
	if up.Traces[0].NoTime {
		t.Fatal("a snapshot with times is marked without")
	}
	nt := uploadFile(t, f, "no_time_us_segment_churn.pickle")
	if !nt.Traces[0].NoTime {
		t.Fatal("a snapshot without time_us is not marked")
	}
	var y struct {
		Settings    any   `json:"settings"`
		Annotations []any `json:"annotations"`
	}
	f.getJSON(t, "/api/traces/"+nt.Traces[0].ID+"/extras", &y)
	if y.Settings != nil || len(y.Annotations) != 0 {
		t.Fatalf("a snapshot with neither: %+v", y)
	}
	page := string(f.get(t, "/traces/"+nt.Traces[0].ID, http.StatusOK))
	if !strings.Contains(page, `data-no-time="1"`) {
		t.Fatal("the page does not say the trace has no times")
	}
}

type searchJSON struct {
	Total   int64 `json:"total"`
	Matches []struct {
		gpu.Allocation
		Label string `json:"label"`
	} `json:"matches"`
	Stacks  []gpu.StackID `json:"stacks"`
	Address *uint64       `json:"address"`
}

func TestSearch(t *testing.T) { testkit.EachBackend(t, testSearch) }

func testSearch(t *testing.T) {
	f := newFixture(t, Options{})
	base := "/api/traces/" + f.id + "/search?q="
	var s searchJSON
	// The fixture's layers are "layer%d.weight" in model.py; the search is
	// case-insensitive and names the allocations in seq order.
	f.getJSON(t, base+"LAYER1", &s)
	if s.Total == 0 || len(s.Matches) == 0 || len(s.Stacks) == 0 {
		t.Fatalf("LAYER1: %+v", s)
	}
	for i, m := range s.Matches {
		st, err := f.db.Stack(f.id, m.Stack)
		if err != nil {
			t.Fatal(err)
		}
		hit := false
		for _, fr := range st {
			hit = hit || strings.Contains(strings.ToLower(fr.Name), "layer1")
		}
		if !hit || i > 0 && m.Seq < s.Matches[i-1].Seq || m.Label == "" {
			t.Fatalf("match %d: %+v (stack %v)", i, m, st)
		}
	}
	// By file name, with a limit.
	f.getJSON(t, base+"model.py&limit=3", &s)
	if len(s.Matches) != 3 || s.Total <= 3 {
		t.Fatalf("model.py: %d matches of %d", len(s.Matches), s.Total)
	}
	// By an address inside an allocation.
	a := s.Matches[0]
	f.getJSON(t, base+url.QueryEscape("0x"+strings.ToUpper(strconv.FormatUint(a.Addr+a.Size/2, 16))), &s)
	found := false
	for _, m := range s.Matches {
		found = found || m.Seq == a.Seq
		if m.Addr > *s.Address || *s.Address >= m.Addr+m.Size {
			t.Fatalf("%#x is not in match %+v", *s.Address, m)
		}
	}
	if !found {
		t.Fatalf("address %#x: %+v", a.Addr+a.Size/2, s)
	}
	f.getJSON(t, base+"no+such+frame", &s)
	if s.Total != 0 || len(s.Matches) != 0 {
		t.Fatalf("nothing should match: %+v", s)
	}
	for _, q := range []string{"", "%20", strings.Repeat("x", 300) + "&limit=0"} {
		e := errorOf(t, f.get(t, base+q, http.StatusBadRequest))
		if !strings.Contains(e, "parameter q") && !strings.Contains(e, "parameter limit") {
			t.Errorf("q=%q: %q", q, e)
		}
	}
	errorOf(t, f.get(t, "/api/traces/nope/search?q=x", http.StatusNotFound))
}

// Real stacks come sorted for people: each frame has a kind, the answer a
// label, and the event list labels its events.
func TestStacksAndEventsForPeople(t *testing.T) { testkit.EachBackend(t, testStacksAndEventsForPeople) }

func testStacksAndEventsForPeople(t *testing.T) {
	f := newFixture(t, Options{})
	up := uploadFile(t, f, "expandable_oom_multigpu.pickle")
	id := up.Traces[1].ID
	var ev struct {
		Events []eventJSON       `json:"events"`
		Labels map[string]string `json:"labels"`
		Meta   map[string]string `json:"user_metadata"`
	}
	f.getJSON(t, "/api/traces/"+id+"/events?from=0&to=200", &ev)
	if len(ev.Events) != 200 || len(ev.Labels) == 0 {
		t.Fatalf("%d events, %d labels", len(ev.Events), len(ev.Labels))
	}
	var sid uint32
	for _, e := range ev.Events {
		if e.Stack != 0 {
			sid = e.Stack
			break
		}
	}
	var st stackJSON
	f.getJSON(t, "/api/traces/"+id+"/stacks/"+itoa(int64(sid)), &st)
	kinds := map[gpu.FrameKind]int{}
	for _, fr := range st.Frames {
		kinds[fr.Kind]++
	}
	if kinds[gpu.FrameRecorder] == 0 || kinds[gpu.FrameNative] == 0 || st.Label == "" || ev.Labels[itoa(int64(sid))] != st.Label {
		t.Fatalf("stack %d: kinds %v, label %q (events say %q)", sid, kinds, st.Label, ev.Labels[itoa(int64(sid))])
	}
	if strings.Contains(st.Label, "unwind") || strings.Contains(st.Label, "CUDACachingAllocator") {
		t.Fatalf("label %q names the recorder", st.Label)
	}
}

// memory_summary() after an event, as after a time.
func TestSummaryAtAnEvent(t *testing.T) { testkit.EachBackend(t, testSummaryAtAnEvent) }

func testSummaryAtAnEvent(t *testing.T) {
	f := newFixture(t, Options{})
	tr := f.trace
	bySeq := string(f.get(t, "/api/traces/"+f.id+"/summary?seq="+itoa(tr.PeakSeq), http.StatusOK))
	if !strings.Contains(bySeq, "PyTorch CUDA memory summary") {
		t.Fatalf("summary: %.200s", bySeq)
	}
	st, _, err := f.db.StatsAtSeq(f.id, tr.PeakSeq)
	if err != nil || st.AllocatedBytes[0].Current != int64(tr.PeakAllocated) {
		t.Fatalf("statistics at the peak event %d: allocated %d, want %d (%v)", tr.PeakSeq, st.AllocatedBytes[0].Current, tr.PeakAllocated, err)
	}
	errorOf(t, f.get(t, "/api/traces/"+f.id+"/summary?seq=x", http.StatusBadRequest))
}

// A search by address that finds an allocation without frames names it as
// every other view does, by where it was made (the selection's "made"),
// never with an empty first user frame.
func TestSearchNamesUnframed(t *testing.T) {
	db := testkit.OpenDB(t)
	tr := recording(t, db, "train_default.pickle")
	srv := serve(t, db)
	all, err := db.Allocations(tr.ID, tr.FirstUS, tr.LastUS, 0, 10000)
	if err != nil {
		t.Fatal(err)
	}
	named := 0
	for _, a := range all.Allocations {
		if a.Stack != 0 || a.Seq < 0 || named >= 3 {
			continue
		}
		var s searchJSON
		getJSON(t, fmt.Sprintf("%s/api/traces/%s/search?q=%x", srv.URL, tr.ID, a.Addr), 200, &s)
		var sel struct {
			Verdict struct {
				Made string `json:"made"`
			} `json:"verdict"`
		}
		getJSON(t, fmt.Sprintf("%s/api/traces/%s/allocations/%d", srv.URL, tr.ID, a.Seq), 200, &sel)
		for _, m := range s.Matches {
			if m.Seq != a.Seq {
				continue
			}
			named++
			if want := sel.Verdict.Made + " · no stack"; sel.Verdict.Made == "" || m.Label != want {
				t.Errorf("allocation %d without frames: the search names it %q, the selection %q", a.Seq, m.Label, want)
			}
		}
	}
	if named == 0 {
		t.Fatal("no allocation without frames was found by its address")
	}
}
