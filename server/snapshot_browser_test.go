package server

import (
	"testing"

	"github.com/chromedp/chromedp"

	"vramscope/internal/testkit"
)

// A snapshot's annotations are listed 500 at a time: the rest come with a
// button, so a run with tens of thousands never lays them all out at once.
func TestBrowserSnapshotAnnotationsPaged(t *testing.T) {
	testkit.EachBackend(t, testBrowserSnapshotAnnotationsPaged)
}

func testBrowserSnapshotAnnotationsPaged(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := importSnapshot(t, db, "uint64_line_annotations.pickle")[0]
	srv := serve(t, db)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+tr.ID+"?panel=snapshot"))
	waitReady(t, ctx)
	rows := `document.querySelectorAll("#annotations-table tbody tr").length`
	within(t, ctx, "the first 500", chromedp.Poll[bool](rows+` === 500`))
	more := within(t, ctx, "button", chromedp.Evaluate[string](`document.getElementById("annotations-more").textContent`))
	if more != "Show 214 more (214 not shown)" {
		t.Fatalf("button reads %q", more)
	}
	within(t, ctx, "scroll to the button", chromedp.Evaluate[bool](`(document.getElementById("annotations-more").scrollIntoView({block: "center"}), true)`))
	screenshot(t, ctx, shotDir(t), "snapshot-annotations")
	within(t, ctx, "more", chromedp.Click(`#annotations-more`))
	within(t, ctx, "all 714", chromedp.Poll[bool](rows+` === 714 && document.getElementById("annotations-more").hidden`))
}
