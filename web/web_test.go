package web

import (
	"testing"

	"vramscope/gpu"
)

// A trace without times (a snapshot without time_us) has event indexes for
// times: its duration and its OOM's place are given in events, never as
// microseconds.
func TestTimesOfTracesWithoutTimes(t *testing.T) {
	timed := gpu.Trace{Events: 1299, FirstUS: 1_000_000, LastUS: 2_140_000}
	noTime := gpu.Trace{Events: 10327, TraceMeta: gpu.TraceMeta{NoTime: true}, LastUS: 10326}
	for _, c := range []struct {
		t    gpu.Trace
		want string
	}{
		{timed, "1.14 s"},
		{noTime, "10327 events"},
		{gpu.Trace{Events: 1, TraceMeta: gpu.TraceMeta{NoTime: true}}, "1 event"},
		{gpu.Trace{TraceMeta: gpu.TraceMeta{NoTime: true}}, "–"},
	} {
		if got := TraceDuration(c.t); got != c.want {
			t.Errorf("%+v: %q, want %q", c.t, got, c.want)
		}
	}
	in := gpu.Incident{Seq: 1117, TimeUS: 2_040_000}
	if got, want := oomWhen(timed, in), "out of memory at event 1117, 1.04 s into the trace"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	in.TimeUS = 1117
	if got, want := oomWhen(noTime, in), "out of memory at event 1117"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}
