package server

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"vramscope/attrib"
	"vramscope/internal/testkit"
	"vramscope/tracer"
)

// liveAnswer is what /live answers, as the page reads it.
type liveAnswer struct {
	Seq        int64                  `json:"seq"`
	T          int64                  `json:"t"`
	Bytes      uint64                 `json:"bytes"`
	Count      int                    `json:"count"`
	Tree       *attrib.Node           `json:"tree"`
	Rows       []attrib.Row           `json:"rows"`
	RowsTotal  int                    `json:"rows_total"`
	Blocks     attrib.LiveBlocks      `json:"blocks"`
	Categories []attrib.CategoryShare `json:"categories"`
	Step       *attrib.Region         `json:"step"`
}

// On a real snapshot, /live at the peak holds exactly the peak's allocated
// bytes, however grouped; every node's range of blocks adds up to it; every
// category is listed, unknown too.
func TestLiveAPI(t *testing.T) { testkit.EachBackend(t, testLiveAPI) }

func testLiveAPI(t *testing.T) {
	f := newFixture(t, Options{})
	up := uploadFile(t, f, "training_22k_user_metadata.pickle")
	tr := up.Traces[0]
	for _, g := range []string{"frame", "stack", "category"} {
		var a liveAnswer
		f.getJSON(t, fmt.Sprintf("/api/traces/%s/live?seq=%d&group=%s&limit=5", tr.ID, tr.PeakSeq, g), &a)
		if a.Seq != tr.PeakSeq || a.Bytes != tr.PeakAllocated || a.Tree.Bytes != a.Bytes || len(a.Rows) != 5 || a.RowsTotal < 5 {
			t.Fatalf("%s: seq %d, %d bytes (tree %d), %d of %d rows; the peak is %d bytes after %d",
				g, a.Seq, a.Bytes, a.Tree.Bytes, len(a.Rows), a.RowsTotal, tr.PeakAllocated, tr.PeakSeq)
		}
		var walk func(n *attrib.Node)
		walk = func(n *attrib.Node) {
			var sum uint64
			for _, s := range a.Blocks.Size[n.B0:n.B1] {
				sum += s
			}
			if sum != n.Bytes {
				t.Fatalf("%s: node %q: %d bytes, its blocks %d", g, n.Name, n.Bytes, sum)
			}
			for _, c := range n.Children {
				walk(c)
			}
		}
		walk(a.Tree)
		var cats uint64
		for _, c := range a.Categories {
			cats += c.Bytes
		}
		if len(a.Categories) != len(attrib.AllCategories) || a.Categories[len(a.Categories)-1].Name != attrib.Unknown || cats != a.Bytes {
			t.Errorf("%s: categories %+v", g, a.Categories)
		}
	}
	var byFrame liveAnswer
	f.getJSON(t, fmt.Sprintf("/api/traces/%s/live?seq=%d", tr.ID, tr.PeakSeq), &byFrame)
	if byFrame.Rows[0].Label != "nn_utils.py:6 softmax" {
		t.Errorf("top frame at the peak %q", byFrame.Rows[0].Label)
	}
	// By time: the last event at or before t.
	var byTime liveAnswer
	f.getJSON(t, fmt.Sprintf("/api/traces/%s/live?t=%d", tr.ID, tr.PeakUS), &byTime)
	if byTime.Seq < tr.PeakSeq || byTime.T != tr.PeakUS {
		t.Errorf("at the peak's time: seq %d at %d", byTime.Seq, byTime.T)
	}

	// The same instant as a pprof profile.
	b := f.get(t, fmt.Sprintf("/api/traces/%s/live.pb.gz?seq=%d", tr.ID, tr.PeakSeq), http.StatusOK)
	p, err := profile.Parse(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var space int64
	for _, s := range p.Sample {
		space += s.Value[1]
	}
	if space != int64(tr.PeakAllocated) || len(p.Sample) != byFrame.Count {
		t.Errorf("profile: %d bytes in %d samples", space, len(p.Sample))
	}

	for _, bad := range []string{"live?seq=1&group=file", "live?seq=-2", "live", "live?t=x", "live?seq=1&frames=some", "live.pb.gz",
		"steps?limit=0", "bands/categories?t0=5&t1=1"} {
		if msg := errorOf(t, f.get(t, "/api/traces/"+tr.ID+"/"+bad, http.StatusBadRequest)); !strings.Contains(msg, "parameter") {
			t.Errorf("%s: %q", bad, msg)
		}
	}
	f.get(t, "/api/traces/nope/live?seq=1", http.StatusNotFound)
}

// /steps lists a training run's steps with their peaks and its phases;
// /bands/categories gives each band of a window its category.
func TestStepsAndBandCategories(t *testing.T) { testkit.EachBackend(t, testStepsAndBandCategories) }

func testStepsAndBandCategories(t *testing.T) {
	f := newFixture(t, Options{})
	w := tracer.DefaultTrain()
	w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 4, 512, 8192, 4, 256, 3
	id := testkit.Record(t, f.db, "train", w, 80<<30, "")
	tr, err := f.db.Trace(id)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Regions    []attrib.Region   `json:"regions"`
		Steps      []attrib.StepPeak `json:"steps"`
		StepsTotal int               `json:"steps_total"`
	}
	f.getJSON(t, "/api/traces/"+id+"/steps", &st)
	if st.StepsTotal != 3 || len(st.Steps) != 3 || len(st.Regions) != 9 {
		t.Fatalf("%d steps of %d, %d regions", len(st.Steps), st.StepsTotal, len(st.Regions))
	}
	var highest uint64
	for i, s := range st.Steps {
		if s.Step != i || s.Peak.TimeUS < s.StartUS || s.Peak.TimeUS > s.EndUS || s.Peak.Allocated == 0 {
			t.Errorf("step %d: %+v", i, s)
		}
		highest = max(highest, s.Peak.Allocated)
	}
	if highest != tr.PeakAllocated {
		t.Errorf("the steps' highest peak %d, the trace's %d", highest, tr.PeakAllocated)
	}
	step2 := st.Steps[2].Peak.Seq
	f.getJSON(t, "/api/traces/"+id+"/steps?from=1&limit=1", &st)
	if len(st.Steps) != 1 || st.Steps[0].Step != 1 {
		t.Errorf("from 1, limit 1: %+v", st.Steps)
	}
	var live liveAnswer
	f.getJSON(t, fmt.Sprintf("/api/traces/%s/live?seq=%d&group=category", id, step2), &live)
	if live.Step == nil || live.Step.Step != 2 {
		t.Errorf("the live set at step 2's peak is in step %+v", live.Step)
	}

	q := fmt.Sprintf("t0=%d&t1=%d&w=400&h=200", tr.FirstUS, tr.LastUS)
	var bands struct {
		Bands []struct {
			Seq  int64  `json:"seq"`
			Size uint64 `json:"size"`
		} `json:"bands"`
	}
	f.getJSON(t, "/api/traces/"+id+"/bands?"+q, &bands)
	var cats struct {
		Categories []attrib.Category `json:"categories"`
		Band       []int             `json:"band"`
		Sure       []int             `json:"sure"`
	}
	f.getJSON(t, "/api/traces/"+id+"/bands/categories?"+q, &cats)
	if len(bands.Bands) == 0 || len(cats.Band) != len(bands.Bands) || len(cats.Sure) != len(cats.Band) {
		t.Fatalf("%d bands, %d categories", len(bands.Bands), len(cats.Band))
	}
	seen := map[attrib.Category]bool{}
	for _, c := range cats.Band {
		seen[cats.Categories[c]] = true
	}
	for _, c := range []attrib.Category{attrib.Parameters, attrib.OptimizerState, attrib.Activations} {
		if !seen[c] {
			t.Errorf("no band of %s among %v", c, seen)
		}
	}
}

// /categories samples the window: the bytes of each category at each
// instant add up to the allocated bytes right after its event.
func TestCategoryAreasAPI(t *testing.T) { testkit.EachBackend(t, testCategoryAreasAPI) }

func testCategoryAreasAPI(t *testing.T) {
	f := newFixture(t, Options{})
	var a attrib.Areas
	f.getJSON(t, fmt.Sprintf("/api/traces/%s/categories?t0=%d&t1=%d&n=30", f.id, f.trace.FirstUS, f.trace.LastUS), &a)
	if len(a.T) != 30 || len(a.Bytes) != 30 {
		t.Fatalf("%d instants", len(a.T))
	}
	for i, seq := range a.Seq {
		l, _, err := f.db.LayoutAtSeq(f.id, seq)
		if err != nil {
			t.Fatal(err)
		}
		var sum uint64
		for _, b := range a.Bytes[i] {
			sum += b
		}
		if sum != l.Figures().Allocated {
			t.Errorf("after event %d: categories hold %d bytes, %d were allocated", seq, sum, l.Figures().Allocated)
		}
	}
	for _, bad := range []string{"categories?t0=1", "categories?t0=1&t1=5&n=0", "categories?t0=1&t1=5&n=100000"} {
		f.get(t, "/api/traces/"+f.id+"/"+bad, http.StatusBadRequest)
	}
}
