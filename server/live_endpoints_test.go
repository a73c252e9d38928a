package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
	"vramscope/internal/testkit"
	"vramscope/live"
	"vramscope/tracer"
)

// momentGate holds a streaming workload at moments of its run, once what
// it made by then is stored on the server: as each training step begins
// (its START annotation already there, none of its events: the step is
// open and begins after the trace's last event) and as each optimizer
// step begins (the training step open, half its events there).
type momentGate struct {
	next  gpu.Annotator
	alloc *caching.Allocator
	anns  int // annotations sent on
	at    chan string
	on    chan struct{}
}

func (g *momentGate) Annotate(anns ...gpu.Annotation) {
	g.next.Annotate(anns...)
	g.anns += len(anns)
	for _, a := range anns {
		if a.Stage == "START" && (strings.HasPrefix(a.Name, "ProfilerStep#") && a.Name != "ProfilerStep#0" || strings.HasPrefix(a.Name, "Optimizer.step")) {
			g.alloc.Flush()
			g.at <- a.Name
			<-g.on
		}
	}
}

// liveMoment is what the page's endpoints answered with the trace stored up
// to event Seq (at LastUS) and Anns annotations.
type liveMoment struct {
	What    string
	Seq     int64
	LastUS  int64
	answers map[string][]byte
	steps   stepsJSON
}

type stepsJSON struct {
	Steps []struct {
		Name    string `json:"name"`
		StartUS int64  `json:"start_us"`
		EndUS   int64  `json:"end_us"`
		Open    bool   `json:"open"`
		Peak    struct {
			Seq       int64  `json:"seq"`
			TimeUS    int64  `json:"time_us"`
			Allocated uint64 `json:"allocated_bytes"`
		} `json:"peak"`
	} `json:"steps"`
	StepsTotal int `json:"steps_total"`
}

// TestLiveEndpointsAsTheJobRuns streams a long training job into a server
// and, at many moments of it, reads every endpoint the trace page reads:
// none fails while the job runs (steps begun and not ended are open, not
// an error), and what each says of the events stored by then is what it
// says of the finished trace at the same event: the usage and the bands
// of the window up to then, the layout, live set and memory_summary()
// right after the last event, the events themselves; each step's peak is
// the one a replay of the finished trace's events through a layout finds
// (the open ones' up to that event).
func TestLiveEndpointsAsTheJobRuns(t *testing.T) {
	testkit.EachBackend(t, testLiveEndpointsAsTheJobRuns)
}

func testLiveEndpointsAsTheJobRuns(t *testing.T) {
	f := newFixture(t, Options{Addr: "127.0.0.1:0"})
	c, err := live.Dial(f.srv.URL, "", live.ClientOptions{Meta: gpu.TraceMeta{Name: "long job", Source: gpu.SourceLive, DeviceName: "simulated", Capacity: 16 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	id := c.TraceID()
	clk := &tracer.Clock{}
	a, err := caching.New(sim.New(16<<30), caching.DefaultConfig(), caching.WithSink(c), caching.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	gate := &momentGate{next: c, alloc: a, at: make(chan string), on: make(chan struct{})}
	w := tracer.DefaultTrain()
	w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 3, 256, 4096, 2, 128, 24
	done := make(chan error, 1)
	go func() {
		done <- tracer.Run(context.Background(), w, &tracer.Env{Alloc: a, Clock: clk, Stacks: c, Annotations: gate})
		close(gate.at)
	}()
	var moments []*liveMoment
	for what := range gate.at {
		last := a.Seq() - 1
		waitAcked(t, c, last)
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if marks, err := f.db.Marks(id); err == nil && len(marks) == gate.anns {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("%d of %d annotations stored", len(marks), gate.anns)
			}
		}
		tr := mustTrace(t, f, id)
		if tr.LastSeq != last || tr.Status != gpu.StatusLive {
			t.Fatalf("at %s the trace is %s up to event %d; the job made %d", what, tr.Status, tr.LastSeq, last)
		}
		moments = append(moments, readMoment(t, f, id, what, tr))
		if len(moments) == 30 { // steps enough for a steady window, had it ended
			if t0, t1 := openingOf(t, f, id); t0 != tr.FirstUS || t1 != tr.LastUS {
				t.Errorf("at %s the page opens on [%d, %d]; while it streams, the whole trace [%d, %d]", what, t0, t1, tr.FirstUS, tr.LastUS)
			}
		}
		gate.on <- struct{}{}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := c.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	if len(moments) < 40 {
		t.Fatalf("%d moments", len(moments))
	}
	final := mustTrace(t, f, id)
	if _, t1 := openingOf(t, f, id); t1 >= final.LastUS {
		t.Errorf("once complete the page opens up to %d, the trace's end; on its steady steps it ends before", t1)
	}
	events, err := f.db.Events(id, 0, final.LastSeq+1)
	if err != nil {
		t.Fatal(err)
	}
	peaks := bruteAllocated(t, f, id, events)
	opens := 0
	for _, m := range moments {
		if next := events[m.Seq+1].TimeUS; next <= m.LastUS {
			t.Fatalf("%s: event %d comes at the same time as the last one stored; the windows below would differ", m.What, m.Seq+1)
		}
		again := readMoment(t, f, id, m.What, gpu.Trace{ID: id, FirstUS: final.FirstUS, LastSeq: m.Seq, LastUS: m.LastUS})
		for k, b := range m.answers {
			if !bytes.Equal(b, again.answers[k]) {
				t.Errorf("%s (event %d): %s answered\n%.300s\nthen, and of the finished trace\n%.300s", m.What, m.Seq, k, b, again.answers[k])
			}
		}
		for _, s := range m.steps.Steps {
			end := s.EndUS
			if s.Open {
				opens++
				if s.StartUS > m.LastUS && s.EndUS != s.StartUS || s.StartUS <= m.LastUS && s.EndUS != m.LastUS+1 {
					t.Errorf("%s: open %s runs [%d, %d]; the trace's last event is at %d", m.What, s.Name, s.StartUS, s.EndUS, m.LastUS)
				}
			}
			want := peaks.in(s.StartUS, end, m.Seq)
			if s.Peak.Seq != want.seq || s.Peak.Allocated != want.allocated || s.Peak.TimeUS != want.timeUS {
				t.Errorf("%s: %s (open %v) peaks %+v; a replay of the events up to %d finds %+v", m.What, s.Name, s.Open, s.Peak, m.Seq, want)
			}
		}
	}
	if opens < len(moments) {
		t.Errorf("%d open steps in %d moments: each moment is inside a step", opens, len(moments))
	}
}

// openingOf is the window the trace's page opens on (data-open-t0, -t1).
func openingOf(t *testing.T, f *fixture, id string) (t0, t1 int64) {
	t.Helper()
	page := string(f.get(t, "/traces/"+id, http.StatusOK))
	for _, a := range []struct {
		name string
		v    *int64
	}{{"data-open-t0", &t0}, {"data-open-t1", &t1}} {
		_, after, ok := strings.Cut(page, a.name+`="`)
		v, _, _ := strings.Cut(after, `"`)
		if _, err := fmt.Sscan(v, a.v); !ok || err != nil {
			t.Fatalf("the page has no %s: %q", a.name, v)
		}
	}
	return t0, t1
}

// readMoment reads every endpoint the trace page reads, as it reads them
// at event tr.LastSeq, failing on any error.
func readMoment(t *testing.T, f *fixture, id, what string, tr gpu.Trace) *liveMoment {
	t.Helper()
	m := &liveMoment{What: what, Seq: tr.LastSeq, LastUS: tr.LastUS, answers: map[string][]byte{}}
	base := "/api/traces/" + id
	win := fmt.Sprintf("t0=%d&t1=%d", tr.FirstUS, tr.LastUS)
	// Usage is answered in buckets of 2^k µs, the least k that fits the
	// window in n of them; the last one reaches past t1 to its end. A
	// window ending where a bucket ends, at or before the last event, is
	// one the events to come cannot change.
	const n = 300
	t1 := tr.LastUS
	for k := 0; k < 62; k++ {
		if (t1>>k)-(tr.FirstUS>>k)+1 <= n {
			t1 = (t1+1)>>k<<k - 1
			break
		}
	}
	done := fmt.Sprintf("t0=%d&t1=%d", tr.FirstUS, t1)
	get := func(path string) []byte {
		res, err := http.Get(f.srv.URL + base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%s (event %d): GET %s: %d %s", what, tr.LastSeq, path, res.StatusCode, b)
		}
		return b
	}
	// Read and compared with the finished trace's.
	for _, p := range []string{
		fmt.Sprintf("/usage?%s&n=%d&format=bin", done, n),
		fmt.Sprintf("/bands?%s&w=%d&h=200&format=bin", done, n),
		fmt.Sprintf("/layout?seq=%d", tr.LastSeq),
		fmt.Sprintf("/summary?seq=%d", tr.LastSeq),
		fmt.Sprintf("/events?from=%d&to=%d", max(0, tr.LastSeq-255), tr.LastSeq+1),
	} {
		m.answers[p] = get(p)
	}
	var l struct {
		Seq   int64           `json:"seq"`
		Bytes uint64          `json:"bytes"`
		Count int             `json:"count"`
		Rows  json.RawMessage `json:"rows"`
	}
	p := fmt.Sprintf("/live?seq=%d&group=frame&limit=200", tr.LastSeq)
	if err := json.Unmarshal(get(p), &l); err != nil {
		t.Fatal(err)
	}
	m.answers[p], _ = json.Marshal(l) // less the categories: they look at what comes later
	// Read: they must answer, and say what they say of this liveMoment.
	if err := json.Unmarshal(get("/steps?limit=2000"), &m.steps); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"", "/incidents", "/extras", "/search?q=train_step&limit=1000",
		"/usage?" + win + "&n=300&format=bin", "/bands?" + win + "&w=300&h=200&format=bin",
		"/bands/categories?" + win + "&w=300&h=200", "/categories?" + win + "&n=40"} {
		get(p)
	}
	return m
}

// allocatedAfter is allocated bytes after each event of a trace, from
// replaying its events through a gpu.Layout (not the store's figures).
type allocatedAfter struct {
	events  []gpu.Event
	bytes   []uint64
	start   uint64 // before the first event
	firstUS int64
}

type peakFound struct {
	seq, timeUS int64
	allocated   uint64
}

func bruteAllocated(t *testing.T, f *fixture, id string, events []gpu.Event) allocatedAfter {
	t.Helper()
	l, _, err := f.db.LayoutAtSeq(id, -1)
	if err != nil {
		t.Fatal(err)
	}
	out := allocatedAfter{events: events, start: l.Figures().Allocated, firstUS: mustTrace(t, f, id).FirstUS}
	for i, e := range events {
		if e.Seq != int64(i) {
			t.Fatalf("event %d has seq %d", i, e.Seq)
		}
		if err := l.Apply(e); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		out.bytes = append(out.bytes, l.Figures().Allocated)
	}
	return out
}

// in is the peak of allocated bytes over the events of [t0, t1] up to
// event last: the first event after which they stood highest, or the
// state entering the span when none goes higher.
func (a allocatedAfter) in(t0, t1, last int64) peakFound {
	p := peakFound{seq: -1, timeUS: a.firstUS, allocated: a.start}
	for i := int64(0); i <= last; i++ {
		e := a.events[i]
		if e.TimeUS < t0 {
			p = peakFound{i, e.TimeUS, a.bytes[i]}
			continue
		}
		if e.TimeUS > t1 {
			break
		}
		if a.bytes[i] > p.allocated {
			p = peakFound{i, e.TimeUS, a.bytes[i]}
		}
	}
	return p
}
