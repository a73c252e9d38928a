package pytorch

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/internal/testkit"
)

type fileFigures struct {
	segments, blocks               int
	reserved, allocated, requested uint64
	events                         []int // per device_traces entry
	ooms                           int
}

// expected is PROVENANCE.md's table (CPython 3.11 pickle figures).
var expected = map[string]fileFigures{
	"expandable_oom_multigpu.pickle":        {12, 790, 114628231168, 28728827904, 28728795288, []int{6445, 596, 882, 0}, 1},
	"oom_nonexpandable.json":                {120, 307, 22571646976, 22536960512, 22531455488, []int{1299}, 1},
	"legacy_block_history.pickle":           {176, 463, 11844714496, 11840159744, 11840159744, []int{1}, 0},
	"no_time_us_segment_churn.pickle":       {136, 204, 18566086656, 16199101440, 16199097344, []int{10327, 0, 0, 0}, 0},
	"training_22k_user_metadata.pickle":     {234, 1031, 25178406912, 6874481152, 6870548484, []int{22331}, 0},
	"windows_paths_small.pickle":            {216, 455, 14180941824, 1377753600, 1373919236, []int{5163}, 0},
	"segments_list_only.pkl":                {255, 2140, 3649044480, 3353639424, 3308174782, nil, 0},
	"uint64_line_annotations.pickle":        {30, 378, 1107296256, 1043817472, 1029235712, []int{8507}, 0},
	"two_gpus_expandable_state_only.pickle": {3, 10, 85983232, 17071104, 17070768, []int{0, 0}, 0},
	"empty_four_devices.pickle":             {0, 0, 0, 0, 0, []int{0, 0, 0, 0}, 0},
	"snapshot_action_entry.pickle":          {22, 97, 9196011520, 1493379584, 1493235840, []int{902}, 0},
	"settings_no_annotations.pickle":        {259, 868, 17133731840, 16397578240, 16380108168, []int{1}, 0},
	"ftcourse_2024_memory_snapshot.pickle":  {215, 1079, 6471811072, 2297283072, 0, []int{10307}, 0},
	"cs336_ctx128_forward.pickle":           {516, 1276, 19667091456, 19498420224, 0, []int{4657}, 0},
}

// Every file of the older real set decodes to PROVENANCE.md's figures
// (expected); a file added there without its figures fails.
func TestRealSnapshots(t *testing.T) {
	files := testkit.RealFiles(t, "pytorch")
	if len(files) != len(expected) {
		t.Errorf("%d real files, %d with figures", len(files), len(expected))
	}
	for _, path := range files {
		name := filepath.Base(path)
		want, ok := expected[name]
		if !ok {
			t.Errorf("%s: no figures in expected; add its row of PROVENANCE.md", name)
			continue
		}
		t.Run(name, func(t *testing.T) {
			traces, err := DecodeFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var got fileFigures
			byDev := map[int]*Trace{}
			for _, tr := range traces {
				byDev[tr.Device] = tr
				f := tr.Final.Figures()
				got.segments += f.Segments
				got.blocks += f.Blocks
				got.reserved += f.Reserved
				got.allocated += f.Allocated
				got.requested += f.Requested
				got.ooms += tr.OOMs()
				if err := tr.Final.CheckTiling(); err != nil {
					t.Errorf("device %d: %v", tr.Device, err)
				}
				if len(tr.Mismatches) != 0 {
					t.Errorf("device %d: %d mismatches, first: %v", tr.Device, len(tr.Mismatches), &tr.Mismatches[0])
				}
			}
			for d, n := range want.events {
				tr := byDev[d]
				if tr == nil {
					t.Errorf("no trace for device %d", d)
					continue
				}
				if len(tr.Events) != n {
					t.Errorf("device %d: %d events, want %d", d, len(tr.Events), n)
				}
			}
			if want.requested == 0 {
				got.requested = 0 // not in the table for these two
			}
			got.events = want.events
			if got.segments != want.segments || got.blocks != want.blocks || got.reserved != want.reserved ||
				got.allocated != want.allocated || got.requested != want.requested || got.ooms != want.ooms {
				t.Errorf("figures\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

// Every PyTorch 2.11 recording decodes to a well-formed layout, and where
// its run wrote memory_stats() at the dump (the .json beside it, at the
// OOM for frag_default), to the real allocator's own counters: bytes
// reserved, allocated and requested, blocks allocated, and segments
// (PyTorch counts none for expandable segments). Those without counters
// (graphs, ddp_rank0) are checked against CPython in TestAgainstCPythonPickle.
func TestReal211Snapshots(t *testing.T) {
	withStats := 0
	for _, path := range testkit.RealFiles(t, "pytorch-2.11") {
		name := filepath.Base(path)
		t.Run(name, func(t *testing.T) {
			traces, err := DecodeFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(traces) != 1 {
				t.Fatalf("%d device traces, want the one GPU", len(traces))
			}
			tr := traces[0]
			if err := tr.Final.CheckTiling(); err != nil {
				t.Error(err)
			}
			if len(tr.Mismatches) != 0 {
				t.Errorf("%d mismatches, first: %v", len(tr.Mismatches), &tr.Mismatches[0])
			}
			stats, expandable := memoryStatsAtDump(t, path)
			if stats == nil {
				return
			}
			withStats++
			f := tr.Final.Figures()
			allocs := 0
			for _, sg := range tr.Final.Segments {
				for _, b := range sg.Blocks {
					if b.State == gpu.BlockAllocated {
						allocs++
					}
				}
			}
			got := map[string]uint64{"reserved_bytes.all.current": f.Reserved, "allocated_bytes.all.current": f.Allocated,
				"requested_bytes.all.current": f.Requested, "allocation.all.current": uint64(allocs)}
			if !expandable {
				got["segment.all.current"] = uint64(f.Segments)
			}
			for k, v := range got {
				if want, ok := stats[k]; !ok || int64(v) != want {
					t.Errorf("%s: %d, memory_stats() %d", k, v, want)
				}
			}
		})
	}
	if withStats < 5 {
		t.Errorf("%d recordings checked against memory_stats(), want the 5 that have them", withStats)
	}
}

// memoryStatsAtDump is memory_stats() as the run of a 2.11 recording
// wrote it when the snapshot was dumped, from the .json beside it (nil
// where it has none), and whether the run had expandable segments.
func memoryStatsAtDump(t *testing.T, snapshot string) (map[string]int64, bool) {
	t.Helper()
	base := strings.TrimSuffix(strings.TrimSuffix(snapshot, ".gz"), ".pickle")
	b, err := os.ReadFile(strings.TrimSuffix(base, "_oom") + ".json")
	if err != nil {
		t.Fatalf("the run's figures: %v", err)
	}
	var run struct {
		Conf        string
		MemoryStats map[string]int64 `json:"memory_stats"`
		OOM         struct {
			MemoryStats map[string]int64 `json:"memory_stats_at_oom"`
		}
	}
	if err := json.Unmarshal(b, &run); err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(base, "_oom") {
		run.MemoryStats = run.OOM.MemoryStats
	}
	return run.MemoryStats, strings.Contains(run.Conf, "expandable_segments:True")
}

var _ = gpu.ActionAlloc

// A snapshot replays under the settings its allocator had: its
// PYTORCH_CUDA_ALLOC_CONF, unless allocator_settings say otherwise.
func TestRecordingSettings(t *testing.T) {
	raw := Dict{{"max_split_size", int64(128 << 20)}, {"expandable_segments", true}, {"garbage_collection_threshold", 0.0}}
	for _, c := range []struct {
		s    Settings
		want string
	}{
		{Settings{Conf: "expandable_segments:True", Rules: rulesFrom(Dict{{"expandable_segments", true}})}, "expandable_segments:True"},
		{Settings{Conf: "", Rules: gpu.DefaultRules(), Raw: Dict{{"garbage_collection_threshold", 0.0}}}, ""},
		// Changed at run time: the settings the allocator reports win.
		{Settings{Conf: "expandable_segments:True", Rules: rulesFrom(raw), Raw: raw}, "expandable_segments:True,max_split_size_mb:128"},
		{Settings{Conf: "", Rules: gpu.DefaultRules(), Raw: Dict{{"garbage_collection_threshold", 0.6}}}, "garbage_collection_threshold:0.6"},
	} {
		if got := c.s.Replay(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.s, got, c.want)
		}
	}
	traces, err := DecodeFile(testkit.Snapshot(t, "expandable_oom_multigpu.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	if got := traces[0].Recording().Settings; got != "expandable_segments:True" {
		t.Errorf("recorded settings %q", got)
	}
}
