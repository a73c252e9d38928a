package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/replay"
	"vramscope/store"
)

// snapshotTrace decodes a real snapshot's device trace (-1: the one replay picks).
func snapshotTrace(t *testing.T, file string, device int) *pytorch.Trace {
	t.Helper()
	f, err := os.Open(testkit.Snapshot(t, file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr, _, err := decodeSnapshotDevice(f, device)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return tr
}

// replayedJSON is what replay --json prints, its segments as a layout's.
type replayedJSON struct {
	Capacity struct {
		Bytes  uint64 `json:"bytes"`
		Source string `json:"source"`
	} `json:"capacity"`
	Settings string        `json:"alloc_conf"`
	Segments []segmentJSON `json:"segments"`
}

func (r replayedJSON) layout() []gpu.Segment {
	var segs []gpu.Segment
	for _, s := range r.Segments {
		seg := gpu.Segment{Addr: s.Address, Size: s.TotalSize}
		for _, b := range s.Blocks {
			st, _ := gpu.ParseBlockState(b.State)
			seg.Blocks = append(seg.Blocks, gpu.Block{Size: b.Size, State: st})
		}
		segs = append(segs, seg)
	}
	return segs
}

// segmentShape is a layout's segments as sizes and block sizes/states.
func segmentShape(segs []gpu.Segment) string {
	var b strings.Builder
	for _, s := range segs {
		fmt.Fprintf(&b, "%#x:%d[", s.Addr, s.Size)
		for _, bl := range s.Blocks {
			fmt.Fprintf(&b, "%d/%v ", bl.Size, bl.State)
		}
		b.WriteString("] ")
	}
	return b.String()
}

// `vramscope replay FILE`, no flags, ends in the segments PyTorch dumped.
func TestReplaySnapshotEndsInItsSegments(t *testing.T) {
	for _, c := range []struct {
		file     string
		device   string
		capacity string
	}{
		{"oom_nonexpandable.json", "", "capacity 21.94 GiB, inferred from the OOM at event 1117"},
		{"no_time_us_segment_churn.pickle", "", "capacity 21.01 GiB, inferred from 39 retries"},
		{"training_22k_user_metadata.pickle", "", "capacity 80.00 GiB, a default"},
		{"expandable_oom_multigpu.pickle", "0", "capacity 79.17 GiB, the most the address space reserved"},
		{"expandable_oom_multigpu.pickle", "1", "capacity 78.51 GiB, inferred from the OOM at event 421"},
		{"expandable_oom_multigpu.pickle", "2", "capacity 79.17 GiB"},
	} {
		dev := -1
		args := []string{"replay", testkit.Snapshot(t, c.file)}
		if c.device != "" {
			fmt.Sscan(c.device, &dev)
			args = append(args, "--device", c.device)
		}
		_, text, _ := runCmd(args...)
		if !strings.Contains(text, c.capacity) {
			t.Errorf("%v says\n%.300s\nwant %q", args, text, c.capacity)
		}
		args = append(args, "--json")
		want := snapshotTrace(t, c.file, dev)
		code, out, errs := runCmd(args...)
		if code != 0 {
			t.Fatalf("%v: exit %d %s", args, code, errs)
		}
		var got replayedJSON
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatal(err)
		}
		segs := got.layout()
		if g, w := segmentShape(segs), segmentShape(want.Final.Segments); g != w {
			t.Errorf("%v: %d segments, want %d:\n%.400s\nwant\n%.400s", args, len(segs), len(want.Final.Segments), g, w)
		}
		if got.Settings != want.Settings.Conf {
			t.Errorf("%v: replayed under %q, recorded %q", args, got.Settings, want.Settings.Conf)
		}
	}
}

// --alloc-conf sets its keys on top of the recorded settings; --capacity
// overrides what the recording implies, and says so.
func TestReplayOverrides(t *testing.T) {
	file := testkit.Snapshot(t, "expandable_oom_multigpu.pickle")
	code, out, errs := runCmd("replay", file, "--device", "1", "--alloc-conf", "max_split_size_mb:128", "--capacity", "100GiB")
	if code != 0 {
		t.Fatalf("exit %d %s", code, errs)
	}
	for _, want := range []string{
		"settings: expandable_segments:True,max_split_size_mb:128 (recorded: expandable_segments:True)",
		"capacity 100.00 GiB, as given (the recording implies 78.51 GiB)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%.600s", want, out)
		}
	}
	if strings.Contains(out, "OOM at request") {
		t.Errorf("an OOM on 100 GiB:\n%.600s", out)
	}
	if code, _, errs := runCmd("replay", file, "--device", "7"); code != 2 || !strings.Contains(errs, "no device 7") {
		t.Errorf("--device 7: exit %d %s", code, errs)
	}
}

// trace --workload replay stores a snapshot's device trace again: from its
// starting layout, the same events, ending in the same segments.
func TestTraceWorkloadReplay(t *testing.T) {
	want := snapshotTrace(t, "no_time_us_segment_churn.pickle", -1)
	db := filepath.Join(t.TempDir(), "r.db")
	code, out, errs := runCmd("trace", "--workload", "replay", testkit.Snapshot(t, "no_time_us_segment_churn.pickle"), "--db", db, "--quiet")
	if code != 0 || !strings.Contains(errs, "capacity 21.01 GiB, inferred from 39 retries") {
		t.Fatalf("exit %d %s\n%s", code, errs, out)
	}
	s, err := store.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	traces, _ := s.Traces()
	if len(traces) != 1 {
		t.Fatalf("%d traces", len(traces))
	}
	tr := traces[0]
	if tr.Events != int64(len(want.Events)) || tr.FirstSeq != 0 || tr.OOMs != 0 {
		t.Errorf("stored %d events from %d, want %d from 0", tr.Events, tr.FirstSeq, len(want.Events))
	}
	first, _, err := s.LayoutAtSeq(tr.ID, -1)
	if err != nil || segmentShape(first.Segments) != segmentShape(want.Initial.Segments) {
		t.Errorf("the stored trace does not start from the snapshot's starting layout: %v", err)
	}
	last, _, err := s.LayoutAtSeq(tr.ID, tr.LastSeq)
	if err != nil || segmentShape(last.Segments) != segmentShape(want.Final.Segments) {
		t.Errorf("the stored trace does not end in the snapshot's segments: %v", err)
	}
	sameReplay(t, s, tr.ID, want)
	// A stored trace replays as its file does, with its stacks.
	if code, _, errs := runCmd("import", testkit.Snapshot(t, "no_time_us_segment_churn.pickle"), "--db", db, "--name", "imported"); code != 0 {
		t.Fatal(errs)
	}
	imported, _ := s.Traces()
	code, out, errs = runCmd("trace", "--workload", "replay", imported[0].ID, "--db", db, "--quiet")
	if code != 0 {
		t.Fatalf("replay of a stored trace: exit %d %s\n%s", code, errs, out)
	}
	again, _ := s.Traces()
	sameReplay(t, s, again[0].ID, want)
	// Half the blocks live before this one's trace have frames.
	framed := snapshotTrace(t, "training_22k_user_metadata.pickle", -1)
	if code, _, errs := runCmd("trace", "--workload", "replay", testkit.Snapshot(t, "training_22k_user_metadata.pickle"), "--db", db, "--quiet"); code != 0 {
		t.Fatalf("exit %d %s", code, errs)
	}
	again, _ = s.Traces()
	sameReplay(t, s, again[0].ID, framed)
	// This one's 714 annotations (compile and autotuning regions) hold for its replay.
	annotated := snapshotTrace(t, "uint64_line_annotations.pickle", -1)
	if code, _, errs := runCmd("trace", "--workload", "replay", testkit.Snapshot(t, "uint64_line_annotations.pickle"), "--db", db, "--quiet"); code != 0 {
		t.Fatalf("exit %d %s", code, errs)
	}
	again, _ = s.Traces()
	sameReplay(t, s, again[0].ID, annotated)
	if code, _, errs := runCmd("trace", "--workload", "frag", "--device", "1", "--db", db); code != 2 || !strings.Contains(errs, "--device must be sim or cuda") {
		t.Errorf("--device 1 without a replay: exit %d %s", code, errs)
	}
	// --device N picks a snapshot's device: device 1 of the multi-GPU file
	// ran out of memory, and so does its replay, at the same event.
	one := snapshotTrace(t, "expandable_oom_multigpu.pickle", 1)
	code, out, errs = runCmd("trace", "--workload", "replay", "--device", "1", testkit.Snapshot(t, "expandable_oom_multigpu.pickle"), "--db", db, "--quiet")
	if code != 0 || !strings.Contains(out, "OOM: CUDA out of memory. Tried to allocate 4.95 GiB") {
		t.Fatalf("--device 1: exit %d %s\n%s", code, errs, out)
	}
	traces, _ = s.Traces()
	replayed := traces[0] // the newest
	incidents, err := s.Incidents(replayed.ID)
	if err != nil || len(incidents) != 1 || incidents[0].Seq != 421 || replayed.Settings != "expandable_segments:True" || replayed.Events != int64(len(one.Events)) || incidents[0].DeviceFree != 95682560 {
		t.Errorf("replayed device 1: %+v, incidents %+v %v (snapshot: %d events, OOM at 421)", replayed, incidents, err, len(one.Events))
	}
}

// sameReplay fails unless stored trace id replays want: the same events,
// allocations and frees with the same frames, from blocks with the same
// frames, in the same steps and phases (annotations).
func sameReplay(t *testing.T, s *store.DB, id string, want *pytorch.Trace) {
	t.Helper()
	events, err := s.Events(id, 0, int64(len(want.Events)))
	if err != nil {
		t.Fatal(err)
	}
	stack := func(sid gpu.StackID) gpu.Stack {
		st, err := s.Stack(id, sid)
		if err != nil && sid != 0 {
			t.Fatalf("trace %s: stack %d: %v", id, sid, err)
		}
		return st
	}
	for i, e := range events {
		w := want.Events[i]
		// A free has the frames of the free call, as PyTorch records them,
		// not those of its block.
		framed := e.Action == gpu.ActionAlloc || e.Action == gpu.ActionSegmentAlloc || e.Action == gpu.ActionSegmentMap ||
			e.Action == gpu.ActionFreeRequested || e.Action == gpu.ActionFreeCompleted
		if e.Action != w.Action || e.Addr != w.Addr || e.Size != w.Size || e.Stream != w.Stream || framed && !reflect.DeepEqual(stack(e.Stack), want.Stack(w.Stack)) {
			t.Fatalf("event %d: stored %v (frames %v), snapshot %v (frames %v)", i, e, stack(e.Stack), w, want.Stack(w.Stack))
		}
	}
	anns, err := s.Annotations(id)
	if err != nil {
		t.Fatal(err)
	}
	wantAnns := want.Annotations()
	if len(anns) != len(wantAnns) {
		t.Fatalf("trace %s: %d annotations, the snapshot %d", id, len(anns), len(wantAnns))
	}
	for i, a := range anns {
		if w := wantAnns[i]; a.TimeUS != w.TimeUS || a.Stage != w.Stage || a.Name != w.Name {
			t.Fatalf("annotation %d: %+v, the snapshot %+v", i, a, w)
		}
	}
	first, _, err := s.LayoutAtSeq(id, -1)
	if err != nil {
		t.Fatal(err)
	}
	for i, seg := range first.Segments {
		for j, b := range seg.Blocks {
			wb := want.Initial.Segments[i].Blocks[j]
			if b.Seq != wb.Seq || !reflect.DeepEqual(stack(b.Stack), want.Stack(wb.Stack)) {
				t.Fatalf("starting block at %#x: made by event %d, frames %v; snapshot: %d, %v", b.Addr, b.Seq, stack(b.Stack), wb.Seq, want.Stack(wb.Stack))
			}
		}
	}
}

// A snapshot imported into the store replays from the store as it does
// from its file.
func TestReplayImportedSnapshot(t *testing.T) {
	file := testkit.Snapshot(t, "no_time_us_segment_churn.pickle")
	want := snapshotTrace(t, "no_time_us_segment_churn.pickle", -1)
	db := filepath.Join(t.TempDir(), "i.db")
	if code, _, errs := runCmd("import", file, "--db", db); code != 0 {
		t.Fatalf("import: exit %d %s", code, errs)
	}
	s, err := store.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	traces, _ := s.Traces()
	s.Close()
	code, out, errs := runCmd("replay", "--db", db, "--json", "--trace", traces[0].ID)
	if code != 0 {
		t.Fatalf("exit %d %s", code, errs)
	}
	var got replayedJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	segs := got.layout()
	if segmentShape(segs) != segmentShape(want.Final.Segments) || got.Capacity.Source != "retries" {
		t.Errorf("the stored trace replays to %d segments (capacity from %q), want %d", len(segs), got.Capacity.Source, len(want.Final.Segments))
	}
}

// The example: scenario D, then a real shortage (50 MiB asked
// with 18 MiB live on the 60 MiB device). Expandable segments serve the
// first OOM, not the second.
func TestWhatIfPerOOMFromALog(t *testing.T) {
	reqs := append(testkit.ScenarioD(), replay.Request{Op: replay.OpMalloc, ID: 11, Size: 50 * testkit.MiB})
	path := filepath.Join(t.TempDir(), "d50.csv")
	if err := os.WriteFile(path, []byte(testkit.RMMLog(reqs)), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCmd("whatif", path, "--capacity", "60MiB", "--json")
	if code != 0 {
		t.Fatalf("exit %d %s", code, errs)
	}
	var rows []struct {
		AllocConf string `json:"alloc_conf"`
		OOMs      []struct {
			Index int `json:"index"`
		} `json:"ooms"`
		Avoided        []int  `json:"avoided"`
		NewOOMs        []int  `json:"new_ooms"`
		CapacityNeeded uint64 `json:"capacity_needed"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows[0].OOMs) != 2 || rows[1].AllocConf != "expandable_segments:True" ||
		fmt.Sprint(rows[1].Avoided, rows[1].NewOOMs, len(rows[1].OOMs)) != "[15] [] 1" ||
		rows[0].CapacityNeeded != 120*testkit.MiB || rows[1].CapacityNeeded != 110*testkit.MiB {
		t.Errorf("rows %+v", rows)
	}
	_, text, _ := runCmd("whatif", path, "--capacity", "60MiB")
	for _, want := range []string{
		"OOM at request 15 (fragmentation): Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: it serves this request, and the whole run needs 110.00 MiB with it, more than the 60.00 MiB device it replayed on",
		"expandable_segments:True would have served this request.",
		"OOM at request 16 (shortage): No setting serves this request",
		"None of the settings tried would have served this request.",
		"Needs 120.00 MiB with the recorded settings, 110.00 MiB with expandable_segments:True (as a per-process limit). Replayed on a simulated device of 60.00 MiB, as given.",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in\n%s", want, text)
		}
	}
}

// storedTrace reads trace id of database db.
func storedTrace(t *testing.T, db, id string) gpu.Trace {
	t.Helper()
	s, err := store.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tr, err := s.Trace(id)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// A replay's statistics are the stream's, not those of rebuilding its
// starting layout: a state-only snapshot replays no request, so nothing
// was allocated or freed and the peaks are the snapshot's own; a trace
// peaks where the import, reading the recorded events, says it did.
func TestReplayStatsLeaveOutTheStartingLayout(t *testing.T) {
	for _, c := range []struct {
		file                    string
		peakAlloc, peakReserved int64 // 0: the imported trace's
	}{
		{"two_gpus_expandable_state_only.pickle", 8551424, 44040192},
		{"legacy_block_history.pickle", 11840159744, 11844714496},
		{"training_22k_user_metadata.pickle", 0, 0},
		{"oom_nonexpandable.json", 0, 0},
	} {
		file := testkit.Snapshot(t, c.file)
		if c.peakAlloc == 0 {
			db := filepath.Join(t.TempDir(), "i.db")
			tr := storedTrace(t, db, importJSON(t, file, db)[0])
			c.peakAlloc, c.peakReserved = int64(tr.PeakAllocated), int64(tr.PeakReserved)
		}
		code, out, errs := runCmd("replay", file, "--json")
		if code != 0 {
			t.Fatalf("%s: exit %d %s", c.file, code, errs)
		}
		var got struct {
			Stats map[string]int64 `json:"stats"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatal(err)
		}
		st := got.Stats
		if st["allocated_bytes.all.peak"] != c.peakAlloc || st["reserved_bytes.all.peak"] != c.peakReserved {
			t.Errorf("%s: peak allocated %d, reserved %d; want %d, %d", c.file,
				st["allocated_bytes.all.peak"], st["reserved_bytes.all.peak"], c.peakAlloc, c.peakReserved)
		}
		if strings.Contains(c.file, "state_only") && (st["allocated_bytes.all.allocated"] != 0 || st["allocated_bytes.all.freed"] != 0 || st["num_device_alloc"] != 0) {
			t.Errorf("%s: no request replayed, yet %d bytes allocated, %d freed, %d device allocations", c.file,
				st["allocated_bytes.all.allocated"], st["allocated_bytes.all.freed"], st["num_device_alloc"])
		}
	}
}

// Of a snapshot of several devices, replay and whatif take the device
// that ran out of memory (as an upload opens on it), say so, and name it
// as PyTorch does ("GPU 1"), from the file as from the stored trace.
func TestReplayPicksAndNamesTheOOMDevice(t *testing.T) {
	file := testkit.Snapshot(t, "expandable_oom_multigpu.pickle")
	code, out, errs := runCmd("whatif", file)
	if code != 0 {
		t.Fatalf("whatif: exit %d %s", code, errs)
	}
	if !strings.Contains(out, "original OOMs: request 287 (4.94 GiB)") {
		t.Errorf("whatif of the file reports no OOM:\n%.400s", out)
	}
	if want := "expandable_oom_multigpu.pickle: device 1 (of 0, 1 and 2), the one that ran out of memory; --device N picks another"; !strings.Contains(errs, want) {
		t.Errorf("whatif's stderr %q does not say %q", errs, want)
	}
	db := filepath.Join(t.TempDir(), "i.db")
	for _, args := range [][]string{{"replay", file}, {"replay", "--db", db, "--trace", importJSON(t, file, db)[1]}} {
		code, out, errs := runCmd(args...)
		if code != 0 {
			t.Fatalf("%v: exit %d %s", args, code, errs)
		}
		if !strings.Contains(out, "Tried to allocate 4.95 GiB. GPU 1 has a total capacity") || !strings.Contains(out, "memory summary, device ID 1 ") {
			t.Errorf("%v does not name device 1:\n%.1200s", args, out)
		}
	}
}

// --device names a device of a snapshot file: of a stored trace (one
// device) or an RMM log it is refused unless it names that device, never
// silently ignored.
func TestReplayDeviceOfATraceOrLog(t *testing.T) {
	db := filepath.Join(t.TempDir(), "d.db")
	ids := importJSON(t, testkit.Snapshot(t, "oom_nonexpandable.json"), db)
	log := scenarioDLog(t)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"replay", "--db", db, "--device", "2", "--trace", ids[0]}, 2, "--device picks a device of a snapshot file; trace " + ids[0] + " is device 0"},
		{[]string{"whatif", "--db", db, "--device", "2", "--trace", ids[0]}, 2, "is device 0 (each device of an upload is a trace of its own)"},
		{[]string{"trace", "--workload", "replay", "--db", db, "--device", "2", "--trace", ids[0]}, 2, "is device 0"},
		{[]string{"replay", "--device", "1", log}, 2, "--device picks a device of a snapshot file; " + log + " is an RMM log"},
		{[]string{"replay", "--db", db, "--device", "0", "--trace", ids[0]}, 0, ""},
	} {
		code, _, errs := runCmd(c.args...)
		if code != c.code || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", c.args, code, errs, c.code, c.want)
		}
	}
}

// A setting whose replay could not run (roundup_power2_divisions:4 makes
// the starting layout of a real snapshot too large for its device) shows
// no counts it did not make: no "0" OOMs, no "0 B" peak, and says why.
func TestWhatIfRowOfAReplayThatStopped(t *testing.T) {
	code, out, errs := runCmd("whatif", testkit.Snapshot(t, "no_time_us_segment_churn.pickle"))
	if code != 0 {
		t.Fatalf("exit %d %s", code, errs)
	}
	var row string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "roundup_power2_divisions:4") {
			row = l
		}
	}
	if f := strings.Fields(row); len(f) != 8 || f[1] != "(*)" || strings.Join(f[2:6], " ") != "- - - -" {
		t.Errorf("the row %q", row)
	}
	if !strings.Contains(out, "(*) roundup_power2_divisions:4: the starting layout (22.32 GiB reserved under these settings) does not fit on a 21.01 GiB device") {
		t.Errorf("whatif says\n%s", out)
	}
}
