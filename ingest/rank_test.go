package ingest

import "testing"

func TestRankOfName(t *testing.T) {
	for _, c := range []struct {
		name        string
		rank, world int
		ok          bool
	}{
		{"rank3.pickle", 3, 0, true},
		{"rank_3.pickle", 3, 0, true},
		{"Rank-03.pkl", 3, 0, true},
		{"rank0_memory_snapshot.pickle", 0, 0, true},              // torchtitan
		{"memory_snapshot_rank_12.pickle", 12, 0, true},           // one file per rank
		{"iteration_10/rank7_memory_snapshot.pickle", 7, 0, true}, // the step's digits are not the rank
		{"step_100_rank_2.pickle", 2, 0, true},
		{"snap_r3_step10.pickle", 3, 0, true},
		{"r10.pickle", 10, 0, true},
		{"oom-r5.pickle", 5, 0, true},
		{"rank3_of_8.pickle", 3, 8, true},
		{"snapshot_3_of_8.pickle", 3, 8, true},
		{"rank3/snapshot.pickle", 3, 0, true}, // a folder per rank
		{`C:\runs\job\rank_4\memory.pickle`, 4, 0, true},
		{"job/rank1/rank2.pickle", 2, 0, true}, // the file name wins
		{"local_rank5.pickle", 5, 0, true},
		{"snapshot.pickle", 0, 0, false},
		{"frank3.pickle", 0, 0, false},
		{"ranking3.pickle", 0, 0, false},
		{"run_r2d2.pickle", 0, 0, false},
		{"cuda3.pickle", 0, 0, false},
		{"snapshot_2024-01-05.pickle", 0, 0, false},
	} {
		rank, world, ok := RankOfName(c.name)
		if ok != c.ok || rank != c.rank || world != c.world {
			t.Errorf("RankOfName(%q) = %d, %d, %v; want %d, %d, %v", c.name, rank, world, ok, c.rank, c.world, c.ok)
		}
	}
}

func TestRankOfMetadata(t *testing.T) {
	for _, c := range []struct {
		texts []string
		rank  int
		ok    bool
	}{
		{[]string{"", "rank=3"}, 3, true},
		{[]string{"{'rank': 5, 'world_size': 8}"}, 5, true},
		{[]string{`{"global_rank": 6}`}, 6, true},
		{[]string{"RANK 2 step 10"}, 2, true},
		{[]string{"local_rank=1"}, 0, false},
		{[]string{"ranks=8"}, 0, false},
		{[]string{"", "step 3"}, 0, false},
		{nil, 0, false},
	} {
		rank, ok := RankOfMetadata(c.texts)
		if ok != c.ok || rank != c.rank {
			t.Errorf("RankOfMetadata(%q) = %d, %v; want %d, %v", c.texts, rank, ok, c.rank, c.ok)
		}
	}
}
