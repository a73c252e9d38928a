package live

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
)

// pollOf is the poll a PyTorch job's helper sends after reading entries
// [from, to) of tr: those entries, and the segments after them.
func pollOf(t *testing.T, tr *pytorch.Trace, from, to int, seq, lost int64) []byte {
	t.Helper()
	l := tr.Initial.Clone()
	for _, e := range tr.Events[:to] {
		if err := l.Apply(e); err != nil {
			t.Fatal(err)
		}
	}
	var b bytes.Buffer
	part := &pytorch.Trace{Device: tr.Device, Final: l, Events: tr.Events[from:to], HasTime: tr.HasTime, Stacks: tr.Stacks, Settings: tr.Settings}
	if err := pytorch.Export(&b, part); err != nil {
		t.Fatal(err)
	}
	return AppendPoll(nil, Poll{Seq: seq, Lost: lost, Pickle: b.Bytes()})
}

// A job's helper reads entries 0-299, loses 300-699 (400, its counters
// say), reads 700-999, loses some it cannot count, reads the rest. The
// trace holds what was read, in order, each gap where it was with what
// filled it, and ends in the job's state; a poll sent again after a
// reconnect is not stored twice, and the numbers the client sees are its
// own.
func TestPollGaps(t *testing.T) {
	traces, err := pytorch.DecodeFile(testkit.Snapshot(t, "uint64_line_annotations.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	tr := traces[0]
	n := len(tr.Events)
	ts := newTestServer(t, Options{FlushEvery: 10 * time.Millisecond})
	url := "ws" + strings.TrimPrefix(ts.srv.URL, "http") + "/ws/ingest"
	var init bytes.Buffer
	if err := pytorch.Export(&init, &pytorch.Trace{Device: 0, Final: tr.Initial, Stacks: tr.Stacks, Settings: tr.Settings}); err != nil {
		t.Fatal(err)
	}
	v, err := pytorch.Unpickle(&init)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(trace string) (*websocket.Conn, reply) {
		conn, _, err := websocket.DefaultDialer.Dial(url, nil)
		if err != nil {
			t.Fatal(err)
		}
		hello, _ := json.Marshal(map[string]any{"type": "hello", "trace": trace, "meta": map[string]any{"name": "job"}, "snapshot": json.RawMessage(snap)})
		conn.WriteMessage(websocket.TextMessage, hello)
		var r reply
		if err := conn.ReadJSON(&r); err != nil || r.Type != "ready" {
			t.Fatalf("ready: %+v %v", r, err)
		}
		return conn, r
	}
	waitAck := func(conn *websocket.Conn, seq int64) {
		for {
			var r reply
			if err := conn.ReadJSON(&r); err != nil {
				t.Fatal(err)
			}
			if r.Type == "error" {
				t.Fatal(r.Error)
			}
			if r.Type == "ack" && r.Seq == seq {
				return
			}
		}
	}
	conn, r := dial("")
	id := r.Trace
	conn.WriteMessage(websocket.BinaryMessage, pollOf(t, tr, 0, 300, 0, 0))
	conn.WriteMessage(websocket.BinaryMessage, pollOf(t, tr, 700, 1000, 300, 400))
	waitAck(conn, 599)
	conn.Close()
	// Resumed: the server says the client's own numbers; the poll sent
	// again is dropped, the next one lost entries the client did not see.
	conn, r = dial(id)
	if r.Seq != 599 {
		t.Fatalf("resumed at %d, want the client's 599", r.Seq)
	}
	conn.WriteMessage(websocket.BinaryMessage, pollOf(t, tr, 700, 1000, 300, 400))
	conn.WriteMessage(websocket.BinaryMessage, pollOf(t, tr, n-500, n, 600, 0))
	waitAck(conn, 1099)
	conn.WriteJSON(map[string]string{"type": "end"})
	for r.Type != "done" {
		if err := conn.ReadJSON(&r); err != nil {
			t.Fatal(err)
		}
	}
	if r.Seq != 1099 {
		t.Fatalf("done at %d, want the client's 1099", r.Seq)
	}
	conn.Close()

	got, err := ts.db.Trace(id)
	if err != nil {
		t.Fatal(err)
	}
	d := got.Dropped
	if got.Status != gpu.StatusComplete || d == nil || d.GapCount != 2 || d.Lost != 400 || len(d.Gaps) != 2 {
		t.Fatalf("trace %+v, dropped %+v", got, d)
	}
	g0, g1 := d.Gaps[0], d.Gaps[1]
	if g0.AfterSeq != 299 || g0.Lost != 400 || g0.Seq != 300+g0.Filled || g1.Lost != -1 || g1.AfterSeq != 599+g0.Filled || g1.Seq != g1.AfterSeq+1+g1.Filled || d.Filled != g0.Filled+g1.Filled {
		t.Fatalf("gaps %+v", d.Gaps)
	}
	evs, err := ts.db.Events(id, 0, 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(evs)) != 1100+d.Filled {
		t.Fatalf("%d events stored, want 1100 read and %d filled", len(evs), d.Filled)
	}
	// What was read is the job's, in order, around the filled events.
	want := append(append(append([]gpu.Event(nil), tr.Events[:300]...), tr.Events[700:1000]...), tr.Events[n-500:]...)
	k := 0
	for i, e := range evs {
		if s := e.Seq; s >= g0.AfterSeq+1 && s < g0.Seq || s >= g1.AfterSeq+1 && s < g1.Seq {
			continue
		}
		w := want[k]
		if e.Seq != int64(i) || e.Action != w.Action || e.Addr != w.Addr || e.Size != w.Size || e.TimeUS != w.TimeUS || (e.Stack == 0) != (w.Stack == 0) {
			t.Fatalf("event %d: %v, the job's entry %v", i, e, w)
		}
		k++
	}
	l, _, err := ts.db.LayoutAtSeq(id, got.LastSeq)
	if err != nil {
		t.Fatal(err)
	}
	if !l.Same(tr.Final) {
		t.Fatal("the trace does not end in the job's state")
	}
}

// A poll that does not go on from the trace's last entry, or whose
// snapshot does not decode, is refused with why, and the stream ends.
func TestPollRefusals(t *testing.T) {
	traces, err := pytorch.DecodeFile(testkit.Snapshot(t, "oom_nonexpandable.json"))
	if err != nil {
		t.Fatal(err)
	}
	tr := traces[0]
	ts := newTestServer(t, Options{})
	url := "ws" + strings.TrimPrefix(ts.srv.URL, "http") + "/ws/ingest"
	for _, c := range []struct {
		second []byte
		want   string
	}{
		{pollOf(t, tr, 100, 200, 150, 0), "poll at entry 150: the trace has entries up to 99; a poll goes on from there"},
		{AppendPoll(nil, Poll{Seq: 100, Pickle: []byte("not a pickle")}), "poll at entry 100: "},
		{[]byte{pollVersion, 0x80}, "binary poll at byte 1: batch ends early"},
		{[]byte{pollWholeVersion, 100, 0, 0, 0}, "binary poll read whole: 0 steps asked for, not in [1, 1048576]"},
	} {
		conn, _, err := websocket.DefaultDialer.Dial(url, nil)
		if err != nil {
			t.Fatal(err)
		}
		conn.WriteJSON(map[string]any{"type": "hello", "meta": map[string]any{"name": "job"}})
		var r reply
		if err := conn.ReadJSON(&r); err != nil || r.Type != "ready" {
			t.Fatalf("ready: %+v %v", r, err)
		}
		conn.WriteMessage(websocket.BinaryMessage, pollOf(t, tr, 0, 100, 0, 0))
		conn.WriteMessage(websocket.BinaryMessage, c.second)
		for r.Type != "error" {
			if err := conn.ReadJSON(&r); err != nil {
				t.Fatalf("%q: %v", c.want, err)
			}
		}
		if !strings.HasPrefix(r.Error, c.want) {
			t.Errorf("refused with %q, want %q", r.Error, c.want)
		}
		conn.Close()
	}
}
