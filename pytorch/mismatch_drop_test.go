package pytorch

import (
	"strings"
	"testing"
)

// TestEventsThatDoNotFitAreDropped: an event the segments contradict is
// recorded in Mismatches and left out of Events, so the rest replays
// cleanly from Initial (as the store replays it).
func TestEventsThatDoNotFitAreDropped(t *testing.T) {
	js := `{"segments": [{"device": 0, "address": 1048576, "total_size": 2097152, "allocated_size": 0, "active_size": 0,
	  "requested_size": 0, "stream": 0, "segment_type": "small", "blocks": [{"address": 1048576, "size": 2097152, "requested_size": 0, "state": "inactive"}]}],
	 "device_traces": [[
	  {"action": "alloc", "addr": 1048576, "size": 100, "stream": 0},
	  {"action": "alloc", "addr": 9437184, "size": 512, "stream": 0},
	  {"action": "free_requested", "addr": 1048576, "size": 100, "stream": 0},
	  {"action": "free_completed", "addr": 1048576, "size": 100, "stream": 0}]]}`
	traces, err := Decode(strings.NewReader(js))
	if err != nil {
		t.Fatal(err)
	}
	tr := traces[0]
	if len(tr.Mismatches) == 0 || !strings.Contains(tr.Mismatches[0].Error(), "event 1") {
		t.Fatalf("mismatches %v", tr.Mismatches)
	}
	if len(tr.Events) != 3 || tr.Events[1].Seq != 2 {
		t.Fatalf("events %v", tr.Events)
	}
	l := tr.Initial.Clone()
	for _, e := range tr.Events {
		if err := l.Apply(e); err != nil {
			t.Fatalf("kept events do not replay: %v", err)
		}
	}
	if l.Figures() != tr.Final.Figures() {
		t.Errorf("replay ends at %+v, snapshot %+v", l.Figures(), tr.Final.Figures())
	}
}
