package server

import (
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"vramscope/internal/testkit"
)

// stepsShareJS is the share of the plot's width the steps from step
// first on take (clipped to the plot).
const stepsShareJS = `((first) => {
	const t = vramscope.timeline, st = vramscope.regions.filter((r) => r.step >= first);
	const x0 = Math.max(64, t.xOfTime(Math.min(...st.map((r) => r.start_us))));
	const x1 = Math.min(64 + t.plotW, t.xOfTime(Math.max(...st.map((r) => r.end_us))));
	return (x1 - x0) / t.plotW;
})`

// The trace view of the 2.11 training run opens on its steady steps:
// steps 1-5 fill at least half of the width (they took an eighth of the
// width before: step 0's warm-up had most of it), and a note says what
// was left out. The event axis gives each step about the same width, is
// kept in the URL, and survives a reload; the reserved line runs below
// the steps' strip, not in it.
func TestBrowserOpensOnTheSteadySteps(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := recording(t, db, "train_default.pickle")
	srv := serve(t, db)
	dir := shotDir(t)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+tr.ID))
	waitReady(t, ctx)
	share := within(t, ctx, "steady steps' width", chromedp.Evaluate[float64](stepsShareJS+"(1)"))
	note := within(t, ctx, "note", chromedp.Evaluate[string](`document.getElementById("open-note").hidden ? "" : document.getElementById("open-note").textContent`))
	screenshot(t, ctx, dir, "opening-train-default")
	if share < 0.5 {
		t.Errorf("the steady steps take %.0f %% of the width as the view opens", 100*share)
	}
	if !strings.Contains(note, "steps 1–5, the steady ones") || !strings.Contains(note, "step 0 (warm-up") {
		t.Errorf("the opening note: %q", note)
	}
	// The reserved line's highest point is below the strip of step labels.
	below := within(t, ctx, "reserved below the strip", chromedp.Evaluate[bool](`(() => {
		const t = vramscope.timeline, u = t.usage; let m = 0;
		for (let i = 1; i < u.reserved.length; i += 2) m = Math.max(m, u.reserved[i]);
		return t.yOf(m) >= t.dataTop && t.dataTop > 8;
	})()`))
	if !below {
		t.Error("the reserved line runs in the steps' strip")
	}

	// The event axis.
	within(t, ctx, "the event axis", chromedp.SetValue(`#axis`, "event"))
	within(t, ctx, "change", chromedp.Evaluate[bool](`(document.getElementById("axis").dispatchEvent(new Event("change")), true)`))
	waitFor(t, ctx, "event columns", `vramscope.timeline.bands && vramscope.timeline.bands.events && location.search.includes("axis=event")`)
	within(t, ctx, "reload", chromedp.Reload())
	waitReady(t, ctx)
	waitFor(t, ctx, "event columns after a reload", `vramscope.axis === "event" && vramscope.timeline.bands?.events && document.getElementById("axis").value === "event"`)
	widths := within(t, ctx, "steps' widths", chromedp.Evaluate[[]float64](`(() => {
		const t = vramscope.timeline;
		return vramscope.regions.filter((r) => r.step >= 1 && r.step <= 4).map((r) => t.xOfTime(r.end_us) - t.xOfTime(r.start_us));
	})()`))
	label := within(t, ctx, "window label", chromedp.Text(`#window-label`))
	screenshot(t, ctx, dir, "opening-train-default-events")
	if len(widths) != 4 || !strings.HasPrefix(label, "events #") {
		t.Fatalf("steps' widths %v, window %q", widths, label)
	}
	lo, hi := widths[0], widths[0]
	for _, w := range widths {
		lo, hi = min(lo, w), max(hi, w)
	}
	if lo < 50 || hi > 1.2*lo {
		t.Errorf("on the event axis the steady steps are %v px wide: not about the same", widths)
	}
}

// The CUDA-graph recording opens where its events are (all but eight of
// its 171 events come 6.3 s after the first), not on 6.6 s of waiting.
func TestBrowserOpensWhereTheEventsAre(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := recording(t, db, "graphs.pickle")
	srv := serve(t, db)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+tr.ID))
	waitReady(t, ctx)
	loc := within(t, ctx, "location", chromedp.Location())
	u, _ := url.Parse(loc)
	var t0, t1 int64
	fmt.Sscan(u.Query().Get("t0"), &t0)
	fmt.Sscan(u.Query().Get("t1"), &t1)
	evs, err := db.Events(tr.ID, 0, tr.LastSeq+1)
	if err != nil {
		t.Fatal(err)
	}
	in := 0
	for _, e := range evs {
		if e.TimeUS >= t0 && e.TimeUS <= t1 {
			in++
		}
	}
	screenshot(t, ctx, shotDir(t), "opening-graphs")
	if float64(in) < 0.95*float64(len(evs)) || t1-t0 > (tr.LastUS-tr.FirstUS)/2 {
		t.Errorf("the view opens on [%d, %d], %.0f %% of the trace, holding %d of %d events", t0, t1, 100*float64(t1-t0)/float64(tr.LastUS-tr.FirstUS), in, len(evs))
	}
	note := within(t, ctx, "note", chromedp.Text(`#open-note`))
	if !strings.Contains(note, "where 95 % of the events are") {
		t.Errorf("the opening note: %q", note)
	}
}

// Zoomed to 7.055–7.064 s of the training run, the stacked areas by
// category fill the allocated envelope in every column, the 1000 MiB
// spike at the peak included: each column is sampled at its peak.
func TestBrowserAreasShowThePeak(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := recording(t, db, "train_default.pickle")
	srv := serve(t, db)
	t0, t1 := tr.FirstUS+7_055_000, tr.FirstUS+7_064_000
	within(t, ctx, "navigate", chromedp.Navigate(fmt.Sprintf("%s/traces/%s?t0=%d&t1=%d&bands=area", srv.URL, tr.ID, t0, t1)))
	waitReady(t, ctx)
	waitFor(t, ctx, "the areas", `vramscope.timeline.areas !== null && vramscope.timeline.bands !== null`)
	got := within(t, ctx, "areas against the envelope", chromedp.Evaluate[map[string]float64](`(() => {
		const t = vramscope.timeline, a = t.areas, b = t.bands;
		let worst = 1, peak = 0, atPeak = 0;
		for (let c = 0; c < b.w; c++) {
			const i = Math.floor(c * a.bytes.length / b.w), sum = a.bytes[i].reduce((x, y) => x + y, 0);
			if (b.allocated[c] > 0) worst = Math.min(worst, sum / b.allocated[c]);
			if (b.allocated[c] > peak) { peak = b.allocated[c]; atPeak = sum; }
		}
		return {worst, peak, atPeak, n: a.bytes.length, w: b.w};
	})()`))
	screenshot(t, ctx, shotDir(t), "areas-at-the-peak")
	if got["n"] != got["w"] || got["worst"] < 0.999 || got["atPeak"] != got["peak"] {
		t.Errorf("the areas: %v (a column's areas short of its envelope, or the peak's)", got)
	}
	if got["peak"] < 5<<30 {
		t.Errorf("the window's peak is %.0f bytes: not the 5.46 GiB one", got["peak"])
	}
}

// A memory range zoomed below the reserved bytes still shows the reserved
// line, pinned to the top with its value; a time label at the right edge
// of the axis is drawn whole, and the window's two ends share one unit.
func TestBrowserLinesAndLabelsInView(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := recording(t, db, "ddp_rank0.pickle")
	reused := importReusedPool(t, db)
	srv := serve(t, db)
	within(t, ctx, "navigate", chromedp.Navigate(fmt.Sprintf("%s/traces/%s?y0=0&y1=%d", srv.URL, tr.ID, 200<<20)))
	waitReady(t, ctx)
	ink := within(t, ctx, "the pinned reserved line", chromedp.Evaluate[float64](`(() => {
		const t = vramscope.timeline, c = document.getElementById("timeline"), r = devicePixelRatio;
		const y = Math.round((t.dataTop + 1.5) * r), d = c.getContext("2d").getImageData(64 * r, y - r, t.plotW * r, 2 * r).data;
		const m = /^#(..)(..)(..)$/.exec(vramscope.pal.reserved), h = m.slice(1).map((x) => parseInt(x, 16));
		let n = 0;
		for (let i = 0; i < d.length; i += 4) if (Math.abs(d[i]-h[0]) + Math.abs(d[i+1]-h[1]) + Math.abs(d[i+2]-h[2]) < 40) n++;
		return n / (d.length / 4);
	})()`))
	screenshot(t, ctx, shotDir(t), "lines-pinned")
	if ink < 0.2 {
		t.Errorf("the reserved line, above the memory range shown, is not along its top (%.0f %% of the row)", 100*ink)
	}
	oneUnit := within(t, ctx, "one unit", chromedp.Evaluate[[]string](`vramscope.fmtTs([vramscope.firstUS + 507.09e6, vramscope.firstUS + 959.4e6], 2.26e6)`))
	if !strings.HasSuffix(oneUnit[0], " min") || !strings.HasSuffix(oneUnit[1], " min") {
		t.Errorf("a window of 507.09 s to 959.4 s reads %q", oneUnit)
	}

	// The snapshot of 5 µs ends on a tick: its label is whole.
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+reused))
	waitReady(t, ctx)
	edge := within(t, ctx, "the right edge", chromedp.Evaluate[map[string]float64](`(() => {
		const t = vramscope.timeline, c = document.getElementById("timeline"), r = devicePixelRatio;
		const y = (8 + t.plotH + 6) * r, h = 14 * r, w = c.width, d = c.getContext("2d").getImageData(0, y, w, h).data;
		const bg = /^#(..)(..)(..)$/.exec(vramscope.pal.panel).slice(1).map((x) => parseInt(x, 16));
		const inked = (x) => { for (let k = 0; k < h; k++) { const i = 4 * (k * w + x); if (Math.abs(d[i]-bg[0]) + Math.abs(d[i+1]-bg[1]) + Math.abs(d[i+2]-bg[2]) > 60) return true; } return false; };
		let last = -1;
		for (let x = 0; x < w; x++) if (inked(x)) last = x;
		return {last, w, labels: t.tickLabels.length};
	})()`))
	label := within(t, ctx, "last label", chromedp.Evaluate[string](`vramscope.timeline.tickLabels.at(-1)`))
	if edge["last"] < 0 || edge["last"] >= edge["w"]-1 || label != "5 µs" {
		t.Errorf("the axis's last label %q inks up to x %v of %v: cut at the edge", label, edge["last"], edge["w"])
	}
}
