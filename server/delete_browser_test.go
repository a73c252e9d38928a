package server

import (
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/chromedp/chromedp"

	"vramscope/internal/testkit"
	"vramscope/tracer"
)

// Deleting on a server with a token: the first DELETE gets 401, the page
// asks for the token once and sends it again, from the list and from a
// run's page alike. A wrong token is said on the page and deletes nothing.
func TestBrowserDeleteAsksForToken(t *testing.T) {
	testkit.EachBackend(t, testBrowserDeleteAsksForToken)
}

func testBrowserDeleteAsksForToken(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	trace := makeTrace(t, db, "to delete", workload{Steps: 1, Layers: 2, Seed: 1})
	job := tracer.Parallel{Train: tracer.DefaultTrain(), Ranks: 2, Mode: tracer.DataParallel}
	job.Layers, job.Steps = 2, 1
	run := testkit.RecordRun(t, db, "run to delete", job, 80<<30)
	srv := httptest.NewServer(New(Options{DB: db, Token: "s3cret", Logger: quietLogger()}).Handler())
	defer srv.Close()

	// The page's prompt answers token and counts how often it was asked.
	answering := func(token string) {
		within(t, ctx, "stub the prompt", chromedp.Evaluate[bool](fmt.Sprintf(
			`window.asked = 0; window.prompt = () => { window.asked++; return %q; }; true`, token)))
	}
	del := func(sel string) {
		within(t, ctx, "delete", chromedp.Click(sel))
		within(t, ctx, "confirm", chromedp.Click(sel))
	}
	asked := func(want int) {
		if n := within(t, ctx, "prompts", chromedp.Evaluate[int](`window.asked`)); n != want {
			t.Errorf("asked for the token %d times, want %d", n, want)
		}
	}

	within(t, ctx, "list", chromedp.Navigate(srv.URL+"/"))
	row := fmt.Sprintf(`tr[data-id=%q]`, trace)
	answering("wrong")
	del(row + ` button.delete`)
	waitFor(t, ctx, "the refusal said", `document.getElementById("upload-status").textContent.startsWith("Could not delete")`)
	asked(1)
	if _, err := db.Trace(trace); err != nil {
		t.Fatalf("a wrong token deleted the trace: %v", err)
	}

	within(t, ctx, "list again", chromedp.Navigate(srv.URL+"/"))
	answering("s3cret")
	del(row + ` button.delete`)
	waitFor(t, ctx, "the row gone", fmt.Sprintf(`document.querySelector(%q) === null`, row))
	asked(1)
	if _, err := db.Trace(trace); err == nil {
		t.Error("the trace is still stored")
	}

	// The token the tab keeps serves the run's page without asking.
	within(t, ctx, "the run's page", chromedp.Navigate(srv.URL+"/runs/"+run))
	within(t, ctx, "its delete button", chromedp.WaitVisible(`#delete-run`))
	answering("unused")
	del(`#delete-run`)
	waitFor(t, ctx, "back on the list", `location.pathname === "/"`)
	if _, err := db.Run(run); err == nil {
		t.Error("the run is still stored")
	}
}
