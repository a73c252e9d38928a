package tracer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
)

// paced is a sink and annotator that notes, as each step begins, the wall
// time and how many events it had been sent by then.
type paced struct {
	events int
	starts []time.Time
	sent   []int // events received when each step began
	simUS  []int64
}

func (p *paced) Emit(b []gpu.Event) { p.events += len(b) }

func (p *paced) Annotate(anns ...gpu.Annotation) {
	for _, a := range anns {
		if a.Stage == "START" && strings.HasPrefix(a.Name, "ProfilerStep#") {
			p.starts, p.sent, p.simUS = append(p.starts, time.Now()), append(p.sent, p.events), append(p.simUS, a.TimeUS)
		}
	}
}

func pacedEnv(t *testing.T, step time.Duration) (*Env, *paced) {
	t.Helper()
	p := &paced{}
	clk := &Clock{}
	a, err := caching.New(sim.New(8<<30), caching.Config{}, caching.WithClock(clk.Now), caching.WithSink(p))
	if err != nil {
		t.Fatal(err)
	}
	return &Env{Alloc: a, Clock: clk, Annotations: p, StepTime: step}, p
}

// Under StepTime each training step begins no sooner than StepTime after
// the one before, with every event of the steps before already sent on
// (a live page shows them while it waits); simulated time is what it
// would be unpaced.
func TestStepTimePacesTheSteps(t *testing.T) {
	const step = 40 * time.Millisecond
	env, p := pacedEnv(t, step)
	if err := Run(context.Background(), smallTrain(), env); err != nil {
		t.Fatal(err)
	}
	free, _ := pacedEnv(t, 0)
	unpaced := &paced{}
	free.Annotations = unpaced
	if err := Run(context.Background(), smallTrain(), free); err != nil {
		t.Fatal(err)
	}
	if len(p.starts) != smallTrain().Steps {
		t.Fatalf("%d steps began", len(p.starts))
	}
	for k := 1; k < len(p.starts); k++ {
		if d := p.starts[k].Sub(p.starts[0]); d < time.Duration(k)*step {
			t.Errorf("step %d began %v after the first; want at least %v", k, d, time.Duration(k)*step)
		}
		if p.sent[k] < unpaced.sent[k] || p.sent[k] == p.sent[k-1] {
			t.Errorf("step %d began with %d events sent; the steps before made %d", k, p.sent[k], unpaced.sent[k])
		}
	}
	for k := range p.simUS {
		if p.simUS[k] != unpaced.simUS[k] {
			t.Errorf("step %d begins at %d µs paced, %d unpaced", k, p.simUS[k], unpaced.simUS[k])
		}
	}
}

// A paced workload stops at once when it is interrupted while it waits
// for a step's turn (an hour here: a wait that did not stop would time the
// test out).
func TestStepTimeStopsWhenInterrupted(t *testing.T) {
	env, p := pacedEnv(t, time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := Run(ctx, smallTrain(), env); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run: %v; want it interrupted", err)
	}
	if len(p.starts) > 1 {
		t.Errorf("%d steps began", len(p.starts))
	}
}
