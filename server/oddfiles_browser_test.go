package server

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"vramscope/internal/testkit"
	"vramscope/tracer"
)

// pageErrors gathers what the tab reports as going wrong from now on:
// console errors, uncaught exceptions and failed requests (the browser
// logs a 4xx or 5xx answer as an error, /favicon.ico's too).
func pageErrors(t *testing.T, ctx context.Context) func() []string {
	t.Helper()
	var mu sync.Mutex
	var got []string
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				mu.Lock()
				got = append(got, m.String()+" "+m.URL)
				mu.Unlock()
			}
		}
	}()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}

// Snapshots that hold the allocator's state alone (no trace events: the
// list of segments torch.cuda.memory_snapshot() returns, a state-only
// dump of two devices) open without a failed request or an error on the
// page, and say they have no events instead of speaking of event -1.
func TestBrowserStateOnlySnapshot(t *testing.T) { testkit.EachBackend(t, testBrowserStateOnlySnapshot) }

func testBrowserStateOnlySnapshot(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	srv := serve(t, db)
	for _, name := range []string{"segments_list_only.pkl", "two_gpus_expandable_state_only.pickle"} {
		tr := importSnapshot(t, db, name)[0]
		errs := pageErrors(t, ctx)
		within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+tr.ID))
		waitReady(t, ctx)
		waitFor(t, ctx, "the live memory and the cursor panel", `!!document.getElementById("view").dataset.liveSeq
			&& !document.querySelector("#panel-cursor").innerText.includes("Loading")`)
		shown := within(t, ctx, "texts", chromedp.Evaluate[map[string]string](`({
			events: document.getElementById("events").innerText,
			cursor: document.getElementById("panel-cursor").innerText,
			live: document.getElementById("live-label").innerText,
			map: document.getElementById("cursor-label").innerText,
			window: document.getElementById("window-label").innerText,
			peakButtons: [...document.querySelectorAll("#go-peak, #live-peak")].filter((b) => !b.hidden).map((b) => b.textContent).join(" "),
			error: [...document.querySelectorAll("#view > .error")].filter((e) => !e.hidden).map((e) => e.innerText).join(" "),
		})`))
		screenshot(t, ctx, shotDir(t), "state-only-"+name)
		if !strings.Contains(shown["events"], "No events") {
			t.Errorf("%s: the event list shows %q", name, shown["events"])
		}
		for k, v := range shown {
			if strings.Contains(v, "-1") {
				t.Errorf("%s: %s shows %q", name, k, v)
			}
		}
		// The fragmentation's denominator is the "Cached free" row above it,
		// as the incident page names it.
		if !strings.Contains(shown["cursor"], "largest free / cached free") {
			t.Errorf("%s: the cursor panel reads %q", name, shown["cursor"])
		}
		if shown["peakButtons"] != "" {
			t.Errorf("%s: buttons to a peak event there is not: %q", name, shown["peakButtons"])
		}
		if shown["window"] != "no events" {
			t.Errorf("%s: the timeline's window is %q", name, shown["window"])
		}
		if shown["error"] != "" {
			t.Errorf("%s: the page shows the error %q", name, shown["error"])
		}
		if e := errs(); len(e) > 0 {
			t.Errorf("%s: %q", name, e)
		}
	}
}

// A trace view opened on the memory_summary() tab (a shared link) shows
// the summary at the cursor once the cursor is known, with no error about
// a missing time on the way.
func TestBrowserSummaryTabFirst(t *testing.T) { testkit.EachBackend(t, testBrowserSummaryTabFirst) }

func testBrowserSummaryTabFirst(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := importSnapshot(t, db, "training_22k_user_metadata.pickle")[0]
	srv := serve(t, db)
	errs := pageErrors(t, ctx)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+tr.ID+"?panel=summary"))
	waitReady(t, ctx)
	waitFor(t, ctx, "the summary", `document.getElementById("summary-text").textContent.includes("PyTorch CUDA memory summary")`)
	shown := within(t, ctx, "error", chromedp.Evaluate[string](`[...document.querySelectorAll("#view > .error")].filter((e) => !e.hidden).map((e) => e.innerText).join(" ")`))
	if shown != "" {
		t.Errorf("the page shows the error %q", shown)
	}
	if e := errs(); len(e) > 0 {
		t.Errorf("%q", e)
	}
}

// On a 1400 px window: every details tab is in sight (none cut off at the
// panel's edge), the event list of a trace without times has no time
// column to repeat its seqs, and the reason of a what-if replay that
// failed (no_time_us_segment_churn under roundup_power2_divisions:4 starts
// larger than the device) wraps inside the page instead of widening it.
func TestBrowserTabsAndFailedReplay(t *testing.T) {
	testkit.EachBackend(t, testBrowserTabsAndFailedReplay)
}

func testBrowserTabsAndFailedReplay(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := importSnapshot(t, db, "no_time_us_segment_churn.pickle")[0]
	srv := serve(t, db)
	errs := pageErrors(t, ctx)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+tr.ID))
	waitReady(t, ctx)
	hidden := within(t, ctx, "tabs", chromedp.Evaluate[[]string](`(() => {
		const box = document.querySelector("#tab-cursor").parentElement.getBoundingClientRect();
		return [...document.querySelectorAll(".tabs .tab")].filter((b) => {
			const r = b.getBoundingClientRect();
			return r.width === 0 || r.right > box.right + 0.5 || r.left < box.left - 0.5;
		}).map((b) => b.textContent);
	})()`))
	if len(hidden) > 0 {
		t.Errorf("tabs out of sight: %q", hidden)
	}
	// Without times, the event list's time column would repeat the seq.
	waitFor(t, ctx, "the event list", `document.querySelectorAll("#events .vrow .c-time").length > 5`)
	if times := within(t, ctx, "times", chromedp.Evaluate[string](`[...document.querySelectorAll("#events .vrow .c-time")].map((e) => e.textContent).join("")`)); times != "" {
		t.Errorf("the event list's times: %q", times)
	}
	waitFor(t, ctx, "the what-if table", `document.getElementById("needed").dataset.done === "1"`)
	width := within(t, ctx, "page width", chromedp.Evaluate[[]float64](`[document.documentElement.scrollWidth, document.documentElement.clientWidth]`))
	screenshot(t, ctx, shotDir(t), "failed-replay")
	if width[0] > width[1] {
		t.Errorf("the page is %v px wide in a %v px window", width[0], width[1])
	}
	if e := errs(); len(e) > 0 {
		t.Errorf("%q", e)
	}
}

// The trace list of real snapshots: its figures, durations in events
// included, and devices keep to one line each; only names may wrap.
func TestBrowserListOneLineFigures(t *testing.T) {
	testkit.EachBackend(t, testBrowserListOneLineFigures)
}

func testBrowserListOneLineFigures(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	for _, name := range []string{"no_time_us_segment_churn.pickle", "two_gpus_expandable_state_only.pickle", "expandable_oom_multigpu.pickle", "training_22k_user_metadata.pickle"} {
		importSnapshot(t, db, name)
	}
	testkit.Record(t, db, "demo: fragmentation OOM, a name long enough to need the room", tracer.DefaultFrag(), fragCapacity, "")
	srv := serve(t, db)
	errs := pageErrors(t, ctx)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/"))
	within(t, ctx, "list", chromedp.WaitVisible(`table.traces`))
	screenshot(t, ctx, shotDir(t), "list-of-real-snapshots")
	wrapped := within(t, ctx, "cells on more than one line", chromedp.Evaluate[[]string](`[...document.querySelectorAll("table.traces td:not(:first-child):not(:last-child), table.traces th:not(:last-child)")].filter((c) => {
		const r = document.createRange();
		r.selectNodeContents(c);
		return new Set([...r.getClientRects()].map((b) => Math.round(b.bottom))).size > 1;
	}).map((c) => c.textContent.trim())`))
	if len(wrapped) > 0 {
		t.Errorf("wrapped: %q", wrapped)
	}
	if e := errs(); len(e) > 0 {
		t.Errorf("%q", e)
	}
}

// Opened with the timeline as stacked category areas (slower to answer
// than the bands: the cursor waits for it), the segment map's label says
// it is loading rather than a time computed from no cursor
// ("at -29731240.37 min"), then the time at the peak.
func TestBrowserAreaBandsFirst(t *testing.T) { testkit.EachBackend(t, testBrowserAreaBandsFirst) }

func testBrowserAreaBandsFirst(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := importSnapshot(t, db, "training_22k_user_metadata.pickle")[0]
	srv := serve(t, db)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+tr.ID+"?bands=area"))
	seen := map[string]bool{}
	for deadline := time.Now().Add(90 * time.Second); ; {
		if time.Now().After(deadline) {
			t.Fatalf("no label at the peak; seen %v", seen)
		}
		got := within(t, ctx, "label", chromedp.Evaluate[map[string]string](`({label: document.getElementById("cursor-label")?.textContent ?? "",
			ready: document.getElementById("view")?.dataset.ready ?? ""})`))
		seen[got["label"]] = true
		if got["ready"] == "1" && strings.Contains(got["label"], "event") {
			break
		}
	}
	for l := range seen {
		if strings.Contains(l, "-") || strings.Contains(l, "NaN") || strings.Contains(l, "min") {
			t.Errorf("the segment map's label read %q", l)
		}
	}
}

// A snapshot whose one event spans no time (settings_no_annotations) gets
// a time axis of distinct whole microseconds, not "0 µs 0 µs 1 µs 1 µs".
func TestBrowserOneInstantAxis(t *testing.T) { testkit.EachBackend(t, testBrowserOneInstantAxis) }

func testBrowserOneInstantAxis(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := importSnapshot(t, db, "settings_no_annotations.pickle")[0]
	srv := serve(t, db)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+tr.ID))
	waitReady(t, ctx)
	labels := within(t, ctx, "ticks", chromedp.Evaluate[[]string](`vramscope.timeline.tickLabels`))
	seen := map[string]bool{}
	for _, l := range labels {
		if seen[l] {
			t.Errorf("the tick %q twice: %q", l, labels)
		}
		seen[l] = true
	}
	if len(labels) < 2 {
		t.Errorf("ticks %q", labels)
	}
}

// Two devices of one snapshot compared: their names differ only at the
// end ("… (cuda:0)", "… (cuda:1)"), so both are shown whole.
func TestBrowserCompareNamesWhole(t *testing.T) { testkit.EachBackend(t, testBrowserCompareNamesWhole) }

func testBrowserCompareNamesWhole(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	devs := importSnapshot(t, db, "two_gpus_expandable_state_only.pickle")
	srv := serve(t, db)
	errs := pageErrors(t, ctx)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/compare/"+devs[0].ID+"/"+devs[1].ID))
	waitFor(t, ctx, "the moments", `document.querySelectorAll("#moment-tabs .tab").length > 0`)
	screenshot(t, ctx, shotDir(t), "compare-two-devices")
	// Snapshots of no events hold one state each: both are drawn across
	// the plot, each in its colour.
	drawn := within(t, ctx, "pixels of A and B", chromedp.Evaluate[[]int](`[`+colourInkJS+`("cmp-timeline", "--reserved", 40), `+colourInkJS+`("cmp-timeline", "--allocated", 40)]`))
	if drawn[0] < 500 || drawn[1] < 500 {
		t.Errorf("pixels of A's and B's colours: %v", drawn)
	}
	clipped := within(t, ctx, "names", chromedp.Evaluate[[]string](`[...document.querySelectorAll(".cmp-name")].filter((e) => e.scrollWidth > e.clientWidth + 1).map((e) => e.textContent)`))
	if len(clipped) > 0 {
		t.Errorf("names cut off: %q", clipped)
	}
	if e := errs(); len(e) > 0 {
		t.Errorf("%q", e)
	}
}
