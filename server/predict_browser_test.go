package server

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"vramscope/internal/testkit"
)

// The compare page's Predict form, filled from the traces' names, opens
// the Predict page with the predictions; the incident page of an OOM at a
// batch that did not fit says which would have.
func TestBrowserPredict(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	dir := shotDir(t)
	a, b := recordGPT(t, db, 2, 80<<30), recordGPT(t, db, 4, 80<<30)
	oom := recordGPT(t, db, 32, 16<<30)
	s := New(Options{DB: db, Logger: quietLogger()})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)

	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/compare/"+a+"/"+b))
	waitFor(t, ctx, "the comparison", `document.getElementById("compare").dataset.ready === "1"`)
	within(t, ctx, "scroll", chromedp.ScrollIntoView(`#predict-form`))
	screenshot(t, ctx, dir, "compare-predict-form")
	within(t, ctx, "at", chromedp.SendKeys(`input[name="at"]`, "8,16,32,64"))
	within(t, ctx, "capacity", chromedp.SendKeys(`input[name="capacity"]`, "16GiB"))
	within(t, ctx, "what-if", chromedp.Click(`input[name="whatif"]`))
	// The replays wait for the server's replay slot: the page says so and
	// reads itself again until they are done.
	s.replaySlots <- struct{}{}
	within(t, ctx, "submit", chromedp.Click(`#predict-form button[type="submit"]`))
	waitFor(t, ctx, "the running page", `document.getElementById("predict")?.dataset.running === "1"`)
	screenshot(t, ctx, dir, "predict-running")
	<-s.replaySlots
	waitFor(t, ctx, "the predictions", `document.querySelectorAll("#predictions tbody tr").length === 4`)
	loc := within(t, ctx, "location", chromedp.Location())
	for _, want := range []string{"/compare/" + a + "/" + b + "/predict?", "batch_a=2", "batch_b=4", "at=8%2C16%2C32%2C64", "capacity=16GiB", "whatif=1"} {
		if !strings.Contains(loc, want) {
			t.Errorf("location %s lacks %s", loc, want)
		}
	}
	largest := within(t, ctx, "largest", chromedp.Evaluate[string](`document.getElementById("largest").textContent`))
	if !strings.HasPrefix(largest, "The largest batch that fits 16.00 GiB (asked for): ") {
		t.Errorf("largest: %q", largest)
	}
	least := within(t, ctx, "what-if column", chromedp.Evaluate[string](`document.querySelector("#predictions tbody tr td:nth-child(5)").textContent`))
	if !strings.Contains(least, "with ") && least != "none needs less" {
		t.Errorf("what-if column: %q", least)
	}
	screenshot(t, ctx, dir, "predict")

	within(t, ctx, "incident", chromedp.Navigate(srv.URL+"/traces/"+oom+"/incidents/1"))
	waitFor(t, ctx, "the incident page", `document.getElementById("incident")?.dataset.ready === "1" && document.getElementById("incident").dataset.whatif === "done"`)
	fit := within(t, ctx, "sentence", chromedp.Evaluate[string](`document.getElementById("batch-fit").textContent`))
	if !strings.HasPrefix(fit, "Batch ") || !strings.Contains(fit, " would have fit this 16.00 GiB device; batch 32 needs ") ||
		!strings.HasSuffix(fit, `Predicted from the traces "gpt batch 2" and "gpt batch 4", recorded at batch 2 and 4.`) {
		t.Errorf("incident page: %q", fit)
	}
	screenshot(t, ctx, dir, "incident-batch-fit")
}
