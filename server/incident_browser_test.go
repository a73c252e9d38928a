package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"vramscope/gpu"
	"vramscope/ingest"
	"vramscope/internal/derive"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/store"
)

// h200 is the memory of the H200 the 2.11 recordings were made on.
const h200 = 150109880320

// trainLimit is 2 MiB under what train_default.pickle's stream needs
// (train_default.json: 6,717,177,856 B), as a per-process memory fraction
// of the H200 that PyTorch reads back as exactly 6,715,080,704 B.
const (
	trainLimit         = 6715080704
	trainLimitFraction = "per_process_memory_fraction:0.04473443513634799"
)

// incidentOpen opens incident 1 of trace id at width px and waits for its
// what-if.
func incidentOpen(t *testing.T, ctx context.Context, base, id string, width int64) {
	t.Helper()
	within(t, ctx, "viewport", chromedp.EmulateViewport(width, 1000))
	within(t, ctx, "navigate", chromedp.Navigate(base+"/traces/"+id+"/incidents/1"))
	waitFor(t, ctx, "the incident page", `document.getElementById("incident")?.dataset.ready === "1" && document.getElementById("incident").dataset.whatif === "done"`)
}

// incidentLayoutJS says what an incident page shows in what order, and
// which of its tables does not fit its box once the evidence is unfolded.
const incidentLayoutJS = `(() => {
	const top = (id) => document.getElementById(id).getBoundingClientRect().top + scrollY;
	const folded = [...document.querySelectorAll("details.evidence")].filter(d => !d.open).map(d => d.id);
	for (const d of document.querySelectorAll("details")) d.open = true;
	const cut = [...document.querySelectorAll("table")].filter(t => t.parentElement.scrollWidth > t.parentElement.clientWidth + 1).map(t => t.id || t.className);
	const wide = document.documentElement.scrollWidth > document.documentElement.clientWidth + 1;
	for (const id of folded) document.getElementById(id).open = false;
	return {order: [top("verdict"), top("fix"), top("whatif"), top("timeline"), top("segmap"), top("pools-box"), top("pinned-box"), top("pinners-box")],
		folded, cut, wide};
})()`

type incidentLayout struct {
	Order  []float64 `json:"order"`
	Folded []string  `json:"folded"`
	Cut    []string  `json:"cut"`
	Wide   bool      `json:"wide"`
}

// checkIncidentLayout: the verdict, then the fix, then the what-if, then
// the evidence, the tables folded; every table fits its box, at 1400 and
// at 1000 px wide (each is measured at both).
func checkIncidentLayout(t *testing.T, ctx context.Context, width int64) {
	t.Helper()
	l := within(t, ctx, "layout", chromedp.Evaluate[incidentLayout](incidentLayoutJS))
	for i := 1; i < len(l.Order); i++ {
		if !(l.Order[i] > l.Order[i-1]) {
			t.Errorf("at %d px: the parts are not in order (verdict, fix, what-if, timeline, map, pools, pinned, pinners): %v", width, l.Order)
			break
		}
	}
	if len(l.Folded) != 3 || len(l.Cut) > 0 || l.Wide {
		t.Errorf("at %d px: folded %v (want the three evidence boxes), tables cut %v, page wider than the window %v", width, l.Folded, l.Cut, l.Wide)
	}
}

// text is an element's text, folded or not.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	return within(t, ctx, sel, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).textContent`, sel)))
}

// TestBrowserIncidentLeadsWithTheFix: three incident pages, each opening
// with its verdict and its fix, then the what-if, then the evidence folded,
// every table inside its box at 1400 and 1000 px. The fragmenting stream
// of the 2.11 set under its unrecorded limit; the OOM, the 2.11
// training stream under a recorded per-process limit 2 MiB under what it
// needs (fragmentation: 812.59 MiB cached and 998 MiB never reserved, and
// expandable segments need 5.51 GiB); and a real shortage, the same stream
// on a device another library left 3 GiB of, as a snapshot (which does not
// say the device's size).
func TestBrowserIncidentLeadsWithTheFix(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	dir := shotDir(t)
	srv := serve(t, db)
	train, err := derive.Stream(testkit.SnapshotOf(t, "pytorch-2.11", "train_default.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	frag := importSnapshotOf(t, db, "pytorch-2.11", "frag_default_oom.pickle")[0].ID
	limited := testkit.Record(t, db, "train under a limit", derive.Workload(train), h200, trainLimitFraction)
	snap, err := derive.UntilOOM(train, derive.Run{Device: 3 << 30})
	if err != nil {
		t.Fatal(err)
	}
	short := importOOM(t, db, "train on a full device", snap)

	for _, c := range []struct {
		name, id                  string
		verdict, fix, facts, says []string
	}{
		{"frag", frag,
			[]string{"Fragmentation: 279.00 MiB was asked for and ", "A per-process limit refused the new 280.00 MiB segment, not the device, which had 128.72 GiB free"},
			[]string{"Set PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:32: it serves this request, and the whole run needs 3.19 GiB with it: less than the limit can have been (it was between 4.90 GiB and 4.94 GiB, inferred)"},
			[]string{"between 4.90 GiB and 4.94 GiB, inferred from the recording", "The recording does not say the device's size"},
			[]string{"expandable_segments:True would have served this request."}},
		{"limit", limited,
			[]string{"Fragmentation: 1000.00 MiB was asked for and 1.77 GiB was not allocated, but in pieces: 812.59 MiB cached (the largest free block 708.50 MiB) and 998.00 MiB never reserved under the per-process limit of 6.25 GiB.",
				"The per-process limit of 6.25 GiB refused the new 1000.00 MiB segment, not the device, which had 134.52 GiB free."},
			[]string{"Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True," + trainLimitFraction + ": it serves this request, and the whole run needs 5.51 GiB with it, less than the 6.25 GiB limit it ran under"},
			[]string{"6.25 GiB, as recorded", "This allocator had reserved 5.28 GiB and the device had 134.52 GiB free at the OOM, the whole of the 139.80 GiB device: nothing else held it."},
			[]string{"The recording ran under a per-process limit of 6.25 GiB: the recorded settings need 6.26 GiB, more than the limit."}},
		{"shortage", short,
			[]string{"A real shortage: 1000.00 MiB was asked for and only 716.31 MiB was not allocated (26.31 MiB cached (the largest free block 7.50 MiB) and 690.00 MiB free on the device)"},
			[]string{"No setting serves this request: less must be allocated by then"},
			[]string{"This allocator had reserved 2.33 GiB and the device had 690.00 MiB free at the OOM. The recording does not say the device's size: whatever it has beyond these 3.00 GiB was held outside this allocator"},
			[]string{"None of the settings tried would have served this request."}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, width := range []int64{1400, 1000} {
				incidentOpen(t, ctx, srv.URL, c.id, width)
				checkIncidentLayout(t, ctx, width)
				screenshot(t, ctx, dir, fmt.Sprintf("incident-%s-%d", c.name, width))
			}
			for _, part := range []struct {
				sel  string
				want []string
			}{{"#verdict", c.verdict}, {"#fix", c.fix}, {"#facts", c.facts}, {".whatif-says", c.says}} {
				got := text(t, ctx, part.sel)
				for _, w := range part.want {
					if !strings.Contains(got, w) {
						t.Errorf("%s: %q\nwants %q", part.sel, got, w)
					}
				}
			}
			// A setting row reads as what it does: under a limit, the
			// garbage collection row keeps it.
			rows := text(t, ctx, "#whatif-table")
			if strings.Contains(rows, "per_process_memory_fraction:1") != (c.name == "shortage") ||
				!strings.Contains(rows, "garbage collection: cached blocks are given back once 60 %") {
				t.Errorf("the garbage collection row: %q", rows)
			}
		})
	}
}

// importOOM stores a snapshot's bytes as an upload named name and
// returns its trace with the OOM.
func importOOM(t *testing.T, db *store.DB, name string, b []byte) string {
	t.Helper()
	ids, err := ingest.Snapshot(db, bytes.NewReader(b), name, pytorch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if tr, err := db.Trace(id); err == nil && tr.OOMs > 0 {
			return id
		}
	}
	t.Fatalf("%s: no trace with an OOM in %v", name, ids)
	return ""
}

// TestBrowserBytesAsTheServerWritesThem: the pages' fmtBytes and the
// server's gpu.FormatBytes write the same text for the same sizes, ties
// (277.125 MiB, which rounds up), negative deltas and units' edges
// included: one rounding in the CLI, the JSON's texts and the pages.
func TestBrowserBytesAsTheServerWritesThem(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	srv := serve(t, db)
	values := []uint64{0, 1, 1023, 1024, 1536, 1<<20 - 1, 1 << 20, 277<<20 + 1<<17, 7<<20 + 1<<17, 7<<20 + 1<<17 - 1,
		6717177856, 6715080704, h200, 1 << 40, 1<<50 + 1<<40, 1<<53 - 1}
	r := rand.New(rand.NewPCG(36, 1))
	for range 500 {
		// Sizes of every magnitude below 2^53 (a page's numbers are
		// exact there), and ties: an odd multiple of an eighth of a unit
		// is a whole number of hundredths and a half.
		v := r.Uint64N(1 << uint(r.IntN(53)+1))
		shift := 10*(1+r.IntN(5)) - 3
		tie := (2*r.Uint64N(1<<(52-shift)) + 1) << shift
		values = append(values, v, tie)
	}
	js, _ := json.Marshal(values)
	within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/"))
	got := within(t, ctx, "fmtBytes", chromedp.Evaluate[[][2]string](`(async () => {
		const src = document.querySelector('script[type="module"][src*="/static/"]').src;
		const m = await import(src.replace(/[^/]+$/, "common.js"));
		return `+string(js)+`.map(v => [m.fmtBytes(v), m.fmtBytes(-v)]);
	})()`, chromedp.EvalAwaitPromise))
	bad := 0
	for i, v := range values {
		want, neg := gpu.FormatBytes(v), "-"+gpu.FormatBytes(v)
		if v == 0 {
			neg = "0 B"
		}
		if got[i][0] != want || got[i][1] != neg {
			if bad++; bad <= 10 {
				t.Errorf("%d B: the page writes %q and %q, the server %q and %q", v, got[i][0], got[i][1], want, neg)
			}
		}
	}
}
