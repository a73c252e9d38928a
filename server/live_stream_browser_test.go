package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
	"vramscope/internal/testkit"
	"vramscope/live"
	"vramscope/tracer"
)

// stepGate holds a workload at the start of each training step after the
// first, its events flushed, until the test lets it go on: the test looks
// at the page between steps, where the allocator's own figures are known.
type stepGate struct {
	next  gpu.Annotator
	alloc *caching.Allocator
	at    chan int      // a step is about to begin: its number
	on    chan struct{} // go on
	stop  chan struct{} // closed: go on without waiting (the test ended)
}

func (g *stepGate) Annotate(anns ...gpu.Annotation) {
	for _, a := range anns {
		var k int
		if a.Stage == "START" && strings.HasPrefix(a.Name, "ProfilerStep#") && a.Name != "ProfilerStep#0" {
			fmt.Sscanf(a.Name, "ProfilerStep#%d", &k)
			g.alloc.Flush()
			select {
			case g.at <- k:
				select {
				case <-g.on:
				case <-g.stop:
				}
			case <-g.stop:
			}
		}
	}
	g.next.Annotate(anns...)
}

// TestBrowserLiveTraceFromFirstEventToEnd opens a live trace's page before
// its first event and watches it to the end: the memory axis is one of
// whole bytes before there is anything to draw; from the first event the
// window starts at it and grows with the stream, the event list grows and
// follows the cursor to the newest event, the steps come with their peaks
// (the running one as running), and the figures at the cursor are the
// allocator's own at that moment; at the end every step is closed and
// every event listed.
func TestBrowserLiveTraceFromFirstEventToEnd(t *testing.T) {
	testkit.EachBackend(t, testBrowserLiveTraceFromFirstEventToEnd)
}

func testBrowserLiveTraceFromFirstEventToEnd(t *testing.T) {
	ctx := browser(t)
	f := newFixture(t, Options{Addr: "127.0.0.1:0"})
	dir := shotDir(t)
	c, err := live.Dial(f.srv.URL, "", live.ClientOptions{Meta: gpu.TraceMeta{Name: "live from the start", Source: gpu.SourceLive, DeviceName: "simulated", Capacity: 16 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	within(t, ctx, "navigate", chromedp.Navigate(f.srv.URL+"/traces/"+c.TraceID()))
	waitReady(t, ctx)
	waitFor(t, ctx, "the empty list", `document.getElementById("events").innerText.includes("No events yet")`)
	labels := within(t, ctx, "memory axis", chromedp.Evaluate[[]string](`window.vramscope.timeline.memoryLabels`))
	seen := map[string]bool{}
	for _, l := range labels {
		if seen[l] || strings.Contains(l, ".") {
			t.Errorf("memory axis before the first event: %q: labels repeat or split a byte", labels)
			break
		}
		seen[l] = true
	}
	screenshot(t, ctx, dir, "live-empty")

	clk := &tracer.Clock{}
	a, err := caching.New(sim.New(16<<30), caching.DefaultConfig(), caching.WithSink(c), caching.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	gate := &stepGate{next: c, alloc: a, at: make(chan int), on: make(chan struct{}), stop: make(chan struct{})}
	w := tracer.DefaultTrain()
	w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 2, 256, 4096, 2, 128, 5
	done := make(chan error, 1)
	go func() {
		done <- tracer.Run(context.Background(), w, &tracer.Env{Alloc: a, Clock: clk, Stacks: c, Annotations: gate})
	}()
	defer func() { close(gate.stop); <-done }()
	firstUS := int64(-1)
	for k := 1; k < w.Steps; k++ {
		if got := <-gate.at; got != k {
			t.Fatalf("step %d began, want %d", got, k)
		}
		last := a.Seq() - 1
		waitAcked(t, c, last)
		tr := mustTrace(t, f, c.TraceID())
		if firstUS < 0 {
			firstUS = tr.FirstUS
		}
		// The page follows: its list holds every event and marks the
		// newest, which the cursor is on, with the allocator's figures.
		waitFor(t, ctx, fmt.Sprintf("the page at event %d", last), fmt.Sprintf(`(() => {
			const v = window.vramscope, d = v.segmap.data, cur = document.querySelector("#events .vrow.current");
			return v.lastSeq === %d && d?.seq === %d && cur?.dataset.seq === "%d";
		})()`, last, last, last))
		shown := within(t, ctx, "figures", chromedp.Evaluate[map[string]float64](`(() => {
			const v = window.vramscope, d = v.segmap.data, box = document.getElementById("events").getBoundingClientRect(),
				row = document.querySelector("#events .vrow.current").getBoundingClientRect();
			return {allocated: d.figures.allocated_bytes, reserved: d.figures.reserved_bytes, t0: v.t0, t1: v.t1,
				firstUS: v.firstUS, rowShown: row.top >= box.top && row.bottom <= box.bottom ? 1 : 0};
		})()`))
		if uint64(shown["allocated"]) != a.Allocated() || uint64(shown["reserved"]) != a.Reserved() {
			t.Errorf("before step %d the cursor shows %v allocated, %v reserved; the allocator had %d, %d", k, shown["allocated"], shown["reserved"], a.Allocated(), a.Reserved())
		}
		if int64(shown["firstUS"]) != firstUS || int64(shown["t0"]) > firstUS || int64(shown["t1"]) < tr.LastUS {
			t.Errorf("before step %d the window is [%v, %v] from %v; the trace runs from %d to %d", k, shown["t0"], shown["t1"], shown["firstUS"], firstUS, tr.LastUS)
		}
		if shown["rowShown"] != 1 {
			t.Errorf("before step %d the newest event's row is not in view in the list", k)
		}
		// The steps so far, each with its peak; none running (the next
		// has not begun).
		waitFor(t, ctx, fmt.Sprintf("steps 0 to %d", k-1), fmt.Sprintf(`window.vramscope.steps.length === %d && window.vramscope.steps.every(s => !s.open && s.peak.allocated_bytes > 0)`, k))
		if k == 1 {
			screenshot(t, ctx, dir, "live-first-step")
		}
		if k == w.Steps/2 {
			screenshot(t, ctx, dir, "live-midway")
		}
		gate.on <- struct{}{}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	done <- nil // for the deferred wait
	if err := c.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	tr := mustTrace(t, f, c.TraceID())
	waitFor(t, ctx, "the end", fmt.Sprintf(`document.querySelector(".live-badge").textContent === "complete" && window.vramscope.lastSeq === %d &&
		window.vramscope.steps.length === %d && window.vramscope.steps.every(s => !s.open)`, tr.LastSeq, w.Steps))
	screenshot(t, ctx, dir, "live-ended")
}

// waitAcked waits until the server has stored the client's events up to seq.
func waitAcked(t *testing.T, c *live.Client, seq int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for c.Acked() < seq {
		if time.Now().After(deadline) {
			t.Fatalf("events not acknowledged: %d of %d", c.Acked(), seq)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
