package server

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"vramscope/internal/testkit/need"
)

// TestBrowserStepsReadWhole watches a job that reads a sample of its
// entries (the Python watcher, on the stand-in torch, with a ring far
// smaller than a read interval's entries) from its live page, asks there
// for the next 15 steps whole, and sees them come marked complete while
// the others stay sampled; the stream then ends.
func TestBrowserStepsReadWhole(t *testing.T) {
	py := need.Program(t, "python3")
	ctx := browser(t)
	f := newFixture(t, Options{Addr: "127.0.0.1:0"})
	dir := shotDir(t)
	helper, _ := filepath.Abs("../live/python")
	standin, _ := filepath.Abs("../live/testdata/standin")
	stop := filepath.Join(t.TempDir(), "stop")
	cmd := exec.Command(py, "-u", "-m", "vramscope_watch", "--url", f.srv.URL, "--interval", "0.05", "--max-entries", "300",
		"../live/testdata/standin_job.py", "1000000")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+standin+string(os.PathListSeparator)+helper, "STANDIN_STOP_FILE="+stop)
	out, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(out)
	id := ""
	for id == "" && lines.Scan() {
		if _, after, ok := strings.Cut(lines.Text(), "watching live at "); ok {
			id = after[strings.LastIndex(after, "/")+1:]
		}
	}
	go func() {
		for lines.Scan() {
			t.Log(lines.Text())
		}
	}()
	within(t, ctx, "navigate", chromedp.Navigate(f.srv.URL+"/traces/"+id))
	waitFor(t, ctx, "the sampled stream's control", `(() => { const b = document.querySelector(".whole-steps");
		return b && !b.hidden && document.getElementById("whole-note").textContent.startsWith("sampled"); })()`)
	waitFor(t, ctx, "sampled steps", `window.vramscope.stepsSampled === true && window.vramscope.steps.length > 20`)
	within(t, ctx, "ask for 15 steps whole", chromedp.Evaluate[bool](`(() => {
		document.getElementById("whole-steps").value = "15";
		document.getElementById("whole-ask").click();
		return true; })()`))
	waitFor(t, ctx, "the read whole", `Number(document.querySelector(".whole-steps").dataset.whole) >= 1`)
	waitFor(t, ctx, "15 steps complete", `window.vramscope.steps.filter(s => s.complete).length >= 15 &&
		[...document.querySelectorAll("#step-select option")].filter(o => o.textContent.endsWith("· complete")).length >= 15 &&
		[...document.querySelectorAll("#step-select option")].some(o => o.textContent.endsWith("· sampled"))`)
	note := within(t, ctx, "note", chromedp.Evaluate[string](`document.getElementById("whole-note").textContent`))
	if !strings.HasPrefix(note, "1 read whole so far") {
		t.Errorf("the control says %q", note)
	}
	screenshot(t, ctx, dir, "live-steps-whole")
	// The steps read whole, up close: underlined in the steps' strip.
	within(t, ctx, "look at them", chromedp.Evaluate[bool](`(() => {
		const v = window.vramscope, c = v.steps.filter(s => s.complete);
		v.live.pause();
		const pad = (c.at(-1).end_us - c[0].start_us) / 2;
		v.setWindow(c[0].start_us - pad, c.at(-1).end_us + pad);
		return true; })()`))
	waitFor(t, ctx, "the window on them", `window.vramscope.timeline.usage?.t1 >= window.vramscope.t1 - 1`)
	screenshot(t, ctx, dir, "live-steps-whole-close")

	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the end", `document.querySelector(".live-badge").textContent === "complete" && document.querySelector(".whole-steps").hidden`)
}
