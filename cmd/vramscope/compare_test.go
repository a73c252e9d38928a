package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
	"vramscope/internal/testkit"
	"vramscope/replay"
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
		id := testkit.Record(t, db, "train", compareJob(cp), 80<<30, "")
		if cp {
			with = id
		} else {
			without = id
		}
	}
	return path, with, without
}

// compareJob is the training job compareDB records, with activation
// checkpointing or without.
func compareJob(cp bool) tracer.Train {
	w := tracer.DefaultTrain()
	w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 4, 512, 2048, 4, 1024, 3
	w.Checkpointing = cp
	return w
}

// runsUnder says whether w runs itself (not a replay of its trace) without
// an OOM under PyTorch's per-process limit of limit bytes on the 80 GiB
// device compareDB records on, under the default settings.
func runsUnder(t *testing.T, w tracer.Workload, limit uint64) bool {
	t.Helper()
	cfg := caching.DefaultConfig()
	cfg.Limit = limit
	clk := &tracer.Clock{}
	a, err := caching.New(sim.New(80<<30), cfg, caching.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	err = tracer.Run(context.Background(), w, &tracer.Env{Alloc: a, Clock: clk})
	var oom *caching.OutOfMemoryError
	if errors.As(err, &oom) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// compare --json prints what GET /api/compare answers, field for field,
// each finding the memory the traces need on its own (two copies of the
// database, no what-if stored in either), and the job itself runs under
// that much as a per-process limit and runs out of memory 2 MiB under it;
// the table's first row at A's peak is the attention
// probabilities that checkpointing drops.
func TestCompareJSONIsTheAPIs(t *testing.T) {
	path, with, without := compareDB(t)
	apiPath := filepath.Join(t.TempDir(), "api.db")
	copyFile(t, path, apiPath)
	code, out, errs := runCmd("compare", "--db", path, "--json", "--align", "step", with, without)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var cli map[string]any
	if err := json.Unmarshal([]byte(out), &cli); err != nil {
		t.Fatal(err)
	}

	db, err := store.Open(apiPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	srv := httptest.NewServer(server.New(server.Options{DB: db, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).Handler())
	defer srv.Close()
	// The API starts the what-if replays and answers "running" until
	// they are done.
	var api map[string]any
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		res, err := http.Get(srv.URL + "/api/compare/" + with + "/" + without + "?align=step")
		if err != nil {
			t.Fatal(err)
		}
		api = nil
		err = json.NewDecoder(res.Body).Decode(&api)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("API: %d %v", res.StatusCode, err)
		}
		if neededStatus(api, "a") == "done" && neededStatus(api, "b") == "done" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the API's what-ifs did not end: %v, %v", api["a"], api["b"])
		}
	}
	// Each answers once its replays under the recorded settings are done
	// (the other settings' may still run): their sentences may differ,
	// not the bytes, which are what the job needs when it runs itself
	// (not a replay of its trace) under a per-process limit.
	for i, side := range []string{"a", "b"} {
		c, a := cli[side].(map[string]any)["needed"].(map[string]any), api[side].(map[string]any)["needed"].(map[string]any)
		bytes, _ := a["bytes"].(float64)
		if c["status"] != "done" || c["bytes"] != a["bytes"] || bytes <= replay.CapacityStep {
			t.Errorf("%s needs: CLI %v, API %v", side, c, a)
		} else if w, need := compareJob(i == 0), uint64(bytes); !runsUnder(t, w, need) || runsUnder(t, w, need-replay.CapacityStep) {
			t.Errorf("%s is said to need %d B; run under that limit it runs: %v, 2 MiB under it: %v", side, need,
				runsUnder(t, w, need), runsUnder(t, w, need-replay.CapacityStep))
		}
		delete(c, "text")
		delete(a, "text")
	}
	if !reflect.DeepEqual(cli, api) {
		for k := range api {
			if !reflect.DeepEqual(cli[k], api[k]) {
				t.Errorf("%s differs:\nCLI %v\nAPI %v", k, cli[k], api[k])
			}
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

// neededStatus is the status of a compare answer's memory needed of side.
func neededStatus(res map[string]any, side string) any {
	s, _ := res[side].(map[string]any)
	n, _ := s["needed"].(map[string]any)
	return n["status"]
}

// copyFile copies a closed SQLite database.
func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err == nil {
		err = os.WriteFile(to, b, 0o644)
	}
	if err != nil {
		t.Fatal(err)
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
