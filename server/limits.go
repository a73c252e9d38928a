package server

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
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

func (t *Timeouts) defaults() {
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
		t.Write = requestTimeout + 30*time.Second
	}
}

// deadlines sets the write deadline of every answer and holds request
// bodies to the minimum rate. It must see the connection's own
// ResponseWriter, so it comes first.
func (s *Server) deadlines(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		rc.SetWriteDeadline(time.Now().Add(s.opt.Timeouts.Write))
		if r.Body != nil && r.Body != http.NoBody {
			// A copy: the server's own request keeps its body, which it
			// reads to the end (or not) once the handler is done.
			r = r.WithContext(r.Context())
			r.Body = &rateReader{r: r.Body, rc: rc, grace: s.opt.Timeouts.BodyGrace, rate: s.opt.Timeouts.BodyRate}
		}
		next.ServeHTTP(w, r)
	})
}

// extendWrite gives an answer that took long to prepare (an upload) the
// full write timeout from now.
func (s *Server) extendWrite(w http.ResponseWriter) {
	http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.opt.Timeouts.Write))
}

// errSlowBody is the error of a body that came slower than the minimum.
type errSlowBody struct {
	read int64
	rate int64
}

func (e *errSlowBody) Error() string {
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
		return 0, &errSlowBody{b.read, b.rate}
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
		err = &errSlowBody{b.read, b.rate}
	}
	return n, err
}

func (b *rateReader) Close() error { return b.r.Close() }

// allowHosts answers, on a server listening on loopback, only requests
// whose Host is a loopback name or address or an --allowed-host: a page of
// another site whose name an attacker points at 127.0.0.1 (DNS rebinding)
// sends its own name as Host, and would otherwise read and write as this
// origin. Beyond loopback the token guards writes instead.
func (s *Server) allowHosts(next http.Handler) http.Handler {
	if !Loopback(s.opt.Addr) {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hostAllowed(r.Host, s.opt.AllowedHosts) {
			writeError(w, http.StatusMisdirectedRequest, "this server listens on loopback and answers only to localhost or a loopback address, not to host %q (start it with --allowed-host %s to allow that name)", r.Host, hostOnly(r.Host))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func hostOnly(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
}

// hostAllowed says whether host (a Host header) names loopback or one of
// allowed. Names under .localhost always resolve to loopback (RFC 6761),
// so no one else can hold them.
func hostAllowed(host string, allowed []string) bool {
	h := hostOnly(host)
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	if ip := net.ParseIP(h); ip != nil && ip.IsLoopback() {
		return true
	}
	for _, a := range allowed {
		if hostOnly(a) == h {
			return true
		}
	}
	return false
}
