package live

import (
	"encoding/json"
	"sync"
	"time"
	"vramscope/gpu"

	"github.com/gorilla/websocket"
)

// maxCredit caps how many messages a viewer may ask for ahead.
const maxCredit = 4

// viewer is one open page. Its queue is a single slot: tail messages are
// whole states, so a newer one replaces an unsent older one.
type viewer struct {
	conn *websocket.Conn
	wake chan struct{} // cap 1: something to send, or credit arrived

	mu     sync.Mutex
	slot   Tail
	full   bool
	folded int // updates replaced in the slot since the last send
	credit int
}

func newViewer(c *websocket.Conn) *viewer {
	return &viewer{conn: c, wake: make(chan struct{}, 1), credit: 1}
}

func (v *viewer) signal() {
	select {
	case v.wake <- struct{}{}:
	default:
	}
}

// offer puts s in the slot without waiting.
func (v *viewer) offer(s Tail) {
	v.mu.Lock()
	if v.full {
		v.folded++
	}
	v.slot, v.full = s, true
	ready := v.credit > 0
	v.mu.Unlock()
	if ready {
		v.signal()
	}
}

func (v *viewer) more() {
	v.mu.Lock()
	v.credit = min(v.credit+1, maxCredit)
	ready := v.full
	v.mu.Unlock()
	if ready {
		v.signal()
	}
}

// take returns the message to send, if there is one and credit for it.
func (v *viewer) take() (Tail, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.full || v.credit == 0 {
		return Tail{}, false
	}
	s := v.slot
	s.Coalesced = v.folded
	v.full, v.folded = false, 0
	v.credit--
	return s, true
}

// view runs one viewer connection until it closes or stops answering.
func (h *Hub) view(c *websocket.Conn, tr gpu.Trace) {
	v := newViewer(c)
	t := h.topic(tr.ID)
	defer h.release(t)
	t.mu.Lock()
	t.viewers[v] = struct{}{}
	s := t.state
	if !t.known {
		s = Tail{Type: "tail", Trace: tr.ID, Status: tr.Status, Seq: tr.LastSeq, Events: tr.Events, FirstUS: tr.FirstUS, LastUS: tr.LastUS}
		if d := tr.Dropped; d != nil {
			s.Gaps, s.Lost = d.GapCount, d.Lost
		}
	}
	v.offer(s)
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.viewers, v)
		t.mu.Unlock()
	}()

	done := make(chan struct{})
	go h.viewWriter(v, done)
	defer close(done)

	c.SetReadLimit(4 << 10)
	c.SetReadDeadline(time.Now().Add(h.opt.PongWait))
	c.SetPongHandler(func(string) error { return c.SetReadDeadline(time.Now().Add(h.opt.PongWait)) })
	for {
		_, msg, err := c.ReadMessage()
		if err != nil {
			return
		}
		c.SetReadDeadline(time.Now().Add(h.opt.PongWait))
		var m struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(msg, &m) == nil && m.Type == "more" {
			v.more()
		}
	}
}

// viewWriter is the connection's one writer: messages as credit allows,
// and pings. A write that misses its deadline closes the connection, which
// ends the reader too.
func (h *Hub) viewWriter(v *viewer, done chan struct{}) {
	ping := time.NewTicker(h.opt.PingPeriod)
	defer ping.Stop()
	var buf []byte
	for {
		select {
		case <-done:
			return
		case <-ping.C:
			if v.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(h.opt.WriteWait)) != nil {
				v.conn.Close()
				return
			}
		case <-v.wake:
			s, ok := v.take()
			if !ok {
				continue
			}
			s.SentMS = time.Now().UnixMilli()
			buf, _ = appendJSON(buf[:0], s)
			v.conn.SetWriteDeadline(time.Now().Add(h.opt.WriteWait))
			if v.conn.WriteMessage(websocket.TextMessage, buf) != nil {
				v.conn.Close()
				return
			}
		}
	}
}

func appendJSON(buf []byte, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	return append(buf, b...), err
}
