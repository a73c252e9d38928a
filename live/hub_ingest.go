package live

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/ingest"
	"vramscope/pytorch"
	"vramscope/store"
)

// takeoverWait bounds how long a resuming stream waits for the stream it
// replaces (a half-open connection the server had not noticed) to let go.
const takeoverWait = 15 * time.Second

// claim makes s the trace's ingest stream, ending the one before it.
func (t *topic) claim(s *ingestConn) error {
	t.mu.Lock()
	old := t.ingest
	t.ingest = s
	t.mu.Unlock()
	if old == nil {
		return nil
	}
	old.c.Close()
	select {
	case <-old.done:
		return nil
	case <-time.After(takeoverWait):
		return fmt.Errorf("trace %s: the previous stream did not let go within %s", t.id, takeoverWait)
	}
}

func (t *topic) unclaim(s *ingestConn) {
	t.mu.Lock()
	if t.ingest == s {
		t.ingest = nil
	}
	t.mu.Unlock()
}

// ingestConn is one ingest connection writing a trace.
type ingestConn struct {
	h    *Hub
	c    *websocket.Conn
	w    *store.Writer
	t    *topic
	done chan struct{} // closed once the connection has closed its writer

	mu    sync.Mutex // guards state and anns, read by the flusher
	state Tail
	fresh bool  // no event stored yet: the first may have any seq from 0 up
	anns  int64 // annotations the trace has, stored or pending
	// off is how many events the server made to fill gaps (see Poll):
	// stored sequence numbers are the client's plus off.
	off int64

	device int // the trace's device, which its annotations are of

	// sampled: the client reads a sample of the job's entries and takes
	// requests for steps read whole, which asks carries to the flusher
	// (the connection's writer).
	sampled bool
	asks    chan int

	ids map[uint64]gpu.StackID // the client's stack ids to the writer's
	msg message                // the message being stored
}

// reject tells the client why and closes.
func reject(c *websocket.Conn, wait time.Duration, format string, args ...any) {
	c.SetWriteDeadline(time.Now().Add(wait))
	if c.WriteJSON(reply{Type: "error", Error: fmt.Sprintf(format, args...)}) == nil {
		c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.ClosePolicyViolation, ""))
	}
}

// ingest runs one ingest connection.
func (h *Hub) ingest(c *websocket.Conn) {
	c.SetReadLimit(h.opt.MaxMessage)
	c.SetReadDeadline(time.Now().Add(h.opt.PongWait))
	c.SetPongHandler(func(string) error { return c.SetReadDeadline(time.Now().Add(h.opt.PongWait)) })
	typ, msg, err := c.ReadMessage()
	if err != nil {
		return
	}
	var hi hello
	if typ != websocket.TextMessage {
		reject(c, h.opt.WriteWait, `the first message must be a text {"type":"hello",...}, not a binary message`)
		return
	}
	if err := json.Unmarshal(msg, &hi); err != nil {
		reject(c, h.opt.WriteWait, "hello: %v", err)
		return
	}
	if hi.Type != "hello" {
		reject(c, h.opt.WriteWait, `the first message must be {"type":"hello",...}, not type %q`, hi.Type)
		return
	}
	s := &ingestConn{h: h, c: c, done: make(chan struct{}), ids: map[uint64]gpu.StackID{}, sampled: hi.Sampled, asks: make(chan int, 1)}
	defer close(s.done)
	var tr gpu.Trace
	if tr, err = s.open(&hi); errors.Is(err, errEnded) {
		// A client whose done was lost learns that its end was stored.
		c.SetWriteDeadline(time.Now().Add(h.opt.WriteWait))
		if c.WriteJSON(reply{Type: "done", Trace: tr.ID, Seq: tr.LastSeq}) == nil {
			c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
		}
		return
	} else if store.Unavailable(err) {
		// The database is away: the client tries again, as after a drop.
		c.SetWriteDeadline(time.Now().Add(h.opt.WriteWait))
		c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseTryAgainLater, "the database is not reachable just now"))
		return
	} else if err != nil {
		reject(c, h.opt.WriteWait, "%v", err)
		return
	}
	defer h.release(s.t)
	defer s.t.unclaim(s)
	s.state = Tail{Status: gpu.StatusLive, Seq: tr.LastSeq, Events: tr.Events, FirstUS: tr.FirstUS, LastUS: tr.LastUS, Sampled: s.sampled}
	if d := tr.Dropped; d != nil {
		s.state.Gaps, s.state.Lost, s.state.Whole = d.GapCount, d.Lost, len(d.Whole)
	}
	s.fresh = tr.Events == 0
	s.device = tr.DeviceOrdinal
	if tr.Dropped != nil {
		s.off = tr.Dropped.Filled
	}
	if s.anns, err = s.storedAnnotations(hi.Trace); err != nil {
		s.finish(gpu.StatusIncomplete)
		reject(c, h.opt.WriteWait, "%v", err)
		return
	}
	s.t.publish(s.state)

	c.SetWriteDeadline(time.Now().Add(h.opt.WriteWait))
	if err := c.WriteJSON(reply{Type: "ready", Trace: tr.ID, Seq: s.clientSeq(tr.LastSeq), Annotations: s.anns, URL: "/traces/" + tr.ID}); err != nil {
		s.finish(gpu.StatusIncomplete)
		return
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go s.flusher(tr.LastSeq, s.anns, stop, stopped)
	end, status, perr := s.read()
	close(stop)
	<-stopped
	switch {
	case perr != nil:
		s.finish(gpu.StatusIncomplete)
		reject(c, h.opt.WriteWait, "%v", perr)
	case end:
		last := s.finish(status)
		c.SetWriteDeadline(time.Now().Add(h.opt.WriteWait))
		if err := s.w.Err(); err != nil {
			reject(c, h.opt.WriteWait, "%v", err)
		} else if c.WriteJSON(reply{Type: "done", Trace: tr.ID, Seq: s.clientSeq(last.Seq)}) == nil {
			c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
		}
	default:
		s.finish(gpu.StatusIncomplete) // dropped: resumable
	}
}

// errEnded is open's answer to a hello resuming a trace that was ended
// (complete or failed): only its stream's end message ends one so.
var errEnded = errors.New("the trace has ended")

// open creates or resumes the trace the hello names.
func (s *ingestConn) open(hi *hello) (gpu.Trace, error) {
	h := s.h
	if hi.Trace != "" {
		tr, err := h.db.Trace(hi.Trace)
		if err != nil {
			return tr, err
		}
		if tr.Source != gpu.SourceLive {
			return tr, fmt.Errorf("trace %s did not come from a live stream (its source is %q); only live traces can be resumed", tr.ID, tr.Source)
		}
		s.t = h.topic(tr.ID)
		if err := s.t.claim(s); err != nil {
			h.release(s.t)
			return tr, err
		}
		// Read again once the stream before has let go: its end is stored.
		if tr, err = h.db.Trace(tr.ID); err == nil && (tr.Status == gpu.StatusComplete || tr.Status == gpu.StatusFailed) {
			err = errEnded
		}
		if err != nil {
			s.t.unclaim(s)
			h.release(s.t)
			return tr, err
		}
		w, _, err := h.db.ResumeTrace(tr.ID)
		if err != nil {
			s.t.unclaim(s)
			h.release(s.t)
			return tr, err
		}
		s.w = w
		tr, err = h.db.Trace(tr.ID)
		return tr, err
	}
	meta := hi.Meta
	meta.Source = gpu.SourceLive
	meta.Upload = "" // the client's uploads are not this server's
	name, err := gpu.CheckName(meta.Name)
	if err != nil {
		return gpu.Trace{}, fmt.Errorf("hello: meta: name: %v", err)
	}
	if meta.Name = name; name == "" {
		meta.Name = "live"
	}
	if meta.DeviceName, err = gpu.CheckName(meta.DeviceName); err != nil {
		return gpu.Trace{}, fmt.Errorf("hello: meta: device_name: %v", err)
	}
	initial, stacks, err := initialLayout(hi.Snapshot, &meta)
	if err != nil {
		return gpu.Trace{}, err
	}
	if initial == nil {
		// The trace's layout follows the rules its settings give, as the
		// job's allocator did.
		cfg, err := caching.ParseConfig(meta.Settings)
		if err != nil {
			return gpu.Trace{}, fmt.Errorf("hello: meta: allocator_settings %q: %v", meta.Settings, err)
		}
		initial = gpu.NewLayout(cfg.Rules)
	}
	if hi.Run != nil {
		if meta.Upload, err = h.joinRun(hi.Run, &meta, initial); err != nil {
			return gpu.Trace{}, err
		}
	}
	w, err := h.db.CreateTrace(meta, initial)
	if err != nil {
		if meta.Upload != "" {
			h.db.DeleteUpload(meta.Upload)
		}
		return gpu.Trace{}, err
	}
	// A new writer numbers distinct stacks 1..n in order, as the
	// snapshot does, so the initial layout's stack ids stay right.
	for _, st := range stacks {
		w.Stack(st)
	}
	s.w = w
	s.t = h.topic(w.ID())
	s.t.claim(s)
	return h.db.Trace(w.ID())
}

// storedAnnotations counts the annotations of the trace a resuming hello
// names (none for a new trace): the client sends those after them.
func (s *ingestConn) storedAnnotations(resumed string) (int64, error) {
	if resumed == "" {
		return 0, nil
	}
	marks, err := s.h.db.Marks(resumed)
	return int64(len(marks)), err
}

// joinRun stores the upload of a live trace that is a rank of a run.
func (h *Hub) joinRun(run *RunJoin, meta *gpu.TraceMeta, initial *gpu.Layout) (string, error) {
	if err := run.check(); err != nil {
		return "", err
	}
	u, err := ingest.RecordedUpload(meta.Name, meta.Settings, initial.Rules)
	if err != nil {
		return "", err
	}
	u.Rank = run.Rank
	if u, err = h.db.JoinRun(run.Name, run.WorldSize, u); err != nil {
		return "", err
	}
	return u.ID, nil
}

// initialLayout reads the state before the first event from a PyTorch
// snapshot in JSON form (its segments; its device_traces are ignored).
func initialLayout(snap json.RawMessage, meta *gpu.TraceMeta) (*gpu.Layout, []gpu.Stack, error) {
	if len(bytes.TrimSpace(snap)) == 0 || string(bytes.TrimSpace(snap)) == "null" {
		return nil, nil, nil
	}
	traces, err := pytorch.DecodeWith(bytes.NewReader(snap), pytorch.Options{MaxBytes: int64(len(snap))})
	if err != nil {
		return nil, nil, fmt.Errorf("hello: snapshot: %w", err)
	}
	for _, t := range traces {
		if meta.Settings == "" {
			meta.Settings = t.Settings.Conf
		}
		if t.Device == meta.DeviceOrdinal {
			return t.Final, t.Stacks, nil
		}
	}
	if len(traces) > 0 {
		return gpu.NewLayout(traces[0].Settings.Rules), nil, nil
	}
	return nil, nil, nil
}

// read takes messages until the client ends the stream (end true, with
// its status), the connection drops (all zero) or the client breaks the
// protocol (perr).
func (s *ingestConn) read() (end bool, status gpu.TraceStatus, perr error) {
	c := s.c
	for {
		typ, msg, err := c.ReadMessage()
		if err != nil {
			return false, "", nil
		}
		c.SetReadDeadline(time.Now().Add(s.h.opt.PongWait))
		if err := s.msg.decode(typ, msg); err != nil {
			return false, "", err
		}
		if s.msg.end {
			return true, s.msg.status, nil
		}
		if s.msg.poll != nil {
			if err := s.readPoll(); err != nil {
				return false, "", err
			}
		}
		if err := s.store(); err != nil {
			return false, "", err
		}
		s.msg.release()
	}
}

// store checks and writes the events of s.msg.
func (s *ingestConn) store() error {
	for _, d := range s.msg.defs {
		s.ids[d.ID] = s.w.Stack(d.Frames)
	}
	s.mu.Lock()
	st := s.state
	fresh := s.fresh
	s.mu.Unlock()
	kept := s.msg.events[:0]
	for i, e := range s.msg.events {
		if e.Seq < 0 {
			return fmt.Errorf("event %d: sequence numbers start at 0 or above", e.Seq)
		}
		if !fresh && e.Seq <= st.Seq {
			continue // sent again after a reconnect: stored already
		}
		if !fresh && e.Seq != st.Seq+1 {
			return fmt.Errorf("event %d follows %d: sequence numbers must follow one another", e.Seq, st.Seq)
		}
		fresh = false
		st.Seq = e.Seq
		if e.Action == gpu.ActionNone {
			continue
		}
		if s.msg.frames != nil && len(s.msg.frames[i]) > 0 {
			e.Stack = s.w.Stack(s.msg.frames[i])
		} else if e.Stack != 0 {
			id, ok := s.ids[uint64(e.Stack)]
			if !ok {
				return fmt.Errorf("event %d: stack %d was not defined on this connection", e.Seq, e.Stack)
			}
			e.Stack = id
		}
		if st.Events == 0 {
			st.FirstUS = e.TimeUS
		}
		st.Events++
		st.LastUS = max(st.LastUS, e.TimeUS)
		kept = append(kept, e)
	}
	if len(kept) > 0 {
		s.w.Emit(kept)
		if err := s.w.Err(); err != nil {
			return err
		}
	}
	for i := range s.msg.anns {
		s.msg.anns[i].Device = s.device
	}
	s.w.Annotate(s.msg.anns...)
	s.mu.Lock()
	s.state, s.fresh = st, fresh
	s.anns += int64(len(s.msg.anns))
	s.mu.Unlock()
	return nil
}

// flusher commits every FlushEvery, then tells viewers and acknowledges;
// it is the connection's only writer until it stops.
func (s *ingestConn) flusher(flushed, flushedAnns int64, stop <-chan struct{}, stopped chan<- struct{}) {
	defer close(stopped)
	tick := time.NewTicker(s.h.opt.FlushEvery)
	defer tick.Stop()
	ping := time.NewTicker(s.h.opt.PingPeriod)
	defer ping.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ping.C:
			if s.c.WriteControl(websocket.PingMessage, nil, time.Now().Add(s.h.opt.WriteWait)) != nil {
				s.c.Close()
				return
			}
		case n := <-s.asks:
			s.c.SetWriteDeadline(time.Now().Add(s.h.opt.WriteWait))
			if s.c.WriteJSON(reply{Type: "complete", Steps: n}) != nil {
				s.c.Close()
				return
			}
		case <-tick.C:
			s.mu.Lock()
			st, anns, seq := s.state, s.anns, s.clientSeq(s.state.Seq)
			s.mu.Unlock()
			if st.Seq == flushed && anns == flushedAnns {
				continue
			}
			if err := s.w.Flush(); err != nil {
				s.c.Close() // the reader stops and reports the writer's error
				return
			}
			flushed, flushedAnns = st.Seq, anns
			s.t.publish(st)
			s.c.SetWriteDeadline(time.Now().Add(s.h.opt.WriteWait))
			if s.c.WriteJSON(reply{Type: "ack", Seq: seq, Annotations: anns}) != nil {
				s.c.Close()
				return
			}
		}
	}
}

// finish closes the writer with status and tells the viewers.
func (s *ingestConn) finish(status gpu.TraceStatus) Tail {
	err := s.w.Close(status)
	s.mu.Lock()
	st := s.state
	s.mu.Unlock()
	if tr, terr := s.h.db.Trace(s.w.ID()); terr == nil {
		st.Status, st.Seq, st.Events, st.FirstUS, st.LastUS = tr.Status, tr.LastSeq, tr.Events, tr.FirstUS, tr.LastUS
	} else if err != nil || errors.Is(terr, store.ErrNotFound) {
		st.Status = gpu.StatusFailed
	}
	s.t.publish(st)
	return st
}

// Errors of Hub.Complete.
var (
	ErrNotStreaming    = errors.New("no job streams this trace to this server now")
	ErrReadsEverything = errors.New("this trace's stream reads every entry of the job already: every step is complete")
)

// MaxCompleteSteps bounds how many steps one request asks for whole.
const MaxCompleteSteps = 10000

// Complete asks the job streaming trace id to this server to read every
// entry of its next steps (its client reads a sample of them): it answers
// later with a read whole (Poll.Whole), and the trace's viewers are told
// of the request meanwhile (Tail.Asked).
func (h *Hub) Complete(id string, steps int) error {
	if steps < 1 || steps > MaxCompleteSteps {
		return fmt.Errorf("steps %d: ask for 1 to %d", steps, MaxCompleteSteps)
	}
	h.mu.Lock()
	t := h.topics[id]
	h.mu.Unlock()
	if t == nil {
		return ErrNotStreaming
	}
	t.mu.Lock()
	s := t.ingest
	t.mu.Unlock()
	if s == nil {
		return ErrNotStreaming
	}
	if !s.sampled {
		return ErrReadsEverything
	}
	s.mu.Lock()
	s.state.Asked = max(s.state.Asked, steps)
	st := s.state
	s.mu.Unlock()
	for n := steps; ; {
		select {
		case s.asks <- n:
			s.t.publish(st)
			return nil
		default:
		}
		select {
		case old := <-s.asks: // not sent yet: one request, the larger
			n = max(n, old)
		default:
		}
	}
}
