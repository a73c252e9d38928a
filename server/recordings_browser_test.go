package server

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"vramscope/attrib"
	"vramscope/gpu"
	"vramscope/ingest"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/store"
)

// recording imports one of the PyTorch 2.11 recordings of a real GPU
// (shared/testdata/pytorch-2.11).
func recording(t *testing.T, db *store.DB, name string) gpu.Trace {
	t.Helper()
	return importSnapshotOf(t, db, "pytorch-2.11", name)[0]
}

// The 300-step run recorded with PyTorch's default stacks="python": at its
// peak no row of the live table is "(no stack)" alone: the backward's
// allocations are named so, with a category; a note says what recording
// Python frames only costs. On the 6-step run, just as an optimizer step
// begins, the gradients' chip reads the parameters' bytes.
func TestBrowserNoStackNamed(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	big := recording(t, db, "big.pickle.gz")
	train := recording(t, db, "train_default.pickle")
	srv := serve(t, db)
	dir := shotDir(t)

	within(t, ctx, "navigate", chromedp.Navigate(fmt.Sprintf("%s/traces/%s?e=%d", srv.URL, big.ID, big.PeakSeq)))
	waitReady(t, ctx)
	within(t, ctx, "live set at the peak", chromedp.Poll[bool](fmt.Sprintf(`vramscopeLive.data && vramscopeLive.data.seq === %d`, big.PeakSeq)))
	rows := within(t, ctx, "rows", chromedp.Evaluate[[]string](`[...document.querySelectorAll("#live-table tbody tr td:first-child")].map(td => td.textContent)`))
	if len(rows) == 0 || rows[0] != "backward (autograd thread) · no stack" {
		t.Errorf("the table's rows at the peak: %q", rows)
	}
	for _, r := range rows {
		if r == "(no stack)" {
			t.Errorf("a row is %q alone", r)
		}
	}
	unknown := within(t, ctx, "unknown", chromedp.Evaluate[float64](`(() => { const d = vramscopeLive.data;
		return d.categories.find(c => c.name === "unknown").bytes / d.bytes; })()`))
	if unknown > 0.05 {
		t.Errorf("%.1f %% of the live bytes at the peak are unknown", 100*unknown)
	}
	note := within(t, ctx, "note", chromedp.Evaluate[string](`document.getElementById("live-note").hidden ? "" : document.getElementById("live-note").textContent`))
	if !strings.Contains(note, `stacks="all"`) || !strings.Contains(note, "no stack") {
		t.Errorf("the note on Python-only stacks: %q", note)
	}
	screenshot(t, ctx, dir, "nostack-big-peak")

	// An allocation without frames, selected: where it was made and its
	// category stand in for the stack.
	sel := within(t, ctx, "a block without frames", chromedp.Evaluate[int64](`(() => { const b = vramscopeLive.data.blocks;
		return b.seq[b.stack.findIndex(s => s === 0)]; })()`))
	within(t, ctx, "select it", chromedp.Navigate(fmt.Sprintf("%s/traces/%s?e=%d&sel=%d&panel=selection", srv.URL, big.ID, big.PeakSeq, sel)))
	waitFor(t, ctx, "its details", `document.querySelector("#panel-selection h3")?.textContent.startsWith("Allocation")`)
	details := within(t, ctx, "details", chromedp.Text(`#panel-selection`))
	for _, want := range []string{"backward (autograd thread) · no stack", "Where it was made: backward (autograd thread)", `stacks="all"`} {
		if !strings.Contains(details, want) {
			t.Errorf("allocation %d's details lack %q: %.500q", sel, want, details)
		}
	}
	screenshot(t, ctx, dir, "nostack-selected")
	// Its tip on the timeline says where it was made too.
	within(t, ctx, "its tip", chromedp.Evaluate[bool](fmt.Sprintf(`(vramscope.showTip(document.getElementById("timeline-tip"),
		{band: {size: 1 << 20, requested_size: 1 << 20, seq: %d, address: 0, stack: 0}}, 40, 40), true)`, sel)))
	waitFor(t, ctx, "the tip names it", `document.getElementById("timeline-tip").textContent.includes("backward (autograd thread) · no stack")`)
	screenshot(t, ctx, dir, "nostack-tip")

	// The page opens on the steady steps, not on the seconds of loading
	// and the warm-up step before them; the phases' strip has a legend;
	// steps' labels, as drawn, fit their steps.
	win := within(t, ctx, "window", chromedp.Evaluate[[]float64](`[vramscope.t0, vramscope.t1, vramscope.regions.find(r => r.step === 1).start_us]`))
	if win[0] <= float64(big.FirstUS) || win[0] > win[2] || (win[2]-win[0]) > 0.05*(win[1]-win[0]) {
		t.Errorf("the window [%.0f, %.0f] and step 1 at %.0f", win[0], win[1], win[2])
	}
	legend := within(t, ctx, "phase legend", chromedp.Evaluate[string](`document.getElementById("phase-legend").hidden ? "" : document.getElementById("phase-legend").textContent`))
	if !strings.Contains(legend, "optimizer") || !strings.Contains(legend, "zero grad") {
		t.Errorf("the phases' legend: %q", legend)
	}
	// The strip's labels sit at its middle (y 14, in 10 px type); each
	// must lie within its step's start and end as the timeline places
	// them, and within the plot: at steps 100 to 104, where "step N"
	// fits, and at 100 to 129, where only the numbers can.
	for _, steps := range []struct {
		from, to, least int
		window          [2]int64
	}{{100, 104, 5, c100(t, ctx)}, {100, 129, 20, stepsWindow(t, ctx, 100, 129)}} {
		// What is drawn from the new window on: recorded afresh in the
		// same task that sets it, so no frame of the old one is counted.
		recordTexts(t, ctx)
		within(t, ctx, "steps", chromedp.Evaluate[bool](fmt.Sprintf(`(window.drawnTexts = [], vramscope.setWindow(%d, %d), true)`, steps.window[0], steps.window[1])))
		waitFor(t, ctx, "step labels drawn", `window.drawnTexts.some(d => d.y === 14 && /^(step )?\d+$/.test(d.text))`)
		labels := within(t, ctx, "step labels", chromedp.Evaluate[[]map[string]float64](`(() => {
			const tl = vramscope.timeline, left = 64, right = 64 + tl.plotW;
			return window.drawnTexts.filter(d => d.y === 14 && /^(step )?\d+$/.test(d.text)).map(d => {
				const n = Number(d.text.replace("step ", "")), r = vramscope.regions.find(r => r.step === n);
				return {n, x: d.x, w: d.w, x0: Math.max(left, tl.xOf(r.start_us)), x1: Math.min(right, tl.xOf(r.end_us))};
			}); })()`))
		seen := map[float64]bool{}
		for _, l := range labels {
			seen[l["n"]] = true
			if l["x"] < l["x0"] || l["x"]+l["w"] > l["x1"] {
				t.Errorf("steps %d to %d: step %.0f's label spans x %.1f to %.1f, its step %.1f to %.1f", steps.from, steps.to, l["n"], l["x"], l["x"]+l["w"], l["x0"], l["x1"])
			}
		}
		if len(seen) < steps.least {
			t.Errorf("steps %d to %d: %d labelled, want %d or more", steps.from, steps.to, len(seen), steps.least)
		}
		if steps.from == 100 && steps.to == 104 {
			screenshot(t, ctx, dir, "steps-100-labels")
		}
	}

	// The 6-step run at the start of its third optimizer step.
	c, err := attrib.NewCategorizer(db, train.ID)
	if err != nil {
		t.Fatal(err)
	}
	var opt []attrib.Region
	for _, r := range c.Regions() {
		if r.Phase == attrib.PhaseOptimizer {
			opt = append(opt, r)
		}
	}
	ls, err := db.LiveAt(train.ID, opt[2].StartUS)
	if err != nil {
		t.Fatal(err)
	}
	within(t, ctx, "navigate", chromedp.Navigate(fmt.Sprintf("%s/traces/%s?e=%d&g=category", srv.URL, train.ID, ls.Seq)))
	waitReady(t, ctx)
	within(t, ctx, "live set at the optimizer step", chromedp.Poll[bool](fmt.Sprintf(`vramscopeLive.data && vramscopeLive.data.seq === %d`, ls.Seq)))
	by := within(t, ctx, "categories", chromedp.Evaluate[map[string]float64](`Object.fromEntries(vramscopeLive.data.categories.map(c => [c.name, c.bytes]))`))
	if p, g := by["parameters"], by["gradients"]; p == 0 || g < 0.95*p || g > 1.05*p {
		t.Errorf("at the optimizer step: parameters %.0f B, gradients %.0f B", p, g)
	}
	chip := within(t, ctx, "chip", chromedp.Evaluate[string](`document.querySelector('#live-cats .cat[data-category="gradients"]').textContent`))
	if !strings.HasPrefix(chip, "gradients 35") {
		t.Errorf("the gradients' chip reads %q", chip)
	}
	screenshot(t, ctx, dir, "nostack-train-optimizer")

	// The event list keeps each frame's line number in view.
	waitFor(t, ctx, "event rows", `document.querySelectorAll("#events .c-frame.split").length > 0`)
	cut := within(t, ctx, "line numbers", chromedp.Evaluate[[]string](`[...document.querySelectorAll("#events .c-frame.split")].filter(c => {
		const l = c.querySelector(".f-line").getBoundingClientRect(), r = c.getBoundingClientRect();
		return l.width === 0 || l.right > r.right + 0.5; }).map(c => c.title)`))
	if len(cut) > 0 {
		t.Errorf("the event list cuts the line number of %q", cut)
	}
}

// Allocations made before the recording began have no stack for that
// reason: at the end of cs336_ctx128_forward.pickle 12.82 GiB of them
// (324 allocations) are live beside ones the recording saw with frames,
// and the note says so, in those figures, without blaming the autograd
// thread (the backward's frameless allocations, which this forward-only
// run has none of).
func TestBrowserNoStackBeforeTheRecording(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := importSnapshotOf(t, db, "pytorch", "cs336_ctx128_forward.pickle")[0]
	srv := serve(t, db)
	within(t, ctx, "navigate", chromedp.Navigate(fmt.Sprintf("%s/traces/%s?e=%d", srv.URL, tr.ID, tr.LastSeq)))
	waitReady(t, ctx)
	within(t, ctx, "live set at the end", chromedp.Poll[bool](fmt.Sprintf(`vramscopeLive.data && vramscopeLive.data.seq === %d`, tr.LastSeq)))
	want := within(t, ctx, "frameless blocks", chromedp.Evaluate[[]float64](`(() => { const b = vramscopeLive.data.blocks;
		let before = 0, n = 0, during = 0;
		b.stack.forEach((s, i) => { if (s) return; if (b.seq[i] < 0) { before += b.size[i]; n++; } else during++; });
		return [before, n, during]; })()`))
	if want[1] != 324 || want[2] != 0 {
		t.Fatalf("frameless live blocks: %.0f bytes in %.0f made before the recording, %.0f after; the file holds 12.82 GiB in 324 before, none after", want[0], want[1], want[2])
	}
	note := within(t, ctx, "note", chromedp.Evaluate[string](`document.getElementById("live-note").hidden ? "" : document.getElementById("live-note").textContent`))
	if !strings.Contains(note, "12.82 GiB in 324 allocations") || !strings.Contains(note, "They were made before the recording began") || strings.Contains(note, "autograd") {
		t.Errorf("the note on allocations made before the recording: %q", note)
	}
	screenshot(t, ctx, shotDir(t), "nostack-before-recording")
}

// Recorded with C++ frames (stacks="all"), allocation 896 is labelled by
// its autograd node and operator, and its Stack section shows the frames
// that named it though C++ frames are folded.
func TestBrowserBackwardNamed(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := recording(t, db, "train_stacks_all.pickle")
	srv := serve(t, db)
	dir := shotDir(t)
	within(t, ctx, "navigate", chromedp.Navigate(fmt.Sprintf("%s/traces/%s?sel=896&e=896&panel=selection", srv.URL, tr.ID)))
	waitReady(t, ctx)
	within(t, ctx, "selection", chromedp.Poll[bool](`document.querySelector("#panel-selection ol.frames") !== null`))
	text := within(t, ctx, "facts", chromedp.Evaluate[string](`document.getElementById("panel-selection").textContent`))
	if !strings.Contains(text, "LogSoftmaxBackward0 · _log_softmax_backward_data") || strings.Contains(text, "create_out ") {
		t.Errorf("allocation 896's details: %.400q", text)
	}
	named := within(t, ctx, "named frames", chromedp.Evaluate[[]string](`[...document.querySelectorAll("#panel-selection ol.frames li.named")].map(li => li.textContent)`))
	if len(named) != 2 || !strings.Contains(named[0], "_log_softmax_backward_data") || !strings.Contains(named[1], "LogSoftmaxBackward0") {
		t.Errorf("the frames shown as naming it: %q", named)
	}
	screenshot(t, ctx, dir, "backward-named-896")
	rows := within(t, ctx, "rows", chromedp.Evaluate[[]string](`[...document.querySelectorAll("#live-table tbody tr td:first-child")].map(td => td.textContent)`))
	for _, r := range rows {
		if strings.Contains(r, "create_out") || strings.Contains(r, "_to_copy") || strings.Contains(r, "zeros_symint") {
			t.Errorf("a row is labelled by a helper: %q", r)
		}
	}
}

// graphs.pickle has no distributed code: at its end, nothing is
// communication; its side stream's allocations are the warm-up
// backward's and the side stream's own.
func TestBrowserSideStreamNotCommunication(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := recording(t, db, "graphs.pickle")
	srv := serve(t, db)
	dir := shotDir(t)
	within(t, ctx, "navigate", chromedp.Navigate(fmt.Sprintf("%s/traces/%s?e=%d&g=category", srv.URL, tr.ID, tr.LastSeq)))
	waitReady(t, ctx)
	within(t, ctx, "live set", chromedp.Poll[bool](fmt.Sprintf(`vramscopeLive.data && vramscopeLive.data.seq === %d`, tr.LastSeq)))
	by := within(t, ctx, "categories", chromedp.Evaluate[map[string]float64](`Object.fromEntries(vramscopeLive.data.categories.map(c => [c.name, c.bytes]))`))
	if by["communication"] != 0 || by["gradients"] < 32<<20 {
		t.Errorf("at the end: %v", by)
	}
	if _, ok := by["side stream"]; !ok {
		t.Errorf("no side stream category: %v", by)
	}
	screenshot(t, ctx, dir, "graphs-side-stream")
}

// The same program under two allocator settings (train_default.pickle and
// train_expandable.pickle): /compare/A/B, with no alignment asked for,
// aligns by request and says the figures that differ are the allocator's;
// the steps fill the plot; A's peak reads B at the same request, where
// the live bytes agree within 1 %; the moments' labels, as drawn, do not
// overlap.
func TestBrowserCompareSameProgram(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	a := recording(t, db, "train_default.pickle")
	b := recording(t, db, "train_expandable.pickle")
	srv := serve(t, db)
	dir := shotDir(t)
	within(t, ctx, "navigate", chromedp.Navigate(fmt.Sprintf("%s/compare/%s/%s", srv.URL, a.ID, b.ID)))
	waitFor(t, ctx, "the comparison", `document.getElementById("compare").dataset.ready === "1"`)
	pressed := within(t, ctx, "alignment", chromedp.Evaluate[string](`document.querySelector('[data-align][aria-pressed="true"]').dataset.align`))
	if pressed != "request" {
		t.Errorf("aligned by %q", pressed)
	}
	note := within(t, ctx, "note", chromedp.Text(`#align-note`))
	if !strings.Contains(note, "The same program") || !strings.Contains(note, "what differs is the allocator's") {
		t.Errorf("note %q", note)
	}
	m := within(t, ctx, "A's peak", chromedp.Evaluate[map[string]float64](`(() => { const m = comparePage.page.data.moments.find(m => m.key === "peak_a");
		return {a: m.a.allocated, b: m.b.allocated}; })()`))
	if d := m["a"] - m["b"]; d > 0.01*m["a"] || d < -0.01*m["a"] {
		t.Errorf("at A's peak: A %.0f B, B %.0f B allocated", m["a"], m["b"])
	}
	// The first step starts in the first twentieth of the plot.
	first := within(t, ctx, "first step", chromedp.Evaluate[float64](`(() => { const d = comparePage.page.data, tl = d.timeline;
		return (Math.min(d.a.steps[0].x, d.b.steps[0].x) - tl.x0) / (tl.x1 - tl.x0); })()`))
	if first < 0 || first > 0.05 {
		t.Errorf("the first step at %.1f %% of the plot", 100*first)
	}
	label := within(t, ctx, "moment label", chromedp.Text(`#moment-label`))
	if !strings.Contains(label, "reserved") {
		t.Errorf("moment label %q", label)
	}
	// Drawn again (a click on the moment shown), the moments' labels: the
	// two peaks of one program lie close together.
	recordTexts(t, ctx)
	within(t, ctx, "redraw", chromedp.Evaluate[bool](`(window.drawnTexts = [], document.querySelector("#moment-tabs .tab.active").click(), true)`))
	moments := `window.drawnTexts.filter(d => ["A peak", "B peak", "most apart", "chosen"].includes(d.text))`
	waitFor(t, ctx, "moments drawn", moments+`.length >= 2`)
	drawn := within(t, ctx, "moments' labels", chromedp.Evaluate[[]drawnText](moments))
	for i, l := range drawn {
		if l.X < 70 {
			t.Errorf("%q drawn at x %.1f, left of the plot", l.Text, l.X)
		}
		for _, m := range drawn[:i] {
			if l.Y == m.Y && l.X < m.X+m.W && m.X < l.X+l.W {
				t.Errorf("%q (x %.1f to %.1f) overlaps %q (x %.1f to %.1f) on the row at y %.0f", l.Text, l.X, l.X+l.W, m.Text, m.X, m.X+m.W, l.Y)
			}
		}
	}
	screenshot(t, ctx, dir, "compare-same-program")

	// By time the window opens on the steps too, with a way to the whole.
	within(t, ctx, "by time", chromedp.Click(`[data-align="time"]`))
	waitFor(t, ctx, "by time", `document.getElementById("compare").dataset.ready === "1" && comparePage.page.data.align === "time"`)
	tl := within(t, ctx, "window", chromedp.Evaluate[map[string]any](`(() => { const tl = comparePage.page.data.timeline;
		return {steps: !!tl.steps_window, reset: !document.getElementById("reset").hidden}; })()`))
	if tl["steps"] != true || tl["reset"] != true {
		t.Errorf("by time: %v", tl)
	}
	screenshot(t, ctx, dir, "compare-same-program-time")
}

// drawnText is a text a canvas of the page drew (recordTexts): where it
// starts, its baseline and its width, in CSS pixels.
type drawnText struct {
	Text    string
	X, Y, W float64
}

// recordTexts makes the page's canvases keep each text they draw from now
// on (fillText) in window.drawnTexts, with its place and width: where a
// label lands is seen as drawn, not as the drawing code means it to.
func recordTexts(t *testing.T, ctx context.Context) {
	t.Helper()
	within(t, ctx, "record texts", chromedp.Evaluate[bool](`(() => {
		window.drawnTexts = [];
		const p = CanvasRenderingContext2D.prototype;
		if (!p.fillText.recording) {
			const fillText = p.fillText;
			p.fillText = function (text, x, y, ...rest) {
				window.drawnTexts.push({text: String(text), x, y, w: this.measureText(text).width});
				return fillText.call(this, text, x, y, ...rest);
			};
			p.fillText.recording = true;
		}
		return true; })()`))
}

// c100 is the window of steps 100 to 104 of the page's trace.
func c100(t *testing.T, ctx context.Context) [2]int64 {
	t.Helper()
	return stepsWindow(t, ctx, 100, 104)
}

// stepsWindow is the window of steps from to to of the page's trace.
func stepsWindow(t *testing.T, ctx context.Context, from, to int) [2]int64 {
	t.Helper()
	w := within(t, ctx, fmt.Sprintf("steps %d to %d", from, to), chromedp.Evaluate[[]float64](fmt.Sprintf(`(() => {
		const s = vramscope.regions.filter(r => r.step >= %d && r.step <= %d);
		return [s[0].start_us, s[s.length - 1].end_us]; })()`, from, to)))
	return [2]int64{int64(w[0]), int64(w[1])}
}

// A run of two real ranks (the DDP rank and the 6-step run): the
// heatmap's keys say what its pale cells, outlines, ▲ and red lines mean.
func TestBrowserRunKeys(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	files := []string{testkit.SnapshotOf(t, "pytorch-2.11", "ddp_rank0.pickle"), testkit.SnapshotOf(t, "pytorch-2.11", "train_default.pickle")}
	runID, _, err := ingest.Run(context.Background(), db, "two ranks", ingest.WithRanks(ingest.Files(files), []int{0, 1}), pytorch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, db)
	dir := shotDir(t)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/runs/"+runID))
	waitFor(t, ctx, "the heatmap", `document.getElementById("scale").childElementCount > 0`)
	keys := within(t, ctx, "keys", chromedp.Text(`.run-keys`))
	for _, want := range []string{"pale", "outlined", "▲", "OOM"} {
		if !strings.Contains(keys, want) {
			t.Errorf("the heatmap's keys %q lack %q", keys, want)
		}
	}
	screenshot(t, ctx, dir, "run-keys")
}

// One file uploaded twice: the second row says it is the same recording
// as the first, with a link to it.
func TestBrowserSameUploadTwice(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	first := recording(t, db, "graphs.pickle")
	second := recording(t, db, "graphs.pickle")
	other := recording(t, db, "ddp_rank0.pickle")
	srv := serve(t, db)
	dir := shotDir(t)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/"))
	waitFor(t, ctx, "the list", `document.querySelectorAll("table.traces tbody tr").length === 3`)
	badges := within(t, ctx, "badges", chromedp.Evaluate[map[string]string](`Object.fromEntries([...document.querySelectorAll("table.traces tbody tr")].map(tr =>
		[tr.dataset.id, tr.querySelector(".badge.same")?.getAttribute("href") || ""]))`))
	if badges[second.ID] != "/traces/"+first.ID || badges[first.ID] != "" || badges[other.ID] != "" {
		t.Errorf("badges %v (first %s, second %s)", badges, first.ID, second.ID)
	}
	screenshot(t, ctx, dir, "list-same-upload")
}
