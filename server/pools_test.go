package server

import (
	"fmt"
	"strings"
	"testing"

	"vramscope/ingest"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/store"
)

// reusedPoolSnapshot is a snapshot whose one segment, at the end, is a
// private pool's (2, 0), at the address and of the size of an earlier
// segment of the default pool (seqs 0 to 4) that was given back first.
const reusedPoolSnapshot = `{"segments": [
  {"device": 0, "address": 1073741824, "total_size": 20971520, "allocated_size": 1048576, "active_size": 1048576,
   "requested_size": 1048576, "stream": 0, "segment_type": "large", "segment_pool_id": [2, 0], "is_expandable": false, "frames": [],
   "blocks": [{"address": 1073741824, "size": 1048576, "requested_size": 1048576, "state": "active_allocated", "frames": []},
              {"address": 1074790400, "size": 19922944, "requested_size": 0, "state": "inactive", "frames": []}]}],
 "device_traces": [[
  {"action": "segment_alloc", "addr": 1073741824, "size": 20971520, "stream": 0, "time_us": 1000, "frames": []},
  {"action": "alloc", "addr": 1073741824, "size": 4194304, "stream": 0, "time_us": 1001, "frames": []},
  {"action": "free_requested", "addr": 1073741824, "size": 4194304, "stream": 0, "time_us": 1002, "frames": []},
  {"action": "free_completed", "addr": 1073741824, "size": 4194304, "stream": 0, "time_us": 1002, "frames": []},
  {"action": "segment_free", "addr": 1073741824, "size": 20971520, "stream": 0, "time_us": 1003, "frames": []},
  {"action": "segment_alloc", "addr": 1073741824, "size": 20971520, "stream": 0, "time_us": 1004, "frames": []},
  {"action": "alloc", "addr": 1073741824, "size": 1048576, "stream": 0, "time_us": 1005, "frames": []}]]}`

// importReusedPool stores reusedPoolSnapshot and returns its trace's id.
func importReusedPool(t *testing.T, db *store.DB) string {
	t.Helper()
	ids, err := ingest.Snapshot(db, strings.NewReader(reusedPoolSnapshot), "reused-pool.json", pytorch.Options{})
	if err != nil || len(ids) != 1 {
		t.Fatalf("import: %v (%d traces)", err, len(ids))
	}
	return ids[0]
}

type layoutPoolsJSON struct {
	Seq      int64      `json:"seq"`
	Segments []int64    `json:"segments"`
	Pools    [][3]int64 `json:"pools"`
}

// A segment is in a private pool only while it lives: /layout?seq= (the
// segment map's answer) names no pool for the segment that held the
// address before, on a snapshot made for it and at every event of the
// 2.11 recording with a CUDA graph and a MemPool, where each segment it
// names must have been made by then (found from the events, and sized as
// the snapshot dumped it) and not given back since.
func TestLayoutPoolsByLifetime(t *testing.T) {
	db := testkit.OpenDB(t)
	reused := importReusedPool(t, db)
	graphs := importSnapshotOf(t, db, "pytorch-2.11", "graphs.pickle")[0]
	srv := serve(t, db)

	for seq, want := range []string{"[]", "[]", "[]", "[]", "[]", "[[1073741824 2 0]]", "[[1073741824 2 0]]"} {
		var l layoutPoolsJSON
		getJSON(t, fmt.Sprintf("%s/api/traces/%s/layout?seq=%d", srv.URL, reused, seq), 200, &l)
		if got := fmt.Sprint(l.Pools); got != want && !(want == "[]" && l.Pools == nil) {
			t.Errorf("after event %d: pools %s, want %s", seq, got, want)
		}
	}

	// The graphs recording: which segment lives at each address after each
	// event, from the events themselves.
	var evs struct {
		Events []eventJSON `json:"events"`
	}
	for len(evs.Events) < int(graphs.Events) {
		var page struct {
			Events []eventJSON `json:"events"`
		}
		getJSON(t, fmt.Sprintf("%s/api/traces/%s/events?from=%d&limit=100", srv.URL, graphs.ID, len(evs.Events)), 200, &page)
		if len(page.Events) == 0 {
			t.Fatalf("%d events read, the trace has %d", len(evs.Events), graphs.Events)
		}
		evs.Events = append(evs.Events, page.Events...)
	}
	var end layoutPoolsJSON
	getJSON(t, fmt.Sprintf("%s/api/traces/%s/layout?seq=%d", srv.URL, graphs.ID, graphs.LastSeq), 200, &end)
	if len(end.Pools) != 5 {
		t.Fatalf("at the end %d segments are in private pools, the snapshot dumped 5: %v", len(end.Pools), end.Pools)
	}
	finalSize := map[int64]int64{}
	for i := 0; i < len(end.Segments); i += store.SegmentColumns {
		finalSize[end.Segments[i]] = end.Segments[i+1]
	}
	born := map[int64]int64{} // address → size of the segment made there, while it lives
	marked := 0
	for _, e := range evs.Events {
		switch e.Action {
		case "segment_alloc":
			born[int64(e.Addr)] = int64(e.Size)
		case "segment_free":
			delete(born, int64(e.Addr))
		}
		var l layoutPoolsJSON
		getJSON(t, fmt.Sprintf("%s/api/traces/%s/layout?seq=%d", srv.URL, graphs.ID, e.Seq), 200, &l)
		for _, p := range l.Pools {
			size, ok := born[p[0]]
			if !ok || size != finalSize[p[0]] || stillFreedLater(evs.Events, e.Seq, p[0]) {
				t.Errorf("after event %d the segment at %#x is put in pool (%d, %d), which did not have it then", e.Seq, p[0], p[1], p[2])
			}
			marked++
		}
	}
	if marked == 0 {
		t.Fatal("no event shows a private pool")
	}
}

// stillFreedLater says whether the segment at addr is given back after event seq.
func stillFreedLater(evs []eventJSON, seq, addr int64) bool {
	for _, e := range evs[seq+1:] {
		if e.Action == "segment_free" && int64(e.Addr) == addr {
			return true
		}
	}
	return false
}
