package server

import (
	"context"
	"strings"
	"testing"
	"time"
	"vramscope/internal/testkit"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
	"vramscope/live"
	"vramscope/tracer"
)

// TestBrowserFollowsLiveTrace streams a running workload to the server and
// watches its trace page: the badge says live, the window grows with the
// stream, L pauses and resumes following, and the end of the stream shows.
func TestBrowserFollowsLiveTrace(t *testing.T) { testkit.EachBackend(t, testBrowserFollowsLiveTrace) }

func testBrowserFollowsLiveTrace(t *testing.T) {
	ctx := browser(t)
	f := newFixture(t, Options{Addr: "127.0.0.1:0"})
	dir := shotDir(t)

	c, err := live.Dial(f.srv.URL, "", live.ClientOptions{Meta: gpu.TraceMeta{Name: "live run", Source: gpu.SourceLive, DeviceName: "simulated", Capacity: 16 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	clk := &tracer.Clock{}
	a, err := caching.New(sim.New(16<<30), caching.DefaultConfig(), caching.WithSink(c), caching.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	env := &tracer.Env{Alloc: a, Clock: clk, Stacks: c}
	// One training step at a time, so the page sees the trace grow.
	w := tracer.DefaultTrain()
	w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 2, 256, 4096, 2, 128, 1
	step := func(seed uint64) {
		w.Seed = seed
		if err := tracer.Run(context.Background(), w, env); err != nil {
			t.Fatal(err)
		}
		clk.Advance(1_000_000)
		a.Malloc(512, 0, 0) // an event at the new time
		a.Flush()
		deadline := time.Now().Add(20 * time.Second)
		for c.Acked() < a.Seq()-1 {
			if time.Now().After(deadline) {
				t.Fatalf("events not acknowledged: %d of %d", c.Acked(), a.Seq())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	step(1)

	within(t, ctx, "navigate", chromedp.Navigate(f.srv.URL+"/traces/"+c.TraceID()))
	waitReady(t, ctx)
	waitFor(t, ctx, "live badge", `document.querySelector(".live-badge")?.textContent.includes("live")`)
	t1 := within(t, ctx, "window end", chromedp.Evaluate[float64](`window.vramscope.t1`))

	step(2)
	step(3)
	waitFor(t, ctx, "the window follows the stream", `window.vramscope.t1 > `+ftoa(t1+1_500_000))
	screenshot(t, ctx, dir, "live-following")

	// L stops following to look back; L again follows.
	within(t, ctx, "pause", chromedp.KeyEvent("l"))
	waitFor(t, ctx, "paused badge", `document.querySelector(".live-badge").dataset.following === "0"`)
	paused := within(t, ctx, "window end", chromedp.Evaluate[float64](`window.vramscope.t1`))
	step(4)
	// Once the page has taken the update that a following page would
	// have moved on, a paused one has not moved.
	waitFor(t, ctx, "the paused page told of step 4", `window.vramscope.live.state.seq >= `+strconvI(a.Seq()-1))
	if now := within(t, ctx, "window end", chromedp.Evaluate[float64](`window.vramscope.t1`)); now != paused {
		t.Errorf("a paused view moved: t1 %v -> %v", paused, now)
	}
	within(t, ctx, "resume", chromedp.KeyEvent("l"))
	waitFor(t, ctx, "following again", `document.querySelector(".live-badge").dataset.following === "1" && window.vramscope.t1 > `+ftoa(paused))

	// A wheel zoom is the user's own move: it stops following, where the
	// moves that follow the stream did not.
	box := within(t, ctx, "timeline box", chromedp.Evaluate[map[string]float64](
		`(() => { const r = document.getElementById("timeline").getBoundingClientRect(); return {x: r.left + r.width/2, y: r.top + r.height/2}; })()`))
	within(t, ctx, "wheel", chromedp.MouseEvent(input.DispatchMouseEventTypeMouseWheel, box["x"], box["y"], func(p *input.DispatchMouseEventParams) { p.DeltaY, p.DeltaX = -400, 1e-6 }))
	waitFor(t, ctx, "paused by the wheel", `document.querySelector(".live-badge").dataset.following === "0"`)

	if err := c.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "complete badge", `document.querySelector(".live-badge").textContent.includes("complete")`)
	tr, err := f.db.Trace(c.TraceID())
	if err != nil || tr.Status != gpu.StatusComplete || tr.Events != a.Seq() {
		t.Fatalf("stored trace %+v, %v (allocator emitted %d)", tr, err, a.Seq())
	}
	if !strings.HasPrefix(tr.Name, "live run") {
		t.Errorf("name %q", tr.Name)
	}
}

func ftoa(f float64) string { return strconvI(int64(f)) }

// A live trace opened before its first event is no snapshot of one
// state: its event list says it had none yet, and the go-to-peak button
// stays for the peak to come.
func TestBrowserLiveTraceBeforeItsFirstEvent(t *testing.T) {
	testkit.EachBackend(t, testBrowserLiveTraceBeforeItsFirstEvent)
}

func testBrowserLiveTraceBeforeItsFirstEvent(t *testing.T) {
	ctx := browser(t)
	f := newFixture(t, Options{Addr: "127.0.0.1:0"})
	c, err := live.Dial(f.srv.URL, "", live.ClientOptions{Meta: gpu.TraceMeta{Name: "live run", Source: gpu.SourceLive, DeviceName: "simulated", Capacity: 16 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(gpu.StatusComplete)
	within(t, ctx, "navigate", chromedp.Navigate(f.srv.URL+"/traces/"+c.TraceID()))
	waitFor(t, ctx, "the event list", `document.getElementById("events")?.innerText.includes("No events")`)
	shown := within(t, ctx, "texts", chromedp.Evaluate[map[string]string](`({
		events: document.getElementById("events").innerText,
		peak: String(document.getElementById("go-peak").hidden),
	})`))
	if !strings.Contains(shown["events"], "listed as they come") || strings.Contains(shown["events"], "snapshot") || shown["peak"] != "false" {
		t.Errorf("%q", shown)
	}
}

// The run page says which ranks are still streaming and which streams
// ended early: neither is a whole trace.
func TestBrowserRunOfLiveRanks(t *testing.T) { testkit.EachBackend(t, testBrowserRunOfLiveRanks) }

func testBrowserRunOfLiveRanks(t *testing.T) {
	ctx := browser(t)
	f := newFixture(t, Options{Addr: "127.0.0.1:0"})
	dir := shotDir(t)
	rank := func(r int, size uint64) *live.Client {
		c, err := live.Dial(f.srv.URL, "", live.ClientOptions{Meta: gpu.TraceMeta{Name: "job", DeviceName: "simulated", Capacity: 16 << 30},
			Run: &live.RunJoin{Name: "job", Rank: r, WorldSize: 2}})
		if err != nil {
			t.Fatal(err)
		}
		c.Emit([]gpu.Event{
			{Seq: 0, TimeUS: 1, Action: gpu.ActionSegmentAlloc, Addr: 1 << 30, Size: size},
			{Seq: 1, TimeUS: 1000, Action: gpu.ActionAlloc, Addr: 1 << 30, Size: size},
		})
		for c.Acked() < 1 {
			time.Sleep(10 * time.Millisecond)
		}
		return c
	}
	streaming := rank(0, 4<<30)
	cut := rank(1, 2<<30)
	cut.Abandon()
	run, ok, err := f.db.RunOf(mustTrace(t, f, cut.TraceID()).Upload)
	if err != nil || !ok {
		t.Fatalf("no run: %v", err)
	}
	within(t, ctx, "navigate", chromedp.Navigate(f.srv.URL+"/runs/"+run.ID))
	waitFor(t, ctx, "the ranks' statuses", `[...document.querySelectorAll("#peaks li")].map(li => li.querySelector(".badge.status")?.textContent ?? "").join() === "live,incomplete"`)
	screenshot(t, ctx, dir, "run-live-ranks")

	// The page follows the live rank: a larger peak later in the run shows
	// without a reload, in a window that grew to hold it.
	streaming.Emit([]gpu.Event{
		{Seq: 2, TimeUS: 2000, Action: gpu.ActionSegmentAlloc, Addr: 8 << 30, Size: 4 << 30},
		{Seq: 3, TimeUS: 3000, Action: gpu.ActionAlloc, Addr: 8 << 30, Size: 4 << 30},
	})
	for streaming.Acked() < 3 {
		time.Sleep(10 * time.Millisecond)
	}
	waitFor(t, ctx, "the live rank's new peak", `runPage.page.data.rows.find(r => r.status === "live")?.peak_bytes === 8 * 2**30 && runPage.page.t1 >= 3000`)
	screenshot(t, ctx, dir, "run-live-followed")

	if err := streaming.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	within(t, ctx, "reload", chromedp.Reload())
	waitFor(t, ctx, "only the cut rank flagged", `[...document.querySelectorAll("#peaks li")].map(li => li.querySelector(".badge.status")?.textContent ?? "").join() === ",incomplete"`)
}

func mustTrace(t *testing.T, f *fixture, id string) gpu.Trace {
	t.Helper()
	tr, err := f.db.Trace(id)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// The trace list follows what streams: a live trace's events, peak and
// badge grow without a reload, its end shows, rows that did not change
// stay as they were, and once nothing on it is live the list stops
// reading itself.
func TestBrowserListFollowsLiveTrace(t *testing.T) {
	testkit.EachBackend(t, testBrowserListFollowsLiveTrace)
}

func testBrowserListFollowsLiveTrace(t *testing.T) {
	ctx := browser(t)
	f := newFixture(t, Options{Addr: "127.0.0.1:0"})
	dir := shotDir(t)
	importSnapshot(t, f.db, "training_22k_user_metadata.pickle")
	dial := func(name string, run *live.RunJoin) *live.Client {
		c, err := live.Dial(f.srv.URL, "", live.ClientOptions{Meta: gpu.TraceMeta{Name: name, Source: gpu.SourceLive, DeviceName: "simulated", Capacity: 16 << 30}, Run: run})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	emit := func(c *live.Client, events ...gpu.Event) {
		c.Emit(events)
		for c.Acked() < events[len(events)-1].Seq {
			time.Sleep(10 * time.Millisecond)
		}
	}
	streaming := dial("streaming", nil)
	emit(streaming,
		gpu.Event{Seq: 0, TimeUS: 1, Action: gpu.ActionSegmentAlloc, Addr: 1 << 30, Size: 1 << 30},
		gpu.Event{Seq: 1, TimeUS: 1000, Action: gpu.ActionAlloc, Addr: 1 << 30, Size: 1 << 30})
	rank := dial("job", &live.RunJoin{Name: "job", Rank: 0, WorldSize: 1})
	emit(rank, gpu.Event{Seq: 0, TimeUS: 1, Action: gpu.ActionSegmentAlloc, Addr: 1 << 30, Size: 2 << 20})

	within(t, ctx, "navigate", chromedp.Navigate(f.srv.URL+"/"))
	row := `document.querySelector('tr[data-id="` + streaming.TraceID() + `"]')`
	cells := row + `.cells`
	runRow := `document.querySelector("tr.run-row")`
	waitFor(t, ctx, "the live row", row+` && `+row+`.dataset.live === "" && `+cells+`[3].textContent === "live" && `+cells+`[4].querySelector(".events")?.textContent === "2 events" && `+cells+`[5].textContent === "1.00 GiB"`)
	waitFor(t, ctx, "the live run", runRow+`?.dataset.live === "" && `+runRow+`.cells[4].querySelector(".events")?.textContent === "1 event" && `+runRow+`.querySelector("summary").textContent === "1 rank, 1 trace · highest: rank 0"`)
	// Marks a reload or a swapped row would lose.
	within(t, ctx, "mark", chromedp.Evaluate[bool](`window.notReloaded = true; document.querySelector('tr[data-id="`+f.id+`"]').notSwapped = true`))

	emit(streaming,
		gpu.Event{Seq: 2, TimeUS: 2000, Action: gpu.ActionSegmentAlloc, Addr: 8 << 30, Size: 4 << 30},
		gpu.Event{Seq: 3, TimeUS: 3000, Action: gpu.ActionAlloc, Addr: 8 << 30, Size: 4 << 30})
	emit(rank, gpu.Event{Seq: 1, TimeUS: 2, Action: gpu.ActionAlloc, Addr: 1 << 30, Size: 1 << 20})
	waitFor(t, ctx, "the live row's growth", cells+`[4].querySelector(".events")?.textContent === "4 events" && `+cells+`[5].textContent === "5.00 GiB" && `+cells+`[4].textContent.startsWith("3.0 ms")`)
	waitFor(t, ctx, "the live run's growth", runRow+`.cells[4].querySelector(".events")?.textContent === "2 events"`)
	screenshot(t, ctx, dir, "list-live")
	if ok := within(t, ctx, "marks", chromedp.Evaluate[bool](`window.notReloaded === true && document.querySelector('tr[data-id="`+f.id+`"]').notSwapped === true`)); !ok {
		t.Error("the list reloaded, or swapped a row that did not change")
	}

	if err := streaming.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the end of the stream", cells+`[3].textContent === "complete" && `+row+`.dataset.live === undefined && !`+cells+`[4].querySelector(".events")`)
	if err := rank.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the end of the run's stream", runRow+`.dataset.live === undefined && !`+runRow+`.cells[4].querySelector(".events")`)
	screenshot(t, ctx, dir, "list-live-ended")
	// The list read itself while rows were live; once none is, it has no
	// read to come or under way (the page says when it schedules one).
	waitFor(t, ctx, "the list to stop following", `document.querySelector("table.traces tbody").dataset.following === undefined`)
	reads := within(t, ctx, "list reads", chromedp.Evaluate[map[string]int](`({
		done: performance.getEntriesByType("resource").filter(e => e.initiatorType === "xmlhttprequest").length,
		started: window.vramscopeListReads})`))
	if reads["started"] == 0 || reads["done"] != reads["started"] {
		t.Errorf("the list read itself %d times while live, %d of them done once nothing was", reads["started"], reads["done"])
	}
}
