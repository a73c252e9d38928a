package server

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"

	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
)

// A real snapshot with one entry its segments contradict, uploaded from
// the page: the trace page says what was left out; the list of 60
// traces pages, sorts and filters.
func TestBrowserDroppedAndListPages(t *testing.T) {
	testkit.EachBackend(t, testBrowserDroppedAndListPages)
}

func testBrowserDroppedAndListPages(t *testing.T) {
	ctx := browser(t)
	l := listen(t, nil, Options{})
	dir := shotDir(t)
	traces, err := pytorch.DecodeFile(testkit.Snapshot(t, "oom_nonexpandable.json"))
	if err != nil {
		t.Fatal(err)
	}
	tr := traces[0]
	mid := len(tr.Events) / 2
	bogus := gpu.Event{Action: gpu.ActionAlloc, Addr: 0x10, Size: 512, TimeUS: tr.Events[mid].TimeUS}
	tr.Events = append(tr.Events[:mid:mid], append([]gpu.Event{bogus}, tr.Events[mid:]...)...)
	tr.ExtraOf = nil
	var snap bytes.Buffer
	if err := pytorch.Export(&snap, tr); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "contradicts.pickle")
	os.WriteFile(path, snap.Bytes(), 0o644)
	for i := range 60 {
		w, err := l.db.CreateTrace(gpu.TraceMeta{Name: fmt.Sprintf("run %02d", i), Source: []gpu.TraceSource{gpu.SourceTrace, gpu.SourceLive}[i%2], DeviceName: "sim"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		w.Close([]gpu.TraceStatus{gpu.StatusComplete, gpu.StatusIncomplete}[i%3/2])
	}

	within(t, ctx, "navigate", chromedp.Navigate(l.base+"/"))
	within(t, ctx, "snapshot", chromedp.SetUploadFiles(`#file`, []string{path}))
	waitFor(t, ctx, "the trace page", `location.pathname.startsWith("/traces/") && document.getElementById("view")?.dataset.ready === "1"`)
	note := within(t, ctx, "the note", chromedp.Evaluate[string](`document.getElementById("dropped")?.textContent ?? ""`))
	if !bytes.Contains([]byte(note), []byte("1 event was left out")) || !bytes.Contains([]byte(note), []byte(fmt.Sprintf("event %d:", mid))) {
		t.Errorf("the note says %q", note)
	}
	within(t, ctx, "open the note", chromedp.Click(`#dropped summary`))
	screenshot(t, ctx, dir, "dropped-note")

	within(t, ctx, "list", chromedp.Navigate(l.base+"/?sort=name&order=asc"))
	rows := within(t, ctx, "rows", chromedp.Evaluate[int](`document.querySelectorAll("table.traces tbody tr").length`))
	first := within(t, ctx, "first", chromedp.Evaluate[string](`document.querySelector("table.traces tbody tr a").textContent`))
	if rows != listPer || first != "contradicts.pickle" {
		t.Errorf("first page by name: %d rows, first %q", rows, first)
	}
	screenshot(t, ctx, dir, "list-page-1")
	within(t, ctx, "next page", chromedp.Click(`a[rel=next]`))
	waitFor(t, ctx, "page 2", `location.search.includes("page=2") && document.querySelectorAll("table.traces tbody tr").length === 11`)
	within(t, ctx, "filter live", chromedp.SetValue(`select[name=source]`, "live"))
	within(t, ctx, "submit", chromedp.Click(`.filters button[type=submit]`))
	waitFor(t, ctx, "live only", `location.search.includes("source=live") && document.querySelectorAll("table.traces tbody tr").length === 30`)
	screenshot(t, ctx, dir, "list-live")
	if code, _ := l.do(t, http.MethodGet, "/?page=9", "", nil, nil); code != http.StatusOK {
		t.Errorf("a page past the end: %d", code)
	}
}
