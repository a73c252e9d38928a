package gpu_test

import (
	"testing"

	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
)

// TestEventsToReachesAnyState: between layouts a real job passed through
// (its states every few hundred entries, including the one before its
// first entry and an empty one), the events EventsTo finds take the first
// to the second, whichever came first: what a live trace that lost entries
// stands in for them with.
func TestEventsToReachesAnyState(t *testing.T) {
	for _, name := range []string{"oom_nonexpandable.json", "expandable_oom_multigpu.pickle", "uint64_line_annotations.pickle"} {
		traces, err := pytorch.DecodeFile(testkit.Snapshot(t, name))
		if err != nil {
			t.Fatal(err)
		}
		tr := traces[0]
		states := []*gpu.Layout{gpu.NewLayout(tr.Initial.Rules)}
		l := tr.Initial.Clone()
		states = append(states, l.Clone())
		step := max(1, len(tr.Events)/12)
		for i, e := range tr.Events {
			if err := l.Apply(e); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if i%step == step-1 {
				states = append(states, l.Clone())
			}
		}
		states = append(states, l.Clone())
		if !l.Same(tr.Final) {
			t.Fatalf("%s: the replay does not end at the snapshot's segments", name)
		}
		pairs := 0
		for i, from := range states {
			for j, to := range states {
				if i == j {
					continue
				}
				evs, err := from.EventsTo(to)
				if err != nil {
					t.Fatalf("%s: state %d to %d: %v", name, i, j, err)
				}
				c := from.Clone()
				for _, e := range evs {
					if err := c.Apply(e); err != nil {
						t.Fatalf("%s: state %d to %d: %v", name, i, j, err)
					}
				}
				if !c.Same(to) {
					t.Fatalf("%s: state %d to %d: not reached", name, i, j)
				}
				pairs++
			}
		}
		if evs, _ := l.EventsTo(l.Clone()); len(evs) != 0 {
			t.Fatalf("%s: %d events from a state to itself", name, len(evs))
		}
		t.Logf("%s: %d pairs of states, %d segments at the end", name, pairs, len(l.Segments))
	}
}
