package server

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"

	"vramscope/gpu"
	"vramscope/store"
)

// TestPerfTenMillionEvents measures the UI on a trace of about ten million
// events (VRAMSCOPE_PERF_EVENTS sets another size): the server's time per
// zoom or pan step and per memory_summary(), the size of the answers, and
// in headless Chromium the first paint, a zoom or pan step from the input to
// the drawn answer, a hover from the pointer's move to the drawn frame, and
// the drawing time per frame. It logs medians and p90s and asserts nothing
// about time. The trace is recorded once and kept in the temporary
// directory. It takes minutes, so it runs only with VRAMSCOPE_PERF=1.
func TestPerfTenMillionEvents(t *testing.T) {
	if os.Getenv("VRAMSCOPE_PERF") != "1" {
		t.Skip("set VRAMSCOPE_PERF=1 to measure on a 10M-event trace")
	}
	events := int64(10_000_000)
	if n := os.Getenv("VRAMSCOPE_PERF_EVENTS"); n != "" {
		fmt.Sscan(n, &events)
	}
	db, tr := perfTrace(t, events)
	t.Logf("trace: %d events over %v", tr.Events, time.Duration(tr.LastUS-tr.FirstUS)*time.Microsecond)
	srv := httptest.NewServer(New(Options{DB: db, Logger: quietLogger()}).Handler())
	defer srv.Close()
	base := srv.URL + "/api/traces/" + tr.ID

	// The server's part of a step: usage and bands at once, as the page asks.
	rng := rand.New(rand.NewPCG(1, 2))
	full := tr.LastUS - tr.FirstUS
	var steps []time.Duration
	for i := 0; i < 60; i++ {
		span := max(int64(100), int64(float64(full)*pow(rng.Float64()*6)))
		t0 := tr.FirstUS + rng.Int64N(max(1, full-span))
		mem := ""
		if i%3 == 2 {
			m0 := rng.Int64N(int64(tr.PeakAllocated))
			mem = fmt.Sprintf("&m0=%d&m1=%d", m0, m0+int64(tr.PeakReserved/100))
		}
		began := time.Now()
		errc := make(chan error, 2)
		for _, q := range []string{
			fmt.Sprintf("/usage?t0=%d&t1=%d&n=1316&format=bin", t0, t0+span),
			fmt.Sprintf("/bands?t0=%d&t1=%d&w=1316&h=270&format=bin%s", t0, t0+span, mem),
		} {
			go func() { _, err := fetch(base + q); errc <- err }()
		}
		for range 2 {
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		}
		steps = append(steps, time.Since(began))
	}
	t.Logf("server step (usage + bands, 1316 x 270 px, random windows, a third with a memory range): median %v, p90 %v, max %v",
		median(steps), pct(steps, 0.9), slices.Max(steps))

	// Answer sizes for the whole trace, raw and as sent (gzip).
	for _, q := range []string{"/bands?w=1316&h=270&", "/usage?n=1316&"} {
		whole := fmt.Sprintf("%st0=%d&t1=%d", q, tr.FirstUS, tr.LastUS)
		js, err := fetch(base + whole)
		if err != nil {
			t.Fatal(err)
		}
		bin, err := fetch(base + whole + "&format=bin")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("whole trace %s JSON %d B (gzip %d B), binary %d B (gzip %d B)", q, len(js), gzipped(js), len(bin), gzipped(bin))
	}

	// memory_summary() at random instants.
	var sums []time.Duration
	for range 20 {
		began := time.Now()
		if _, err := fetch(fmt.Sprintf("%s/summary?t=%d", base, tr.FirstUS+rng.Int64N(full))); err != nil {
			t.Fatal(err)
		}
		sums = append(sums, time.Since(began))
	}
	t.Logf("memory_summary() at a random instant: median %v, p90 %v, max %v", median(sums), pct(sums, 0.9), slices.Max(sums))

	ctx := browser(t)
	var paints []float64
	for i := 0; i < 5; i++ {
		within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+tr.ID))
		waitReady(t, ctx)
		paints = append(paints, within(t, ctx, "first paint", chromedp.Evaluate[float64](`performance.getEntriesByName("vramscope-first-paint")[0].startTime`)))
	}
	slices.Sort(paints)
	t.Logf("first complete paint after navigation: median %.0f ms (runs %v)", paints[len(paints)/2], paints)

	box := within(t, ctx, "timeline box", chromedp.Evaluate[map[string]float64](
		`(() => { const r = document.getElementById("timeline").getBoundingClientRect(); return {x: r.left, y: r.top, w: r.width, h: r.height}; })()`))
	within(t, ctx, "reset stats", chromedp.Evaluate[bool](`(vramscope.stats.clear(), true)`))
	settle := func() {
		waitFor(t, ctx, "the step's answer", `vramscope.stepStart === null`)
	}
	// Zoom in and out on the time axis at every level, each step waited for.
	for i := 0; i < 40; i++ {
		d := -500.0
		if i >= 20 {
			d = 500
		}
		within(t, ctx, "wheel", chromedp.MouseEvent(input.DispatchMouseEventTypeMouseWheel, box["x"]+box["w"]*0.5+float64(i%7-3)*40, box["y"]+box["h"]/2,
			func(p *input.DispatchMouseEventParams) { p.DeltaY, p.DeltaX = d, 1e-6 }))
		settle()
	}
	// The memory axis, and pans.
	for i := 0; i < 10; i++ {
		within(t, ctx, "alt-wheel", chromedp.MouseEvent(input.DispatchMouseEventTypeMouseWheel, box["x"]+box["w"]*0.5, box["y"]+box["h"]*0.7,
			func(p *input.DispatchMouseEventParams) { p.DeltaY, p.DeltaX, p.Modifiers = -400, 1e-6, 1 }))
		settle()
	}
	for i := 0; i < 10; i++ {
		within(t, ctx, "pan", chromedp.KeyEvent("d"))
		settle()
	}
	// Hover across the plot.
	for i := 0; i < 80; i++ {
		within(t, ctx, "hover", chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, box["x"]+80+float64(i)*(box["w"]-100)/80, box["y"]+box["h"]*(0.2+0.6*float64(i%9)/9)))
		within(t, ctx, "frame", chromedp.Sleep(20*time.Millisecond))
	}
	type figures struct {
		Draw, TL, SM, Fetch, Step, Hover []float64
		Heap                             float64
	}
	phases := within(t, ctx, "steps", chromedp.Evaluate[[]int](`vramscope.stats.stepMs.values().map(Math.round)`))
	f := within(t, ctx, "stats", chromedp.Evaluate[figures](
		`(s => ({draw: s.drawMs.values(), tl: s.timelineMs.values(), sm: s.segmapMs.values(), fetch: s.fetchMs.values(), step: s.stepMs.values(), hover: s.hoverMs.values(), heap: performance.memory ? performance.memory.usedJSHeapSize : -1}))(vramscope.stats)`))
	for _, x := range [][]float64{f.Draw, f.TL, f.Fetch, f.Step, f.Hover} {
		if len(x) == 0 {
			t.Fatalf("no figures measured: %d draws, %d fetches, %d steps, %d hovers", len(f.Draw), len(f.Fetch), len(f.Step), len(f.Hover))
		}
		slices.Sort(x)
	}
	if len(f.SM) == 0 {
		f.SM = []float64{0} // no map drawn: the cursor's map did not change
	}
	slices.Sort(f.SM)
	q := func(x []float64, p float64) float64 { return x[int(float64(len(x)-1)*p)] }
	t.Logf("zoom/pan step, input to drawn answer: median %.0f ms, p90 %.0f ms, max %.0f ms over %d steps", q(f.Step, 0.5), q(f.Step, 0.9), q(f.Step, 1), len(f.Step))
	t.Logf("  by kind (in order: 20 time zooms in, 20 out, 10 memory zooms, 10 pans): %v", phases)
	t.Logf("hover, pointer move to drawn frame: median %.1f ms, p90 %.1f ms over %d", q(f.Hover, 0.5), q(f.Hover, 0.9), len(f.Hover))
	t.Logf("drawing per canvas frame: median %.1f ms, p90 %.1f ms, max %.1f ms over %d draws", q(f.Draw, 0.5), q(f.Draw, 0.9), q(f.Draw, 1), len(f.Draw))
	t.Logf("timeline draws: median %.1f ms, p90 %.1f; segment map draws: median %.1f ms, p90 %.1f", q(f.TL, 0.5), q(f.TL, 0.9), q(f.SM, 0.5), q(f.SM, 0.9))
	t.Logf("viewport fetch seen by the page: median %.0f ms, p90 %.0f ms over %d fetches", q(f.Fetch, 0.5), q(f.Fetch, 0.9), len(f.Fetch))
	t.Logf("JS heap used: %.1f MiB", f.Heap/(1<<20))
	screenshot(t, ctx, shotDir(t), "ten-million-events")
}

// perfTrace opens (recording it the first time) a database in the
// temporary directory holding one recorded trace of about n events.
func perfTrace(t *testing.T, n int64) (*store.DB, gpu.Trace) {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("vramscope-perf-v1-%d.db", n))
	if db, err := store.Open(path); err == nil {
		if ts, err := db.Traces(); err == nil && len(ts) == 1 && ts[0].Status == gpu.StatusComplete && ts[0].Events >= n {
			t.Cleanup(func() { db.Close() })
			return db, ts[0]
		}
		db.Close()
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		os.Remove(p)
	}
	db, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	start := time.Now()
	// A step of 24 layers makes about 480 events.
	id := makeTrace(t, db, "ten million", workload{Steps: int(n/480) + 1, Layers: 24, Seed: 9})
	tr, err := db.Trace(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recorded %d events in %v", tr.Events, time.Since(start).Round(time.Millisecond))
	return db, tr
}

func fetch(url string) ([]byte, error) {
	res, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err == nil && res.StatusCode != 200 {
		err = fmt.Errorf("%s: %d %s", url, res.StatusCode, b)
	}
	return b, err
}

func gzipped(b []byte) int {
	var buf bytes.Buffer
	w, _ := gzip.NewWriterLevel(&buf, 5)
	w.Write(b)
	w.Close()
	return buf.Len()
}

func pow(x float64) float64 { // 10^-x
	r := 1.0
	for ; x >= 1; x-- {
		r /= 10
	}
	return r * (1 - 0.9*x)
}

func median(d []time.Duration) time.Duration { return pct(d, 0.5) }

func pct(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}
