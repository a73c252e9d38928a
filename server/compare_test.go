package server

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"vramscope/compare"
	"vramscope/internal/testkit"
	"vramscope/store"
	"vramscope/tracer"
)

// attnProbs is the frame under which the training workload saves the
// attention probabilities (tracer's layerOps["attn.probs"]): the
// activation that activation checkpointing drops, largest at these sizes.
const attnProbs = "model.py:34 forward"

// trainRun records a small training run, with or without activation
// checkpointing.
func trainRun(t *testing.T, db *store.DB, checkpointing bool) string {
	w := tracer.DefaultTrain()
	w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 4, 512, 2048, 4, 1024, 3
	w.Checkpointing = checkpointing
	name := "no checkpointing"
	if checkpointing {
		name = "checkpointing"
	}
	return testkit.Record(t, db, name, w, 80<<30, "")
}

// compareAnswer fetches a comparison.
func compareAnswer(t *testing.T, f *fixture, a, b, query string) *compare.Result {
	t.Helper()
	var r compare.Result
	f.getJSON(t, fmt.Sprintf("/api/compare/%s/%s?%s", a, b, query), &r)
	return &r
}

func moment(t *testing.T, r *compare.Result, key string) compare.Moment {
	t.Helper()
	for _, m := range r.Moments {
		if m.Key == key {
			return m
		}
	}
	t.Fatalf("no moment %s in %+v", key, r.Moments)
	return compare.Moment{}
}

// Two training runs that differ in activation checkpointing: at both
// peaks, the frame that differs most is the attention probabilities the
// run without checkpointing keeps.
func TestCompareCheckpointing(t *testing.T) { testkit.EachBackend(t, testCompareCheckpointing) }

func testCompareCheckpointing(t *testing.T) {
	f := newFixture(t, Options{})
	with, without := trainRun(t, f.db, true), trainRun(t, f.db, false)
	for _, align := range []string{"time", "step"} {
		r := compareAnswer(t, f, with, without, "align="+align)
		if r.Align != compare.Align(align) || r.Note != "" {
			t.Fatalf("align %s: used %s (%s)", align, r.Align, r.Note)
		}
		for _, key := range []string{"peak_a", "peak_b"} {
			m := moment(t, r, key)
			if len(m.Rows) == 0 || m.Rows[0].Label != attnProbs || m.Rows[0].Delta <= 0 {
				t.Errorf("align %s, %s: top row %+v", align, key, m.Rows[:min(3, len(m.Rows))])
			}
		}
		if r.Figures[0].Key != "peak_allocated" || r.Figures[0].Delta <= 0 {
			t.Errorf("figures %+v", r.Figures)
		}
	}
}

// Unknown traces are 404 with a JSON error; bad parameters are 400 and
// name the parameter.
func TestCompareErrors(t *testing.T) { testkit.EachBackend(t, testCompareErrors) }

func testCompareErrors(t *testing.T) {
	f := newFixture(t, Options{})
	if msg := errorOf(t, f.get(t, "/api/compare/nope/"+f.id, http.StatusNotFound)); !strings.Contains(msg, `"nope"`) {
		t.Errorf("unknown A: %q", msg)
	}
	errorOf(t, f.get(t, "/api/compare/"+f.id+"/nope", http.StatusNotFound))
	for _, bad := range []string{"align=rank", "group=file", "n=0", "at=x", "x0=5&x1=1", "rows=0"} {
		if msg := errorOf(t, f.get(t, "/api/compare/"+f.id+"/"+f.id+"?"+bad, http.StatusBadRequest)); !strings.Contains(msg, "parameter") {
			t.Errorf("%s: %q", bad, msg)
		}
	}
	if b := string(f.get(t, "/compare/"+f.id+"/nope", http.StatusNotFound)); !strings.Contains(b, "There is no trace nope.") {
		t.Errorf("page: %s", b)
	}
}

// Through the API: a trace compared with itself differs nowhere; two
// devices of the real multi-GPU snapshot compare, each moment's groups
// adding up to each side's allocated bytes; the page names both traces.
func TestCompareAPI(t *testing.T) { testkit.EachBackend(t, testCompareAPI) }

func testCompareAPI(t *testing.T) {
	f := newFixture(t, Options{})
	self := compareAnswer(t, f, f.id, f.id, "group=stack&rows=100000")
	for _, m := range self.Moments {
		if m.Divergence != 0 || m.A != m.B {
			t.Errorf("self %s: %+v", m.Key, m)
		}
		for _, d := range m.Rows {
			if d.Delta != 0 {
				t.Errorf("self %s: %+v", m.Key, d)
			}
		}
	}
	if fig := self.Figures[2]; fig.Key != "memory_needed" || !fig.Known || fig.Delta != 0 || self.A.Needed.Status != "done" || self.A.Needed.Bytes == 0 {
		t.Errorf("memory needed %+v (%+v)", fig, self.A.Needed)
	}

	up := uploadFile(t, f, "expandable_oom_multigpu.pickle")
	var devs []string
	for _, tr := range up.Traces {
		if tr.Events > 0 {
			devs = append(devs, tr.ID)
		}
	}
	for _, align := range []string{"time", "step", "event"} {
		r := compareAnswer(t, f, devs[0], devs[1], "rows=100000&align="+align)
		if r.Settings[0].Key != "expandable_segments" || r.Settings[0].A != "True" || r.Settings[0].Differs {
			t.Errorf("settings %+v", r.Settings)
		}
		for _, m := range r.Moments {
			var sa, sb uint64
			for _, d := range m.Rows {
				sa, sb = sa+d.A, sb+d.B
			}
			if sa != m.A.Allocated || sb != m.B.Allocated || len(m.Rows) != m.RowsTotal {
				t.Errorf("%s %s: rows %d and %d bytes, allocated %d and %d", align, m.Key, sa, sb, m.A.Allocated, m.B.Allocated)
			}
		}
		if len(r.Timeline.A.AllocMax) != compare.DefaultColumns || r.Timeline.X1 <= r.Timeline.X0 {
			t.Errorf("%s: timeline [%d, %d] in %d columns", align, r.Timeline.X0, r.Timeline.X1, len(r.Timeline.A.AllocMax))
		}
	}
	// A chosen instant is a fourth moment; a window narrows the timeline.
	r := compareAnswer(t, f, devs[0], devs[1], "align=event&at=100&x0=50&x1=150&n=10")
	if at := r.Moments[3]; at.Key != "at" || at.X != 100 || at.A.Seq != r.A.FirstSeq+100 || at.B.Seq != r.B.FirstSeq+100 {
		t.Errorf("chosen %+v", at)
	}
	if r.Timeline.X0 != 50 || r.Timeline.X1 != 150 || r.Timeline.N != 10 || r.Timeline.Unit != "event" {
		t.Errorf("timeline %+v", r.Timeline)
	}
	page := string(f.get(t, "/compare/"+devs[0]+"/"+devs[1], http.StatusOK))
	if !strings.Contains(page, `data-a="`+devs[0]+`"`) || !strings.Contains(page, "compare.js") {
		t.Errorf("page %s", page[:min(len(page), 400)])
	}
}
