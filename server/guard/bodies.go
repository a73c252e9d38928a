package guard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// Timeouts bound how long a client may hold a connection without doing
// its part; zero fields take the defaults below.
type Timeouts struct {
	// BodyGrace and BodyRate: a request body must arrive at BodyRate
	// bytes per second or faster, counting only the time the server
	// waits for it, after a first BodyGrace (10 s, 16 KiB/s).
	BodyGrace time.Duration
	BodyRate  int64
	// Idle closes a kept-alive connection with no request (120 s).
	Idle time.Duration
	// Write bounds writing an answer (60 s), from the request's start or,
	// for uploads, from when the answer is ready. Websockets keep their
	// own deadlines.
	Write time.Duration
}

// Defaults fills the zero fields; write is the default write timeout.
func (t *Timeouts) Defaults(write time.Duration) {
	if t.BodyGrace <= 0 {
		t.BodyGrace = 10 * time.Second
	}
	if t.BodyRate <= 0 {
		t.BodyRate = 16 << 10
	}
	if t.Idle <= 0 {
		t.Idle = 120 * time.Second
	}
	if t.Write <= 0 {
		t.Write = write
	}
}

// Deadlines sets the write deadline of every answer and holds request
// bodies to the minimum rate. It must see the connection's own
// ResponseWriter, so it comes first.
func Deadlines(t Timeouts) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rc := http.NewResponseController(w)
			rc.SetWriteDeadline(time.Now().Add(t.Write))
			if r.Body != nil && r.Body != http.NoBody {
				// A copy: the server's own request keeps its body, which it
				// reads to the end (or not) once the handler is done.
				r = r.WithContext(r.Context())
				r.Body = &rateReader{r: r.Body, rc: rc, grace: t.BodyGrace, rate: t.BodyRate}
			}
			next.ServeHTTP(w, r)
		})
	}
}

// ExtendWrite gives an answer that took long to prepare (an upload) the
// full write timeout from now.
func ExtendWrite(w http.ResponseWriter, d time.Duration) {
	http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d))
}

// SlowBodyError is the error of a body that came slower than the minimum.
type SlowBodyError struct {
	read int64
	rate int64
}

func (e *SlowBodyError) Error() string {
	return fmt.Sprintf("the request body came too slowly: %d bytes, under the %d bytes per second this server needs", e.read, e.rate)
}

// rateReader is a request body that must come at rate bytes per second
// or faster after a grace period, counting only the time spent waiting
// for it: a slow decoder does not count against the client.
type rateReader struct {
	r      io.ReadCloser
	rc     *http.ResponseController
	grace  time.Duration
	rate   int64
	read   int64
	waited time.Duration
	done   bool
}

func (b *rateReader) Read(p []byte) (int, error) {
	if b.done {
		return b.r.Read(p)
	}
	allowed := b.grace + time.Duration(float64(b.read)/float64(b.rate)*float64(time.Second)) - b.waited
	if allowed <= 0 {
		return 0, &SlowBodyError{b.read, b.rate}
	}
	b.rc.SetReadDeadline(time.Now().Add(allowed))
	start := time.Now()
	n, err := b.r.Read(p)
	b.waited += time.Since(start)
	b.read += int64(n)
	switch {
	case err == io.EOF:
		// Past the body, the server reads the connection to notice a
		// client that goes away: that read must have no deadline.
		b.done = true
		b.rc.SetReadDeadline(time.Time{})
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The deadline stays: the server then drops the connection
		// rather than wait for the rest of the body.
		b.done = true
		err = &SlowBodyError{b.read, b.rate}
	}
	return n, err
}

func (b *rateReader) Close() error { return b.r.Close() }

// AheadReader reads a request body ahead of its consumer, a few chunks at
// most. The server learns that a client went away only once it has read
// the whole body, and a small gzip can take long to decode: reading ahead
// gets to the end of such a body at once.
type AheadReader struct {
	chunks chan []byte
	cur    []byte
	err    error // set before chunks is closed
	cancel context.CancelFunc
	done   chan struct{}
}

// aheadChunks and aheadChunk bound what is read ahead (4 MiB).
const aheadChunks, aheadChunk = 64, 64 << 10

// stopGrace is how long Stop waits for the reading ahead to end by itself.
const stopGrace = time.Second

func ReadAhead(ctx context.Context, r io.Reader) *AheadReader {
	ctx, cancel := context.WithCancel(ctx)
	a := &AheadReader{chunks: make(chan []byte, aheadChunks), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		defer close(a.chunks)
		for {
			buf := make([]byte, aheadChunk)
			n, err := r.Read(buf)
			if n > 0 {
				select {
				case a.chunks <- buf[:n]:
				case <-ctx.Done():
					a.err = context.Cause(ctx)
					return
				}
			}
			if err != nil {
				a.err = err
				return
			}
		}
	}()
	return a
}

func (a *AheadReader) Read(p []byte) (int, error) {
	for len(a.cur) == 0 {
		b, ok := <-a.chunks
		if !ok {
			return 0, a.err
		}
		a.cur = b
	}
	n := copy(p, a.cur)
	a.cur = a.cur[n:]
	return n, nil
}

// Stop ends the reading ahead and waits for it, so the body is not read
// once the handler returns: a read still waiting on the client is cut
// short through the connection's read deadline, which stays past, so the
// server drops the connection rather than read the rest of the body.
//
// The deadline is a last resort, after stopGrace: once a body has ended
// the server reads the connection itself, and a deadline then would end
// the context of every later request on the connection (each would look
// abandoned by its client). A reader that is not waiting on the client
// (it has read the end, or has a chunk nobody takes) ends at once.
func (a *AheadReader) Stop(rc *http.ResponseController) {
	a.cancel()
	select {
	case <-a.done:
		return
	case <-time.After(stopGrace):
	}
	rc.SetReadDeadline(time.Now())
	for range a.chunks {
	}
	<-a.done
}
