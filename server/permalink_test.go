package server

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"vramscope/internal/testkit"
	"vramscope/store"
	"vramscope/tracer"
)

// noRedirect is a client that shows redirects instead of following them.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func share(t *testing.T, base, contentType, body string) (int, map[string]string) {
	t.Helper()
	res, err := http.Post(base+"/api/permalinks", contentType, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var out map[string]string
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("POST /api/permalinks %s: not JSON: %s", body, b)
	}
	return res.StatusCode, out
}

func shareJSON(trace, url string) string {
	b, _ := json.Marshal(map[string]string{"trace": trace, "url": url})
	return string(b)
}

// open follows /p/TOKEN one step and returns the status and Location.
func open(t *testing.T, base, path string) (int, string, string) {
	t.Helper()
	res, err := noRedirect.Get(base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header.Get("Location"), string(b)
}

func TestPermalinks(t *testing.T) { testkit.EachBackend(t, testPermalinks) }

func testPermalinks(t *testing.T) {
	f := newFixture(t, Options{})
	view := "/traces/" + f.id + "?t0=1000100&t1=1000900&c=1000500&sel=42&panel=selection"
	code, out := share(t, f.srv.URL, "application/json", shareJSON(f.id, view))
	if code != http.StatusCreated || len(out["token"]) < 26 || out["url"] != "/p/"+out["token"] || out["view"] != view {
		t.Fatalf("create: %d %v", code, out)
	}
	code, loc, _ := open(t, f.srv.URL, out["url"])
	if code != http.StatusSeeOther || loc != view {
		t.Fatalf("open: %d to %q, want %q", code, loc, view)
	}
	// Each share is its own link.
	if _, again := share(t, f.srv.URL, "application/json", shareJSON(f.id, view)); again["token"] == out["token"] {
		t.Fatalf("two shares got one token %s", again["token"])
	}

	// An incident page can be shared too.
	inc := "/traces/" + f.id + "/incidents/1?t0=5&t1=9"
	if code, out := share(t, f.srv.URL, "application/json; charset=utf-8", shareJSON(f.id, inc)); code != http.StatusCreated || out["view"] != inc {
		t.Fatalf("incident view: %d %v", code, out)
	}

	// Only local pages of the named trace.
	for _, bad := range []struct{ body, want string }{
		{shareJSON(f.id, "https://evil.example/traces/"+f.id), "not a local path"},
		{shareJSON(f.id, "//evil.example/traces/"+f.id), "not a local path"},
		{shareJSON(f.id, "/traces/"+f.id+"/../../api/traces"), "not a trace view"},
		{shareJSON(f.id, "/api/traces/"+f.id), "not a trace view"},
		{shareJSON(f.id, "/traces/someotherid?t0=1"), "not of " + f.id},
		{shareJSON(f.id, "javascript:alert(1)"), "not a local path"},
		{shareJSON(f.id, "/traces/"+f.id+"?t0=%zz"), "query"},
		{shareJSON(f.id, ""), "required"},
		{`{"trace": "` + f.id + `", "url": "/traces/` + f.id + `", "extra": 1}`, "unknown field"},
		{`not json`, "body"},
	} {
		code, out := share(t, f.srv.URL, "application/json", bad.body)
		if code != http.StatusBadRequest || !strings.Contains(out["error"], bad.want) {
			t.Errorf("%s: %d %q, want 400 with %q", bad.body, code, out["error"], bad.want)
		}
	}
	if code, out := share(t, f.srv.URL, "application/json", shareJSON("nosuchtrace", "/traces/nosuchtrace")); code != http.StatusNotFound {
		t.Errorf("unknown trace: %d %v", code, out)
	}
	// A form from another site cannot post one (it cannot send JSON).
	if code, _ := share(t, f.srv.URL, "text/plain", shareJSON(f.id, view)); code != http.StatusUnsupportedMediaType {
		t.Errorf("text/plain: %d", code)
	}

	// An unknown token is a page, not JSON.
	code, _, body := open(t, f.srv.URL, "/p/AAAAAAAAAAAAAAAAAAAAAAAAAA")
	if code != http.StatusNotFound || !strings.Contains(strings.ToLower(body), "<!doctype html>") || !strings.Contains(body, "unknown") {
		t.Fatalf("unknown token: %d %s", code, body)
	}
	getPage(t, f.srv.URL+"/p/AAAAAAAAAAAAAAAAAAAAAAAAAA", http.StatusNotFound)

	// Links go with their trace.
	_, gone := share(t, f.srv.URL, "application/json", shareJSON(f.id, view))
	if err := f.db.DeleteTrace(f.id); err != nil {
		t.Fatal(err)
	}
	if code, _, body := open(t, f.srv.URL, gone["url"]); code != http.StatusNotFound || !strings.Contains(body, "trace was deleted") {
		t.Fatalf("deleted trace: %d %s", code, body)
	}
}

// The links `vramscope trace` prints open the incident page.
func TestIncidentPermalinkOfTraceCommand(t *testing.T) {
	testkit.EachBackend(t, testIncidentPermalinkOfTraceCommand)
}

func testIncidentPermalinkOfTraceCommand(t *testing.T) {
	db := testkit.OpenDB(t)
	id := testkit.Record(t, db, "frag", tracer.DefaultFrag(), fragCapacity, "")
	srv := serve(t, db)
	// The state cmd/vramscope's incidentPermalink stores.
	token, err := db.CreatePermalink(id, json.RawMessage(`{"url": "/traces/`+id+`/incidents/1", "trace": "`+id+`", "incident": 1}`))
	if err != nil {
		t.Fatal(err)
	}
	code, loc, _ := open(t, srv.URL, "/p/"+token)
	if code != http.StatusSeeOther || loc != "/traces/"+id+"/incidents/1" {
		t.Fatalf("open: %d to %q", code, loc)
	}
	if p := string(getPage(t, srv.URL+"/p/"+token, http.StatusOK)); !strings.Contains(p, `id="incident"`) {
		t.Fatalf("the link does not land on the incident page: %s", p)
	}
}

func TestPermalinkSurvivesRestart(t *testing.T) { testkit.EachBackend(t, testPermalinkSurvivesRestart) }

func testPermalinkSurvivesRestart(t *testing.T) {
	path := testkit.DBPath(t)
	db, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	id := makeTrace(t, db, "kept", workload{Steps: 1, Layers: 2, Seed: 1})
	srv := httptest.NewServer(New(Options{DB: db, Logger: quietLogger()}).Handler())
	view := "/traces/" + id + "?t0=1&t1=2&c=1&panel=cursor"
	code, out := share(t, srv.URL, "application/json", shareJSON(id, view))
	if code != http.StatusCreated {
		t.Fatalf("create: %d %v", code, out)
	}
	srv.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db, err = store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	srv = httptest.NewServer(New(Options{DB: db, Logger: quietLogger()}).Handler())
	defer srv.Close()
	if code, loc, body := open(t, srv.URL, out["url"]); code != http.StatusSeeOther || loc != view {
		t.Fatalf("after a restart: %d to %q: %s", code, loc, body)
	}
	if _, err := db.Permalink(out["token"]); err != nil {
		t.Fatal(err)
	}
}
