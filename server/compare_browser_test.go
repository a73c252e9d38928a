package server

import (
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"

	"vramscope/internal/testkit"
	"vramscope/tracer"
)

// The compare page of two training runs shows what the API answers: the
// same top row at A's peak; its alignment, grouping and moment are in the
// URL, and a click on the plot compares another instant.
func TestBrowserCompare(t *testing.T) { testkit.EachBackend(t, testBrowserCompare) }

func testBrowserCompare(t *testing.T) {
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
	box := within(t, ctx, "plot box", chromedp.Evaluate[map[string]float64](
		`(() => { const r = document.getElementById("cmp-timeline").getBoundingClientRect(); return {x: r.left, y: r.top, w: r.width}; })()`))
	within(t, ctx, "click", chromedp.MouseClickXY(box["x"]+box["w"]/2, box["y"]+150))
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

	// A drag zooms: the window is in the URL and the answer covers it.
	x0, x1 := box["x"]+300, box["x"]+700
	for _, step := range []struct {
		typ input.DispatchMouseEventType
		x   float64
	}{{input.DispatchMouseEventTypeMousePressed, x0}, {input.DispatchMouseEventTypeMouseMoved, (x0 + x1) / 2},
		{input.DispatchMouseEventTypeMouseMoved, x1}, {input.DispatchMouseEventTypeMouseReleased, x1}} {
		within(t, ctx, "drag", chromedp.MouseEvent(step.typ, step.x, box["y"]+150, func(e *input.DispatchMouseEventParams) {
			e.Button, e.Buttons = input.MouseButtonLeft, 1
		}))
	}
	waitFor(t, ctx, "the zoomed window", `location.search.includes("x0=") && document.getElementById("compare").dataset.ready === "1" && comparePage.page.data.timeline.x0 === comparePage.page.x0 - comparePage.page.x0 % 1`)
	if hidden := within(t, ctx, "whole button", chromedp.Evaluate[bool](`document.getElementById("reset").hidden`)); hidden {
		t.Error("no way back to the whole traces")
	}
	screenshot(t, ctx, dir, "compare-training-zoomed")
	within(t, ctx, "dark theme", chromedp.Click(`#theme`))
	screenshot(t, ctx, dir, "compare-training-dark")
	within(t, ctx, "light theme", chromedp.Click(`#theme`))

	// Grouped by category, step alignment of a trace without steps falls
	// back to time and says so.
	within(t, ctx, "self", chromedp.Navigate(fmt.Sprintf("%s/compare/%s/%s?align=step&group=category", f.srv.URL, f.id, with)))
	waitFor(t, ctx, "the comparison", `document.getElementById("compare").dataset.ready === "1"`)
	note := within(t, ctx, "note", chromedp.Text(`#align-note`))
	if !strings.HasPrefix(note, "Trace A has no step annotations (ProfilerStep#N): aligned by time.") {
		t.Errorf("note %q", note)
	}
	screenshot(t, ctx, dir, "compare-no-steps")
}

// Two real snapshots (cs336 training runs of two models) compared: the
// page shows the API's top row at the largest divergence.
func TestBrowserCompareRealSnapshots(t *testing.T) {
	testkit.EachBackend(t, testBrowserCompareRealSnapshots)
}

func testBrowserCompareRealSnapshots(t *testing.T) {
	ctx := browser(t)
	f := newFixture(t, Options{})
	dir := shotDir(t)
	a := uploadFile(t, f, "training_22k_user_metadata.pickle").Traces[0].ID
	b := uploadFile(t, f, "uint64_line_annotations.pickle").Traces[0].ID
	r := compareAnswer(t, f, a, b, "")
	want := moment(t, r, "divergence").Rows[0].Label

	within(t, ctx, "navigate", chromedp.Navigate(f.srv.URL+"/compare/"+a+"/"+b+"?m=divergence"))
	waitFor(t, ctx, "the comparison", `document.getElementById("compare").dataset.ready === "1"`)
	screenshot(t, ctx, dir, "compare-real")
	top := within(t, ctx, "top row", chromedp.Evaluate[string](`document.querySelector("#delta tbody tr td").textContent`))
	if top != want {
		t.Errorf("page's top row %q, the API's %q", top, want)
	}
	within(t, ctx, "group by stack", chromedp.SetValue(`#group`, "stack"))
	within(t, ctx, "change", chromedp.Evaluate[bool](`document.getElementById("group").dispatchEvent(new Event("change")) || true`))
	waitFor(t, ctx, "by stack", `location.search.includes("group=stack") && document.getElementById("compare").dataset.ready === "1"`)
	screenshot(t, ctx, dir, "compare-real-stack")
	within(t, ctx, "by event", chromedp.Click(`[data-align="event"]`))
	waitFor(t, ctx, "by event", `location.search.includes("align=event") && document.getElementById("compare").dataset.ready === "1"`)
	if href := within(t, ctx, "swap", chromedp.Evaluate[string](`document.getElementById("swap").getAttribute("href")`)); href != "/compare/"+b+"/"+a+"?align=event&group=stack" {
		t.Errorf("swap goes to %s", href)
	}
	screenshot(t, ctx, dir, "compare-real-event")

	// Traces without time_us are aligned by event whatever was asked; the
	// pressed button is the alignment used, and the note says why.
	c := uploadFile(t, f, "no_time_us_segment_churn.pickle").Traces[0].ID
	within(t, ctx, "navigate", chromedp.Navigate(f.srv.URL+"/compare/"+c+"/"+a))
	waitFor(t, ctx, "the comparison without times", `document.getElementById("compare").dataset.ready === "1"`)
	pressed := within(t, ctx, "pressed", chromedp.Evaluate[string](`document.querySelector('[data-align][aria-pressed="true"]').dataset.align`))
	note := within(t, ctx, "note", chromedp.Text(`#align-note`))
	if pressed != "event" || !strings.Contains(note, "aligned by event") {
		t.Errorf("pressed %q, note %q", pressed, note)
	}
}

// The run page's Compare opens the comparison of the two ranks picked.
func TestBrowserCompareFromARun(t *testing.T) { testkit.EachBackend(t, testBrowserCompareFromARun) }

func testBrowserCompareFromARun(t *testing.T) {
	ctx := browser(t)
	f := newFixture(t, Options{})
	job := tracer.Parallel{Train: tracer.DefaultTrain(), Ranks: 2, Mode: tracer.PipelineParallel}
	job.Layers, job.Hidden, job.Vocab, job.Seq, job.Steps = 4, 512, 2048, 256, 2
	run, err := f.db.Run(testkit.RecordRun(t, f.db, "pipeline", job, 80<<30))
	if err != nil {
		t.Fatal(err)
	}
	within(t, ctx, "navigate", chromedp.Navigate(f.srv.URL+"/runs/"+run.ID))
	within(t, ctx, "compare", chromedp.Click(`#compare-form button[type=submit]`))
	waitFor(t, ctx, "the comparison", `document.getElementById("compare")?.dataset.ready === "1"`)
	loc := within(t, ctx, "location", chromedp.Location())
	if want := "/compare/" + run.Ranks[0].Traces[0].ID + "/" + run.Ranks[1].Traces[0].ID; !strings.Contains(loc, want) {
		t.Errorf("location %s, want %s", loc, want)
	}
	// Pipeline stages hold different layers: their peaks differ.
	if d := within(t, ctx, "delta", chromedp.Text(`#figures tr[data-key="peak_allocated"] td:nth-of-type(3)`)); d == "0 B" || d == "" {
		t.Errorf("peak allocated B − A %q", d)
	}
}
