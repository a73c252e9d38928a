package live

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/gorilla/websocket"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
	"vramscope/internal/testkit"
	"vramscope/store"
	"vramscope/tracer"
)

// testServer is a real server on 127.0.0.1 over a real database.
type testServer struct {
	db  *store.DB
	hub *Hub
	srv *httptest.Server
}

func newTestServer(t testing.TB, opt Options) *testServer {
	t.Helper()
	db := testkit.OpenDB(t)
	hub := NewHub(db, opt)
	r := chi.NewRouter()
	r.Get("/ws/ingest", hub.ServeIngest)
	r.Get("/ws/traces/{id}", func(w http.ResponseWriter, r *http.Request) {
		tr, err := db.Trace(chi.URLParam(r, "id"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		hub.ServeViewer(w, r, tr)
	})
	srv := httptest.NewServer(r)
	t.Cleanup(func() {
		srv.CloseClientConnections()
		hub.Close()
		srv.Close()
	})
	return &testServer{db, hub, srv}
}

// workload is a real allocator run: its events, stacks and annotations
// (its steps and phases).
type workload struct {
	events []gpu.Event
	stacks []gpu.Stack
	ids    gpu.StackTable
	anns   []gpu.Annotation
}

func (w *workload) Annotate(anns ...gpu.Annotation) { w.anns = append(w.anns, anns...) }

// until is w's first n events, its stacks and the annotations up to the
// last of those events.
func (w *workload) until(n int) *workload {
	last := w.events[n-1].TimeUS
	part := &workload{events: w.events[:n], stacks: w.stacks}
	for _, a := range w.anns {
		if a.TimeUS <= last {
			part.anns = append(part.anns, a)
		}
	}
	return part
}

func (w *workload) Stack(s gpu.Stack) gpu.StackID {
	id, fresh := w.ids.Intern(s)
	if fresh {
		w.stacks = append(w.stacks, append(gpu.Stack(nil), s...))
	}
	return id
}

var (
	trainOnce sync.Once
	trainRun  workload
)

// train runs a small training loop through the caching allocator once.
func train(t testing.TB) *workload {
	trainOnce.Do(func() {
		clk := &tracer.Clock{}
		a, err := caching.New(sim.New(80<<30), caching.Config{Rules: gpu.DefaultRules()}, caching.WithClock(clk.Now),
			caching.WithSink(gpu.SinkFunc(func(b []gpu.Event) { trainRun.events = append(trainRun.events, b...) })))
		if err != nil {
			panic(err)
		}
		w := tracer.DefaultTrain()
		w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 6, 512, 8192, 4, 256, 30
		if err := tracer.Run(context.Background(), w, &tracer.Env{Alloc: a, Clock: clk, Stacks: &trainRun, Annotations: &trainRun}); err != nil {
			panic(err)
		}
	})
	if len(trainRun.events) < 1000 || len(trainRun.anns) < 100 {
		t.Fatalf("the workload made only %d events and %d annotations", len(trainRun.events), len(trainRun.anns))
	}
	return &trainRun
}

// send streams w's events through c in batches of n, defining stacks and
// annotating as a tracer would.
func send(c *Client, w *workload, n int) {
	for _, s := range w.stacks {
		c.Stack(s)
	}
	anns := w.anns
	for i := 0; i < len(w.events); i += n {
		batch := w.events[i:min(i+n, len(w.events))]
		c.Emit(batch)
		k := 0
		for k < len(anns) && anns[k].TimeUS <= batch[len(batch)-1].TimeUS {
			k++
		}
		c.Annotate(anns[:k]...)
		anns = anns[k:]
	}
	c.Annotate(anns...)
}

// checkStored says whether the trace holds exactly w's events, in order.
func checkStored(t *testing.T, db *store.DB, id string, w *workload) {
	t.Helper()
	tr, err := db.Trace(id)
	if err != nil {
		t.Fatal(err)
	}
	got, err := db.Events(id, 0, int64(len(w.events)))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Events != int64(len(w.events)) || len(got) != len(w.events) {
		t.Fatalf("stored %d events (trace says %d), sent %d", len(got), tr.Events, len(w.events))
	}
	for i, e := range got {
		want := w.events[i]
		if e.Seq != want.Seq || e.Action != want.Action || e.Addr != want.Addr || e.Size != want.Size || e.TimeUS != want.TimeUS {
			t.Fatalf("event %d: stored %v, sent %v", i, e, want)
		}
		if (e.Stack == 0) != (want.Stack == 0) {
			t.Fatalf("event %d: stored stack %d, sent %d", i, e.Stack, want.Stack)
		}
		if want.Stack != 0 && i%97 == 0 {
			st, err := db.Stack(id, e.Stack)
			if err != nil {
				t.Fatal(err)
			}
			if ws := w.stacks[want.Stack-1]; len(st) != len(ws) || st[0] != ws[0] {
				t.Fatalf("event %d: stored stack %v, sent %v", i, st, ws)
			}
		}
	}
	anns, err := db.Annotations(id)
	if err != nil {
		t.Fatal(err)
	}
	if len(anns) != len(w.anns) {
		t.Fatalf("stored %d annotations, sent %d", len(anns), len(w.anns))
	}
	for i, a := range anns {
		if a != w.anns[i] {
			t.Fatalf("annotation %d: stored %+v, sent %+v", i, a, w.anns[i])
		}
	}
}

func TestStreamComplete(t *testing.T) {
	ts := newTestServer(t, Options{})
	w := train(t)
	c, err := Dial(ts.srv.URL, "", ClientOptions{Meta: gpu.TraceMeta{Name: "job", DeviceName: "sim", Capacity: 80 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := ts.db.Trace(c.TraceID())
	if err != nil {
		t.Fatal(err)
	}
	if tr.Status != gpu.StatusLive || tr.Source != gpu.SourceLive || tr.Name != "job" {
		t.Fatalf("while streaming: %+v", tr)
	}
	send(c, w, 1000)
	if err := c.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	if got := c.Acked(); got != w.events[len(w.events)-1].Seq {
		t.Fatalf("acked %d, last event %d", got, w.events[len(w.events)-1].Seq)
	}
	checkStored(t, ts.db, c.TraceID(), w)
	if tr, _ := ts.db.Trace(c.TraceID()); tr.Status != gpu.StatusComplete {
		t.Fatalf("status %s after the end", tr.Status)
	}
}

// proxy forwards TCP to the server; each connection's client-to-server
// direction is cut after a byte budget, in the middle of whatever it is
// carrying.
type proxy struct {
	ln      net.Listener
	target  string
	budgets chan int // one per connection; none left: no cut
	cuts    atomic.Int32
}

func newProxy(t *testing.T, target string, budgets ...int) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, budgets: make(chan int, len(budgets))}
	for _, b := range budgets {
		p.budgets <- b
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(in)
		}
	}()
	return p
}

func (p *proxy) serve(in net.Conn) {
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		in.Close()
		return
	}
	budget := -1
	select {
	case budget = <-p.budgets:
	default:
	}
	go func() { io.Copy(in, out); in.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := in.Read(buf)
		if budget >= 0 && n > budget {
			out.Write(buf[:budget])
			p.cuts.Add(1)
			in.Close()
			out.Close()
			return
		}
		if n > 0 {
			if _, werr := out.Write(buf[:n]); werr != nil {
				break
			}
			if budget >= 0 {
				budget -= n
			}
		}
		if err != nil {
			break
		}
	}
	out.Close()
	in.Close()
}

func TestResumeAfterCutMidBatch(t *testing.T) {
	ts := newTestServer(t, Options{FlushEvery: 20 * time.Millisecond})
	w := train(t)
	// Cuts at odd byte counts land inside binary batches (each some
	// tens of KiB), and the first inside the stack definitions.
	p := newProxy(t, strings.TrimPrefix(ts.srv.URL, "http://"), 3001, 150_001, 77_777, 133_333, 12_345)
	c, err := Dial("http://"+p.ln.Addr().String(), "", ClientOptions{MaxBatch: 3000})
	if err != nil {
		t.Fatal(err)
	}
	send(c, w, 700)
	if err := c.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	if n := p.cuts.Load(); n < 3 {
		t.Fatalf("only %d connections were cut", n)
	}
	checkStored(t, ts.db, c.TraceID(), w)
	if tr, _ := ts.db.Trace(c.TraceID()); tr.Status != gpu.StatusComplete {
		t.Fatalf("status %s after the end", tr.Status)
	}
}

// TestEndWhoseDoneWasLost: the connection dies after the server stored
// the end, before its done reaches the client. The client connects again
// and the server answers the hello with done: Close reports the end, which
// holds. A client not ending that resumes the ended trace is refused.
func TestEndWhoseDoneWasLost(t *testing.T) {
	ts := newTestServer(t, Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var dropped atomic.Bool
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", strings.TrimPrefix(ts.srv.URL, "http://"))
			if err != nil {
				in.Close()
				continue
			}
			go func() { io.Copy(out, in); out.Close() }()
			go func() {
				defer in.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := out.Read(buf)
					// The server's frames are not masked: the first done
					// is seen, and dropped with its connection.
					if strings.Contains(string(buf[:n]), `{"type":"done"`) && dropped.CompareAndSwap(false, true) {
						out.Close()
						return
					}
					if _, werr := in.Write(buf[:n]); werr != nil || err != nil {
						return
					}
				}
			}()
		}
	}()
	w := train(t)
	c, err := Dial("http://"+ln.Addr().String(), "", ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	send(c, w, 500)
	if err := c.Close(gpu.StatusFailed); err != nil {
		t.Fatalf("closing: %v", err)
	}
	if !dropped.Load() {
		t.Fatal("no done was dropped")
	}
	checkStored(t, ts.db, c.TraceID(), w)
	if tr, _ := ts.db.Trace(c.TraceID()); tr.Status != gpu.StatusFailed {
		t.Fatalf("status %s after the end", tr.Status)
	}
	other := &Client{url: c.url, hdr: c.hdr, opt: c.opt, trace: c.TraceID(), defined: map[uint64]bool{}, done: make(chan struct{}), acked: -1}
	other.cond = sync.NewCond(&other.mu)
	if _, err := other.connect(); err == nil || !strings.Contains(err.Error(), "trace "+c.TraceID()+" has ended") {
		t.Fatalf("resuming an ended trace: %v", err)
	}
	if tr, _ := ts.db.Trace(c.TraceID()); tr.Status != gpu.StatusFailed {
		t.Fatalf("status %s after a refused resume", tr.Status)
	}
}

func TestDroppedStreamIsIncompleteAndResumable(t *testing.T) {
	ts := newTestServer(t, Options{})
	w := train(t)
	half := len(w.events) / 2
	c, err := Dial(ts.srv.URL, "", ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first := w.until(half)
	send(c, first, 500)
	id := c.TraceID()
	// Wait for everything to be acknowledged, then drop the connection.
	for c.Acked() < w.events[half-1].Seq {
		time.Sleep(5 * time.Millisecond)
	}
	c.Abandon()
	for {
		tr, err := ts.db.Trace(id)
		if err != nil {
			t.Fatal(err)
		}
		if tr.Status == gpu.StatusIncomplete {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A new client resumes it: the hello names the trace.
	c2 := &Client{url: c.url, hdr: c.hdr, opt: c.opt, trace: id, defined: map[uint64]bool{},
		done: make(chan struct{}), acked: -1}
	c2.cond = sync.NewCond(&c2.mu)
	conn, err := c2.connect()
	if err != nil {
		t.Fatal(err)
	}
	go c2.run(conn)
	// Send everything again: what was stored is dropped, not doubled.
	send(c2, w, 500)
	if err := c2.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	checkStored(t, ts.db, id, w)
}

// viewerConn is a page's websocket.
func viewerConn(t *testing.T, ts *testServer, id string) *websocket.Conn {
	t.Helper()
	conn, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(ts.srv.URL, "http")+"/ws/traces/"+id, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func readTail(t *testing.T, conn *websocket.Conn) Tail {
	t.Helper()
	var m Tail
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if err := conn.ReadJSON(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

func more(t *testing.T, conn *websocket.Conn) {
	t.Helper()
	if err := conn.WriteJSON(map[string]string{"type": "more"}); err != nil {
		t.Fatal(err)
	}
}

func TestViewersFollowAndSlowOneIsCoalesced(t *testing.T) {
	ts := newTestServer(t, Options{FlushEvery: 5 * time.Millisecond})
	w := train(t)
	c, err := Dial(ts.srv.URL, "", ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := c.TraceID()
	fast, slow := viewerConn(t, ts, id), viewerConn(t, ts, id)
	for _, v := range []*websocket.Conn{fast, slow} {
		if m := readTail(t, v); m.Type != "tail" || m.Trace != id || m.Status != gpu.StatusLive || m.Seq != -1 {
			t.Fatalf("first message %+v", m)
		}
	}
	for ts.hub.Viewers(id) < 2 {
		time.Sleep(time.Millisecond)
	}
	// The fast viewer asks for more after every message and follows
	// the tail; the slow one reads nothing while ingest goes on.
	var fastSeen []Tail
	fastDone := make(chan struct{})
	last := w.events[len(w.events)-1].Seq
	go func() {
		defer close(fastDone)
		for {
			more(t, fast)
			m := readTail(t, fast)
			fastSeen = append(fastSeen, m)
			if m.Status != gpu.StatusLive {
				return
			}
		}
	}()
	// Batches one at a time, each acknowledged (so published) before
	// the next: every one is an update the slow viewer misses.
	updates := 0
	for _, s := range w.stacks {
		c.Stack(s)
	}
	for i := 0; i < len(w.events); i += 400 {
		b := w.events[i:min(i+400, len(w.events))]
		c.Emit(b)
		for c.Acked() < b[len(b)-1].Seq {
			time.Sleep(time.Millisecond)
		}
		updates++
	}
	more(t, slow)
	m := readTail(t, slow)
	if m.Seq != last || m.Status != gpu.StatusLive {
		t.Fatalf("slow viewer's update %+v, want seq %d live", m, last)
	}
	if m.Coalesced < updates-1 {
		t.Fatalf("slow viewer's update folds %d updates, %d were published", m.Coalesced, updates)
	}
	if err := c.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	<-fastDone
	prev := int64(-1)
	for _, m := range fastSeen {
		if m.Seq < prev {
			t.Fatalf("fast viewer went back from %d to %d", prev, m.Seq)
		}
		prev = m.Seq
	}
	end := fastSeen[len(fastSeen)-1]
	if end.Status != gpu.StatusComplete || end.Seq != last || end.Events != int64(len(w.events)) {
		t.Fatalf("fast viewer's last update %+v", end)
	}
	if len(fastSeen) < 3 {
		t.Fatalf("fast viewer saw %d updates", len(fastSeen))
	}
	more(t, slow)
	if m := readTail(t, slow); m.Status != gpu.StatusComplete || m.Seq != last {
		t.Fatalf("slow viewer's last update %+v", m)
	}
}

func TestDeadViewerIsDropped(t *testing.T) {
	ts := newTestServer(t, Options{PingPeriod: 20 * time.Millisecond, PongWait: 100 * time.Millisecond})
	c, err := Dial(ts.srv.URL, "", ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(gpu.StatusComplete)
	// A viewer that never reads never answers pings.
	viewerConn(t, ts, c.TraceID())
	for ts.hub.Viewers(c.TraceID()) == 0 {
		time.Sleep(time.Millisecond)
	}
	for ts.hub.Viewers(c.TraceID()) != 0 {
		time.Sleep(5 * time.Millisecond)
	}
}

func TestViewerOfUnknownTrace(t *testing.T) {
	ts := newTestServer(t, Options{})
	_, resp, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(ts.srv.URL, "http")+"/ws/traces/nope", nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown trace: %v, %v", resp, err)
	}
}

func TestJSONEventsAndRefusals(t *testing.T) {
	ts := newTestServer(t, Options{})
	url := "ws" + strings.TrimPrefix(ts.srv.URL, "http") + "/ws/ingest"
	conn, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	must := func(v any) {
		if err := conn.WriteJSON(v); err != nil {
			t.Fatal(err)
		}
	}
	must(map[string]any{"type": "hello", "meta": map[string]any{"name": "py"}})
	var r reply
	if err := conn.ReadJSON(&r); err != nil || r.Type != "ready" || r.Seq != -1 {
		t.Fatalf("ready: %+v %v", r, err)
	}
	frames := []map[string]any{{"name": "fwd", "filename": "model.py", "line": 12}}
	must(map[string]any{"type": "events", "stacks": map[string]any{"5": frames}, "events": []map[string]any{
		{"seq": 10, "time_us": 100, "action": "segment_alloc", "addr": 1 << 21, "size": 2 << 20, "stream": 0},
		{"seq": 11, "time_us": 101, "action": "alloc", "addr": 1 << 21, "size": 1000, "stream": 0, "stack": 5},
		{"seq": 12, "time_us": 102, "action": "annotate", "addr": 1 << 21, "size": 0, "stream": 0},
		{"seq": 13, "time_us": 103, "action": "free_requested", "addr": 1 << 21, "size": 1000, "stream": 0, "frames": frames},
	}})
	// Annotations ride in a text message, of the trace's device.
	must(map[string]any{"type": "events", "annotations": []map[string]any{
		{"time_us": 100, "stage": "START", "name": "ProfilerStep#0"}, {"time_us": 103, "stage": "END", "name": "ProfilerStep#0"}}})
	// A gap is refused with a reason.
	must(map[string]any{"type": "events", "events": []map[string]any{
		{"seq": 20, "time_us": 110, "action": "free_completed", "addr": 1 << 21, "size": 1000, "stream": 0}}})
	for {
		if err := conn.ReadJSON(&r); err != nil {
			t.Fatal(err)
		}
		if r.Type == "error" {
			break
		}
	}
	if !strings.Contains(r.Error, "event 20 follows 13") {
		t.Fatalf("gap refused with %q", r.Error)
	}
	id := ""
	for id == "" {
		trs, _ := ts.db.Traces()
		for _, tr := range trs {
			if tr.Status == gpu.StatusIncomplete {
				id = tr.ID
			}
		}
	}
	evs, err := ts.db.Events(id, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3 || evs[0].Seq != 10 || evs[2].Seq != 13 || evs[1].Stack == 0 || evs[1].Stack != evs[2].Stack {
		t.Fatalf("stored %v", evs)
	}
	if anns, err := ts.db.Annotations(id); err != nil || len(anns) != 2 || anns[1] != (gpu.Annotation{TimeUS: 103, Stage: "END", Name: "ProfilerStep#0"}) {
		t.Fatalf("stored annotations %+v (%v)", anns, err)
	}

	// An annotation of an unknown stage is refused, naming it.
	conn2, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	conn2.WriteJSON(map[string]any{"type": "hello", "meta": map[string]any{"name": "py"}})
	conn2.WriteJSON(map[string]any{"type": "events", "annotations": []map[string]any{{"time_us": 1, "stage": "BEGIN", "name": "step"}}})
	for r.Type = ""; r.Type != "error"; {
		if err := conn2.ReadJSON(&r); err != nil {
			t.Fatal(err)
		}
	}
	if want := `annotations[0] ("step"): stage "BEGIN" is neither START nor END`; r.Error != want {
		t.Fatalf("refused with %q, want %q", r.Error, want)
	}
}

func TestBatchRoundTrip(t *testing.T) {
	w := train(t)
	defs := []StackDef{{3, w.stacks[0]}, {9, w.stacks[1]}}
	buf := AppendBatch(nil, defs, w.events[:500])
	gotDefs, got, err := ParseBatch(buf, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(gotDefs) != 2 || gotDefs[1].ID != 9 || len(gotDefs[1].Frames) != len(w.stacks[1]) {
		t.Fatalf("stacks %+v", gotDefs)
	}
	for i := range got {
		if got[i] != w.events[i] {
			t.Fatalf("event %d: %v, want %v", i, got[i], w.events[i])
		}
	}
	for _, n := range []int{0, 1, len(buf) / 2, len(buf) - 1} {
		if _, _, err := ParseBatch(buf[:n], nil, nil); err == nil {
			t.Fatalf("a batch cut to %d of %d bytes parsed", n, len(buf))
		}
	}
	b, _ := json.Marshal(Tail{})
	if !strings.Contains(string(b), `"coalesced"`) {
		t.Fatal(string(b))
	}
}

// A hello's trace name and device name follow the rules of every name:
// too long, a control character or a right-to-left override is refused
// before anything is stored, naming the field and the limit; white space
// around a name is trimmed, and a blank name is "live".
func TestHelloNames(t *testing.T) {
	ts := newTestServer(t, Options{})
	url := "ws" + strings.TrimPrefix(ts.srv.URL, "http") + "/ws/ingest"
	for _, c := range []struct {
		meta map[string]any
		want string
	}{
		{map[string]any{"name": strings.Repeat("n", 1<<20)}, "hello: meta: name: a name is at most 255 bytes, this one is 1048576"},
		{map[string]any{"name": "job\x1b]0;pwned\x07"}, "hello: meta: name: a name is one line of plain text; byte 3 of this one is the control character U+001B"},
		{map[string]any{"name": "job\nFAKE LINE"}, "control character U+000A"},
		{map[string]any{"name": "rank0\u202Elekcip"}, "bidirectional formatting character U+202E"},
		{map[string]any{"name": "ok", "device_name": "cuda:0\x1b[2J"}, "hello: meta: device_name: a name is one line of plain text"},
	} {
		conn, _, err := websocket.DefaultDialer.Dial(url, nil)
		if err != nil {
			t.Fatal(err)
		}
		conn.WriteJSON(map[string]any{"type": "hello", "meta": c.meta})
		var r reply
		if err := conn.ReadJSON(&r); err != nil || r.Type != "error" || !strings.Contains(r.Error, c.want) || len(r.Error) > 300 {
			t.Errorf("meta %.60q: %.300q %v; want an error saying %q", c.meta, r.Error, err, c.want)
		}
		conn.Close()
	}
	if trs, _ := ts.db.Traces(); len(trs) != 0 {
		t.Fatalf("%d traces stored", len(trs))
	}
	for name, want := range map[string]string{"  <b>rank 0</b>\u00a0 ": "<b>rank 0</b>", " \t ": "live"} {
		c, err := Dial(ts.srv.URL, "", ClientOptions{Meta: gpu.TraceMeta{Name: name}})
		if err != nil {
			t.Fatalf("%q: %v", name, err)
		}
		if err := c.Close(gpu.StatusComplete); err != nil {
			t.Fatal(err)
		}
		if tr, err := ts.db.Trace(c.TraceID()); err != nil || tr.Name != want {
			t.Errorf("name %q stored as %q (%v), want %q", name, tr.Name, err, want)
		}
	}
}

// A hello's run is checked before anything is stored; a good one makes
// the trace a rank of the run, through the Go client too.
func TestHelloRun(t *testing.T) {
	ts := newTestServer(t, Options{})
	url := "ws" + strings.TrimPrefix(ts.srv.URL, "http") + "/ws/ingest"
	for _, bad := range []map[string]any{
		{"name": "", "rank": 0},
		{"name": "job", "rank": -1},
		{"name": "job", "rank": 4, "world_size": 4},
		{"name": strings.Repeat("x", gpu.MaxNameBytes+1), "rank": 0},
	} {
		conn, _, err := websocket.DefaultDialer.Dial(url, nil)
		if err != nil {
			t.Fatal(err)
		}
		conn.WriteJSON(map[string]any{"type": "hello", "meta": map[string]any{"name": "py"}, "run": bad})
		var r reply
		if err := conn.ReadJSON(&r); err != nil || r.Type != "error" || !strings.Contains(r.Error, "hello: run:") {
			t.Errorf("run %v: %+v %v", bad, r, err)
		}
		conn.Close()
	}
	if trs, _ := ts.db.Traces(); len(trs) != 0 {
		t.Fatalf("%d traces stored", len(trs))
	}
	w := train(t)
	c, err := Dial(ts.srv.URL, "", ClientOptions{Meta: gpu.TraceMeta{Name: "rank 3"}, Run: &RunJoin{Name: "job", Rank: 3, WorldSize: 4}})
	if err != nil {
		t.Fatal(err)
	}
	send(c, w, len(w.events))
	if err := c.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	tr, err := ts.db.Trace(c.TraceID())
	if err != nil {
		t.Fatal(err)
	}
	if of, ok, err := ts.db.RunOf(tr.Upload); err != nil || !ok || of.Rank != 3 || of.WorldSize != 4 || of.Name != "job" {
		t.Errorf("run %+v %v %v", of, ok, err)
	}
	checkStored(t, ts.db, c.TraceID(), w)
}
