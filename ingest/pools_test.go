package ingest

import (
	"os"
	"testing"

	"vramscope/gpu/caching"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/replay"
)

// TestStoredPoolsReplay: an upload keeps the private pools of its
// segments (a CUDA graph's and a MemPool's), and a replay of the stored
// trace routes each request to its pool and ends as PyTorch did.
func TestStoredPoolsReplay(t *testing.T) {
	db := testkit.OpenDB(t)
	f, err := os.Open(testkit.SnapshotOf(t, "pytorch-2.11", "graphs.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ids, err := Snapshot(db, f, "graphs.pickle", pytorch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := db.Recording(ids[0])
	if err != nil {
		t.Fatal(err)
	}
	pools := map[[2]int64]int{}
	for _, p := range rec.Pools {
		pools[p]++
	}
	if pools[[2]int64{1, 0}] != 3 || pools[[2]int64{0, 1}] != 2 {
		t.Fatalf("segments by private pool %v", pools)
	}
	s := replay.FromRecording(rec)
	s.Use(0, replay.DefaultCapacity)
	cfg, err := s.Config("")
	if err != nil {
		t.Fatal(err)
	}
	a, res, err := s.Run(cfg, s.Capacity.Bytes)
	if err != nil || len(res.OOMs) != 0 {
		t.Fatal(err, res.OOMs)
	}
	end := a.Layout()
	if len(end.Segments) != 15 {
		t.Errorf("%d segments at the end, PyTorch dumped 15", len(end.Segments))
	}
	for addr, p := range rec.Pools {
		if got := a.SegmentPool(addr); got != caching.PoolID(p) {
			t.Errorf("segment %#x in pool %v, recorded in %v", addr, got, p)
		}
	}
}
