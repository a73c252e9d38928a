package server

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/live"
)

// POST /api/traces/{id}/complete asks a job to read its next steps whole
// (the watcher's side is tested in live/python_whole_test.go); what it
// cannot do it refuses with why.
func TestCompleteRefusals(t *testing.T) {
	f := newFixture(t, Options{Addr: "127.0.0.1:0"})
	c, err := live.Dial(f.srv.URL, "", live.ClientOptions{Meta: gpu.TraceMeta{Name: "every event", Source: gpu.SourceLive}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(gpu.StatusComplete)
	for _, tc := range []struct {
		path   string
		status int
		want   string
	}{
		{"/api/traces/" + f.id + "/complete", http.StatusConflict, "no job streams this trace to this server now (its stream has ended)"},
		{"/api/traces/" + c.TraceID() + "/complete?steps=5", http.StatusConflict, "this trace's stream reads every entry of the job already: every step is complete"},
		{"/api/traces/" + c.TraceID() + "/complete?steps=0", http.StatusBadRequest, "steps"},
		{"/api/traces/" + c.TraceID() + "/complete?steps=10001", http.StatusBadRequest, "steps"},
		{"/api/traces/nope/complete", http.StatusNotFound, "nope"},
	} {
		res, err := http.Post(f.srv.URL+tc.path, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != tc.status || !strings.Contains(string(b), tc.want) {
			t.Errorf("POST %s: %d %s; want %d %q", tc.path, res.StatusCode, b, tc.status, tc.want)
		}
	}
	if res, err := http.Get(f.srv.URL + "/api/traces/" + f.id + "/complete"); err != nil || res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET complete: %v %v", res.Status, err)
	}
}
