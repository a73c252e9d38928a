package incident

import (
	"testing"

	"vramscope/internal/testkit"
	"vramscope/tracer"
)

// A job hands out the recorded settings' row once its replays are done,
// the row the whole table then starts with; a job that fails closes
// Original after Done, so no empty row is read as an answer.
func TestJobOriginalRow(t *testing.T) {
	db := testkit.OpenDB(t)
	w := tracer.DefaultTrain()
	w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 4, 512, 2048, 4, 1024, 3
	id := testkit.Record(t, db, "train", w, 80<<30, "")
	tr, err := db.Trace(id)
	if err != nil {
		t.Fatal(err)
	}
	jobs := NewJobs(db, 2, make(chan struct{}, 1))
	j := jobs.WhatIf(id, tr.LastSeq)
	<-j.Original
	first, capacity := j.Needed, j.Capacity
	<-j.Done
	if j.Err != nil {
		t.Fatal(j.Err)
	}
	if orig := j.Table.Rows[0]; first.CapacityNeeded == 0 || first.CapacityNeeded != orig.CapacityNeeded || first.AllocConf != orig.AllocConf ||
		first.PeakReserved != orig.PeakReserved || capacity != j.Table.Capacity {
		t.Errorf("first %+v on %d, the table's row %+v on %d", first, capacity, orig, j.Table.Capacity)
	}

	failed := jobs.WhatIf("no-such-trace", 0)
	<-failed.Original
	select {
	case <-failed.Done:
		if failed.Err == nil {
			t.Error("a job of no trace did not fail")
		}
	default:
		t.Error("a failed job closed Original before Done")
	}
}
