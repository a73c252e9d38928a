package live

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"vramscope/gpu"
	"vramscope/store"
)

// Options tune a Hub; zero fields take the defaults.
type Options struct {
	// FlushEvery is how often ingest commits, acknowledges and tells
	// viewers (50 ms): the bulk of the latency from event to page.
	FlushEvery time.Duration
	// PingPeriod, PongWait and WriteWait are the keepalive: a ping every
	// PingPeriod (30 s); a peer silent for PongWait (60 s), or a write not
	// done within WriteWait (10 s), is dropped.
	PingPeriod, PongWait, WriteWait time.Duration
	// MaxMessage caps one ingest message (8 MiB): what parsing it may
	// cost follows from it.
	MaxMessage int64
	// MaxStreams caps the ingest connections open at once (64); more are
	// refused with 503 before the upgrade.
	MaxStreams int
	// EmptyExpiry: a live trace that never got an event is deleted once
	// it is this old and no connection writes it (10 min).
	EmptyExpiry time.Duration
	Logger      *slog.Logger
}

func (o *Options) defaults() {
	if o.FlushEvery <= 0 {
		o.FlushEvery = 50 * time.Millisecond
	}
	if o.PongWait <= 0 {
		o.PongWait = 60 * time.Second
	}
	if o.PingPeriod <= 0 {
		o.PingPeriod = o.PongWait / 2
	}
	if o.WriteWait <= 0 {
		o.WriteWait = 10 * time.Second
	}
	if o.MaxMessage <= 0 {
		o.MaxMessage = 8 << 20
	}
	if o.MaxStreams <= 0 {
		o.MaxStreams = 64
	}
	if o.EmptyExpiry <= 0 {
		o.EmptyExpiry = 10 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Hub joins ingest streams to the viewers of their traces: one topic per
// trace, written through the store's writer.
type Hub struct {
	db  *store.DB
	opt Options
	up  websocket.Upgrader

	mu      sync.Mutex
	topics  map[string]*topic
	conns   map[*websocket.Conn]struct{} // every open connection, for Close
	streams int                          // ingest connections open
	closed  bool
	wg      sync.WaitGroup
	stop    chan struct{} // ends the sweeper
	unwatch func()        // stops hearing of other servers' commits
}

// NewHub returns a hub storing into db. It deletes, every minute, the
// live traces that never got an event (Options.EmptyExpiry).
func NewHub(db *store.DB, opt Options) *Hub {
	opt.defaults()
	h := &Hub{db: db, opt: opt, topics: map[string]*topic{}, conns: map[*websocket.Conn]struct{}{}, stop: make(chan struct{}),
		up: websocket.Upgrader{ReadBufferSize: 64 << 10, WriteBufferSize: 4 << 10, WriteBufferPool: &sync.Pool{}, Error: refuseUpgrade}}
	h.wg.Add(1)
	go h.sweep(min(time.Minute, opt.EmptyExpiry/2))
	h.unwatch = db.Watch(h.elsewhere)
	return h
}

// elsewhere tells this server's viewers of a trace that another server
// (sharing a PostgreSQL database) stores its stream: the store hears of
// every commit there (LISTEN/NOTIFY), in order, within a fraction of a
// millisecond of it.
func (h *Hub) elsewhere(ch store.TraceChange) {
	h.mu.Lock()
	t := h.topics[ch.ID]
	h.mu.Unlock()
	if t == nil {
		return // no one here follows it
	}
	t.mu.Lock()
	here := t.ingest != nil
	t.mu.Unlock()
	if !here {
		t.publish(Tail{Status: ch.Status, Seq: ch.LastSeq, Events: ch.Events, FirstUS: ch.FirstUS, LastUS: ch.LastUS})
	}
}

// refuseUpgrade answers a request the websocket upgrade refuses: a JSON
// error saying why, as every other refusal of the server.
func refuseUpgrade(w http.ResponseWriter, r *http.Request, status int, reason error) {
	msg := fmt.Sprintf("%s: %v", r.URL.Path, reason)
	if status == http.StatusForbidden {
		msg = fmt.Sprintf("%s: origin %q is not this server's (%s): a page of another site may not open its websockets",
			r.URL.Path, r.Header.Get("Origin"), r.Host)
	}
	httpError(w, status, msg)
}

func httpError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// sweep deletes the expired empty live traces every period.
func (h *Hub) sweep(period time.Duration) {
	defer h.wg.Done()
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		if n, err := h.db.ExpireEmpty(gpu.SourceLive, time.Now().Add(-h.opt.EmptyExpiry)); err != nil {
			h.opt.Logger.Warn("live: expiring empty traces", "err", err)
		} else if n > 0 {
			h.opt.Logger.Info("live: expired traces that never got an event", "traces", n)
		}
		select {
		case <-h.stop:
			return
		case <-tick.C:
		}
	}
}

// Close drops every connection and waits for their handlers: ingest
// streams leave their traces incomplete, to be resumed.
func (h *Hub) Close() {
	h.mu.Lock()
	if !h.closed {
		close(h.stop)
		h.unwatch()
	}
	h.closed = true
	for c := range h.conns {
		c.Close()
	}
	h.mu.Unlock()
	h.wg.Wait()
}

// track registers a connection for Close; false when the hub is closed.
func (h *Hub) track(c *websocket.Conn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.conns[c] = struct{}{}
	h.wg.Add(1)
	return true
}

func (h *Hub) untrack(c *websocket.Conn) {
	h.mu.Lock()
	delete(h.conns, c)
	h.mu.Unlock()
	c.Close()
	h.wg.Done()
}

// topic is one trace's viewers and its current ingest stream.
type topic struct {
	id string

	mu      sync.Mutex
	viewers map[*viewer]struct{}
	state   Tail
	known   bool        // state holds something
	ingest  *ingestConn // the connection writing the trace, if any
	samples []sample    // recent (time, events), for the rate
	refs    int         // viewers and ingest connections holding the topic
}

type sample struct {
	at     time.Time
	events int64
}

// topic returns the topic of trace id, holding a reference to it.
func (h *Hub) topic(id string) *topic {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.topics[id]
	if t == nil {
		t = &topic{id: id, viewers: map[*viewer]struct{}{}}
		h.topics[id] = t
	}
	t.mu.Lock()
	t.refs++
	t.mu.Unlock()
	return t
}

// release drops a reference; the last one removes the topic.
func (h *Hub) release(t *topic) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t.mu.Lock()
	t.refs--
	empty := t.refs == 0
	t.mu.Unlock()
	if empty && h.topics[t.id] == t {
		delete(h.topics, t.id)
	}
}

// Viewers counts the open viewers of trace id.
func (h *Hub) Viewers(id string) int {
	h.mu.Lock()
	t := h.topics[id]
	h.mu.Unlock()
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.viewers)
}

// publish sets the trace's state and offers it to every viewer; it never
// waits for one.
func (t *topic) publish(s Tail) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.samples = append(t.samples, sample{now, s.Events})
	// The rate is over the last second or so of samples.
	i := 0
	for i < len(t.samples)-2 && now.Sub(t.samples[i+1].at) >= time.Second {
		i++
	}
	t.samples = append(t.samples[:0], t.samples[i:]...)
	if s.Status == gpu.StatusLive && len(t.samples) > 1 {
		if dt := now.Sub(t.samples[0].at).Seconds(); dt > 0 {
			s.Rate = float64(s.Events-t.samples[0].events) / dt
		}
	}
	if s.Status != gpu.StatusLive {
		t.samples = t.samples[:0]
	}
	s.Type, s.Trace = "tail", t.id
	t.state, t.known = s, true
	for v := range t.viewers {
		v.offer(s)
	}
}

// ServeIngest serves /ws/ingest: one job streaming a trace. Who may
// stream (tokens, hosts) is the router's to check before.
func (h *Hub) ServeIngest(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	full := h.streams >= h.opt.MaxStreams
	if !full {
		h.streams++
	}
	h.mu.Unlock()
	if full {
		w.Header().Set("Retry-After", "10")
		httpError(w, http.StatusServiceUnavailable, fmt.Sprintf("this server takes %d live streams at once, and has them", h.opt.MaxStreams))
		return
	}
	defer func() {
		h.mu.Lock()
		h.streams--
		h.mu.Unlock()
	}()
	c, err := h.up.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader has answered
	}
	if !h.track(c) {
		c.Close()
		return
	}
	defer h.untrack(c)
	h.ingest(c)
}

// ServeViewer serves /ws/traces/{id}: one page following trace tr.
func (h *Hub) ServeViewer(w http.ResponseWriter, r *http.Request, tr gpu.Trace) {
	c, err := h.up.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	if !h.track(c) {
		c.Close()
		return
	}
	defer h.untrack(c)
	h.view(c, tr)
}
