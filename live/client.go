package live

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"vramscope/gpu"
)

// ClientOptions tune Dial; zero fields take the defaults.
type ClientOptions struct {
	Meta gpu.TraceMeta
	// Run, when set, makes the trace a rank of a run on the server.
	Run *RunJoin
	// Snapshot, when set, is a PyTorch snapshot in JSON form whose
	// segments are the state before the first event.
	Snapshot json.RawMessage
	// MaxPending bounds the events kept until the server acknowledges
	// them (1<<18); Emit waits while that many are outstanding.
	MaxPending int
	// MaxBatch caps the events in one message (16384).
	MaxBatch int
	// RetryFor is how long reconnecting goes on before the client gives
	// up (2 minutes).
	RetryFor time.Duration
}

// Client streams events to a server's /ws/ingest. It is a gpu.Sink and
// interns stacks (Stack); it reconnects after a dropped connection and
// resends exactly what the server had not stored.
type Client struct {
	url   string
	hdr   http.Header
	opt   ClientOptions
	trace string

	mu      sync.Mutex
	cond    *sync.Cond
	pending []gpu.Event // emitted and not acknowledged, in seq order
	sent    int         // how many of pending went out on this connection
	stacks  []StackDef  // every definition, sent again after a reconnect
	unsent  int         // stacks[unsent:] still to go on this connection
	known   gpu.StackTable
	defined map[uint64]bool
	// Annotations are numbered in the order given; anns holds those from
	// annBase on that the server has not confirmed stored.
	anns    []gpu.Annotation
	annBase int64 // the number of anns[0]: the server has every one before
	annNext int64 // the number the next annotation gets
	annSent int64 // those before it went out on this connection
	ending  bool
	quit    bool // Abandon: no reconnecting
	status  gpu.TraceStatus
	done    chan struct{} // closed when the stream is over
	err     error         // why it is over, if not cleanly
	acked   int64
	conn    *websocket.Conn
}

// Dial opens a live trace on the server at rawURL (http(s):// or ws(s)://,
// with or without the /ws/ingest path). token, when not empty, is sent as a
// bearer token.
func Dial(rawURL, token string, opt ClientOptions) (*Client, error) {
	u, err := ingestURL(rawURL)
	if err != nil {
		return nil, err
	}
	if opt.MaxPending <= 0 {
		opt.MaxPending = 1 << 18
	}
	if opt.MaxBatch <= 0 {
		opt.MaxBatch = 16384
	}
	if opt.RetryFor <= 0 {
		opt.RetryFor = 2 * time.Minute
	}
	c := &Client{url: u, hdr: http.Header{}, opt: opt, defined: map[uint64]bool{},
		done: make(chan struct{}), acked: -1}
	if token != "" {
		c.hdr.Set("Authorization", "Bearer "+token)
	}
	c.cond = sync.NewCond(&c.mu)
	conn, err := c.connect()
	if err != nil {
		return nil, err
	}
	go c.run(conn)
	return c, nil
}

// ingestURL turns a server address into its ingest websocket URL.
func ingestURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("live: server URL: %w", err)
	}
	switch u.Scheme {
	case "http", "ws":
		u.Scheme = "ws"
	case "https", "wss":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("live: server URL %q: want http://, https://, ws:// or wss://", raw)
	}
	if !strings.HasSuffix(u.Path, "/ws/ingest") {
		u.Path = strings.TrimSuffix(u.Path, "/") + "/ws/ingest"
	}
	return u.String(), nil
}

// TraceID is the id of the trace on the server.
func (c *Client) TraceID() string { return c.trace }

// FatalError is a refusal by the server: reconnecting would not help.
type FatalError struct{ Msg string }

func (e *FatalError) Error() string { return "live: server refused the stream: " + e.Msg }

// connect dials, says hello and reads ready; the first connection creates
// the trace, later ones resume it.
func (c *Client) connect() (*websocket.Conn, error) {
	conn, resp, err := websocket.DefaultDialer.Dial(c.url, c.hdr)
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusUnauthorized {
			return nil, &FatalError{"401 Unauthorized: wrong or missing token"}
		}
		if resp != nil && resp.StatusCode >= 400 {
			// The server's JSON error says why, where it sent one.
			why := resp.Status
			var body struct{ Error string }
			if json.NewDecoder(io.LimitReader(resp.Body, 4<<10)).Decode(&body) == nil && body.Error != "" {
				why += ": " + body.Error
			}
			if resp.StatusCode < 500 {
				return nil, &FatalError{why}
			}
			// A server busy or restarting (503 with Retry-After, a
			// proxy's 502) may take the stream in a moment.
			return nil, fmt.Errorf("live: %s: %s", c.url, why)
		}
		return nil, fmt.Errorf("live: %s: %w", c.url, err)
	}
	hi := hello{Type: "hello", Trace: c.trace}
	if c.trace == "" {
		hi.Meta, hi.Snapshot, hi.Run = c.opt.Meta, c.opt.Snapshot, c.opt.Run
	}
	conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	var r reply
	if err := conn.WriteJSON(hi); err != nil {
		conn.Close()
		return nil, fmt.Errorf("live: hello: %w", err)
	}
	if err := conn.ReadJSON(&r); err != nil {
		conn.Close()
		return nil, fmt.Errorf("live: hello: %w", err)
	}
	if r.Type == "error" {
		conn.Close()
		return nil, &FatalError{r.Error}
	}
	if r.Type == "done" {
		// The trace was ended: by this stream's end, whose done was lost,
		// when it is ending.
		conn.Close()
		c.mu.Lock()
		ending := c.ending
		c.trim(r.Seq)
		c.mu.Unlock()
		if ending {
			return nil, errFinished
		}
		return nil, &FatalError{fmt.Sprintf("trace %s has ended", r.Trace)}
	}
	if r.Type != "ready" {
		conn.Close()
		return nil, fmt.Errorf("live: hello answered with %q", r.Type)
	}
	conn.SetReadDeadline(time.Time{})
	conn.SetWriteDeadline(time.Time{})
	c.mu.Lock()
	c.trace = r.Trace
	c.trim(r.Seq)
	c.trimAnnotations(r.Annotations)
	c.sent, c.unsent, c.annSent = 0, 0, c.annBase
	c.conn = conn
	c.mu.Unlock()
	return conn, nil
}

// trim drops pending events up to seq, which the server has stored.
func (c *Client) trim(seq int64) {
	if seq > c.acked {
		c.acked = seq
	}
	i := 0
	for i < len(c.pending) && c.pending[i].Seq <= seq {
		i++
	}
	if i > 0 {
		c.pending = append(c.pending[:0], c.pending[i:]...)
		c.sent = max(0, c.sent-i)
		c.cond.Broadcast()
	}
}

// trimAnnotations drops the annotations the server says it has: the first n.
func (c *Client) trimAnnotations(n int64) {
	if n <= c.annBase {
		return
	}
	drop := min(n-c.annBase, int64(len(c.anns)))
	c.anns = append(c.anns[:0], c.anns[drop:]...)
	c.annBase = n
	c.annSent = max(c.annSent, n)
}

// unsentAnnotations says whether annotations wait to go on this connection.
func (c *Client) unsentAnnotations() bool { return c.annSent < c.annBase+int64(len(c.anns)) }

// run keeps the stream going across reconnects until it ends.
func (c *Client) run(conn *websocket.Conn) {
	var err error
	for {
		var fatal *FatalError
		var finished bool
		finished, err = c.serve(conn)
		c.mu.Lock()
		quit := c.quit
		c.mu.Unlock()
		if finished || quit || errors.As(err, &fatal) {
			break
		}
		conn, err = c.reconnect()
		if errors.Is(err, errFinished) {
			err = nil
			break
		}
		if err != nil {
			break
		}
	}
	c.mu.Lock()
	c.err = err
	c.conn = nil
	c.cond.Broadcast()
	c.mu.Unlock()
	close(c.done)
}

func (c *Client) reconnect() (*websocket.Conn, error) {
	deadline := time.Now().Add(c.opt.RetryFor)
	wait := 50 * time.Millisecond
	for {
		conn, err := c.connect()
		var fatal *FatalError
		if err == nil || errors.As(err, &fatal) || errors.Is(err, errFinished) || time.Now().After(deadline) {
			return conn, err
		}
		time.Sleep(wait)
		wait = min(2*wait, 2*time.Second)
	}
}

// serve runs one connection: a reader of acks and this goroutine sending.
// finished is true once the server confirmed the end.
func (c *Client) serve(conn *websocket.Conn) (finished bool, err error) {
	readErr := make(chan error, 1)
	go func() { readErr <- c.readAcks(conn) }()
	var buf []byte
	for {
		c.mu.Lock()
		for c.sent == len(c.pending) && c.unsent == len(c.stacks) && !c.unsentAnnotations() && !c.ending && c.conn == conn {
			c.cond.Wait()
		}
		if c.conn != conn { // the reader saw the connection end
			c.mu.Unlock()
			return c.finish(readErr)
		}
		if c.unsentAnnotations() {
			// Annotations go as a text message of their own: the
			// binary form has no place for them.
			from := c.annSent - c.annBase
			to := min(int64(len(c.anns)), from+int64(c.opt.MaxBatch))
			msg := jsonBatch{Type: "events", Annotations: make([]jsonAnnotation, 0, to-from)}
			for _, a := range c.anns[from:to] {
				msg.Annotations = append(msg.Annotations, jsonAnnotation{TimeUS: a.TimeUS, Stage: a.Stage, Name: a.Name})
			}
			c.annSent = c.annBase + to
			c.mu.Unlock()
			conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
			if err := conn.WriteJSON(msg); err != nil {
				conn.Close()
				return c.finish(readErr)
			}
			continue
		}
		if c.sent == len(c.pending) && c.unsent == len(c.stacks) && c.ending {
			status := c.status
			c.mu.Unlock()
			conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if err := conn.WriteJSON(jsonBatch{Type: "end", Status: string(status)}); err != nil {
				conn.Close()
			}
			return c.finish(readErr)
		}
		end := min(len(c.pending), c.sent+c.opt.MaxBatch)
		buf = AppendBatch(buf[:0], c.stacks[c.unsent:], c.pending[c.sent:end])
		c.sent, c.unsent = end, len(c.stacks)
		c.mu.Unlock()
		conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if err := conn.WriteMessage(websocket.BinaryMessage, buf); err != nil {
			conn.Close()
			return c.finish(readErr)
		}
	}
}

// finish waits for the reader's verdict on a connection.
func (c *Client) finish(readErr chan error) (bool, error) {
	err := <-readErr
	if errors.Is(err, errFinished) {
		return true, nil
	}
	return false, err
}

var errFinished = errors.New("finished")

// readAcks reads the server's messages until the connection ends.
func (c *Client) readAcks(conn *websocket.Conn) error {
	defer func() {
		c.mu.Lock()
		if c.conn == conn {
			c.conn = nil
		}
		c.cond.Broadcast()
		c.mu.Unlock()
		conn.Close()
	}()
	for {
		var r reply
		if err := conn.ReadJSON(&r); err != nil {
			return err
		}
		switch r.Type {
		case "ack":
			c.mu.Lock()
			c.trim(r.Seq)
			c.trimAnnotations(r.Annotations)
			c.mu.Unlock()
		case "done":
			c.mu.Lock()
			c.trim(r.Seq)
			c.mu.Unlock()
			return errFinished
		case "error":
			return &FatalError{r.Error}
		}
	}
}

// Emit queues a copy of batch (gpu.Sink); it waits while MaxPending events
// are unacknowledged. After the stream has failed, events are dropped and
// Close reports why.
func (c *Client) Emit(batch []gpu.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.pending) >= c.opt.MaxPending && !c.over() {
		c.cond.Wait()
	}
	if c.over() || c.ending {
		return
	}
	c.pending = append(c.pending, batch...)
	c.cond.Broadcast()
}

func (c *Client) over() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Annotate queues annotations of the job (gpu.Annotator): its steps and
// phases, which the trace's regions are read from. Those an earlier
// connection of the trace stored already (a resend) are dropped.
func (c *Client) Annotate(anns ...gpu.Annotation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.over() || c.ending {
		return
	}
	for _, a := range anns {
		if c.annNext >= c.annBase {
			c.anns = append(c.anns, a)
		}
		c.annNext++
	}
	c.cond.Broadcast()
}

// Stack interns s and returns its id on this stream (gpu.Stacks).
func (c *Client) Stack(s gpu.Stack) gpu.StackID {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, fresh := c.known.Intern(s)
	if fresh {
		c.stacks = append(c.stacks, StackDef{uint64(id), append(gpu.Stack(nil), s...)})
		c.cond.Broadcast()
	}
	return id
}

// define records the frames of a stack id chosen elsewhere (see Tee).
func (c *Client) define(id gpu.StackID, s gpu.Stack) {
	if id == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.defined[uint64(id)] {
		return
	}
	c.defined[uint64(id)] = true
	c.stacks = append(c.stacks, StackDef{uint64(id), append(gpu.Stack(nil), s...)})
	c.cond.Broadcast()
}

// Close ends the stream with status (complete, failed or incomplete),
// waits until the server has stored every event, and says how it ended.
func (c *Client) Close(status gpu.TraceStatus) error {
	c.mu.Lock()
	c.ending, c.status = true, status
	c.cond.Broadcast()
	c.mu.Unlock()
	<-c.done
	return c.err
}

// Abandon drops the connection without ending the stream: the trace stays
// incomplete on the server, to be resumed.
func (c *Client) Abandon() {
	c.mu.Lock()
	conn := c.conn
	c.quit = true
	c.cond.Broadcast()
	c.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
	<-c.done
}

// Acked is the last sequence number the server has confirmed stored.
func (c *Client) Acked() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.acked
}

// Tee sends events (and annotations, when the local sink takes them) both
// to a local sink and to the server, under the local sink's stack ids.
type Tee struct {
	local gpu.Recorder
	c     *Client
}

// Tee returns a sink and stack interner writing to local and to c. Use it
// instead of c's own Stack, not beside it.
func (c *Client) Tee(local gpu.Recorder) *Tee { return &Tee{local, c} }

// Stack interns s locally and tells the server its frames.
func (t *Tee) Stack(s gpu.Stack) gpu.StackID {
	id := t.local.Stack(s)
	t.c.define(id, s)
	return id
}

// Emit writes batch locally and to the server.
func (t *Tee) Emit(batch []gpu.Event) {
	t.local.Emit(batch)
	t.c.Emit(batch)
}

// Annotate writes annotations locally, when the local sink takes them, and
// to the server.
func (t *Tee) Annotate(anns ...gpu.Annotation) {
	if a, ok := t.local.(gpu.Annotator); ok {
		a.Annotate(anns...)
	}
	t.c.Annotate(anns...)
}
