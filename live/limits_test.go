package live

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"vramscope/gpu"
	"vramscope/internal/testkit"
)

func wsURL(ts *testServer) string {
	return "ws" + strings.TrimPrefix(ts.srv.URL, "http") + "/ws/ingest"
}

// A message over MaxMessage closes the connection as too big; the trace
// stays, incomplete.
func TestMessageOverLimit(t *testing.T) {
	ts := newTestServer(t, Options{MaxMessage: 1 << 20})
	conn := ingestRaw(t, ts)
	// The server refuses on the frame's header and closes with the rest
	// unread, so the write may meet the reset of that close.
	if err := conn.WriteMessage(websocket.BinaryMessage, make([]byte, 2<<20)); err != nil {
		if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
			t.Fatal(err)
		}
		return
	}
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, _, err := conn.ReadMessage()
	if !websocket.IsCloseError(err, websocket.CloseMessageTooBig) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("got %v, want a close for a message too big", err)
	}
}

// No more than MaxStreams ingest connections at once: the next one gets
// 503 with a JSON error before the upgrade.
func TestStreamLimit(t *testing.T) {
	ts := newTestServer(t, Options{MaxStreams: 2})
	a, b := ingestRaw(t, ts), ingestRaw(t, ts)
	_, res, err := websocket.DefaultDialer.Dial(wsURL(ts), nil)
	if err == nil || res == nil || res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a third stream: %v", err)
	}
	var e struct{ Error string }
	if json.NewDecoder(res.Body).Decode(&e); !strings.Contains(e.Error, "2 live streams") {
		t.Errorf("error %q", e.Error)
	}
	a.Close()
	b.Close()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, _, err := websocket.DefaultDialer.Dial(wsURL(ts), nil)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stream taken after two closed: %v", err)
		}
	}
}

// heapLive is the live heap after a collection.
func heapLive() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// After one big batch, a connection holds no buffer of its size: the
// ~500 MB a 30 MB batch kept for the connection's life.
func TestBigBatchBuffersReleased(t *testing.T) {
	ts := newTestServer(t, Options{MaxMessage: 32 << 20})
	conn := ingestRaw(t, ts)
	const n = 1 << 20
	evs := make([]gpu.Event, 0, n)
	evs = append(evs, gpu.Event{Seq: 0, TimeUS: 0, Action: gpu.ActionSegmentAlloc, Addr: 1 << 30, Size: 2 << 20})
	for len(evs) < n {
		i := int64(len(evs))
		a := []gpu.Action{gpu.ActionAlloc, gpu.ActionFreeRequested, gpu.ActionFreeCompleted}[(i-1)%3]
		evs = append(evs, gpu.Event{Seq: i, TimeUS: i, Action: a, Addr: 1 << 30, Size: 512})
	}
	batch := AppendBatch(nil, nil, evs)
	evs = nil
	before := heapLive()
	if err := conn.WriteMessage(websocket.BinaryMessage, batch); err != nil {
		t.Fatal(err)
	}
	batch = nil
	conn.SetReadDeadline(time.Now().Add(2 * time.Minute))
	for {
		var r reply
		if err := conn.ReadJSON(&r); err != nil {
			t.Fatal(err)
		}
		if r.Type == "error" {
			t.Fatal(r.Error)
		}
		if r.Type == "ack" && r.Seq == n-1 {
			break
		}
	}
	if grew := int64(heapLive()) - int64(before); grew > 24<<20 {
		t.Errorf("the open connection holds %d MiB more after a batch of %d events", grew>>20, n)
	}
}

// A hello whose settings do not parse is refused, naming them.
func TestHelloBadSettings(t *testing.T) {
	ts := newTestServer(t, Options{})
	conn, _, err := websocket.DefaultDialer.Dial(wsURL(ts), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.WriteJSON(map[string]any{"type": "hello", "meta": map[string]any{"name": "x", "allocator_settings": "garbage_collection_threshold:7"}})
	var r reply
	if err := conn.ReadJSON(&r); err != nil || r.Type != "error" || !strings.Contains(r.Error, "garbage_collection_threshold:7") {
		t.Fatalf("got %+v %v", r, err)
	}
	if trs, _ := ts.db.Traces(); len(trs) != 0 {
		t.Errorf("%d traces made", len(trs))
	}
}

// A hello's settings give the trace's rules, as the job's allocator had
// them: what its layouts and figures are read under.
func TestHelloSettingsGiveTheRules(t *testing.T) {
	ts := newTestServer(t, Options{})
	c, err := Dial(ts.srv.URL, "", ClientOptions{Meta: gpu.TraceMeta{Name: "x", Settings: "max_split_size_mb:256,expandable_segments:True"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(gpu.StatusComplete)
	tr, err := ts.db.Trace(c.TraceID())
	if err != nil {
		t.Fatal(err)
	}
	if tr.Rules.MaxSplitSize != 256<<20 || !tr.Rules.Expandable {
		t.Fatalf("rules %+v", tr.Rules)
	}
}

// Live traces that never got an event go once EmptyExpiry has passed;
// those with events stay.
func TestEmptyLiveTracesExpire(t *testing.T) {
	ts := newTestServer(t, Options{EmptyExpiry: 200 * time.Millisecond})
	for range 20 {
		ingestRaw(t, ts).Close()
	}
	kept := ingestRaw(t, ts)
	kept.WriteMessage(websocket.BinaryMessage, AppendBatch(nil, nil, []gpu.Event{{Seq: 0, TimeUS: 1, Action: gpu.ActionSegmentAlloc, Addr: 1 << 21, Size: 2 << 20}}))
	kept.WriteJSON(map[string]any{"type": "end", "status": "complete"})
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		trs, err := ts.db.Traces()
		if err != nil {
			t.Fatal(err)
		}
		if len(trs) == 1 && trs[0].Events == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d traces left a minute on", len(trs))
		}
	}
}

// FuzzDecodeMessage: any message, text or binary, decodes or fails with
// an error, never a panic; a binary batch or poll that decodes encodes
// back to the same bytes' meaning (a poll's pickle is the PyTorch
// decoder's, fuzzed there).
func FuzzDecodeMessage(f *testing.F) {
	f.Add(false, []byte(`{"type":"events","stacks":{"1":[{"name":"f","filename":"a.py","line":3}]},"events":[{"seq":0,"time_us":1,"action":"alloc","addr":2097152,"size":512,"stream":0,"stack":1}]}`))
	f.Add(false, []byte(`{"type":"end","status":"failed"}`))
	f.Add(true, AppendBatch(nil, []StackDef{{1, gpu.Stack{{Name: "f", Filename: "a.py", Line: 1}}}},
		[]gpu.Event{{Seq: 3, TimeUS: 7, Action: gpu.ActionAlloc, Addr: 1 << 21, Size: 512, Stack: 1}}))
	f.Add(true, AppendPoll(nil, Poll{Seq: 5, Lost: -1, Ann: 2, Pickle: []byte("\x80\x04}\x94.")}))
	f.Add(true, AppendPoll(nil, Poll{Seq: 5, Lost: 7, Ann: 2, Whole: 20, Pickle: []byte("\x80\x04}\x94.")}))
	f.Fuzz(func(t *testing.T, binary bool, data []byte) {
		typ := websocket.TextMessage
		if binary {
			typ = websocket.BinaryMessage
		}
		var m message
		if err := m.decode(typ, data); err != nil || !binary {
			return
		}
		if m.poll != nil {
			p, err := ParsePoll(AppendPoll(nil, *m.poll))
			if err != nil || p.Seq != m.poll.Seq || p.Lost != m.poll.Lost || p.Ann != m.poll.Ann || p.Whole != m.poll.Whole || !bytes.Equal(p.Pickle, m.poll.Pickle) {
				t.Fatalf("a poll changed through encode and decode: %+v, %v", p, err)
			}
			return
		}
		again := AppendBatch(nil, m.defs, m.events)
		var m2 message
		if err := m2.decode(typ, again); err != nil {
			t.Fatalf("a decoded batch does not decode again: %v", err)
		}
		if !bytes.Equal(AppendBatch(nil, m2.defs, m2.events), again) || len(m2.events) != len(m.events) {
			t.Fatalf("a batch changed through encode and decode")
		}
	})
}

// A server that answers a reconnect with 503 (busy, or a proxy's answer
// while it restarts) is tried again; a 4xx ends the stream at once.
func TestReconnectWaitsOutA503(t *testing.T) {
	db := testkit.OpenDB(t)
	hub := NewHub(db, Options{FlushEvery: 10 * time.Millisecond})
	var attempts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := attempts.Add(1); n == 2 || n == 3 {
			httpError(w, http.StatusServiceUnavailable, "restarting")
			return
		}
		hub.ServeIngest(w, r)
	}))
	t.Cleanup(func() { hub.Close(); srv.Close() })
	w := train(t)
	// The first connection is cut inside its second batch.
	p := newProxy(t, strings.TrimPrefix(srv.URL, "http://"), 100_001)
	c, err := Dial("http://"+p.ln.Addr().String(), "", ClientOptions{MaxBatch: 2000})
	if err != nil {
		t.Fatal(err)
	}
	send(c, w, 1000)
	if err := c.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	if n := attempts.Load(); n < 4 || p.cuts.Load() != 1 {
		t.Fatalf("%d connections, %d cut", n, p.cuts.Load())
	}
	checkStored(t, db, c.TraceID(), w)
}
