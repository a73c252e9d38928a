package server

import (
	"encoding/json"
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
func TestLiveIngestNeedsTheToken(t *testing.T) { testkit.EachBackend(t, testLiveIngestNeedsTheToken) }

func testLiveIngestNeedsTheToken(t *testing.T) {
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

// What the websocket upgrade refuses is a JSON error saying why: a plain
// GET, a page of another site (its origin), on ingest and viewers alike.
func TestLiveUpgradeRefusalsSayWhy(t *testing.T) {
	testkit.EachBackend(t, testLiveUpgradeRefusalsSayWhy)
}

func testLiveUpgradeRefusalsSayWhy(t *testing.T) {
	db := testkit.OpenDB(t)
	srv := httptest.NewServer(New(Options{DB: db, Addr: "127.0.0.1:0", Logger: quietLogger()}).Handler())
	t.Cleanup(srv.Close)
	c, err := live.Dial(srv.URL, "", live.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(gpu.StatusComplete)
	ws := "ws" + strings.TrimPrefix(srv.URL, "http")
	for _, path := range []string{"/ws/ingest", "/ws/traces/" + c.TraceID()} {
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Error string }
		json.NewDecoder(res.Body).Decode(&body)
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest || res.Header.Get("Content-Type") != "application/json" ||
			!strings.Contains(body.Error, path+": websocket: the client is not using the websocket protocol") {
			t.Errorf("GET %s: %d %q %q", path, res.StatusCode, res.Header.Get("Content-Type"), body.Error)
		}

		_, res, err = websocket.DefaultDialer.Dial(ws+path, http.Header{"Origin": {"http://evil.example"}})
		if err == nil || res == nil {
			t.Fatalf("%s from another origin: %v", path, err)
		}
		body.Error = ""
		json.NewDecoder(res.Body).Decode(&body)
		want := path + `: origin "http://evil.example" is not this server's (` + strings.TrimPrefix(srv.URL, "http://") + `): a page of another site may not open its websockets`
		if res.StatusCode != http.StatusForbidden || body.Error != want {
			t.Errorf("%s from another origin: %d %q", path, res.StatusCode, body.Error)
		}
	}
}
