package ingest

import (
	"context"
	"testing"

	"vramscope/internal/testkit"
	"vramscope/pytorch"
)

// A snapshot without time_us is stored as such (the view then shows event
// numbers), one with times is not; an upload lists its devices in order.
func TestStoreTimesAndDevices(t *testing.T) {
	db := testkit.OpenDB(t)
	for _, c := range []struct {
		file    string
		noTime  bool
		devices int
	}{
		{"no_time_us_segment_churn.pickle", true, 1},
		{"expandable_oom_multigpu.pickle", false, 3},
	} {
		traces, err := pytorch.DecodeFile(testkit.Snapshot(t, c.file))
		if err != nil {
			t.Fatal(err)
		}
		keep, err := pytorch.Devices(traces, -1)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := Store(context.Background(), db, keep, c.file)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := db.Trace(ids[0])
		if err != nil || tr.NoTime != c.noTime {
			t.Fatalf("%s: no time %v, want %v (%v)", c.file, tr.NoTime, c.noTime, err)
		}
		all, err := db.UploadTraces(tr.Upload)
		if err != nil || len(all) != c.devices {
			t.Fatalf("%s: the upload lists %d traces, want %d (%v)", c.file, len(all), c.devices, err)
		}
		for i, x := range all {
			if x.ID != ids[i] || i > 0 && x.DeviceOrdinal <= all[i-1].DeviceOrdinal {
				t.Fatalf("%s: device %d is %s (cuda:%d)", c.file, i, x.ID, x.DeviceOrdinal)
			}
		}
	}
}
