package server

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"vramscope/gpu"
	"vramscope/ingest"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/store"
)

// greyJS draws the timeline's data (bands, folded bands, and the
// allocated envelope behind them; no lines, no steps) into a canvas of its
// own and returns the share of the drawn pixels that are the envelope's
// undifferentiated colour (--small), and how many pixels were drawn.
const greyJS = `(() => {
	const t = vramscope.timeline, c = document.createElement("canvas");
	c.width = t.cssW; c.height = t.cssH;
	const ctx = c.getContext("2d");
	t.drawData(ctx, vramscope.pal);
	const d = ctx.getImageData(0, 0, c.width, c.height).data;
	const m = /^#(..)(..)(..)$/.exec(vramscope.pal.small), g = m.slice(1).map((x) => parseInt(x, 16));
	let drawn = 0, grey = 0;
	for (let i = 0; i < d.length; i += 4) {
		if (d[i + 3] < 128) continue;
		drawn++;
		if (Math.abs(d[i] - g[0]) + Math.abs(d[i + 1] - g[1]) + Math.abs(d[i + 2] - g[2]) < 12) grey++;
	}
	return {share: drawn ? grey / drawn : 0, drawn};
})()`

type greyShare struct {
	Share float64 `json:"share"`
	Drawn float64 `json:"drawn"`
}

// maxGrey is the most of a drawn timeline that may be the one colour that
// tells nothing apart.
const maxGrey = 0.2

// Never a view that tells nothing: on every real recording in shared/ (and
// a synthetic one shaped like a 51 GiB snapshot of ~100 MiB allocations,
// 1,010 segments and 19,342 entries), as the trace view opens and over the
// whole trace, at most a fifth of the timeline's drawn area is the
// undifferentiated colour: allocations too small to draw one by one are
// folded into bands by group, in their groups' colours.
func TestBrowserNoGreyTimeline(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	var traces []gpu.Trace
	for _, set := range []string{"pytorch", "pytorch-2.11"} {
		for _, path := range testkit.RealFiles(t, set) {
			traces = append(traces, importFile(t, db, path)...)
		}
	}
	traces = append(traces, importBytes(t, db, "synthetic-51gib.json", syntheticLarge())...)
	srv := serve(t, db)
	dir := shotDir(t)
	for _, tr := range traces {
		if tr.Events == 0 {
			continue // a snapshot of its state alone draws no timeline
		}
		within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+tr.ID))
		waitFor(t, ctx, "the first complete paint", `document.getElementById("view")?.dataset.ready === "1"`)
		for _, view := range []string{"opening", "whole"} {
			if view == "whole" {
				key(t, ctx, "0")
				waitFor(t, ctx, "the whole trace", `vramscope.timeline.bands && vramscope.timeline.bands.t0 <= vramscope.fullT0 + 1`)
			}
			g := within(t, ctx, "grey", chromedp.Evaluate[greyShare](greyJS))
			name := strings.ReplaceAll(tr.Name, " ", "_")
			t.Logf("%-55s %-8s grey %5.1f %% of %7.0f px", tr.Name, view, 100*g.Share, g.Drawn)
			if g.Share > maxGrey {
				screenshot(t, ctx, dir, "grey-"+name+"-"+view)
				t.Errorf("%s, %s: %.1f %% of the drawn timeline is the undifferentiated colour (at most %.0f %%)", tr.Name, view, 100*g.Share, 100*maxGrey)
			}
		}
	}
}

// importFile stores a snapshot file; one with nothing to store (no
// segments, no events on any device) gives no trace.
func importFile(t *testing.T, db *store.DB, path string) []gpu.Trace {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return importBytes(t, db, filepath.Base(path), b)
}

func importBytes(t *testing.T, db *store.DB, name string, b []byte) []gpu.Trace {
	t.Helper()
	ids, err := ingest.Snapshot(db, strings.NewReader(string(b)), name, pytorch.Options{})
	if err != nil {
		if strings.Contains(err.Error(), "holds no segments and no trace events") {
			return nil
		}
		t.Fatalf("%s: %v", name, err)
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

// syntheticLarge is a snapshot shaped like a real 51 GiB one: 100
// parameters and 400 activations of about 100 MiB each in segments of
// their own, and 510 small segments of 2 MiB (1,010 segments), over
// training steps cut at 19,342 entries; frames from a few dozen lines of
// a model.
func syntheticLarge() []byte {
	const mib = 1 << 20
	const entries = 19342
	type entry struct {
		action     string
		addr, size uint64
		line       int
	}
	var evs []entry
	ev := func(action string, addr, size uint64, line int) { evs = append(evs, entry{action, addr, size, line}) }
	size := func(i int) uint64 { return uint64(90*mib + (i*7919)%10*2*mib) }
	segSize := func(i int) uint64 { return (size(i) + 2*mib - 1) / (2 * mib) * (2 * mib) }
	seg := func(i int) uint64 { return uint64(1<<40) + uint64(i)*(256*mib) }
	small := func(i int) uint64 { return uint64(1<<44) + uint64(i)*(2*mib) }
	for i := range 100 { // parameters
		ev("segment_alloc", seg(i), segSize(i), 1)
		ev("alloc", seg(i), size(i), 1)
	}
	for step := 0; len(evs) < entries; step++ {
		for i := 100; i < 500; i++ {
			if step == 0 {
				ev("segment_alloc", seg(i), segSize(i), 0)
			}
			ev("alloc", seg(i), size(i), 10+i%24)
		}
		for i := range 510 {
			if step == 0 {
				ev("segment_alloc", small(i), 2*mib, 0)
			}
			ev("alloc", small(i), mib, 40+i%7)
		}
		for i := 509; i >= 0; i-- {
			ev("free_requested", small(i), mib, 40+i%7)
			ev("free_completed", small(i), mib, 40+i%7)
		}
		for i := 499; i >= 100; i-- {
			ev("free_requested", seg(i), size(i), 10+i%24)
			ev("free_completed", seg(i), size(i), 10+i%24)
		}
	}
	evs = evs[:entries]
	live := map[uint64]uint64{}
	var lines []string
	for k, e := range evs {
		switch e.action {
		case "alloc":
			live[e.addr] = e.size
		case "free_completed":
			delete(live, e.addr)
		}
		frames := "[]"
		if e.line > 0 {
			frames = fmt.Sprintf(`[{"filename":"/job/model.py","line":%d,"name":"layer%d"}]`, e.line, e.line)
		}
		lines = append(lines, fmt.Sprintf(`{"action":%q,"addr":%d,"size":%d,"stream":0,"time_us":%d,"frames":%s}`, e.action, e.addr, e.size, 1_000_000+10*k, frames))
	}
	// The final state: what is live at the cut allocated, the rest cached.
	block := func(addr, size uint64, allocated bool) string {
		if allocated {
			return fmt.Sprintf(`{"address":%d,"size":%d,"requested_size":%d,"state":"active_allocated","frames":[]}`, addr, size, size)
		}
		return fmt.Sprintf(`{"address":%d,"size":%d,"requested_size":0,"state":"inactive","frames":[]}`, addr, size)
	}
	segment := func(addr, total uint64, kind string) string {
		blocks := block(addr, total, false)
		if n, ok := live[addr]; ok {
			blocks = block(addr, n, true)
			if n < total {
				blocks += "," + block(addr+n, total-n, false)
			}
		}
		return fmt.Sprintf(`{"device":0,"address":%d,"total_size":%d,"stream":0,"segment_type":%q,"blocks":[%s]}`, addr, total, kind, blocks)
	}
	var segs []string
	for i := range 500 {
		segs = append(segs, segment(seg(i), segSize(i), "large"))
	}
	for i := range 510 {
		segs = append(segs, segment(small(i), 2*mib, "small"))
	}
	return []byte(fmt.Sprintf(`{"segments":[%s],"device_traces":[[%s]]}`, strings.Join(segs, ","), strings.Join(lines, ",")))
}
