package live

import (
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"vramscope/gpu"
)

func TestParseBatchRefusesUnknownActionAndPool(t *testing.T) {
	seg := gpu.Event{Seq: 0, TimeUS: 1, Action: gpu.ActionSegmentAlloc, Addr: 1 << 21, Size: 2 << 20}
	alloc := gpu.Event{Seq: 1, TimeUS: 2, Action: gpu.ActionAlloc, Addr: 1 << 21, Size: 512}
	for _, c := range []struct {
		name string
		e    func(e *gpu.Event)
		want string
	}{
		{"pool 4", func(e *gpu.Event) { e.Pool = 4 }, "unknown pool 4"},
		{"pool 3", func(e *gpu.Event) { e.Pool = gpu.PoolLarge + 1 }, "unknown pool 3"},
		{"pool 255", func(e *gpu.Event) { e.Pool = 255 }, "unknown pool 255"},
		{"action 10", func(e *gpu.Event) { e.Action = gpu.ActionOOM + 1 }, "unknown action 10"},
		{"action 200", func(e *gpu.Event) { e.Action = 200 }, "unknown action 200"},
	} {
		e := seg
		c.e(&e)
		_, _, err := ParseBatch(AppendBatch(nil, nil, []gpu.Event{e, alloc}), nil, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.name, err, c.want)
		}
	}
	// Every known action and pool gets through, ActionNone included (it
	// stores nothing but keeps its seq, as an unknown action in a text
	// batch does).
	var evs []gpu.Event
	for a := gpu.ActionNone; a <= gpu.ActionOOM; a++ {
		for p := gpu.PoolUnknown; p <= gpu.PoolLarge; p++ {
			evs = append(evs, gpu.Event{Seq: int64(len(evs)), Action: a, Pool: p})
		}
	}
	_, got, err := ParseBatch(AppendBatch(nil, nil, evs), nil, nil)
	if err != nil || len(got) != len(evs) {
		t.Fatalf("%d of %d events, %v", len(got), len(evs), err)
	}
}

// ingestRaw opens an ingest connection and says hello.
func ingestRaw(t *testing.T, ts *testServer) *websocket.Conn {
	t.Helper()
	url := "ws" + strings.TrimPrefix(ts.srv.URL, "http") + "/ws/ingest"
	conn, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.WriteJSON(map[string]any{"type": "hello", "meta": map[string]any{"name": "raw"}}); err != nil {
		t.Fatal(err)
	}
	var r reply
	if err := conn.ReadJSON(&r); err != nil || r.Type != "ready" {
		t.Fatalf("ready: %+v %v", r, err)
	}
	return conn
}

// refusal waits for the server's error and returns the trace it leaves.
func refusal(t *testing.T, ts *testServer, conn *websocket.Conn, want string) gpu.Trace {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		var r reply
		if err := conn.ReadJSON(&r); err != nil {
			t.Fatalf("no error reply (want %q): %v", want, err)
		}
		if r.Type == "error" {
			if !strings.Contains(r.Error, want) {
				t.Fatalf("refused with %q, want %q", r.Error, want)
			}
			break
		}
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		trs, err := ts.db.Traces()
		if err != nil {
			t.Fatal(err)
		}
		if len(trs) == 1 && trs[0].Status != gpu.StatusLive {
			return trs[0]
		}
	}
	t.Fatal("the trace stayed live after the stream was refused")
	return gpu.Trace{}
}

func TestBinaryIngestRefusesUnknownPool(t *testing.T) {
	ts := newTestServer(t, Options{})
	conn := ingestRaw(t, ts)
	evs := []gpu.Event{
		{Seq: 0, TimeUS: 1, Action: gpu.ActionSegmentAlloc, Pool: 4, Addr: 1 << 21, Size: 2 << 20},
		{Seq: 1, TimeUS: 2, Action: gpu.ActionAlloc, Addr: 1 << 21, Size: 512},
	}
	if err := conn.WriteMessage(websocket.BinaryMessage, AppendBatch(nil, nil, evs)); err != nil {
		t.Fatal(err)
	}
	conn.WriteJSON(map[string]any{"type": "end", "status": "complete"})
	tr := refusal(t, ts, conn, "binary batch: event 0: unknown pool 4")
	if tr.Status == gpu.StatusComplete || tr.Events != 0 {
		t.Fatalf("trace %s with %d events", tr.Status, tr.Events)
	}
	if _, err := ts.db.Events(tr.ID, 0, 10); err != nil {
		t.Fatal(err)
	}
}

func TestIngestRefusesNegativeSeq(t *testing.T) {
	for _, binary := range []bool{false, true} {
		ts := newTestServer(t, Options{})
		conn := ingestRaw(t, ts)
		evs := []gpu.Event{
			{Seq: -5, TimeUS: 1, Action: gpu.ActionSegmentAlloc, Addr: 1 << 21, Size: 2 << 20},
			{Seq: -4, TimeUS: 2, Action: gpu.ActionAlloc, Addr: 1 << 21, Size: 512},
		}
		var err error
		if binary {
			err = conn.WriteMessage(websocket.BinaryMessage, AppendBatch(nil, nil, evs))
		} else {
			var js []map[string]any
			for _, e := range evs {
				js = append(js, map[string]any{"seq": e.Seq, "time_us": e.TimeUS, "action": e.Action.String(),
					"addr": e.Addr, "size": e.Size, "stream": 0})
			}
			err = conn.WriteJSON(map[string]any{"type": "events", "events": js})
		}
		if err != nil {
			t.Fatal(err)
		}
		conn.WriteJSON(map[string]any{"type": "end", "status": "complete"})
		tr := refusal(t, ts, conn, "event -5: sequence numbers start at 0")
		if tr.Status == gpu.StatusComplete || tr.Events != 0 {
			t.Fatalf("binary %v: trace %s with %d events", binary, tr.Status, tr.Events)
		}
	}
}

// A hello that is not one is refused saying what is wrong with it: which
// field does not parse, which type it has, that it is binary.
func TestBadHelloSaysWhy(t *testing.T) {
	ts := newTestServer(t, Options{})
	other, err := ts.db.CreateTrace(gpu.TraceMeta{Name: "recorded", Source: gpu.SourceTrace}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		typ       int
		msg, want string
	}{
		{websocket.TextMessage, `{"type":"hello","meta":{"name":"x","capacity_bytes":-1}}`, "hello: json: cannot unmarshal number -1 into Go struct field TraceMeta.meta.capacity_bytes of type uint64"},
		{websocket.TextMessage, `{"type":"hel`, "hello: unexpected end of JSON input"},
		{websocket.TextMessage, `{"type":"events"}`, `the first message must be {"type":"hello",...}, not type "events"`},
		{websocket.BinaryMessage, string(AppendBatch(nil, nil, nil)), "the first message must be a text {\"type\":\"hello\",...}, not a binary message"},
		{websocket.TextMessage, `{"type":"hello","trace":"` + other.ID() + `"}`, `trace ` + other.ID() + ` did not come from a live stream (its source is "trace"); only live traces can be resumed`},
	} {
		conn, _, err := websocket.DefaultDialer.Dial(wsURL(ts), nil)
		if err != nil {
			t.Fatal(err)
		}
		conn.WriteMessage(c.typ, []byte(c.msg))
		var r reply
		if err := conn.ReadJSON(&r); err != nil || r.Type != "error" || r.Error != c.want {
			t.Errorf("%s: got %+v (%v), want %q", c.msg, r, err, c.want)
		}
		conn.Close()
	}
}
