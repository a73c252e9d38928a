package server

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/chromedp"

	"vramscope/internal/testkit"
)

// pageErrors gathers what the tab reports as going wrong from now on:
// console errors, uncaught exceptions and failed requests (the browser
// logs a 4xx or 5xx answer as an error). A 404 of /favicon.ico is no
// page's fault and is left out.
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
			if (m.Type == chromedp.ConsoleError || m.IsException()) && !strings.Contains(m.URL, "/favicon.ico") {
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
func TestBrowserStateOnlySnapshot(t *testing.T) {
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
func TestBrowserSummaryTabFirst(t *testing.T) {
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
