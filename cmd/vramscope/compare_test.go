package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"vramscope/incident"

	"vramscope/internal/testkit"
	"vramscope/server"
	"vramscope/store"
	"vramscope/tracer"
)

// compareDB records two small training runs that differ in activation
// checkpointing into a database file.
func compareDB(t *testing.T) (path, with, without string) {
	path = filepath.Join(t.TempDir(), "cmp.db")
	db, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, cp := range []bool{true, false} {
		w := tracer.DefaultTrain()
		w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 4, 512, 2048, 4, 1024, 3
		w.Checkpointing = cp
		id := testkit.Record(t, db, "train", w, 80<<30, "")
		if cp {
			with = id
		} else {
			without = id
		}
	}
	return path, with, without
}

// compare --json prints what GET /api/compare answers, field for field;
// the table's first row at A's peak is the attention probabilities that
// checkpointing drops.
func TestCompareJSONIsTheAPIs(t *testing.T) {
	path, with, without := compareDB(t)
	// The what-if tables first: once done they are the database's, and
	// the CLI and the API answer from them alike.
	db, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	jobs := incident.NewJobs(db, 2, make(chan struct{}, 1))
	for _, id := range []string{with, without} {
		tr, err := db.Trace(id)
		if err != nil {
			t.Fatal(err)
		}
		j := jobs.WhatIf(id, tr.LastSeq)
		if <-j.Done; j.Err != nil {
			t.Fatal(j.Err)
		}
	}
	db.Close()
	code, out, errs := runCmd("compare", "--db", path, "--json", "--align", "step", with, without)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var cli map[string]any
	if err := json.Unmarshal([]byte(out), &cli); err != nil {
		t.Fatal(err)
	}

	db, err = store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	srv := httptest.NewServer(server.New(server.Options{DB: db, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).Handler())
	defer srv.Close()
	res, err := http.Get(srv.URL + "/api/compare/" + with + "/" + without + "?align=step")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var api map[string]any
	if err := json.NewDecoder(res.Body).Decode(&api); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("API: %d %v", res.StatusCode, err)
	}
	if !reflect.DeepEqual(cli, api) {
		for k := range api {
			if !reflect.DeepEqual(cli[k], api[k]) {
				t.Errorf("%s differs:\nCLI %v\nAPI %v", k, cli[k], api[k])
			}
		}
	}
	for _, s := range []string{"a", "b"} {
		if n := api[s].(map[string]any)["needed"].(map[string]any); n["status"] != "done" {
			t.Errorf("%s: memory needed %v", s, n)
		}
	}

	code, out, errs = runCmd("compare", "--db", path, "--align", "step", "--rows", "3", "--trace", with, "--", without)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	_, peakA, _ := strings.Cut(out, "A's peak")
	lines := strings.Split(peakA, "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[1], "FIRST USER FRAME") || !strings.HasPrefix(lines[2], "model.py:34 forward") {
		t.Errorf("table at A's peak:\n%s", peakA)
	}
	for _, want := range []string{"aligned by step", "Peak allocated", "Memory needed", "allocator settings: identical", "Largest divergence"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}

func TestCompareErrors(t *testing.T) {
	path, with, _ := compareDB(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{with}, "want two traces"},
		{[]string{with, "nope"}, `no trace "nope"`},
		{[]string{with, with, "--align", "rank"}, "--align: alignment \"rank\" is none of time, step, event"},
		{[]string{with, with, "--group", "file"}, "--group"},
		{[]string{with, with, "--rows", "0"}, "--rows"},
	} {
		code, _, errs := runCmd(append([]string{"compare", "--db", path}, c.args...)...)
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d: %s", c.args, code, errs)
		}
	}
	// Step alignment of a trace without steps says it fell back to time.
	db, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	frag := testkit.Record(t, db, "frag", tracer.DefaultFrag(), 4<<30, "")
	db.Close()
	code, out, errs := runCmd("compare", "--db", path, "--align", "step", frag, with)
	if code != 0 || !strings.Contains(out, "\ntrace A has no step annotations (ProfilerStep#N): aligned by time\n") {
		t.Errorf("exit %d: %s\n%s", code, errs, out)
	}
}

// The CLI's deltas round as the compare page's (−7.125 MiB is −7.13 MiB
// on both; TestBrowserBytesAsTheServerWritesThem holds the page to
// gpu.FormatBytes).
func TestSignedDeltaRoundsAsThePage(t *testing.T) {
	for d, want := range map[int64]string{-(7<<20 + 1<<17): "-7.13 MiB", 277<<20 + 1<<17: "+277.13 MiB", 0: "0 B"} {
		if got := signed(d); got != want {
			t.Errorf("signed(%d) = %q, want %q", d, got, want)
		}
	}
}
