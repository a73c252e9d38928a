package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"vramscope/gpu"
	"vramscope/ingest"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/store"
)

// importSnapshot stores a real snapshot and returns its traces.
func importSnapshot(t *testing.T, db *store.DB, name string) []gpu.Trace {
	t.Helper()
	return importSnapshotOf(t, db, "pytorch", name)
}

// importSnapshotOf stores a real snapshot of shared/testdata/set and
// returns its traces.
func importSnapshotOf(t *testing.T, db *store.DB, set, name string) []gpu.Trace {
	t.Helper()
	f, err := os.Open(testkit.SnapshotOf(t, set, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ids, err := ingest.Snapshot(db, f, name, pytorch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var out []gpu.Trace
	for _, id := range ids {
		tr, err := db.Trace(id)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tr)
	}
	return out
}

// blur takes the focus off any field, so page keys reach the page.
const blur = `(document.activeElement && document.activeElement.blur(), true)`

func key(t *testing.T, ctx context.Context, k string) {
	t.Helper()
	within(t, ctx, "blur", chromedp.Evaluate[bool](blur))
	within(t, ctx, "key "+k, chromedp.KeyEvent(k))
}

// On a real training snapshot: the cursor starts exactly at the peak, the
// event list steps it, "?" lists the keys, a small allocation folded into
// the envelope at the whole range is reached by zooming both axes and
// hovered, and a search of a frame lists and marks its allocations.
func TestBrowserRealSnapshot(t *testing.T) { testkit.EachBackend(t, testBrowserRealSnapshot) }

func testBrowserRealSnapshot(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := importSnapshot(t, db, "training_22k_user_metadata.pickle")[0]
	srv := serve(t, db)
	dir := shotDir(t)

	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+tr.ID))
	waitReady(t, ctx)
	// The cursor sits right after the event at the peak of allocated bytes.
	within(t, ctx, "at the peak", chromedp.Poll[bool](fmt.Sprintf(`vramscope.segmap.data && vramscope.segmap.data.seq === %d
		&& vramscope.segmap.data.figures.allocated_bytes === %d && document.querySelector(".vrow.current")?.dataset.seq === "%d"`,
		tr.PeakSeq, tr.PeakAllocated, tr.PeakSeq)))
	screenshot(t, ctx, dir, "real-trace-view")

	// ↑/↓ step the cursor event by event; the list and the URL follow.
	key(t, ctx, kb.ArrowDown)
	within(t, ctx, "a step down", chromedp.Poll[bool](fmt.Sprintf(`vramscope.segmap.data.seq === %d && new URLSearchParams(location.search).get("e") === "%d"
		&& document.querySelector(".vrow.current")?.dataset.seq === "%d"`, tr.PeakSeq+1, tr.PeakSeq+1, tr.PeakSeq+1)))
	key(t, ctx, kb.ArrowUp)
	key(t, ctx, kb.ArrowUp)
	within(t, ctx, "two steps up", chromedp.Poll[bool](fmt.Sprintf(`vramscope.segmap.data.seq === %d`, tr.PeakSeq-1)))
	// A click on a row puts the cursor after that event.
	within(t, ctx, "click a row", chromedp.Click(fmt.Sprintf(`.vrow[data-seq="%d"]`, tr.PeakSeq+3)))
	within(t, ctx, "clicked", chromedp.Poll[bool](fmt.Sprintf(`vramscope.segmap.data.seq === %d`, tr.PeakSeq+3)))

	// "?" lists every key; Esc closes the list.
	key(t, ctx, "?")
	help := within(t, ctx, "help", chromedp.Poll[string](`!document.getElementById("help").hidden && document.getElementById("help").innerText`))
	for _, k := range []string{"W", "S", "A", "D", "F", "Esc", "↑", "↓", "?"} {
		if !strings.Contains(help, k) {
			t.Errorf("the keys list lacks %s:\n%s", k, help)
		}
	}
	screenshot(t, ctx, dir, "real-keys")
	key(t, ctx, kb.Escape)
	within(t, ctx, "help closed", chromedp.Poll[bool](`document.getElementById("help").hidden`))

	// W zooms the time window in, S out, A and D pan it.
	span := within(t, ctx, "span", chromedp.Evaluate[float64](`vramscope.t1 - vramscope.t0`))
	key(t, ctx, "w")
	within(t, ctx, "W zooms in", chromedp.Poll[bool](fmt.Sprintf(`vramscope.t1 - vramscope.t0 < %f`, span*0.9)))
	t0 := within(t, ctx, "t0", chromedp.Evaluate[float64](`vramscope.t0`))
	key(t, ctx, "d")
	within(t, ctx, "D pans right", chromedp.Poll[bool](fmt.Sprintf(`vramscope.t0 > %f`, t0)))
	key(t, ctx, "0")

	// A small allocation, folded into the envelope at the whole memory
	// range, is brought on screen by zooming the time axis to its life and
	// the memory axis (alt-wheel) to its place in the stack, then hovered.
	a, off := smallAllocation(t, db, tr)
	within(t, ctx, "time zoom", chromedp.Evaluate[bool](fmt.Sprintf(`(vramscope.setWindow(%d, %d), true)`, a.AllocUS-(a.FreeUS-a.AllocUS)/4, a.FreeUS+(a.FreeUS-a.AllocUS)/4)))
	box := within(t, ctx, "timeline box", chromedp.Evaluate[map[string]float64](
		`(() => { scrollTo(0, 0); const r = document.getElementById("timeline").getBoundingClientRect(); return {x: r.left, y: r.top}; })()`))
	for i := 0; i < 40; i++ {
		p := within(t, ctx, "target", chromedp.Evaluate[map[string]float64](fmt.Sprintf(`(() => { const tl = vramscope.timeline, [lo, hi] = tl.yRange();
			return {x: tl.xOf(%d), y: tl.yOf(%d), span: hi - lo}; })()`, (a.AllocUS+a.FreeUS)/2, off+a.Size/2)))
		if p["span"] < float64(a.Size)*50 {
			break
		}
		within(t, ctx, "alt-wheel", chromedp.MouseEvent(input.DispatchMouseEventTypeMouseWheel, box["x"]+p["x"], box["y"]+p["y"],
			func(e *input.DispatchMouseEventParams) { e.DeltaY, e.DeltaX, e.Modifiers = -500, 1e-6, 1 }))
	}
	within(t, ctx, "the band arrives", chromedp.Poll[bool](fmt.Sprintf(`vramscope.timeline.bands?.bands.some(b => b.seq === %d)`, a.Seq)))
	p := within(t, ctx, "band center", chromedp.Evaluate[map[string]float64](fmt.Sprintf(`(() => {
		const tl = vramscope.timeline, b = tl.bands, band = b.bands.find(x => x.seq === %d), colW = (b.t1 - b.t0) / b.w;
		const r = band.r0, c1 = band.r0 + 1 < band.r1 ? b.runCols[r + 1] : band.c1 + 1;
		return {x: tl.xOf(b.t0 + (b.runCols[r] + c1) / 2 * colW), y: tl.yOf(b.runOffs[r] + band.size / 2)}; })()`, a.Seq)))
	within(t, ctx, "hover", chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, box["x"]+p["x"], box["y"]+p["y"]))
	within(t, ctx, "tooltip", chromedp.Poll[bool](fmt.Sprintf(`document.getElementById("timeline-tip").textContent.includes("alloc #%d")`, a.Seq)))
	screenshot(t, ctx, dir, "real-small-allocation")
	if y := within(t, ctx, "memory range in the URL", chromedp.Evaluate[string](`new URLSearchParams(location.search).get("y1") || ""`)); y == "" {
		t.Error("the memory range is not in the URL")
	}

	// A shift-dragged rectangle zooms both axes to it.
	before := within(t, ctx, "ranges", chromedp.Evaluate[[]float64](`[vramscope.t0, vramscope.t1, ...vramscope.timeline.yRange()]`))
	drag := func(typ input.DispatchMouseEventType, x, y float64) {
		within(t, ctx, "drag", chromedp.MouseEvent(typ, box["x"]+x, box["y"]+y, func(e *input.DispatchMouseEventParams) {
			e.Modifiers, e.Button, e.Buttons = 8, input.MouseButtonLeft, 1
		}))
	}
	drag(input.DispatchMouseEventTypeMousePressed, 300, 60)
	drag(input.DispatchMouseEventTypeMouseMoved, 500, 120)
	drag(input.DispatchMouseEventTypeMouseReleased, 600, 160)
	after := within(t, ctx, "ranges", chromedp.Evaluate[[]float64](`[vramscope.t0, vramscope.t1, ...vramscope.timeline.yRange()]`))
	if !(after[0] > before[0] && after[1] < before[1] && after[2] > before[2] && after[3] < before[3]) {
		t.Fatalf("a rectangle from %v zoomed to %v", before, after)
	}

	// Search a frame: the matches are listed, marked on the timeline and
	// in the URL; a reload restores them.
	within(t, ctx, "reset", chromedp.Evaluate[bool](`(vramscope.resetWindow(), true)`))
	within(t, ctx, "type", chromedp.SendKeys(`#search-q`, "optimizer.py\n"))
	within(t, ctx, "matches", chromedp.Poll[bool](`document.querySelectorAll("#search-results tr.match").length > 0
		&& vramscope.searchSeqs?.size > 0 && new URLSearchParams(location.search).get("q") === "optimizer.py"`))
	summary := within(t, ctx, "summary", chromedp.Text(`#search-summary`))
	if !strings.Contains(summary, "optimizer.py") {
		t.Fatalf("search summary %q", summary)
	}
	screenshot(t, ctx, dir, "real-search")
	within(t, ctx, "reload", chromedp.Reload())
	waitReady(t, ctx)
	within(t, ctx, "search restored", chromedp.Poll[bool](`document.querySelectorAll("#search-results tr.match").length > 0 && document.getElementById("search-q").value === "optimizer.py"`))
	// A click on a match selects it (the first ones were allocated before
	// the trace began: take one made during it).
	const made = `#search-results tr.match:not([data-seq="-1"])`
	seq := within(t, ctx, "first match", chromedp.Evaluate[string](`document.querySelector('`+made+`').dataset.seq`))
	within(t, ctx, "click match", chromedp.Click(made))
	within(t, ctx, "selected", chromedp.Poll[bool](fmt.Sprintf(`document.querySelector("#panel-selection h3")?.textContent === "Allocation #%s"`, seq)))

	// A match made before the trace began selects its block, which says so
	// (not "alloc #-1").
	within(t, ctx, "back to the matches", chromedp.Click(`#tab-search`))
	within(t, ctx, "click a match from before", chromedp.Click(`#search-results tr.match[data-seq="-1"]`))
	within(t, ctx, "its block", chromedp.Poll[bool](`(() => { const s = document.getElementById("panel-selection");
		return !s.hidden && s.querySelector("h3")?.textContent.startsWith("Block at 0x") && s.textContent.includes("before the trace began") && !s.textContent.includes("#-1"); })()`))

	// "At cursor" follows the cursor: each new map replaces "Loading…".
	within(t, ctx, "at cursor", chromedp.Click(`#tab-cursor`))
	for range 3 {
		key(t, ctx, kb.ArrowDown)
		within(t, ctx, "the cursor's figures", chromedp.Poll[bool](`vramscope.segmap.data !== null && (() => { const c = document.getElementById("panel-cursor").textContent;
			return c.includes("right after event " + vramscope.segmap.data.seq + ")") && !c.includes("Loading"); })()`))
	}
}

// smallAllocation picks an allocation of the trace smaller than a pixel at
// the whole memory range that lives a while, and its offset in the stack
// when it is made.
func smallAllocation(t *testing.T, db *store.DB, tr gpu.Trace) (gpu.Allocation, uint64) {
	t.Helper()
	as, err := db.Allocations(tr.ID, tr.FirstUS, tr.LastUS, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	pixel := tr.PeakReserved / 250
	var pick *gpu.Allocation
	for i := range as.Allocations {
		a := &as.Allocations[i]
		if a.Seq >= 0 && a.Size < pixel/8 && a.FreeUS < tr.LastUS && a.FreeUS-a.AllocUS > (tr.LastUS-tr.FirstUS)/200 {
			pick = a
		}
	}
	if pick == nil {
		t.Fatal("no small, long-lived allocation")
	}
	l, _, err := db.LayoutAtSeq(tr.ID, pick.Seq)
	if err != nil {
		t.Fatal(err)
	}
	type blk struct {
		seq  int64
		addr uint64
		size uint64
	}
	var live []blk
	for _, s := range l.Segments {
		for _, b := range s.Blocks {
			if b.State == gpu.BlockAllocated {
				live = append(live, blk{b.Seq, b.Addr, b.Size})
			}
		}
	}
	sort.Slice(live, func(i, j int) bool {
		if live[i].seq != live[j].seq {
			return live[i].seq < live[j].seq
		}
		return live[i].addr < live[j].addr
	})
	var off uint64
	for _, b := range live {
		if b.seq == pick.Seq {
			return *pick, off
		}
		off += b.size
	}
	t.Fatalf("allocation %d is not live after its own event", pick.Seq)
	return gpu.Allocation{}, 0
}

// A multi-GPU upload lands on the device that ran out of memory; the
// device switcher lists the others and opens them.
func TestBrowserDevices(t *testing.T) { testkit.EachBackend(t, testBrowserDevices) }

func testBrowserDevices(t *testing.T) {
	ctx := browser(t)
	f := newFixture(t, Options{})
	snap, err := filepath.Abs(testkit.Snapshot(t, "expandable_oom_multigpu.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	within(t, ctx, "navigate", chromedp.Navigate(f.srv.URL+"/"))
	within(t, ctx, "snapshot", chromedp.SetUploadFiles(`#file`, []string{snap}))
	waitFor(t, ctx, "the trace page", `location.pathname.startsWith("/traces/") && document.getElementById("view")?.dataset.ready === "1"`)
	within(t, ctx, "on the OOM's device", chromedp.Poll[bool](`document.getElementById("view").dataset.device === "1"
		&& !document.getElementById("go-oom").hidden && document.querySelectorAll("#devices a, #devices .current").length === 3`))
	// Go to OOM puts the cursor right after the oom event.
	within(t, ctx, "go to OOM", chromedp.Click(`#go-oom`))
	within(t, ctx, "at the OOM", chromedp.Poll[bool](`vramscope.segmap.data?.seq === 421`))
	screenshot(t, ctx, shotDir(t), "devices")
	within(t, ctx, "switch", chromedp.Click(`#devices a`))
	waitFor(t, ctx, "device 0", `document.getElementById("view")?.dataset.device === "0" && document.getElementById("view").dataset.ready === "1"`)
}

// A snapshot without times gets an axis of event numbers.
func TestBrowserEventAxis(t *testing.T) { testkit.EachBackend(t, testBrowserEventAxis) }

func testBrowserEventAxis(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := importSnapshot(t, db, "no_time_us_segment_churn.pickle")[0]
	srv := serve(t, db)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+tr.ID))
	waitReady(t, ctx)
	label := within(t, ctx, "window", chromedp.Text(`#window-label`))
	if !strings.Contains(label, "#0") || !strings.Contains(label, "events") || strings.Contains(label, "ms") {
		t.Fatalf("window label %q", label)
	}
}
