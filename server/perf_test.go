package server

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"testing"
	"time"
	"vramscope/internal/testkit"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
)

// TestPerfMillionEvents measures the UI on a trace of about a million
// events: first complete paint after navigation, server time of each zoom
// or pan step, drawing time per frame and the page's JS heap. It logs the
// figures and asserts nothing about time. It takes a minute or more, so it
// runs only with VRAMSCOPE_PERF=1.
func TestPerfMillionEvents(t *testing.T) {
	if os.Getenv("VRAMSCOPE_PERF") != "1" {
		t.Skip("set VRAMSCOPE_PERF=1 to measure on a 1M-event trace")
	}
	db := testkit.OpenDB(t)
	start := time.Now()
	id := makeTrace(t, db, "million", workload{Steps: 2100, Layers: 24, Seed: 9})
	tr, err := db.Trace(id)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recorded %d events in %v", tr.Events, time.Since(start).Round(time.Millisecond))
	srv := httptest.NewServer(New(Options{DB: db, Logger: quietLogger()}).Handler())
	defer srv.Close()

	// Server time of zoom and pan steps: the two requests the timeline makes.
	rng := rand.New(rand.NewPCG(1, 2))
	full := tr.LastUS - tr.FirstUS
	var steps []time.Duration
	for i := 0; i < 60; i++ {
		span := max(int64(100), int64(float64(full)*pow(rng.Float64()*6)))
		t0 := tr.FirstUS + rng.Int64N(max(1, full-span))
		// Both requests at once, as the page makes them.
		began := time.Now()
		errc := make(chan error, 2)
		for _, q := range []string{
			fmt.Sprintf("/usage?t0=%d&t1=%d&n=1316", t0, t0+span),
			fmt.Sprintf("/bands?t0=%d&t1=%d&w=1316&h=270", t0, t0+span),
		} {
			go func() {
				res, err := http.Get(srv.URL + "/api/traces/" + id + q)
				if err != nil {
					errc <- err
					return
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != 200 {
					err = fmt.Errorf("%s: %d", q, res.StatusCode)
				}
				errc <- err
			}()
		}
		for range 2 {
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		}
		steps = append(steps, time.Since(began))
	}
	for _, q := range []string{"usage?n=1316&", "bands?w=1316&h=270&"} {
		var ds []time.Duration
		for range 5 {
			began := time.Now()
			res, err := http.Get(fmt.Sprintf("%s/api/traces/%s/%st0=%d&t1=%d", srv.URL, id, q, tr.FirstUS, tr.LastUS))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			ds = append(ds, time.Since(began))
		}
		t.Logf("whole trace, %s median %v", q, median(ds))
	}
	var maps []time.Duration
	for i := 0; i < 20; i++ {
		began := time.Now()
		res, err := http.Get(fmt.Sprintf("%s/api/traces/%s/layout?t=%d", srv.URL, id, tr.FirstUS+rng.Int64N(full)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		maps = append(maps, time.Since(began))
	}
	t.Logf("zoom/pan step (usage + bands, 1316 columns): median %v, p90 %v, max %v", median(steps), pct(steps, 0.9), slices.Max(steps))
	t.Logf("segment map at a random time: median %v, p90 %v", median(maps), pct(maps, 0.9))

	ctx := browser(t)
	var paints []float64
	for i := 0; i < 5; i++ {
		within(t, ctx, "navigate", chromedp.Navigate(srv.URL+"/traces/"+id))
		waitReady(t, ctx)
		paints = append(paints, within(t, ctx, "first paint", chromedp.Evaluate[float64](`performance.getEntriesByName("vramscope-first-paint")[0].startTime`)))
	}
	slices.Sort(paints)
	t.Logf("first complete paint after navigation: median %.0f ms (runs %v)", paints[len(paints)/2], paints)

	box := within(t, ctx, "timeline box", chromedp.Evaluate[map[string]float64](
		`(() => { const r = document.getElementById("timeline").getBoundingClientRect(); return {x: r.left + r.width/2, y: r.top + r.height/2}; })()`))
	within(t, ctx, "reset stats", chromedp.Evaluate[bool](`(vramscope.stats.clear(), true)`))
	for i := 0; i < 30; i++ {
		d := -300.0
		if i%3 == 2 {
			d = 250
		}
		within(t, ctx, "wheel", chromedp.MouseEvent(input.DispatchMouseEventTypeMouseWheel, box["x"]+float64(i%7-3)*40, box["y"],
			func(p *input.DispatchMouseEventParams) { p.DeltaY, p.DeltaX = d, 1e-6 }))
		within(t, ctx, "frame", chromedp.Sleep(60*time.Millisecond))
	}
	within(t, ctx, "settle", chromedp.Sleep(time.Second))
	type figures struct {
		Draw  []float64
		TL    []float64
		SM    []float64
		Fetch []float64
		Heap  float64
	}
	f := within(t, ctx, "stats", chromedp.Evaluate[figures](
		`(s => ({draw: s.drawMs.values(), tl: s.timelineMs.values(), sm: s.segmapMs.values(), fetch: s.fetchMs.values(), heap: performance.memory ? performance.memory.usedJSHeapSize : -1}))(vramscope.stats)`))
	slices.Sort(f.Draw)
	slices.Sort(f.Fetch)
	if len(f.Draw) == 0 || len(f.Fetch) == 0 {
		t.Fatalf("no frames measured: %+v", f)
	}
	t.Logf("drawing per canvas frame: median %.1f ms, p90 %.1f ms, max %.1f ms over %d draws", f.Draw[len(f.Draw)/2], f.Draw[len(f.Draw)*9/10], f.Draw[len(f.Draw)-1], len(f.Draw))
	slices.Sort(f.TL)
	slices.Sort(f.SM)
	t.Logf("timeline draws: median %.1f ms, max %.1f; segment map draws: median %.1f ms, max %.1f", f.TL[len(f.TL)/2], f.TL[len(f.TL)-1], f.SM[len(f.SM)/2], f.SM[len(f.SM)-1])
	t.Logf("viewport fetch seen by the page: median %.0f ms, p90 %.0f ms over %d fetches", f.Fetch[len(f.Fetch)/2], f.Fetch[len(f.Fetch)*9/10], len(f.Fetch))
	t.Logf("JS heap used: %.1f MiB", f.Heap/(1<<20))
	screenshot(t, ctx, shotDir(t), "million-events")
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
