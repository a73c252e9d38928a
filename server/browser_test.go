package server

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"

	"vramscope/internal/pgtest"
	"vramscope/internal/testkit"
	"vramscope/internal/testkit/need"
)

// One headless Chromium serves every browser test of the package.
var (
	browserOnce   sync.Once
	browserCtx    context.Context
	browserErr    error
	browserCancel = func() {}
)

const chromium = "/usr/bin/chromium"

func TestMain(m *testing.M) {
	code := m.Run()
	browserCancel()
	pgtest.Stop()
	os.Exit(code)
}

// browser returns a new tab of the shared browser. Without Chromium the
// test is skipped, unless CI=true or VRAMSCOPE_BROWSER_TESTS=1 asks for it
// to fail.
func browser(t *testing.T) context.Context {
	t.Helper()
	if _, err := exec.LookPath(chromium); err != nil {
		if os.Getenv("VRAMSCOPE_BROWSER_TESTS") == "1" {
			t.Fatalf("VRAMSCOPE_BROWSER_TESTS=1 but %s is missing: %v", chromium, err)
		}
		need.Missing(t, "the browser %s (%v)", chromium, err)
	}
	browserOnce.Do(func() {
		opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium),
			chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU,
			chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-dev-shm-usage", true),
			chromedp.WindowSize(1400, 1000))
		actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
		bctx, cancelB := chromedp.NewContext(actx)
		browserCancel = func() { cancelB(); cancelA() }
		browserErr = chromedp.Do(bctx) // starts the browser
		browserCtx = bctx
	})
	if browserErr != nil {
		t.Fatalf("starting %s: %v", chromium, browserErr)
	}
	ctx, cancel := chromedp.NewContext(browserCtx)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1400, 1000)); err != nil {
		t.Fatal(err)
	}
	return ctx
}

// shotDir is where screenshots go: $VRAMSCOPE_SCREENSHOTS, else the test's temp dir.
func shotDir(t *testing.T) string {
	if d := os.Getenv("VRAMSCOPE_SCREENSHOTS"); d != "" {
		os.MkdirAll(d, 0o755)
		return d
	}
	return t.TempDir()
}

func screenshot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	b, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	p := filepath.Join(dir, name+".png")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", p)
}

// within runs a browser step with a deadline, so a page that never gets
// ready fails the test with the step's name instead of hanging.
func within[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(c, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// waitFor evaluates cond until it is true, across navigations (which
// make a Poll fail).
func waitFor(t *testing.T, ctx context.Context, what, cond string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second) // generous: CI machines are shared and slow
	for {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := chromedp.Run(c, chromedp.Evaluate[bool](cond))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func waitReady(t *testing.T, ctx context.Context) {
	t.Helper()
	within(t, ctx, "waiting for the first complete paint",
		chromedp.Poll[bool](`document.getElementById("view")?.dataset.ready === "1"`))
}

// inkJS is the share of a canvas region (CSS px) whose pixels differ from
// the panel background at the region's top-left corner.
const inkJS = `((id, x0, y0, x1, y1) => {
	const c = document.getElementById(id), r = devicePixelRatio;
	const d = c.getContext("2d").getImageData(x0*r, y0*r, (x1-x0)*r, (y1-y0)*r).data;
	const bg = getComputedStyle(document.documentElement).getPropertyValue("--panel").trim();
	const m = /^#(..)(..)(..)$/.exec(bg), b = m.slice(1).map(h => parseInt(h, 16));
	let n = 0;
	for (let i = 0; i < d.length; i += 4) if (Math.abs(d[i]-b[0]) + Math.abs(d[i+1]-b[1]) + Math.abs(d[i+2]-b[2]) > 24) n++;
	return n / (d.length / 4);
})`

// colourInkJS counts the pixels of a canvas within tol (the sum of the
// channels' differences) of a colour of the page's CSS (a --variable).
const colourInkJS = `((id, colour, tol) => {
	const c = document.getElementById(id), d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
	const m = /^#(..)(..)(..)$/.exec(getComputedStyle(document.documentElement).getPropertyValue(colour).trim());
	const h = m.slice(1).map(x => parseInt(x, 16));
	let n = 0;
	for (let i = 0; i < d.length; i += 4) if (Math.abs(d[i]-h[0]) + Math.abs(d[i+1]-h[1]) + Math.abs(d[i+2]-h[2]) < tol) n++;
	return n;
})`

func TestBrowserTraceView(t *testing.T) { testkit.EachBackend(t, testBrowserTraceView) }

func testBrowserTraceView(t *testing.T) {
	ctx := browser(t)
	f := newFixture(t, Options{})
	dir := shotDir(t)

	within(t, ctx, "navigate", chromedp.Navigate(f.srv.URL+"/traces/"+f.id))
	waitReady(t, ctx)
	screenshot(t, ctx, dir, "trace-view")

	// The canvases hold data: the lower half of the timeline's plot is
	// mostly bands; the segment map's block area is mostly blocks.
	tl := within(t, ctx, "timeline pixels", chromedp.Evaluate[float64](inkJS+`("timeline", 80, 180, 1300, 290)`))
	sm := within(t, ctx, "segment map pixels", chromedp.Evaluate[float64](inkJS+`("segmap", 174, 30, 200, 140)`))
	if tl < 0.5 || sm < 0.5 {
		t.Fatalf("canvases look empty: timeline %.2f, segment map %.2f inked", tl, sm)
	}
	// The trace name holds markup; it is shown as text.
	crumb := within(t, ctx, "crumb", chromedp.Text(`.crumb`))
	if !strings.Contains(crumb, xssFrame) {
		t.Fatalf("crumb = %q", crumb)
	}

	// Wheel zoom around the middle of the timeline narrows the window and the URL follows.
	span := func() (int64, string) {
		loc := within(t, ctx, "location", chromedp.Location())
		u, _ := url.Parse(loc)
		var t0, t1 int64
		fmt.Sscan(u.Query().Get("t0"), &t0)
		fmt.Sscan(u.Query().Get("t1"), &t1)
		return t1 - t0, loc
	}
	before, _ := span()
	box := within(t, ctx, "timeline box", chromedp.Evaluate[map[string]float64](
		`(() => { const r = document.getElementById("timeline").getBoundingClientRect(); return {x: r.left + r.width/2, y: r.top + r.height/2}; })()`))
	within(t, ctx, "wheel", chromedp.MouseEvent(input.DispatchMouseEventTypeMouseWheel, box["x"], box["y"], func(p *input.DispatchMouseEventParams) { p.DeltaY, p.DeltaX = -400, 1e-6 }))
	within(t, ctx, "zoomed URL", chromedp.Poll[bool](fmt.Sprintf(
		`(() => { const q = new URLSearchParams(location.search); return q.get("t1") - q.get("t0") < %d; })()`, before)))
	after, loc := span()
	if !(after < before) {
		t.Fatalf("wheel zoom: span %d -> %d (%s)", before, after, loc)
	}
	within(t, ctx, "zoomed data", chromedp.Poll[bool](`vramscope.timeline.bands && vramscope.timeline.bands.t1 - vramscope.timeline.bands.t0 <= vramscope.t1 - vramscope.t0 + 2`))
	screenshot(t, ctx, dir, "trace-zoomed")

	// Hover the 96 MiB parameter block on the segment map: its size and
	// its (hostile) frame name show as text.
	pt := within(t, ctx, "block position", chromedp.Evaluate[map[string]float64](`(() => {
		const m = vramscope.segmap, d = m.data;
		for (let b = 0; b < d.block_count; b++) {
			if (d.blocks[b*6+3] === 1 && d.blocks[b*6+1] === 96 * 1048576) {
				const c = m.blockCenter(b), wrap = document.getElementById("segmap-wrap");
				wrap.scrollTop = Math.max(0, c.y - 60);
				wrap.scrollIntoView({block: "nearest"}); // the page may scroll: the map is below the live panel
				const r = m.canvas.getBoundingClientRect();
				return {x: r.left + c.x, y: r.top + c.y, seq: d.blocks[b*6+4]};
			}
		}
		return null;
	})()`))
	if pt == nil {
		t.Fatal("the 96 MiB block is not on the map")
	}
	seq := int64(pt["seq"])
	within(t, ctx, "hover", chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, pt["x"], pt["y"]))
	within(t, ctx, "tooltip", chromedp.Poll[bool](
		`document.getElementById("segmap-tip").textContent.includes("96.00 MiB") && document.getElementById("segmap-tip").textContent.includes("<img src=x onerror=alert(1)>")`))
	if n := within(t, ctx, "img count", chromedp.Evaluate[int](`document.querySelectorAll("img").length`)); n != 0 {
		t.Fatalf("a frame name became %d <img> elements", n)
	}
	screenshot(t, ctx, dir, "segmap-hover")

	// Click selects it in both panels and in the URL.
	within(t, ctx, "click", chromedp.MouseClickXY(pt["x"], pt["y"]))
	within(t, ctx, "selected", chromedp.Poll[bool](fmt.Sprintf(`new URLSearchParams(location.search).get("sel") === "%d"
		&& document.querySelector("#panel-selection h3")?.textContent === "Allocation #%d"
		&& vramscope.sel === %d && vramscope.timeline.bands.bands.some(b => b.seq === %d)`, seq, seq, seq, seq)))
	details := within(t, ctx, "details", chromedp.Text(`#panel-selection`))
	if !strings.Contains(details, "96.00 MiB") || !strings.Contains(details, xssFrame) || !strings.Contains(details, "free_completed") {
		t.Fatalf("details = %q", details)
	}
	screenshot(t, ctx, dir, "selected")

	// A reload restores the view exactly.
	_, want := span()
	state := `JSON.stringify([vramscope.t0, vramscope.t1, vramscope.cursor, vramscope.sel, vramscope.panel])`
	before2 := within(t, ctx, "state", chromedp.Evaluate[string](state))
	within(t, ctx, "reload", chromedp.Reload())
	waitReady(t, ctx)
	within(t, ctx, "selection restored", chromedp.Poll[bool](fmt.Sprintf(`document.querySelector("#panel-selection h3")?.textContent === "Allocation #%d"`, seq)))
	_, got := span()
	after2 := within(t, ctx, "state", chromedp.Evaluate[string](state))
	if got != want || after2 != before2 {
		t.Fatalf("reload: URL %s -> %s, state %s -> %s", want, got, before2, after2)
	}

	// The memory_summary() tab shows the text for the cursor.
	within(t, ctx, "summary tab", chromedp.Click(`#tab-summary`))
	within(t, ctx, "summary", chromedp.Poll[bool](`document.getElementById("summary-text").textContent.includes("PyTorch CUDA memory summary")`))

	// Performance samples are bounded: the newest are kept.
	kept := within(t, ctx, "bounded samples", chromedp.Evaluate[[]float64](`(() => {
		const s = vramscope.stats.drawMs;
		for (let i = 0; i < 5000; i++) s.push(i);
		const v = s.values();
		return [s.length, v[0], v[v.length - 1]];
	})()`))
	if kept[0] > 2048 || kept[2] != 4999 || kept[1] != 5000-kept[0] {
		t.Fatalf("after 5000 samples: length %v, oldest %v, newest %v", kept[0], kept[1], kept[2])
	}

	// Keyboard: 0 resets the window.
	within(t, ctx, "focus", chromedp.Focus(`#timeline`))
	within(t, ctx, "key 0", chromedp.KeyEvent("0"))
	within(t, ctx, "reset", chromedp.Poll[bool](fmt.Sprintf(`vramscope.t0 <= %d && vramscope.t1 >= %d`, f.trace.FirstUS, f.trace.LastUS)))

	// Dark theme draws on a dark panel.
	within(t, ctx, "theme", chromedp.Click(`#theme`))
	dark := within(t, ctx, "dark", chromedp.Poll[bool](`document.documentElement.dataset.theme === "dark"`))
	_ = dark
	within(t, ctx, "redraw", chromedp.Sleep(300*time.Millisecond))
	screenshot(t, ctx, dir, "trace-dark")
}

func TestBrowserUpload(t *testing.T) { testkit.EachBackend(t, testBrowserUpload) }

func testBrowserUpload(t *testing.T) {
	ctx := browser(t)
	f := newFixture(t, Options{})
	dir := shotDir(t)
	snap, err := filepath.Abs(testkit.Snapshot(t, "oom_nonexpandable.json"))
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "notes.txt")
	os.WriteFile(bad, []byte("these are not the bytes of a snapshot"), 0o644)

	within(t, ctx, "navigate", chromedp.Navigate(f.srv.URL+"/"))
	within(t, ctx, "list", chromedp.WaitVisible(`table.traces`))
	within(t, ctx, "bad file", chromedp.SetUploadFiles(`#file`, []string{bad}))
	within(t, ctx, "refusal shown", chromedp.Poll[bool](`document.getElementById("upload-status").classList.contains("error")
		&& document.getElementById("upload-status").textContent.includes("not a PyTorch snapshot")`))
	screenshot(t, ctx, dir, "upload-refused")

	within(t, ctx, "snapshot", chromedp.SetUploadFiles(`#file`, []string{snap}))
	waitFor(t, ctx, "the trace page", `location.pathname.startsWith("/traces/") && document.getElementById("view")?.dataset.ready === "1"`)
	waitReady(t, ctx)
	screenshot(t, ctx, dir, "uploaded-trace")
}
