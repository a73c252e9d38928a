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
func TestCompareCheckpointing(t *testing.T) {
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
func TestCompareErrors(t *testing.T) {
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
