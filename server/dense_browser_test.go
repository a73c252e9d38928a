package server

import (
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"

	"vramscope/internal/testkit"
)

// denseJS checks the timeline's bands answer against its usage answer
// (the usage pyramid, at the pixels' resolution): each of a dense
// window's columns is drawn as at its peak, so its envelope is at most
// the greatest allocated bytes of the usage buckets that overlap it, and
// at least those of the buckets within it (but the first to hold events,
// whose bytes entering it may be the column's before), where the usage
// answer covers the whole column. It returns the
// columns, the columns checked, those out of bounds, and where the
// middle of the widest column's top band is.
const denseJS = `(() => {
	const t = vramscope.timeline, b = t.bands, u = t.usage, colW = (b.t1 - b.t0) / b.w;
	const uEnd = u.start_us + u.events.length * u.bucket_us;
	let checked = 0, wrong = [];
	for (let c = 0; c < b.w; c++) {
		const lo = b.t0 + c * colW, hi = lo + colW;
		if (lo < u.start_us || hi > uEnd) continue; // widened past the usage answer's buckets
		let outer = -1, inner = -1, seen = false;
		for (let i = 0; i < u.events.length; i++) {
			const s = u.start_us + i * u.bucket_us, e = s + u.bucket_us, max = u.allocated[2 * i + 1];
			if (e <= lo || s >= hi) continue;
			outer = Math.max(outer, max);
			if (s < lo || e > hi) continue;
			if (seen) inner = Math.max(inner, max);
			seen = seen || u.events[i] > 0;
		}
		if (outer < 0) continue;
		checked++;
		if (b.allocated[c] > outer || b.allocated[c] < inner) wrong.push([c, b.allocated[c], inner, outer]);
	}
	let at = null;
	const c = b.allocated.indexOf(Math.max(...b.allocated));
	const r = t.canvas.getBoundingClientRect();
	at = {x: r.left + t.xOf(b.t0 + (c + 0.5) * colW), y: r.top + t.yOf(b.allocated[c] * 0.9)};
	return {w: b.w, dense: b.dense, plot: t.plotW, checked, wrong: wrong.length, first: JSON.stringify(wrong.slice(0, 3)), x: at.x, y: at.y};
})()`

type denseCheck struct {
	W       int     `json:"w"`
	Dense   bool    `json:"dense"`
	Plot    float64 `json:"plot"`
	Checked int     `json:"checked"`
	Wrong   int     `json:"wrong"`
	First   string  `json:"first"`
	X       float64 `json:"x"`
	Y       float64 `json:"y"`
}

// The whole of the 951,877-event recording is a dense window: fewer
// columns than pixels, each drawn at its peak, its envelope within what
// the usage pyramid says of the buckets it spans, and no grey; a band's
// tip says how wide its column is.
func TestBrowserDenseColumnsAtTheirPeaks(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := recording(t, db, "big.pickle.gz")
	srv := serve(t, db)
	within(t, ctx, "navigate", chromedp.Navigate(fmt.Sprintf("%s/traces/%s?t0=%d&t1=%d", srv.URL, tr.ID, tr.FirstUS, tr.LastUS+1)))
	waitReady(t, ctx)
	waitFor(t, ctx, "the bands", `vramscope.timeline.bands !== null && vramscope.timeline.usage !== null`)
	got := within(t, ctx, "columns against the usage", chromedp.Evaluate[denseCheck](denseJS))
	t.Logf("%d columns over %.0f px, %d checked", got.W, got.Plot, got.Checked)
	if !got.Dense || float64(got.W) > got.Plot/2 || got.Checked < got.W/2 {
		t.Fatalf("the whole recording: %+v (a dense window of fewer columns than pixels)", got)
	}
	if got.Wrong > 0 {
		t.Errorf("%d columns' envelopes are not their peaks (column, envelope, least, greatest): %s", got.Wrong, got.First)
	}
	if g := within(t, ctx, "grey", chromedp.Evaluate[greyShare](greyJS)); g.Share > 0.01 {
		t.Errorf("%.1f %% of the drawn timeline is grey", 100*g.Share)
	}
	within(t, ctx, "hover", chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, got.X, got.Y))
	waitFor(t, ctx, "the tip", `!document.getElementById("timeline-tip").hidden`)
	tip := within(t, ctx, "tip", chromedp.Text("#timeline-tip"))
	if !strings.Contains(tip, "px column") {
		t.Errorf("the tip of a dense window's band: %q", tip)
	}
	screenshot(t, ctx, shotDir(t), "dense-big-whole")
}
