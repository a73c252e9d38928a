package server

import (
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

// The compare page of two training runs shows what the API answers: the
// same top row at A's peak; its alignment, grouping and moment are in the
// URL, and a click on the plot compares another instant.
func TestBrowserCompare(t *testing.T) {
	ctx := browser(t)
	f := newFixture(t, Options{})
	dir := shotDir(t)
	with, without := trainRun(t, f.db, true), trainRun(t, f.db, false)
	r := compareAnswer(t, f, with, without, "align=step")

	within(t, ctx, "navigate", chromedp.Navigate(f.srv.URL+"/compare/"+with+"/"+without+"?align=step"))
	waitFor(t, ctx, "the comparison", `document.getElementById("compare").dataset.ready === "1"`)
	screenshot(t, ctx, dir, "compare-training")
	top := within(t, ctx, "top row", chromedp.Evaluate[string](`document.querySelector("#delta tbody tr td").textContent`))
	if want := moment(t, r, "peak_a").Rows[0].Label; top != want || top != attnProbs {
		t.Errorf("page's top row %q, the API's %q", top, want)
	}
	tl := within(t, ctx, "timeline pixels", chromedp.Evaluate[float64](inkJS+`("cmp-timeline", 80, 60, 1300, 290)`))
	if tl < 0.05 {
		t.Errorf("the timeline looks empty: %.2f inked", tl)
	}

	// B's peak, by the tab.
	within(t, ctx, "B's peak tab", chromedp.Click(`[data-moment="peak_b"]`))
	waitFor(t, ctx, "the URL", `location.search.includes("m=peak_b")`)
	top = within(t, ctx, "top row", chromedp.Evaluate[string](`document.querySelector("#delta tbody tr td").textContent`))
	if top != attnProbs {
		t.Errorf("top row at B's peak %q", top)
	}

	// A click on the plot compares that instant.
	within(t, ctx, "click", chromedp.Evaluate[bool](`(() => {
		const c = document.getElementById("cmp-timeline"), r = c.getBoundingClientRect();
		c.dispatchEvent(new MouseEvent("click", {clientX: r.left + r.width / 2, clientY: r.top + 150, bubbles: true}));
		return true;
	})()`))
	waitFor(t, ctx, "the chosen instant", `location.search.includes("at=") && document.querySelector('[data-moment="at"]')?.classList.contains("active") && document.getElementById("compare").dataset.ready === "1"`)
	loc := within(t, ctx, "location", chromedp.Location())
	if !strings.Contains(loc, "align=step") || !strings.Contains(loc, "m=at") {
		t.Errorf("location %s", loc)
	}
	// The permalink reopens the same view.
	within(t, ctx, "reload", chromedp.Navigate(loc))
	waitFor(t, ctx, "the comparison again", `document.getElementById("compare").dataset.ready === "1"`)
	if tab := within(t, ctx, "tab", chromedp.Evaluate[string](`document.querySelector(".tab.active").dataset.moment`)); tab != "at" {
		t.Errorf("reopened on %q", tab)
	}
	screenshot(t, ctx, dir, "compare-training-at")

	// Grouped by category, step alignment of a trace without steps falls
	// back to time and says so.
	within(t, ctx, "self", chromedp.Navigate(fmt.Sprintf("%s/compare/%s/%s?align=step&group=category", f.srv.URL, f.id, with)))
	waitFor(t, ctx, "the comparison", `document.getElementById("compare").dataset.ready === "1"`)
	note := within(t, ctx, "note", chromedp.Text(`#align-note`))
	if !strings.Contains(note, "trace A has no step annotations") {
		t.Errorf("note %q", note)
	}
	screenshot(t, ctx, dir, "compare-no-steps")
}
