package server

import (
	"fmt"
	"math"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"vramscope/internal/testkit"
	"vramscope/tracer"
)

// A simulated 8-rank pipeline: the heatmap's highest peak is stage 0, as
// the workload knows; clicking that peak opens rank 0's trace with the
// cursor right after its peak event.
func TestBrowserRunPage(t *testing.T) { testkit.EachBackend(t, testBrowserRunPage) }

func testBrowserRunPage(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	job := tracer.Parallel{Train: tracer.DefaultTrain(), Ranks: 8, Mode: tracer.PipelineParallel}
	job.Layers, job.Steps = 8, 2
	runID := testkit.RecordRun(t, db, "pipeline", job, 80<<30)
	run, err := db.Run(runID)
	if err != nil {
		t.Fatal(err)
	}
	stage0 := run.Ranks[0].Traces[0]
	for _, rk := range run.Ranks[1:] {
		if p := rk.Traces[0].PeakAllocated; p >= stage0.PeakAllocated {
			t.Fatalf("rank %d peaks at %d, stage 0 at %d: the workload's truth is stage 0", rk.Rank, p, stage0.PeakAllocated)
		}
	}
	srv := httptest.NewServer(New(Options{DB: db, Logger: quietLogger()}).Handler())
	defer srv.Close()
	dir := shotDir(t)

	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/runs/"+runID))
	waitFor(t, ctx, "the heatmap", `!!(window.runPage && runPage.page.data && runPage.page.drawMs !== undefined)`)
	screenshot(t, ctx, dir, "run")
	top := within(t, ctx, "top row", chromedp.Evaluate[int](`runPage.topRow()`))
	rank := within(t, ctx, "its rank", chromedp.Evaluate[int](fmt.Sprintf(`runPage.page.data.rows[%d].rank`, top)))
	first := within(t, ctx, "first of the peaks list", chromedp.Evaluate[string](`document.querySelector("#peaks li").dataset.trace`))
	if rank != 0 || first != stage0.ID {
		t.Fatalf("the heatmap's highest peak is rank %d, the list's first is %s; want stage 0 (%s)", rank, first, stage0.ID)
	}
	pt := within(t, ctx, "peak cell", chromedp.Evaluate[map[string]float64](fmt.Sprintf(`(() => {
		const p = runPage.peakPoint(%d), r = document.getElementById("heatmap").getBoundingClientRect();
		return {x: r.left + p.x, y: r.top + p.y};
	})()`, top)))
	within(t, ctx, "click the peak", chromedp.MouseClickXY(pt["x"], pt["y"]))
	waitFor(t, ctx, "the trace view", fmt.Sprintf(`location.pathname === "/traces/%s" && document.getElementById("view")?.dataset.ready === "1"`, stage0.ID))
	loc := within(t, ctx, "location", chromedp.Location())
	u, _ := url.Parse(loc)
	if u.Query().Get("e") != fmt.Sprint(stage0.PeakSeq) {
		t.Fatalf("opened %s; want the cursor at the peak event %d", loc, stage0.PeakSeq)
	}
	waitFor(t, ctx, "the cursor at the peak", fmt.Sprintf(`vramscope.cursorSeq === %d && vramscope.cursor === %d`, stage0.PeakSeq, stage0.PeakUS))
	waitFor(t, ctx, "the run link", `document.getElementById("run-link")?.textContent.includes("rank 0")`)
	screenshot(t, ctx, dir, "run-peak-opened")
}

// Two snapshots chosen at once on the list page become one run named
// after them, its page opens; back on the list the run is one row with
// its ranks folded, and deleting it takes every rank.
func TestBrowserUploadRun(t *testing.T) { testkit.EachBackend(t, testBrowserUploadRun) }

func testBrowserUploadRun(t *testing.T) {
	ctx := browser(t)
	f := newFixture(t, Options{})
	dir := shotDir(t)
	tmp := t.TempDir()
	var paths []string
	for i, name := range []string{"two_gpus_expandable_state_only.pickle", "expandable_oom_multigpu.pickle"} {
		p := filepath.Join(tmp, fmt.Sprintf("llama_rank%d.pickle", i))
		if err := os.WriteFile(p, readSnapshot(t, name), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	within(t, ctx, "navigate", chromedp.Navigate(f.srv.URL+"/"))
	within(t, ctx, "list", chromedp.WaitVisible(`table.traces`))
	within(t, ctx, "two files", chromedp.SetUploadFiles(`#file`, paths))
	waitFor(t, ctx, "the run page", `location.pathname.startsWith("/runs/") && !!(window.runPage && runPage.page.data)`)
	if h1 := within(t, ctx, "title", chromedp.Evaluate[string](`document.querySelector("h1, .viewbar strong")?.textContent || document.title`)); !strings.Contains(h1, "llama") {
		t.Errorf("the run is named %q, want llama", h1)
	}
	screenshot(t, ctx, dir, "run-of-real-snapshots")
	// The time axis marks round times since the run began (its labels'
	// origin), not round clock times labelled from it (284.1 ms, 784.1 ms).
	ticks := within(t, ctx, "ticks", chromedp.Evaluate[[]float64](`runPage.page.ticks || []`))
	if len(ticks) < 2 {
		t.Fatalf("ticks %v", ticks)
	}
	for _, v := range ticks {
		if step := ticks[1] - ticks[0]; math.Abs(math.Remainder(v, step)) > 1e-6*step {
			t.Errorf("tick at %v µs is not a multiple of the step %v µs: %v", v, step, ticks)
		}
	}
	run := strings.TrimPrefix(within(t, ctx, "path", chromedp.Evaluate[string](`location.pathname`)), "/runs/")

	within(t, ctx, "back to the list", chromedp.Navigate(f.srv.URL+"/"))
	within(t, ctx, "list", chromedp.WaitVisible(`table.traces`))
	sel := fmt.Sprintf(`tr.run-row[data-run=%q]`, run)
	within(t, ctx, "unfold the ranks", chromedp.Click(sel+` details summary`))
	if n := within(t, ctx, "ranks", chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel+` details li`))); n != 5 {
		t.Errorf("the run's row lists %d traces, want 5", n)
	}
	screenshot(t, ctx, dir, "list-with-run")
	within(t, ctx, "delete", chromedp.Click(sel+` button.delete`))
	within(t, ctx, "confirm", chromedp.Click(sel+` button.delete`))
	waitFor(t, ctx, "the row gone", fmt.Sprintf(`document.querySelector(%q) === null`, sel))
	if _, err := f.db.Run(run); err == nil {
		t.Error("the run is still stored")
	}
}
