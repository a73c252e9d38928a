package ingest

import (
	"os"
	"testing"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/replay"
)

// TestStoredPoolsReplay: an upload keeps the private pools of its
// segments (a CUDA graph's and a MemPool's), and a replay of the stored
// trace routes each request to its pool and ends as PyTorch did: the
// segments and blocks the file holds (where, how large, which state,
// what was requested), each segment in the pool it was recorded in.
func TestStoredPoolsReplay(t *testing.T) { testkit.EachBackend(t, testStoredPoolsReplay) }

func testStoredPoolsReplay(t *testing.T) {
	db := testkit.OpenDB(t)
	path := testkit.SnapshotOf(t, "pytorch-2.11", "graphs.pickle")
	f, err := os.Open(path)
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
	dumped, err := pytorch.DecodeFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, end := dumped[0].Final, a.Layout()
	if len(end.Segments) != len(want.Segments) || len(want.Segments) != 15 {
		t.Errorf("%d segments at the end, PyTorch dumped %d (15)", len(end.Segments), len(want.Segments))
	}
	got := map[uint64]gpu.Segment{}
	for _, sg := range end.Segments {
		got[sg.Addr] = sg
	}
	for _, w := range want.Segments {
		g, ok := got[w.Addr]
		if !ok || g.Size != w.Size || g.Stream != w.Stream || len(g.Blocks) != len(w.Blocks) {
			t.Errorf("segment %#x: replayed %d B in %d blocks (found %v), dumped %d B in %d blocks", w.Addr, g.Size, len(g.Blocks), ok, w.Size, len(w.Blocks))
			continue
		}
		for i, wb := range w.Blocks {
			gb := g.Blocks[i]
			if gb.Addr != wb.Addr || gb.Size != wb.Size || gb.State != wb.State || wb.State != gpu.BlockFree && gb.Requested != wb.Requested {
				t.Errorf("segment %#x block %d: replayed %#x %d B %v (asked %d), dumped %#x %d B %v (asked %d)", w.Addr, i,
					gb.Addr, gb.Size, gb.State, gb.Requested, wb.Addr, wb.Size, wb.State, wb.Requested)
			}
		}
	}
	for addr, p := range rec.Pools {
		if got := a.SegmentPool(addr); got != caching.PoolID(p) {
			t.Errorf("segment %#x in pool %v, recorded in %v", addr, got, p)
		}
	}
}
