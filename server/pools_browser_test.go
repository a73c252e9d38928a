package server

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"vramscope/internal/testkit"
)

// The segment map of a PyTorch 2.11 recording with a CUDA graph and a
// MemPool shows each private pool's segments apart, under a heading, and
// its blocks stay reachable by hovering.
func TestBrowserPrivatePools(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := importSnapshotOf(t, db, "pytorch-2.11", "graphs.pickle")[0]
	srv := serve(t, db)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+tr.ID))
	waitReady(t, ctx)
	// At the end of the trace every segment is there.
	key(t, ctx, "End")
	waitFor(t, ctx, "the last event's map", `vramscope.segmap.data && vramscope.segmap.data.segment_count === 15`)
	headings := within(t, ctx, "pool headings", chromedp.Evaluate[[]string](`vramscope.segmap.rows.filter((r) => r.pool !== undefined).map((r) => r.pool)`))
	if strings.Join(headings, "|") != "0, 1|1, 0" {
		t.Fatalf("pool headings %q, want the MemPool's (0, 1) and the graph's (1, 0)", headings)
	}
	// Every segment after the first heading is in that pool, and a block
	// of one is hit where blockCenter says it is.
	ok := within(t, ctx, "pool rows", chromedp.Evaluate[bool](`(() => {
		const m = vramscope.segmap, d = m.data, rows = m.rows;
		const pool = new Map(d.pools.map(([a, o, i]) => [a, o + ", " + i]));
		let cur = null, checked = 0;
		for (const r of rows) {
			if (r.pool !== undefined) { cur = r.pool; continue; }
			if ((pool.get(d.segments[r.seg]) ?? null) !== cur) return false;
			if (cur !== null) {
				const b = d.segments[r.seg + 5], c = m.blockCenter(b), h = m.hit(c.x, c.y);
				if (!h || h.index !== b) return false;
				checked++;
			}
		}
		return checked === 5;
	})()`))
	if !ok {
		t.Fatal("a private pool's segment is out of its group, or its blocks are not reachable")
	}
	within(t, ctx, "scroll", chromedp.ScrollIntoView(`#segmap`))
	within(t, ctx, "scroll the map", chromedp.Evaluate[bool](`(() => { const w = document.getElementById("segmap-wrap"); w.scrollTop = w.scrollHeight; return true; })()`))
	screenshot(t, ctx, shotDir(t), "segmap-private-pools")
}

// The segment map puts a segment under a private pool's heading only
// while the pool has it: before the segment that held the address first
// is given back, the map has no pool heading; after the pool's own
// segment is made there, it has one.
func TestBrowserPoolsByLifetime(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	id := importReusedPool(t, db)
	srv := serve(t, db)
	for _, c := range []struct {
		seq  int
		want string
	}{{2, ""}, {6, "2, 0"}} {
		within(t, ctx, "navigate", chromedp.Navigate(fmt.Sprintf("%s/traces/%s?e=%d", srv.URL, id, c.seq)))
		waitReady(t, ctx)
		waitFor(t, ctx, "the map at the event", fmt.Sprintf(`vramscope.segmap.data && vramscope.segmap.data.seq === %d`, c.seq))
		headings := within(t, ctx, "pool headings", chromedp.Evaluate[[]string](`vramscope.segmap.rows.filter((r) => r.pool !== undefined).map((r) => r.pool)`))
		if strings.Join(headings, "|") != c.want {
			t.Errorf("after event %d the map's pool headings are %q, want %q", c.seq, headings, c.want)
		}
		screenshot(t, ctx, shotDir(t), fmt.Sprintf("segmap-pool-after-%d", c.seq))
	}
}

// The incident page of an OOM under a per-process limit the snapshot does
// not record says the limit the what-if inferred, and its evidence.
func TestBrowserIncidentUnderALimit(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	tr := importSnapshotOf(t, db, "pytorch-2.11", "frag_default_oom.pickle")[0]
	srv := serve(t, db)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+tr.ID+"/incidents/1"))
	waitFor(t, ctx, "the incident page", `document.getElementById("incident")?.dataset.ready === "1" && document.getElementById("incident").dataset.whatif === "done"`)
	status := within(t, ctx, "what-if status", chromedp.Text(`#whatif-status`))
	says := within(t, ctx, "what-if sentences", chromedp.Text(`.whatif-says`))
	if !strings.Contains(status, "Under a per-process limit of 4.94 GiB, inferred") || !strings.Contains(status, "while the device itself had 128.72 GiB free") ||
		!strings.Contains(says, "expandable_segments:True would have served this request.") {
		t.Fatalf("what-if status %q, says %q", status, says)
	}
	verdict := within(t, ctx, "verdict", chromedp.Text(`#verdict`))
	facts := within(t, ctx, "facts", chromedp.Text(`#facts`))
	if !strings.HasPrefix(verdict, "Fragmentation") || !strings.Contains(verdict, "A per-process limit refused the new 280.00 MiB segment, not the device, which had 128.72 GiB free") ||
		!strings.Contains(facts, "Per-process limit") || strings.Contains(facts, "130.71 GiB") {
		t.Fatalf("verdict %q, facts %q", verdict, facts)
	}
	// A row whose memory needed has a non-monotone edge gives its limits
	// in MiB, 2 MiB apart, not three equal GiB figures.
	table := within(t, ctx, "what-if table", chromedp.Text(`#whatif`))
	if m := regexp.MustCompile(`(\d+) MiB \(it also runs under (\d+) MiB but not under (\d+) MiB`).FindStringSubmatch(table); m == nil || m[1] == m[2] || m[2] == m[3] {
		t.Errorf("no edge in MiB in the what-if table: %q", table)
	}
	screenshot(t, ctx, shotDir(t), "incident-under-a-limit")
	within(t, ctx, "scroll", chromedp.ScrollIntoView(`#whatif`))
	screenshot(t, ctx, shotDir(t), "incident-under-a-limit-whatif")
}
