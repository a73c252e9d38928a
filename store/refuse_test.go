package store

import (
	"strings"
	"sync"
	"testing"

	"vramscope/gpu"
)

// The writer refuses what the event encoding cannot hold, whatever sent it,
// instead of storing a trace that cannot be read back.
func TestWriterRefusesUnencodableEvents(t *testing.T) {
	eachBackend(t, testWriterRefusesUnencodableEvents)
}

func testWriterRefusesUnencodableEvents(t *testing.T) {
	seg := gpu.Event{Seq: 0, TimeUS: 1, Action: gpu.ActionSegmentAlloc, Addr: 1 << 21, Size: 2 << 20}
	alloc := gpu.Event{Seq: 1, TimeUS: 2, Action: gpu.ActionAlloc, Addr: 1 << 21, Size: 512}
	for _, c := range []struct {
		name string
		evs  []gpu.Event
		want string
	}{
		{"pool", []gpu.Event{func() gpu.Event { e := seg; e.Pool = 4; return e }(), alloc}, "pool"},
		{"pool 3", []gpu.Event{func() gpu.Event { e := seg; e.Pool = gpu.PoolLarge + 1; return e }(), alloc}, "pool"},
		{"action", []gpu.Event{seg, func() gpu.Event { e := alloc; e.Action = gpu.ActionOOM + 1; return e }()}, "action"},
		{"action 200", []gpu.Event{seg, func() gpu.Event { e := alloc; e.Action = 200; return e }()}, "action"},
		{"negative seq", []gpu.Event{func() gpu.Event { e := seg; e.Seq = -5; return e }(),
			func() gpu.Event { e := alloc; e.Seq = -4; return e }()}, "seq"},
	} {
		t.Run(c.name, func(t *testing.T) {
			db, _ := openTemp(t)
			w, err := db.CreateTrace(testMeta, nil)
			if err != nil {
				t.Fatal(err)
			}
			w.Emit(c.evs)
			err = w.Close(gpu.StatusComplete)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("stored %v: error %v, want one about the %s", c.evs, err, c.want)
			}
			tr, err := db.Trace(w.ID())
			if err != nil {
				t.Fatal(err)
			}
			if tr.Status == gpu.StatusComplete {
				t.Fatal("the trace is complete after an event was refused")
			}
			if evs, err := db.Events(w.ID(), -1, 10); err != nil || int64(len(evs)) != tr.Events {
				t.Fatalf("read back %d of %d events: %v", len(evs), tr.Events, err)
			}
		})
	}

	// Every action and pool the encoding has room for reads back.
	db, _ := openTemp(t)
	w, err := db.CreateTrace(testMeta, nil)
	if err != nil {
		t.Fatal(err)
	}
	evs := []gpu.Event{
		{Seq: 0, TimeUS: 1, Action: gpu.ActionSegmentAlloc, Pool: gpu.PoolSmall, Addr: 1 << 21, Size: 2 << 20},
		{Seq: 1, TimeUS: 2, Action: gpu.ActionSegmentAlloc, Pool: gpu.PoolLarge, Addr: 1 << 30, Size: 20 << 20},
		{Seq: 2, TimeUS: 3, Action: gpu.ActionNone},
		{Seq: 3, TimeUS: 4, Action: gpu.ActionOOM, Size: 1 << 40},
	}
	w.Emit(evs)
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	got, err := db.Events(w.ID(), 0, 10)
	if err != nil || len(got) != len(evs) {
		t.Fatalf("read back %d events, %v", len(got), err)
	}
	for i := range got {
		if got[i].Action != evs[i].Action || got[i].Pool != evs[i].Pool {
			t.Fatalf("event %d read back as %v", i, got[i])
		}
	}
}

// Of two resumes of one trace racing, from two handles on the same file,
// exactly one gets a writer.
func TestResumeRaceHasOneWinner(t *testing.T) { eachBackend(t, testResumeRaceHasOneWinner) }

func testResumeRaceHasOneWinner(t *testing.T) {
	db, path := openTemp(t)
	db2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	w, err := db.CreateTrace(testMeta, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.Emit([]gpu.Event{{Seq: 0, TimeUS: 1, Action: gpu.ActionSegmentAlloc, Addr: 1 << 21, Size: 2 << 20}})
	if err := w.Close(gpu.StatusIncomplete); err != nil {
		t.Fatal(err)
	}
	id := w.ID()
	for round := 0; round < 20; round++ {
		dbs := []*DB{db, db2, db, db2}
		ws := make([]*Writer, len(dbs))
		errs := make([]error, len(dbs))
		var start, done sync.WaitGroup
		start.Add(1)
		for i, d := range dbs {
			done.Add(1)
			go func() {
				defer done.Done()
				start.Wait()
				ws[i], _, errs[i] = d.ResumeTrace(id)
			}()
		}
		start.Done()
		done.Wait()
		var won []*Writer
		for i, w := range ws {
			if w != nil {
				won = append(won, w)
			} else if !strings.Contains(errs[i].Error(), "still being written") {
				t.Fatalf("round %d: resume refused with %v", round, errs[i])
			}
		}
		if len(won) != 1 {
			t.Fatalf("round %d: %d of %d resumes got a writer", round, len(won), len(dbs))
		}
		tr, err := db2.Trace(id)
		if err != nil || tr.Status != gpu.StatusLive {
			t.Fatalf("round %d: trace %s (%v) while resumed", round, tr.Status, err)
		}
		if err := won[0].Close(gpu.StatusIncomplete); err != nil {
			t.Fatal(err)
		}
	}
}
