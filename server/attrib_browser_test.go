package server

import (
	"context"
	"fmt"
	"testing"

	"github.com/chromedp/chromedp"

	"vramscope/internal/testkit"
	"vramscope/tracer"
)

// choose picks an option of a select as a user does: its value, then change.
func choose(t *testing.T, ctx context.Context, sel, value string) {
	t.Helper()
	within(t, ctx, "choose "+value+" in "+sel, chromedp.Evaluate[bool](fmt.Sprintf(`(() => { const s = document.querySelector(%q);
		s.value = %q; s.dispatchEvent(new Event("change")); return true; })()`, sel, value)))
}

// On a real training snapshot: a click on "Peak" shows the live memory at
// the peak as a flame graph and a table, topped by the attention's
// softmax; a click on that frame in the graph highlights its 24
// allocations on the timeline and on the segment map; grouping by
// category and colouring the timeline's bands by category follow.
func TestBrowserLiveMemory(t *testing.T) { testkit.EachBackend(t, testBrowserLiveMemory) }

func testBrowserLiveMemory(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := importSnapshot(t, db, "training_22k_user_metadata.pickle")[0]
	srv := serve(t, db)
	dir := shotDir(t)

	// Start away from the peak, then click Peak.
	within(t, ctx, "navigate", chromedp.Navigate(fmt.Sprintf("%s/traces/%s?e=%d", srv.URL, tr.ID, tr.FirstSeq+10)))
	waitReady(t, ctx)
	within(t, ctx, "live set away from the peak", chromedp.Poll[bool](fmt.Sprintf(`document.getElementById("view").dataset.liveSeq === "%d"`, tr.FirstSeq+10)))
	within(t, ctx, "click Peak", chromedp.Click("#live-peak"))
	within(t, ctx, "live set at the peak", chromedp.Poll[bool](fmt.Sprintf(`document.getElementById("view").dataset.liveSeq === "%d"
		&& vramscopeLive.data.bytes === %d`, tr.PeakSeq, tr.PeakAllocated)))
	top := within(t, ctx, "table", chromedp.Evaluate[string](`document.querySelector("#live-table tbody tr td").textContent`))
	if top != "nn_utils.py:6 softmax" {
		t.Errorf("the table's top frame at the peak: %q", top)
	}
	if ink := within(t, ctx, "flame ink", chromedp.Evaluate[float64](inkJS+`("flame", 0, 0, 400, 36)`)); ink < 0.5 {
		t.Errorf("the flame graph's top rows are %.0f %% drawn", 100*ink)
	}
	screenshot(t, ctx, dir, "live-peak")

	// Click the softmax frame in the graph, where it is drawn.
	at := within(t, ctx, "softmax's place", chromedp.Evaluate[map[string]float64](`(() => {
		const f = vramscopeLive.flame, e = f.nodes.find(e => e.depth === 1 && e.node.name === "nn_utils.py:6 softmax");
		const r = f.canvas.getBoundingClientRect();
		return {x: r.left + (f.xOf(e.off) + f.xOf(e.off + e.node.bytes)) / 2, y: r.top + e.depth * 18 + 9};
	})()`))
	within(t, ctx, "click the frame", chromedp.MouseClickXY(at["x"], at["y"]))
	within(t, ctx, "its allocations highlighted", chromedp.Poll[bool](`vramscope.highlight && vramscope.highlight.seqs.size === 24`))
	within(t, ctx, "drawn", chromedp.Poll[bool](colourInkJS+`("timeline", "--hl", 40) > 200 && `+colourInkJS+`("segmap", "--hl", 40) > 200`))
	bands := within(t, ctx, "highlighted bands", chromedp.Evaluate[int](`vramscope.timeline.bands.bands.filter(b => vramscope.highlighted(b.seq, b.address)).length`))
	if bands == 0 {
		t.Error("no band of the picked frame's allocations is highlighted")
	}
	if picked := within(t, ctx, "row", chromedp.Evaluate[string](`document.querySelector("#live-table tr.picked td")?.textContent || ""`)); picked != "nn_utils.py:6 softmax" {
		t.Errorf("the table marks %q", picked)
	}
	screenshot(t, ctx, dir, "live-frame-picked")
	// Clicking the root zooms out and clears the highlight.
	root := within(t, ctx, "root", chromedp.Evaluate[map[string]float64](`(() => { const r = vramscopeLive.flame.canvas.getBoundingClientRect(); return {x: r.left + 50, y: r.top + 9}; })()`))
	within(t, ctx, "click the root", chromedp.MouseClickXY(root["x"], root["y"]))
	within(t, ctx, "cleared", chromedp.Poll[bool](`vramscope.highlight === null && !document.querySelector("#live-table tr.picked")`))

	// By category, with the timeline's bands by category: every category
	// listed, unknown too; the URL keeps both.
	choose(t, ctx, "#live-group", "category")
	choose(t, ctx, "#band-mode", "category")
	within(t, ctx, "by category", chromedp.Poll[bool](`vramscopeLive.data.grouping === "category" && vramscope.timeline.bandCats !== null
		&& document.querySelectorAll("#live-cats .cat").length === 9 && document.querySelector('#live-cats .cat[data-category="unknown"]') !== null
		&& new URLSearchParams(location.search).get("g") === "category" && new URLSearchParams(location.search).get("bands") === "category"`))
	screenshot(t, ctx, dir, "live-by-category")
	choose(t, ctx, "#band-mode", "area")
	within(t, ctx, "area mode", chromedp.Poll[bool](`vramscope.bandMode === "area" && vramscope.timeline.areas !== null && vramscope.timeline.layerUsage === vramscope.timeline.usage`))
	screenshot(t, ctx, dir, "live-category-areas")
}

// On a Go training run: steps shade the timeline and a step's peak is one
// click away, from the step list or from the step's label on the timeline.
func TestBrowserSteps(t *testing.T) { testkit.EachBackend(t, testBrowserSteps) }

func testBrowserSteps(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	w := tracer.DefaultTrain()
	w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 4, 512, 8192, 4, 256, 3
	id := testkit.Record(t, db, "train", w, 80<<30, "")
	srv := serve(t, db)
	dir := shotDir(t)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+id))
	waitReady(t, ctx)
	within(t, ctx, "steps", chromedp.Poll[bool](`vramscope.steps.length === 3 && document.querySelectorAll("#step-select option").length === 4`))
	peak := within(t, ctx, "step 1's peak", chromedp.Evaluate[int](`vramscope.steps[1].peak.seq`))
	choose(t, ctx, "#step-select", "1")
	within(t, ctx, "at step 1's peak", chromedp.Poll[bool](fmt.Sprintf(`document.getElementById("view").dataset.liveSeq === "%d"
		&& vramscopeLive.data.step && vramscopeLive.data.step.step === 1`, peak)))
	screenshot(t, ctx, dir, "live-steps")

	// Back to the whole run; a click on step 2's label goes to its peak.
	within(t, ctx, "reset", chromedp.Evaluate[bool](`(vramscope.resetWindow(), true)`))
	within(t, ctx, "redrawn", chromedp.Poll[bool](`vramscope.t0 <= vramscope.steps[0].start_us`))
	p := within(t, ctx, "step 2's label", chromedp.Evaluate[map[string]float64](`(() => {
		const tl = vramscope.timeline, s = vramscope.steps[2], r = tl.canvas.getBoundingClientRect();
		return {x: r.left + tl.xOf((s.start_us + s.end_us) / 2), y: r.top + 12, seq: s.peak.seq};
	})()`))
	within(t, ctx, "click the label", chromedp.MouseClickXY(p["x"], p["y"]))
	within(t, ctx, "at step 2's peak", chromedp.Poll[bool](fmt.Sprintf(`document.getElementById("view").dataset.liveSeq === "%d"`, int64(p["seq"]))))
}
