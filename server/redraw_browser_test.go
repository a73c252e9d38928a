package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"

	"vramscope/internal/testkit"
)

// On a real snapshot with hundreds of annotated regions: the phases' strip
// is not drawn again while the window stays (a hover redraws the timeline
// 60 times a second, and a long run has tens of thousands of regions), it
// looks the same copied as drawn, and a zoom draws it again.
func TestBrowserPhasesDrawnOncePerWindow(t *testing.T) {
	testkit.EachBackend(t, testBrowserPhasesDrawnOncePerWindow)
}

func testBrowserPhasesDrawnOncePerWindow(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := importSnapshot(t, db, "uint64_line_annotations.pickle")[0]
	srv := serve(t, db)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+tr.ID))
	waitReady(t, ctx)
	within(t, ctx, "regions drawn", chromedp.Poll[bool](`vramscope.regions.length > 100 && vramscope.timeline.phasesDrawn?.regions === vramscope.regions`))
	within(t, ctx, "count the strip's draws", chromedp.Evaluate[bool](`(() => {
		const tl = vramscope.timeline, draw = tl.drawPhases;
		window.phaseDraws = 0;
		tl.drawPhases = function (...a) { window.phaseDraws++; return draw.apply(this, a); };
		return true;
	})()`))
	strip := func() float64 {
		return within(t, ctx, "strip ink", chromedp.Evaluate[float64](
			`(c => `+inkJS+`("timeline", 70, 9, c.getBoundingClientRect().width - 10, 17))(document.getElementById("timeline"))`))
	}
	before := strip()
	if before < 0.05 {
		t.Fatalf("the phases' strip is %.3f inked before any hover", before)
	}
	box := within(t, ctx, "timeline box", chromedp.Evaluate[map[string]float64](
		`(() => { const r = document.getElementById("timeline").getBoundingClientRect(); return {x: r.left, y: r.top, w: r.width, h: r.height}; })()`))
	hovers := within(t, ctx, "hovers so far", chromedp.Evaluate[int](`vramscope.stats.hoverMs.length`))
	for i := 0; i < 20; i++ {
		within(t, ctx, "hover", chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, box["x"]+80+float64(i)*(box["w"]-100)/20, box["y"]+box["h"]*0.6))
		within(t, ctx, "frame", chromedp.Sleep(20*time.Millisecond))
	}
	within(t, ctx, "hover frames drawn", chromedp.Poll[bool](fmt.Sprintf(`vramscope.stats.hoverMs.length >= %d`, hovers+10)))
	within(t, ctx, "leave", chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, 2, 2))
	within(t, ctx, "outline gone", chromedp.Poll[bool](`vramscope.timeline.hover === null`))
	within(t, ctx, "a frame", chromedp.Sleep(100*time.Millisecond))
	if n := within(t, ctx, "draws", chromedp.Evaluate[int](`window.phaseDraws`)); n != 0 {
		t.Errorf("hovering drew the phases' strip %d times; the window did not change", n)
	}
	if after := strip(); after != before {
		t.Errorf("the strip's ink went from %.4f to %.4f across hovers", before, after)
	}
	within(t, ctx, "zoom", chromedp.Evaluate[bool](`(vramscope.zoomTime((vramscope.t0 + vramscope.t1) / 2, 0.5), true)`))
	within(t, ctx, "the strip drawn for the new window", chromedp.Poll[bool](`window.phaseDraws >= 1`))
}
