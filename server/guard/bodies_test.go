package guard

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// lateEOF is a request body whose end reaches its reader a moment after
// the server's own body has ended: the window in which a reader ahead
// has read the whole body but not yet finished.
type lateEOF struct {
	r     io.Reader
	ended bool
}

func (l *lateEOF) Read(p []byte) (int, error) {
	if !l.ended {
		n, err := l.r.Read(p)
		if err != io.EOF {
			return n, err
		}
		l.ended = true
		if n > 0 {
			return n, nil
		}
	}
	time.Sleep(50 * time.Millisecond)
	return 0, io.EOF
}

// Stopping a reader ahead that has read the whole body but not yet
// finished does not cut the connection's read short: the server reads
// on after a body's end, and a read deadline then would end the context
// of every later request on the connection (they would look abandoned).
func TestStopAfterTheBodyKeepsTheConnection(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.Context().Err(); err != nil {
			http.Error(w, "the request's context ended before its handler ran: "+err.Error(), http.StatusTeapot)
			return
		}
		a := ReadAhead(r.Context(), &lateEOF{r: r.Body})
		defer a.Stop(http.NewResponseController(w))
		buf := make([]byte, r.ContentLength) // all of it, not waiting for the end
		if _, err := io.ReadFull(a, buf); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		time.Sleep(5 * time.Millisecond) // the server reaches the body's end
	}))
	defer srv.Close()
	client := srv.Client()
	for i := range 3 { // on one kept-alive connection
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL, bytes.NewReader(make([]byte, 1000)))
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, res.StatusCode, b)
		}
	}
}
