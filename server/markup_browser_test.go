package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"

	"vramscope/gpu"
	"vramscope/internal/hostile"
	"vramscope/internal/testkit"
	"vramscope/live"
)

// pwnedJS lists what a hostile string became on the page beyond text:
// elements that match hostile.PwnSelector, and whether a handler of one
// ever ran.
var pwnedJS = fmt.Sprintf(`(() => {
	const out = [];
	if (document.documentElement.dataset.pwned) out.push("a handler ran");
	for (const e of document.querySelectorAll(%q)) if (!e.src?.includes("/static/")) out.push(e.outerHTML.slice(0, 120));
	return out;
})()`, hostile.PwnSelector)

// A real snapshot whose every shown string is markup, script or a
// javascript: URL (frame names and files, user_metadata, compile_context,
// annotations, allocator_settings keys and values), uploaded under such
// names (?name=, X-Filename, a form's file name), as a run of such a name
// and rank file, beside a live trace of such a name, is shown as text on
// every page and tab: the list, the trace view with its tooltips, panels,
// search and selection, the incident, the run, the comparison and a
// permalink. The page's policy would stop what got through: markup from a
// string throws, and nothing is logged as refused.
func TestBrowserMarkupShownAsText(t *testing.T) { testkit.EachBackend(t, testBrowserMarkupShownAsText) }

func testBrowserMarkupShownAsText(t *testing.T) {
	ctx := browser(t)
	f := newFixture(t, Options{})
	dir := shotDir(t)
	snap := hostile.MarkupSnapshot(t, testkit.Snapshot(t, "windows_paths_small.pickle"))
	upload := func(query string, header map[string]string, ct string, body []byte) []byte {
		t.Helper()
		code, b := postWith(t, f.srv.URL+"/api/traces"+query, withType(header, ct), body)
		if code != http.StatusCreated {
			t.Fatalf("upload %s: %d %s", query, code, b)
		}
		return b
	}
	var up uploadJSON
	json.Unmarshal(upload("?name="+url.QueryEscape(hostile.Markup[0]), nil, "application/octet-stream", snap), &up)
	id := up.Traces[0].ID
	upload("", map[string]string{"X-Filename": hostile.Markup[3]}, "application/octet-stream", snap)
	ct, body := formAs(t, `form-data; name="file"; filename="`+strings.ReplaceAll(hostile.Markup[2], `"`, `\"`)+`"`, snap)
	json.Unmarshal(upload("", nil, ct, body.Bytes()), &up)
	other := up.Traces[0].ID
	ct, body = form(t, map[string][]byte{"rank0 <svg class=pwn onload=alert(1)>.pickle": snap}, "rank0 <svg class=pwn onload=alert(1)>.pickle")
	var run runUploadJSON
	json.Unmarshal(upload("?run="+url.QueryEscape(hostile.Markup[1]), nil, ct, body.Bytes()), &run)
	c, err := live.Dial(f.srv.URL, "", live.ClientOptions{Meta: gpu.TraceMeta{Name: hostile.Markup[4], DeviceName: "simulated", Capacity: 16 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(gpu.StatusComplete)
	var link map[string]string
	code, b := postAs(t, f.srv.URL+"/api/permalinks", "application/json", strings.NewReader(fmt.Sprintf(`{"trace": %q, "url": %q}`,
		id, "/traces/"+id+"?panel=search&q="+url.QueryEscape(hostile.Markup[1]))))
	if json.Unmarshal(b, &link); code != http.StatusCreated {
		t.Fatalf("permalink: %d %s", code, b)
	}

	errs := pageErrors(t, ctx)
	check := func(what string) {
		t.Helper()
		time.Sleep(300 * time.Millisecond) // what a hover or an answer draws
		if got := within(t, ctx, what, chromedp.Evaluate[[]string](pwnedJS)); len(got) > 0 {
			t.Errorf("%s: markup from a file rendered: %q", what, got)
		}
	}
	open := func(path string) {
		t.Helper()
		within(t, ctx, "navigate "+path, chromedp.Navigate(f.srv.URL+path))
		within(t, ctx, "load "+path, chromedp.Poll[bool](`document.readyState === "complete"`))
	}
	hover := func(what, js string) {
		t.Helper()
		pt := within(t, ctx, what, chromedp.Evaluate[map[string]float64](js))
		within(t, ctx, what, chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, pt["x"], pt["y"]))
		check(what)
	}

	open("/")
	waitFor(t, ctx, "the names", fmt.Sprintf(`document.body.innerText.includes(%q) && document.body.innerText.includes(%q)`, hostile.Markup[0], hostile.Markup[4]))
	check("list")
	screenshot(t, ctx, dir, "markup-list")
	open("/?name=" + url.QueryEscape(hostile.Markup[1]))
	check("list filtered by markup")

	for _, q := range []string{"?sel=1402&panel=selection", "?panel=search&q=pwned", "?panel=snapshot&g=stack", "?panel=summary&bands=category", "?panel=cursor&g=category&bands=area"} {
		open("/traces/" + id + q)
		waitReady(t, ctx)
		waitFor(t, ctx, "the live memory", `!!document.getElementById("view").dataset.liveSeq`)
		check("trace view " + q)
		for i := 1; i < 4; i++ {
			hover(fmt.Sprintf("segment map %d %s", i, q), fmt.Sprintf(`(() => {
				const m = vramscope.segmap, c = m.blockCenter(Math.floor(m.data.block_count * %d / 4)), wrap = document.getElementById("segmap-wrap");
				wrap.scrollTop = Math.max(0, c.y - 60); wrap.scrollIntoView({block: "nearest"});
				const r = m.canvas.getBoundingClientRect(); return {x: r.left + c.x, y: r.top + c.y};
			})()`, i))
			for _, canvas := range []string{"flame", "timeline"} {
				hover(fmt.Sprintf("%s %d %s", canvas, i, q), fmt.Sprintf(`(() => { const c = document.getElementById(%q); c.scrollIntoView({block: "nearest"});
					const r = c.getBoundingClientRect(); return {x: r.left + r.width * %d / 4, y: r.top + r.height * %d / 4}; })()`, canvas, i, i))
			}
		}
		screenshot(t, ctx, dir, "markup-view-"+strings.NewReplacer("?", "", "&", "-", "=", "-").Replace(q))
	}
	shown := within(t, ctx, "text", chromedp.Evaluate[string](`document.body.innerText`))
	for _, m := range hostile.Markup[:5] {
		if !strings.Contains(shown, m) {
			t.Errorf("the trace view does not show %q as text", m)
		}
	}

	open("/traces/" + id + "/incidents/1")
	waitFor(t, ctx, "the incident", `document.body.innerText.includes("pwned")`)
	check("incident")
	screenshot(t, ctx, dir, "markup-incident")
	open("/runs/" + run.Run)
	waitFor(t, ctx, "the run", `document.querySelectorAll("[data-trace]").length > 0`)
	check("run")
	screenshot(t, ctx, dir, "markup-run")
	open("/compare/" + id + "/" + other)
	waitFor(t, ctx, "the comparison", `document.body.innerText.includes("pwned=1")`)
	check("compare")
	screenshot(t, ctx, dir, "markup-compare")
	open(link["url"])
	waitReady(t, ctx)
	waitFor(t, ctx, "the permalink's search", `document.getElementById("search-summary")?.textContent.includes("<script>")`)
	check("permalink")

	for _, e := range errs() {
		t.Errorf("page error: %s", e)
	}

	// Were a string to reach an HTML or script sink, the policy refuses it.
	sinks := within(t, ctx, "sinks", chromedp.Evaluate[[]string](`[
		() => document.body.insertAdjacentHTML("beforeend", "<img class=pwn src=x>"),
		() => { document.getElementById("search-summary").innerHTML = "<b class=pwn>x</b>"; },
		() => { const s = document.createElement("script"); s.textContent = "document.documentElement.dataset.pwned = 1"; document.body.append(s); },
	].map((f) => { try { f(); return "ran"; } catch (e) { return e.name; } })`))
	if strings.Join(sinks, " ") != "TypeError TypeError TypeError" {
		t.Errorf("HTML and script sinks: %q, want each refused (TypeError)", sinks)
	}
	check("after the sinks")
}
