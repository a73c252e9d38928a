package server

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"vramscope/incident"
	"vramscope/ingest"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/tracer"
)

// viewParams are the URL parameters that hold a trace view.
var viewParams = []string{"t0", "t1", "c", "sel", "panel"}

func queryOf(t *testing.T, loc string, keys []string) string {
	t.Helper()
	u, err := url.Parse(loc)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s ", k, u.Query().Get(k))
	}
	return b.String()
}

// shareLink clicks Share and returns the link it shows.
func shareLink(t *testing.T, ctx context.Context) string {
	t.Helper()
	within(t, ctx, "share", chromedp.Click(`#share`))
	within(t, ctx, "link shown", chromedp.Poll[bool](`/\/p\/[A-Z2-7]{26}$/.test(document.getElementById("share-link")?.value || "")`))
	return within(t, ctx, "link", chromedp.Evaluate[string](`document.getElementById("share-link").value`))
}

func TestBrowserShareAndIncident(t *testing.T) { testkit.EachBackend(t, testBrowserShareAndIncident) }

func testBrowserShareAndIncident(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	id := testkit.Record(t, db, "frag", tracer.DefaultFrag(), fragCapacity, "")
	srv := serve(t, db)
	dir := shotDir(t)
	tr, err := db.Trace(id)
	if err != nil {
		t.Fatal(err)
	}

	// A trace view with a window, a cursor and a selection of its own.
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+id))
	waitReady(t, ctx)
	// The incident link lands in the timeline's head: wait for it before
	// measuring where blocks are.
	within(t, ctx, "incident link", chromedp.Poll[bool](`document.querySelectorAll("#incident-links a").length === 1`))
	span := tr.LastUS - tr.FirstUS
	t0, t1, c := tr.FirstUS+span/10, tr.FirstUS+span*7/10, tr.FirstUS+span/2
	within(t, ctx, "window and cursor", chromedp.Evaluate[bool](fmt.Sprintf(`vramscope.setWindow(%d, %d); vramscope.setCursor(%d); true`, t0, t1, c)))
	within(t, ctx, "map at the cursor", chromedp.Poll[bool](fmt.Sprintf(
		`new URLSearchParams(location.search).get("c") === "%d" && vramscope.segmap.data && vramscope.segmap.data.t === %d`, c, c)))
	// Click the largest allocated block on the map. The map is measured
	// again before each try: a busy machine may lay the page out late.
	var seq int64
	var selected string
	for try := 1; ; try++ {
		pt := within(t, ctx, "block position", chromedp.Evaluate[map[string]float64](`(() => {
		const m = vramscope.segmap, d = m.data;
		let best = -1;
		for (let b = 0; b < d.block_count; b++)
			if (d.blocks[b*6+3] === 1 && d.blocks[b*6+4] >= 0 && (best < 0 || d.blocks[b*6+1] > d.blocks[best*6+1])) best = b;
		if (best < 0) return null;
		const p = m.blockCenter(best), wrap = document.getElementById("segmap-wrap");
		wrap.scrollTop = Math.max(0, p.y - 60);
		const r = m.canvas.getBoundingClientRect();
		return {x: r.left + p.x, y: r.top + p.y, seq: d.blocks[best*6+4]};
	})()`))
		if pt == nil {
			t.Fatal("no allocated block on the map at the cursor")
		}
		seq = int64(pt["seq"])
		within(t, ctx, "click block", chromedp.MouseClickXY(pt["x"], pt["y"]))
		selected = fmt.Sprintf(`new URLSearchParams(location.search).get("sel") === "%d" && new URLSearchParams(location.search).get("panel") === "selection"
		&& document.querySelector("#panel-selection h3")?.textContent === "Allocation #%d"`, seq, seq)
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := chromedp.Run(c, chromedp.Poll[bool](selected))
		cancel()
		if err == nil {
			break
		}
		if try == 3 {
			state := within(t, ctx, "state", chromedp.Evaluate[string](`location.search + " · " + (document.querySelector("#panel-selection h3")?.textContent ?? "no selection")`))
			t.Fatalf("clicking allocation #%d at (%.0f, %.0f) did not select it: %s", seq, pt["x"], pt["y"], state)
		}
	}
	before := queryOf(t, within(t, ctx, "location", chromedp.Location()), viewParams)
	details := within(t, ctx, "details", chromedp.Text(`#panel-selection`))

	link := shareLink(t, ctx)
	screenshot(t, ctx, dir, "share-trace-view")

	// The link, opened afresh, restores the same view.
	within(t, ctx, "leave", chromedp.Navigate(srv.URL+"/"))
	within(t, ctx, "open the link", chromedp.Navigate(link))
	waitFor(t, ctx, "the restored view", `document.getElementById("view")?.dataset.ready === "1"`)
	within(t, ctx, "selection restored", chromedp.Poll[bool](selected))
	loc := within(t, ctx, "location", chromedp.Location())
	if after := queryOf(t, loc, viewParams); after != before || !strings.Contains(loc, "/traces/"+id+"?") {
		t.Fatalf("the link restored %s (%s), want %s", after, loc, before)
	}
	if got := within(t, ctx, "details", chromedp.Text(`#panel-selection`)); got != details {
		t.Fatalf("details after the link:\n%s\nwant\n%s", got, details)
	}
	state := within(t, ctx, "state", chromedp.Evaluate[[]float64](`[vramscope.t0, vramscope.t1, vramscope.cursor, vramscope.sel]`))
	if state[0] != float64(t0) || state[1] != float64(t1) || state[2] != float64(c) || state[3] != float64(seq) {
		t.Fatalf("view state %v, want [%d %d %d %d]", state, t0, t1, c, seq)
	}
	screenshot(t, ctx, dir, "share-restored")

	// The trace view links its incident; the incident page explains it.
	within(t, ctx, "incident link", chromedp.Poll[bool](`document.querySelectorAll("#incident-links a").length === 1 && vramscope.markers?.length === 1`))
	within(t, ctx, "open the incident", chromedp.Click(`#incident-links a`))
	waitFor(t, ctx, "the incident page", `document.getElementById("incident")?.dataset.ready === "1"`)
	verdict := within(t, ctx, "verdict", chromedp.Text(`#verdict`))
	if !strings.HasPrefix(verdict, "Fragmentation: ") || !strings.Contains(verdict, "split segments could not be released") {
		t.Fatalf("verdict %q", verdict)
	}
	// Frag asks for half the 2 GiB device.
	if facts := within(t, ctx, "facts", chromedp.Text(`#facts`)); !strings.Contains(facts, "1.00 GiB on stream 0") || !strings.Contains(facts, "the 2.00 GiB device") {
		t.Fatalf("facts %q", facts)
	}
	// The pinning blocks are drawn in their own colour on the map.
	pinned := within(t, ctx, "pin pixels", chromedp.Evaluate[int](colourInkJS+`("segmap", "--pin", 6)`))
	if pinned < 200 {
		t.Fatalf("%d pixels of the pinning colour on the map", pinned)
	}
	// The evidence is folded: opened, the stacks show.
	within(t, ctx, "open the pinning stacks", chromedp.Evaluate[bool](`document.getElementById("pinners-box").open = true`))
	pinners := within(t, ctx, "pinners", chromedp.Text(`#pinners`))
	if !strings.Contains(pinners, "register_buffer (stress.py:52)") {
		t.Fatalf("pinning stacks: %q", pinners)
	}
	within(t, ctx, "what-if", chromedp.Poll[bool](`document.getElementById("incident").dataset.whatif === "done"`))
	rows := within(t, ctx, "what-if rows", chromedp.Evaluate[[][]string](
		`[...document.querySelectorAll("#whatif-table tbody tr")].map(tr => [...tr.cells].map(td => (td.querySelector(".conf") || td).textContent))`))
	// Settings (as written; what they do is beside), this request, fragmentation here, OOMs, new OOMs, peak reserved, memory needed.
	if len(rows) != 1+len(incident.Variants) || !strings.HasSuffix(rows[0][0], "[original]") || rows[0][1] != "failed" || rows[0][3] == "0" ||
		!strings.HasSuffix(rows[0][6], " GiB") {
		t.Fatalf("what-if rows %q", rows)
	}
	found := false
	for _, r := range rows[1:] {
		if strings.Contains(r[0], "expandable_segments:True") {
			found = r[1] == "served" && r[3] == "0"
		}
	}
	if !found {
		t.Fatalf("expandable segments do not avoid the OOM in %q", rows)
	}
	says := within(t, ctx, "what-if sentences", chromedp.Text(`.whatif-says`))
	if !strings.Contains(says, "expandable_segments:True would have served this request.") || !strings.Contains(says, "Needs ") {
		t.Fatalf("the incident says %q", says)
	}
	screenshot(t, ctx, dir, "incident")
	within(t, ctx, "scroll", chromedp.ScrollIntoView(`#whatif-table`))
	screenshot(t, ctx, dir, "incident-whatif")

	// The incident page shares its own view.
	incLoc := within(t, ctx, "location", chromedp.Location())
	link = shareLink(t, ctx)
	within(t, ctx, "open the incident link", chromedp.Navigate(link))
	waitFor(t, ctx, "the incident page again", `document.getElementById("incident")?.dataset.ready === "1"`)
	if got := within(t, ctx, "location", chromedp.Location()); got != incLoc {
		t.Fatalf("incident link opened %s, want %s", got, incLoc)
	}
}

func TestBrowserSnapshotIncident(t *testing.T) { testkit.EachBackend(t, testBrowserSnapshotIncident) }

func testBrowserSnapshotIncident(t *testing.T) {
	ctx := browser(t)
	f, err := os.Open(testkit.Snapshot(t, "oom_nonexpandable.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	db := testkit.OpenDB(t)
	ids, err := ingest.Snapshot(db, f, "oom_nonexpandable.json", pytorch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, db)
	var id string
	for _, x := range ids {
		if tr, err := db.Trace(x); err == nil && tr.OOMs > 0 {
			id = x
		}
	}
	if id == "" {
		t.Fatal("the snapshot's OOM made no incident")
	}
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+id+"/incidents/1"))
	waitFor(t, ctx, "the incident page", `document.getElementById("incident")?.dataset.ready === "1" && document.getElementById("incident").dataset.whatif === "done"`)
	verdict := within(t, ctx, "verdict", chromedp.Text(`#verdict`))
	facts := within(t, ctx, "facts", chromedp.Text(`#facts`))
	if !strings.HasPrefix(verdict, "A real shortage") || !strings.Contains(facts, "The recording does not say the device's size") {
		t.Fatalf("verdict %q, facts %q", verdict, facts)
	}
	// Replayed from its own layout, at its recorded addresses and inferred
	// capacity, the snapshot's OOM happens again and no setting serves it.
	status := within(t, ctx, "what-if status", chromedp.Text(`#whatif-status`))
	says := within(t, ctx, "what-if sentences", chromedp.Text(`.whatif-says`))
	if !strings.Contains(status, "inferred from the OOM at event 1117, what this allocator had then") ||
		!strings.Contains(says, "None of the settings tried would have served this request.") || !strings.Contains(says, "with the recorded settings") {
		t.Fatalf("what-if status %q, says %q", status, says)
	}
	// Long stacks show their first frames; the rest, folded runs of C++
	// frames included, wait under a toggle.
	loose := within(t, ctx, "folded runs outside the toggles", chromedp.Evaluate[int](
		`[...document.querySelectorAll("li.folded")].filter((li) => !li.closest("details")).length`))
	toggles := within(t, ctx, "toggles", chromedp.Evaluate[int](`document.querySelectorAll("details.more-frames").length`))
	if toggles == 0 || loose > 10*toggles {
		t.Errorf("%d folded runs shown outside %d more-frames toggles", loose, toggles)
	}
	dir := shotDir(t)
	screenshot(t, ctx, dir, "incident-snapshot")
	within(t, ctx, "scroll", chromedp.ScrollIntoView(`#whatif-table`))
	screenshot(t, ctx, dir, "incident-snapshot-whatif")
}

// The trace view of a run without an OOM says the memory it needs.
func TestBrowserMemoryNeeded(t *testing.T) { testkit.EachBackend(t, testBrowserMemoryNeeded) }

func testBrowserMemoryNeeded(t *testing.T) {
	ctx := browser(t)
	f, err := os.Open(testkit.Snapshot(t, "no_time_us_segment_churn.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	db := testkit.OpenDB(t)
	ids, err := ingest.Snapshot(db, f, "no_time_us_segment_churn.pickle", pytorch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, db)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+ids[0]))
	waitFor(t, ctx, "the memory needed", `document.getElementById("needed")?.dataset.done === "1"`)
	needed := within(t, ctx, "needed", chromedp.Text(`#needed .needed`))
	status := within(t, ctx, "status", chromedp.Text(`#needed [role=status]`))
	if !strings.HasPrefix(needed, "Needs ") || !strings.Contains(needed, " GiB with the recorded settings") ||
		!strings.Contains(status, "replayed on a simulated device of 21.01 GiB, inferred from 39 retries (between 20.97 GiB and 21.01 GiB).") {
		t.Fatalf("memory needed %q, status %q", needed, status)
	}
	// roundup_power2_divisions:4 makes the starting layout too large for
	// the device: its row says why and shows no counts it did not make.
	rows := within(t, ctx, "what-if rows", chromedp.Evaluate[[][]string](
		`[...document.querySelectorAll("#whatif-table tbody tr")].map(tr => [...tr.cells].map(td => (td.querySelector(".conf") || td).textContent))`))
	var stopped []string
	for _, r := range rows {
		if r[0] == "roundup_power2_divisions:4" {
			stopped = r
		}
	}
	// Settings, OOMs, new OOMs, peak reserved, memory needed.
	if len(stopped) != 5 || strings.Join(stopped[1:4], " ") != "– – –" || !strings.Contains(stopped[4], "the replay failed: the starting layout") {
		t.Fatalf("the row of a replay that stopped: %q (rows %q)", stopped, rows)
	}
	within(t, ctx, "scroll", chromedp.ScrollIntoView(`#needed-panel`))
	screenshot(t, ctx, shotDir(t), "trace-memory-needed")
}
