package attrib_test

import (
	"strings"
	"testing"

	"vramscope/attrib"
	"vramscope/internal/testkit"
	"vramscope/tracer"
)

// A run of many steps opens on its first few steady ones, each wide
// enough to see its shape, and says which steps of how many it shows; a
// run of few steps opens on all of them (here the time before the first
// step is left out, and said). The steps are read from the
// trace's regions, independently of Opening.
func TestOpeningShowsAFewSteadySteps(t *testing.T) {
	for _, c := range []struct {
		steps    int
		shown    int
		wantNote string
	}{
		{20, 8, "Opened on steps 0–7 of 0–19"},
		{5, 5, "Opened on steps 0–4: the "},
	} {
		db := testkit.OpenDB(t)
		w := tracer.Train{Layers: 2, Hidden: 256, Vocab: 1024, Batch: 2, Seq: 64, Steps: c.steps, DtypeBytes: 2, Seed: 1}
		id := testkit.Record(t, db, "train", w, 80<<30, "")
		cat, err := attrib.NewCategorizer(db, id)
		if err != nil {
			t.Fatal(err)
		}
		steps := attrib.Steps(cat.Regions())
		if len(steps) != c.steps {
			t.Fatalf("%d steps recorded, want %d", len(steps), c.steps)
		}
		o, err := cat.Opening()
		if err != nil {
			t.Fatal(err)
		}
		in := 0
		for _, s := range steps {
			if s.StartUS >= o.T0 && s.StartUS < o.T1 {
				in++
			}
		}
		// Before the first step shown, no more than a thirtieth of the
		// window: the steps fill it.
		if lead := steps[0].StartUS - o.T0; c.steps > 8 && (lead < 0 || lead > (o.T1-o.T0)/29) {
			t.Errorf("%d steps: the window [%d, %d] starts %d µs before step 0", c.steps, o.T0, o.T1, lead)
		}
		if in != c.shown {
			t.Errorf("%d steps: the opening window [%d, %d] holds the starts of %d steps, want %d", c.steps, o.T0, o.T1, in, c.shown)
		}
		if !strings.HasPrefix(o.Note, c.wantNote) {
			t.Errorf("%d steps: the note %q, want it to start %q", c.steps, o.Note, c.wantNote)
		}
	}
}
