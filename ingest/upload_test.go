package ingest_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"vramscope/gpu"
	"vramscope/ingest"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/store"
)

// A device that fails to store takes its whole upload with it: no trace,
// no upload record, no annotation, no extra is left.
func TestStoreIsAllOrNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.db")
	db, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	traces, err := pytorch.DecodeFile(testkit.Snapshot(t, "expandable_oom_multigpu.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	keep, err := pytorch.Devices(traces, -1)
	if err != nil || len(keep) != 3 {
		t.Fatalf("%d devices: %v", len(keep), err)
	}
	bad := *keep[2]
	bad.Events = append(slices.Clone(bad.Events), gpu.Event{Seq: int64(len(bad.Events)), Action: gpu.ActionFreeCompleted, Addr: 12345, Size: 1})
	bad.ExtraOf = append(slices.Clone(bad.ExtraOf), 0)
	_, err = ingest.Store(context.Background(), db, []*pytorch.Trace{keep[0], keep[1], &bad}, "broken")
	var ie *ingest.InputError
	if !errors.As(err, &ie) {
		t.Fatalf("got %v, want an input error", err)
	}
	raw, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, table := range []string{"traces", "uploads", "annotations", "event_extras", "event_extra_runs", "snapshot_segments", "stacks", "chunks"} {
		var n int
		if err := raw.QueryRow("SELECT count(*) FROM " + table).Scan(&n); err != nil || n != 0 {
			t.Errorf("%s: %d rows left (%v)", table, n, err)
		}
	}

	ids, err := ingest.Store(context.Background(), db, keep, "whole")
	if err != nil || len(ids) != 3 {
		t.Fatalf("%v %v", ids, err)
	}
	tr, _ := db.Trace(ids[1])
	group, err := db.UploadTraces(tr.Upload)
	if err != nil || len(group) != 3 || group[0].ID != ids[0] || group[2].ID != ids[2] {
		t.Errorf("the upload's traces: %v %v", group, err)
	}
	if anns, _ := db.Annotations(ids[0]); len(anns) != 4 || anns[0].Stage != "START" {
		t.Errorf("device 0 annotations %+v", anns)
	}
}
