package server

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/live"
)

// A live stream without the server's token is refused with 401 and
// nothing is written; with it the stream is stored.
func TestLiveIngestNeedsTheToken(t *testing.T) {
	db := testkit.OpenDB(t)
	srv := httptest.NewServer(New(Options{DB: db, Token: "s3cret", Logger: quietLogger()}).Handler())
	t.Cleanup(srv.Close)
	for _, tok := range []string{"", "wrong"} {
		_, err := live.Dial(srv.URL, tok, live.ClientOptions{})
		var fe *live.FatalError
		if err == nil || !errors.As(err, &fe) || !strings.Contains(err.Error(), "401") {
			t.Fatalf("token %q: %v", tok, err)
		}
		// The raw handshake answer is 401.
		hdr := http.Header{}
		if tok != "" {
			hdr.Set("Authorization", "Bearer "+tok)
		}
		_, resp, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http")+"/ws/ingest", hdr)
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("token %q: handshake answered %v, %v", tok, resp, err)
		}
	}
	if trs, err := db.Traces(); err != nil || len(trs) != 0 {
		t.Fatalf("after refused streams the database holds %d traces (%v)", len(trs), err)
	}
	c, err := live.Dial(srv.URL, "s3cret", live.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Emit([]gpu.Event{
		{Seq: 0, TimeUS: 1, Action: gpu.ActionSegmentAlloc, Addr: 1 << 21, Size: 2 << 20},
		{Seq: 1, TimeUS: 2, Action: gpu.ActionAlloc, Addr: 1 << 21, Size: 512},
	})
	if err := c.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	if tr, err := db.Trace(c.TraceID()); err != nil || tr.Events != 2 || tr.Status != gpu.StatusComplete {
		t.Fatalf("stored %+v (%v)", tr, err)
	}
}
