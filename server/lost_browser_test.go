package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/gorilla/websocket"

	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/live"
	"vramscope/pytorch"
)

// A live trace that lost entries of its job twice (the helper read
// entries 0-299, lost 300-699, read 700-999 and lost some more before the
// rest), stored as the live hub stores it: the trace page says so, gap by
// gap, a gap's link puts the cursor there, and the trace's JSON says the
// same.
func TestBrowserLostEntries(t *testing.T) {
	ctx := browser(t)
	l := listen(t, nil, Options{})
	dir := shotDir(t)
	traces, err := pytorch.DecodeFile(testkit.Snapshot(t, "uint64_line_annotations.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	tr := traces[0]
	w, err := l.db.CreateTrace(gpu.TraceMeta{Name: "train.py (cuda:0)", Source: gpu.SourceLive, DeviceName: "cuda:0"}, tr.Initial)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range tr.Stacks {
		w.Stack(s)
	}
	seq := int64(0)
	emit := func(evs []gpu.Event) {
		for _, e := range evs {
			e.Seq = seq
			seq++
			w.Emit([]gpu.Event{e})
		}
	}
	gap := func(to int, lost int64) {
		state := tr.Initial.Clone()
		for _, e := range tr.Events[:to] {
			state.Apply(e)
		}
		fill, err := w.Layout().EventsTo(state)
		if err != nil {
			t.Fatal(err)
		}
		for i := range fill {
			fill[i].Seq, fill[i].TimeUS = seq+int64(i), tr.Events[to].TimeUS
		}
		w.EmitGap(gpu.Gap{AfterSeq: seq - 1, Seq: seq + int64(len(fill)), TimeUS: tr.Events[to].TimeUS, Lost: lost, Filled: int64(len(fill))}, fill)
		seq += int64(len(fill))
	}
	n := len(tr.Events)
	emit(tr.Events[:300])
	gap(700, 400)
	emit(tr.Events[700:1000])
	gap(n-2000, -1)
	emit(tr.Events[n-2000:])
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}

	code, body := l.do(t, http.MethodGet, "/api/traces/"+w.ID(), "", nil, nil)
	var got gpu.Trace
	if err := json.Unmarshal(body, &got); code != http.StatusOK || err != nil || got.Dropped == nil || got.Dropped.GapCount != 2 || got.Dropped.Lost != 400 || got.Dropped.Gaps[0].AfterSeq != 299 {
		t.Fatalf("GET the trace: %d %v %s", code, err, body)
	}

	within(t, ctx, "navigate", chromedp.Navigate(l.base+"/traces/"+w.ID()))
	waitFor(t, ctx, "the trace page", `document.getElementById("view")?.dataset.ready === "1"`)
	note := within(t, ctx, "the note", chromedp.Evaluate[string](`document.getElementById("lost")?.textContent ?? ""`))
	for _, want := range []string{"Entries of the job were lost in 2 gaps: 400 known.", "after event 299", "about 400 entries lost",
		fmt.Sprintf("after event %d", got.Dropped.Gaps[1].AfterSeq), "entries lost, how many unknown"} {
		if !strings.Contains(note, want) {
			t.Errorf("the note lacks %q: %q", want, note)
		}
	}
	within(t, ctx, "open the note", chromedp.Click(`#lost summary`))
	screenshot(t, ctx, dir, "lost-entries")
	within(t, ctx, "go to the first gap", chromedp.Click(`#lost li a`))
	waitFor(t, ctx, "the cursor at the gap", fmt.Sprintf(`new URLSearchParams(location.search).get("c") === "%d"`, got.Dropped.Gaps[0].TimeUS))
}

// A live trace's page, open while its job's helper streams: a poll after
// entries were lost makes the page say so at once (where, once reloaded).
func TestBrowserLiveLostEntries(t *testing.T) {
	ctx := browser(t)
	l := listen(t, nil, Options{})
	traces, err := pytorch.DecodeFile(testkit.Snapshot(t, "uint64_line_annotations.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	tr := traces[0]
	poll := func(from, to int, seq, lost int64) []byte {
		l := tr.Initial.Clone()
		for _, e := range tr.Events[:to] {
			l.Apply(e)
		}
		var b bytes.Buffer
		if err := pytorch.Export(&b, &pytorch.Trace{Final: l, Events: tr.Events[from:to], HasTime: true, Stacks: tr.Stacks, Settings: tr.Settings}); err != nil {
			t.Fatal(err)
		}
		return live.AppendPoll(nil, live.Poll{Seq: seq, Lost: lost, Pickle: b.Bytes()})
	}
	var init bytes.Buffer
	pytorch.Export(&init, &pytorch.Trace{Final: tr.Initial, Stacks: tr.Stacks, Settings: tr.Settings})
	v, err := pytorch.Unpickle(&init)
	if err != nil {
		t.Fatal(err)
	}
	snap, _ := json.Marshal(v)
	conn, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(l.base, "http")+"/ws/ingest", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.WriteJSON(map[string]any{"type": "hello", "meta": map[string]any{"name": "train.py (cuda:0)"}, "snapshot": json.RawMessage(snap)})
	var r struct{ Type, Trace string }
	if err := conn.ReadJSON(&r); err != nil || r.Type != "ready" {
		t.Fatalf("ready: %+v %v", r, err)
	}
	conn.WriteMessage(websocket.BinaryMessage, poll(0, 300, 0, 0))

	within(t, ctx, "navigate", chromedp.Navigate(l.base+"/traces/"+r.Trace))
	waitFor(t, ctx, "the live page", `document.querySelector(".live-badge")?.textContent.includes("live")`)
	if n := within(t, ctx, "no note", chromedp.Evaluate[int](`document.querySelectorAll("#lost, #lost-live").length`)); n != 0 {
		t.Fatalf("%d notes before anything was lost", n)
	}
	conn.WriteMessage(websocket.BinaryMessage, poll(700, 1000, 300, 400))
	waitFor(t, ctx, "the live note", `document.getElementById("lost-live")?.textContent === "Entries of the job were lost in 1 gap: 400 known. Reload the page to see where."`)
	screenshot(t, ctx, shotDir(t), "lost-live")
	within(t, ctx, "reload", chromedp.Reload())
	waitFor(t, ctx, "the drawn note", `document.getElementById("lost")?.textContent.includes("after event 299") && !document.getElementById("lost-live")`)
}
