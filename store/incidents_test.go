package store

import (
	"encoding/json"
	"errors"
	"testing"

	"vramscope/gpu"
)

func TestIncidentsAndPermalinks(t *testing.T) { eachBackend(t, testIncidentsAndPermalinks) }

func testIncidentsAndPermalinks(t *testing.T) {
	db, path := openTemp(t)
	w, err := db.CreateTrace(gpu.TraceMeta{Name: "oom", Source: gpu.SourceTrace}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.Emit([]gpu.Event{
		{Seq: 0, TimeUS: 1, Action: gpu.ActionSegmentAlloc, Addr: 1 << 30, Size: 2 << 20, Pool: gpu.PoolSmall},
		{Seq: 1, TimeUS: 2, Action: gpu.ActionOOM, Size: 10 << 20, DeviceFree: 5, Stream: 7, Stack: 0},
		{Seq: 2, TimeUS: 3, Action: gpu.ActionOOM, Size: 20 << 20, DeviceFree: 6},
	})
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	ins, err := db.Incidents(w.ID())
	if err != nil || len(ins) != 2 {
		t.Fatalf("%v %v", ins, err)
	}
	if ins[0] != (gpu.Incident{N: 1, Seq: 1, TimeUS: 2, Size: 10 << 20, DeviceFree: 5, Stream: 7}) || ins[1].N != 2 || ins[1].Size != 20<<20 {
		t.Errorf("incidents %+v", ins)
	}
	if _, err := db.IncidentN(w.ID(), 3); !errors.Is(err, ErrNotFound) {
		t.Errorf("incident 3: %v", err)
	}
	state := json.RawMessage(`{"t0":1,"t1":3,"cursor":2,"sel":1}`)
	tok, err := db.CreatePermalink(w.ID(), state)
	if err != nil {
		t.Fatal(err)
	}
	if len(tok) < 26 {
		t.Errorf("token %q too short for 128 bits", tok)
	}
	tok2, _ := db.CreatePermalink(w.ID(), state)
	if tok2 == tok {
		t.Error("tokens repeat")
	}
	if _, err := db.CreatePermalink(w.ID(), json.RawMessage(`{`)); err == nil {
		t.Error("invalid JSON accepted")
	}
	if _, err := db.CreatePermalink("nope", state); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown trace: %v", err)
	}
	db.Close()
	// Links survive a restart.
	db, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	p, err := db.Permalink(tok)
	if err != nil || p.TraceID != w.ID() || string(p.State) != string(state) {
		t.Fatalf("%+v %v", p, err)
	}
	if _, err := db.Permalink("AAAAAAAAAAAAAAAAAAAAAAAAAA"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown token: %v", err)
	}
	if err := db.DeleteTrace(w.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Permalink(tok); !errors.Is(err, ErrNotFound) {
		t.Errorf("permalink outlived its trace: %v", err)
	}
}
