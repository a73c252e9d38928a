package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"vramscope/gpu"
	"vramscope/internal/hostile"
	"vramscope/internal/testkit"
	"vramscope/store"
)

// TestExportImportRoundTrip: import(export(t)) gives back the same trace:
// the same events, the same stacks, the same layouts.
func TestExportImportRoundTrip(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "e.db")
	if code, _, errs := runCmd("trace", "--workload", "frag", "--capacity", "4GiB", "--alloc-conf", "expandable_segments:True", "--db", db, "--quiet"); code != 0 {
		t.Fatal(errs)
	}
	if code, _, errs := runCmd("trace", "--workload", "train", "--layers", "2", "--hidden", "512", "--steps", "2", "--db", db, "--quiet"); code != 0 {
		t.Fatal(errs)
	}
	s, err := store.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	traces, _ := s.Traces()
	s.Close()
	for _, orig := range traces {
		file := filepath.Join(dir, orig.ID+".pickle")
		if code, _, errs := runCmd("export", orig.ID, "-o", file, "--db", db); code != 0 {
			t.Fatalf("export: %s", errs)
		}
		db2 := filepath.Join(dir, orig.ID+".db")
		code, out, errs := runCmd("import", file, "--db", db2)
		if code != 0 {
			t.Fatalf("import: %s", errs)
		}
		if strings.Contains(errs, "mismatch") {
			t.Errorf("import reported mismatches: %s", errs)
		}
		a, _ := store.Open(db)
		b, _ := store.Open(db2)
		back, _ := b.Traces()
		if len(back) != 1 {
			t.Fatalf("%d traces after import: %s", len(back), out)
		}
		ea, err1 := a.Events(orig.ID, 0, orig.LastSeq+1)
		eb, err2 := b.Events(back[0].ID, 0, back[0].LastSeq+1)
		if err1 != nil || err2 != nil || len(ea) != len(eb) || len(ea) == 0 {
			t.Fatalf("%s: %d events, then %d (%v %v)", orig.Name, len(ea), len(eb), err1, err2)
		}
		for i := range ea {
			x, y := ea[i], eb[i]
			sx, _ := a.Stack(orig.ID, x.Stack)
			sy, _ := b.Stack(back[0].ID, y.Stack)
			x.Stack, y.Stack = 0, 0
			if x.Pool != y.Pool && (x.Action == gpu.ActionSegmentAlloc || x.Action == gpu.ActionSegmentMap) {
				y.Pool = x.Pool // snapshots name no pool per event; it is read from the segment
			}
			x.Pool, y.Pool = 0, 0
			if x != y || !equalStacks(sx, sy) {
				t.Fatalf("%s: event %d: %v then %v", orig.Name, i, ea[i], eb[i])
			}
		}
		la, _, _ := a.LayoutAtSeq(orig.ID, orig.LastSeq)
		lb, _, _ := b.LayoutAtSeq(back[0].ID, back[0].LastSeq)
		if la.Figures() != lb.Figures() {
			t.Errorf("%s: final layout %+v then %+v", orig.Name, la.Figures(), lb.Figures())
		}
		if back[0].Settings != orig.Settings || back[0].PeakReserved != orig.PeakReserved || back[0].OOMs != orig.OOMs {
			t.Errorf("%s: trace %+v then %+v", orig.Name, orig, back[0])
		}
		a.Close()
		b.Close()
	}
}

func equalStacks(a, b gpu.Stack) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// compareScript is pytorch/testdata/compare_snapshots.py: it unpickles
// snapshots with CPython's standard library and compares them as values.
func compareScript(t *testing.T) string {
	b, err := os.ReadFile("../../pytorch/testdata/compare_snapshots.py")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type comparison struct {
	Equal bool     `json:"equal"`
	Diffs []string `json:"diffs"`
	Order []string `json:"order"`
}

// importJSON imports a snapshot and returns its trace ids by device.
func importJSON(t *testing.T, file, db string) map[int]string {
	t.Helper()
	code, out, errs := runCmd("import", file, "--db", db, "--json")
	if code != 0 {
		t.Fatalf("import %s: %s", filepath.Base(file), errs)
	}
	var res struct {
		Devices []struct {
			Device  int    `json:"device"`
			TraceID string `json:"trace_id"`
		} `json:"devices"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	ids := map[int]string{}
	for _, d := range res.Devices {
		ids[d.Device] = d.TraceID
	}
	return ids
}

// Every real snapshot of both sets, imported and exported, unpickles (CPython,
// standard library) to the value the original unpickles to, with every
// dict's keys in the original order; so does one device exported alone.
// The exception: a snapshot with no segments and no events on any device
// is refused on import, so it has no round trip.
func TestExportRealSnapshotsSameValue(t *testing.T) {
	files := append(testkit.RealFiles(t, "pytorch"), testkit.RealFiles(t, "pytorch-2.11")...)
	tmp := t.TempDir()
	db := filepath.Join(tmp, "rt.db")
	var args []string
	for _, file := range files {
		base := filepath.Base(file)
		if base == "empty_four_devices.pickle" {
			if code, _, errs := runCmd("import", file, "--db", db); code == 0 || !strings.Contains(errs, "no segments and no trace events") {
				t.Errorf("%s: exit %d: %s", base, code, errs)
			}
			continue
		}
		ids := importJSON(t, file, db)
		out := filepath.Join(tmp, base)
		if code, _, errs := runCmd("export", ids[minKey(ids)], "-o", out, "--db", db); code != 0 {
			t.Fatalf("export %s: %s", base, errs)
		}
		args = append(args, file, out)
		if base == "expandable_oom_multigpu.pickle" {
			alone := filepath.Join(tmp, "device1-"+base)
			if code, _, errs := runCmd("export", ids[0], "--device", "1", "-o", alone, "--db", db); code != 0 {
				t.Fatalf("export --device 1: %s", errs)
			}
			args = append(args, file+"@1", alone)
		}
	}
	if len(args) < 2*(len(files)-1) {
		t.Fatalf("only %d round trips", len(args)/2)
	}
	var got map[string]comparison
	if err := json.Unmarshal(testkit.Python3(t, compareScript(t), args...), &got); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(args); i += 2 {
		c, ok := got[args[i]]
		if !ok || !c.Equal || len(c.Diffs) > 0 || len(c.Order) > 0 {
			t.Errorf("%s: %+v", filepath.Base(args[i]), c)
		}
	}
}

func minKey(m map[int]string) int {
	k := -1
	for d := range m {
		if k < 0 || d < k {
			k = d
		}
	}
	return k
}

// vizFigures computes, in the manner of torch/cuda/_memory_viz.py, per
// device: bytes of blocks by state, segment sums, totals, trace entries
// by action, and the annotations and settings keys.
const vizFigures = `
import json, pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
out = {}
def dev(d):
    return out.setdefault(str(d), {"segments": 0, "reserved": 0, "states": {}, "seg_allocated": 0, "seg_active": 0,
        "seg_requested": 0, "requested": 0, "actions": {}, "framed": 0, "annotations": []})
for seg in s["segments"]:
    f = dev(seg["device"])
    f["segments"] += 1
    f["reserved"] += seg["total_size"]
    f["seg_allocated"] += seg["allocated_size"]
    f["seg_active"] += seg["active_size"]
    f["seg_requested"] += seg["requested_size"]
    for b in seg["blocks"]:
        f["states"][b["state"]] = f["states"].get(b["state"], 0) + b["size"]
        if b["state"] == "active_allocated":
            f["requested"] += b["requested_size"]
for d, t in enumerate(s["device_traces"]):
    f = dev(d)
    for e in t:
        f["actions"][e["action"]] = f["actions"].get(e["action"], 0) + 1
        f["framed"] += bool(e["frames"])
for a in s["external_annotations"]:
    dev(a["device"])["annotations"].append([a["stage"], a["name"], a["time_us"]])
json.dump({"devices": out, "settings": list(s["allocator_settings"])}, sys.stdout)
`

type vizDevice struct {
	Segments     int               `json:"segments"`
	Reserved     uint64            `json:"reserved"`
	States       map[string]uint64 `json:"states"`
	SegAllocated uint64            `json:"seg_allocated"`
	SegActive    uint64            `json:"seg_active"`
	SegRequested uint64            `json:"seg_requested"`
	Requested    uint64            `json:"requested"`
	Actions      map[string]int    `json:"actions"`
	Framed       int               `json:"framed"`
	Annotations  [][3]any          `json:"annotations"`
}

// A recorded workload exports with its frames, its step annotations and
// its settings, and the figures _memory_viz.py would compute from the file
// are the trace's own.
func TestExportWorkloadFigures(t *testing.T) {
	tmp := t.TempDir()
	db := filepath.Join(tmp, "w.db")
	runs := [][]string{
		{"--workload", "train", "--layers", "2", "--hidden", "512", "--steps", "3", "--alloc-conf", "max_split_size_mb:64"},
		{"--workload", "frag", "--capacity", "4GiB", "--alloc-conf", "expandable_segments:True"},
	}
	for _, run := range runs {
		if code, _, errs := runCmd(append(append([]string{"trace"}, run...), "--db", db, "--quiet")...); code != 0 && !strings.Contains(errs, "out of memory") {
			t.Fatal(errs)
		}
	}
	s, err := store.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	traces, err := s.Traces()
	if err != nil || len(traces) != 2 {
		t.Fatalf("%d traces: %v", len(traces), err)
	}
	for _, tr := range traces {
		file := filepath.Join(tmp, tr.ID+".pickle")
		if code, _, errs := runCmd("export", tr.ID, "-o", file, "--db", db); code != 0 {
			t.Fatal(errs)
		}
		var got struct {
			Devices  map[string]vizDevice `json:"devices"`
			Settings []string             `json:"settings"`
		}
		if err := json.Unmarshal(testkit.Python3(t, vizFigures, file), &got); err != nil {
			t.Fatal(err)
		}
		final, _, err := s.LayoutAtSeq(tr.ID, tr.LastSeq)
		if err != nil {
			t.Fatal(err)
		}
		fg := final.Figures()
		states := map[string]uint64{}
		for _, seg := range final.Segments {
			for _, b := range seg.Blocks {
				states[b.State.String()] += b.Size
			}
		}
		events, err := s.Events(tr.ID, 0, tr.LastSeq+1)
		if err != nil {
			t.Fatal(err)
		}
		actions, framed := map[string]int{}, 0
		for _, e := range events {
			actions[e.Action.String()]++
			if e.Stack != 0 {
				framed++
			}
		}
		anns, err := s.Annotations(tr.ID)
		if err != nil {
			t.Fatal(err)
		}
		d := got.Devices[fmt.Sprint(tr.DeviceOrdinal)]
		if d.Segments != fg.Segments || d.Reserved != fg.Reserved || d.SegAllocated != fg.Allocated || d.SegActive != fg.Active ||
			d.SegRequested != fg.Requested || d.Requested != fg.Requested || !reflect.DeepEqual(d.States, states) {
			t.Errorf("%s: segments: python %+v, trace %+v %v", tr.Name, d, fg, states)
		}
		if !reflect.DeepEqual(d.Actions, actions) || d.Framed != framed || framed == 0 {
			t.Errorf("%s: trace entries: python %v (%d with frames), trace %v (%d)", tr.Name, d.Actions, d.Framed, actions, framed)
		}
		if len(anns) == 0 || len(d.Annotations) != len(anns) {
			t.Fatalf("%s: %d annotations exported, %d stored", tr.Name, len(d.Annotations), len(anns))
		}
		for i, a := range anns {
			if w := [3]any{a.Stage, a.Name, float64(a.TimeUS)}; d.Annotations[i] != w {
				t.Errorf("%s: annotation %d: %v, want %v", tr.Name, i, d.Annotations[i], w)
			}
		}
		want := []string{"PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "garbage_collection_threshold", "expandable_segments",
			"pinned_num_register_threads", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register", "roundup_power2_divisions"}
		if !reflect.DeepEqual(got.Settings, want) {
			t.Errorf("%s: settings %v", tr.Name, got.Settings)
		}
	}
	if code, _, errs := runCmd("export", traces[0].ID, "--device", "5", "-o", filepath.Join(tmp, "x.pickle"), "--db", db); code != 2 || !strings.Contains(errs, "no device 5") {
		t.Errorf("--device 5: exit %d: %s", code, errs)
	}
}

// newerSnapshot writes a snapshot with what no shared real file has:
// keys vramscope does not know at every level, values it holds otherwise
// (a stream beyond int64, a pool id as a list, an odd segment type, a
// dict user_metadata, an unknown action), FX frame fields, frames written
// in another key order, and one large unknown value that every trace
// entry shares.
const newerSnapshot = `
import pickle, sys
fx = {"name": "f", "filename": "a.py", "line": 3, "fx_node_op": "call_function", "fx_node_name": "mm"}
old = {"filename": "b.py", "name": "g", "line": 4}
shared = {"forward": ["layer%d" % i for i in range(5000)]}
blocks = [
    {"address": 4096, "size": 1024, "requested_size": 1000, "state": "active_pending_free", "frames": [fx, old], "tag": 1},
    {"address": 5120, "size": 2096128, "requested_size": 17, "state": "inactive", "frames": []},
]
seg = {"device": 0, "address": 4096, "total_size": 2097152, "allocated_size": 0, "active_size": 1024, "requested_size": 0,
       "stream": 2**63 + 5, "segment_type": "weird", "segment_pool_id": [1, 2], "is_expandable": False, "frames": [old],
       "blocks": blocks, "x": (1, 2.5, None, b"\xff")}
entries = [{"action": "alloc", "addr": 4096, "size": 1000, "stream": 2**63 + 5, "time_us": 10, "compile_context": "N/A",
            "user_metadata": {"step": 1}, "pool_id": (1, 2), "shared": shared, "frames": [fx]}]
for i in range(1000):
    entries.append({"action": "annotate", "addr": 4096, "size": 0, "stream": 2**63 + 5, "time_us": 11 + i,
                    "user_metadata": "note %d" % (i % 3), "shared": shared})
entries.append({"action": "free_requested", "addr": 4096, "size": 1000, "stream": 2**63 + 5, "time_us": 2000, "frames": [fx]})
snap = {"device_traces": [entries], "segments": [seg],
        "allocator_settings": {"expandable_segments": False, "PYTORCH_CUDA_ALLOC_CONF": "", "future_key": [1, 2]},
        "external_annotations": [{"stage": "START", "name": "fwd", "device": 0, "time_us": 9, "extra": {"k": 1}},
                                 {"name": "fwd", "stage": "END", "device": 0, "time_us": 2001}],
        "host_segments": [], "host_traces": [[{"action": "alloc", "addr": 1, "size": 2, "stream": 0, "time_us": 3}]]}
pickle.dump(snap, open(sys.argv[1], "wb"), protocol=4)
`

// What no real file has survives import, store and export too, and a
// large value that every trace entry shares is kept and written once.
func TestExportKeepsWhatItDoesNotInterpret(t *testing.T) {
	tmp := t.TempDir()
	orig, out, db := filepath.Join(tmp, "newer.pickle"), filepath.Join(tmp, "out.pickle"), filepath.Join(tmp, "n.db")
	testkit.Python3(t, newerSnapshot, orig)
	ids := importJSON(t, orig, db)
	if code, _, errs := runCmd("export", ids[0], "-o", out, "--db", db); code != 0 {
		t.Fatal(errs)
	}
	var got map[string]comparison
	if err := json.Unmarshal(testkit.Python3(t, compareScript(t), orig, out), &got); err != nil {
		t.Fatal(err)
	}
	if c := got[out]; !c.Equal || len(c.Diffs) > 0 || len(c.Order) > 0 {
		t.Errorf("%+v", c)
	}
	a, _ := os.Stat(orig)
	b, _ := os.Stat(out)
	if b.Size() > a.Size()+a.Size()/10 {
		t.Errorf("the export has %d bytes, the original %d: the shared value is written more than once", b.Size(), a.Size())
	}
	s, err := store.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	extras, runs, err := s.EventExtras(ids[0])
	if err != nil || len(extras) != 5 || len(runs) != 1002 {
		t.Errorf("%d extras in %d runs, want 5 in 1002: %v", len(extras), len(runs), err)
	}
	if x, ok, _ := s.EventExtra(ids[0], 2); !ok || x.Action != "annotate" || x.UserMetadata != "note 1" {
		t.Errorf("event 2: %+v", x)
	}
}

// What export and compare say of real snapshots reads right: the devices
// written by number, and a snapshot without trace entries as the layout
// before the first event (not "after event -1"), in the profile too.
func TestExportAndCompareWordingOfRealSnapshots(t *testing.T) {
	tmp := t.TempDir()
	db := filepath.Join(tmp, "w.db")
	multi := importJSON(t, testkit.Snapshot(t, "expandable_oom_multigpu.pickle"), db)
	listOnly := importJSON(t, testkit.Snapshot(t, "segments_list_only.pkl"), db)[1]
	twoGPUs := importJSON(t, testkit.Snapshot(t, "two_gpus_expandable_state_only.pickle"), db)[0]
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{multi[1]}, ": devices 0, 1 and 2, 7923 events, 12 segments;"},
		{[]string{multi[1], "--device", "1"}, ": device 1, 596 events, 8 segments;"},
		{[]string{listOnly, "--format", "pprof"}, ": 1938 live allocations, 3353639424 bytes, before the first event;"},
	} {
		args := append([]string{"export", "-o", filepath.Join(tmp, "out"), "--db", db}, c.args...)
		code, _, errs := runCmd(args...)
		if code != 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, %q; want %q", args, code, errs, c.want)
		}
	}
	f, err := os.Open(filepath.Join(tmp, "out"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Comments) != 1 || !strings.HasSuffix(p.Comments[0], "device 1, the live allocations before the first event") {
		t.Errorf("profile comments %q", p.Comments)
	}
	code, out, errs := runCmd("compare", "--db", db, "--group", "category", "--rows", "2", listOnly, twoGPUs)
	if code != 0 {
		t.Fatalf("compare: exit %d %s", code, errs)
	}
	for _, want := range []string{"A 3.12 GiB before the first event · B 8.16 MiB before the first event", "(1 more group)\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("compare says\n%s\nwant %q", out, want)
		}
	}
	if strings.Contains(out, "event -1") {
		t.Errorf("compare says\n%s", out)
	}
}

// An export that fails part-way (the disk fills) leaves no half snapshot
// behind and does not spoil the file it was to replace.
func TestExportWholeOrNothing(t *testing.T) {
	db := filepath.Join(t.TempDir(), "v.db")
	code, out, errs := runCmd("import", testkit.Snapshot(t, "training_22k_user_metadata.pickle"), "--db", db, "--json")
	if code != 0 {
		t.Fatal(errs)
	}
	var imported struct {
		Devices []struct {
			Trace string `json:"trace_id"`
		} `json:"devices"`
	}
	if err := json.Unmarshal([]byte(out), &imported); err != nil || len(imported.Devices) != 1 {
		t.Fatalf("import said %s (%v)", out, err)
	}
	dir := hostile.SmallDisk(t, 4<<20)
	file := filepath.Join(dir, "t.pickle")
	if err := os.WriteFile(file, []byte("the last export"), 0o644); err != nil {
		t.Fatal(err)
	}
	hostile.Fill(t, dir, 8<<10)
	for _, format := range []string{"pickle", "pprof"} {
		args := []string{"export", imported.Devices[0].Trace, "--format", format, "-o", file, "--db", db}
		if format == "pprof" {
			args = append(args, "--all-frames") // the biggest profile
		}
		if code, _, errs := runCmd(args...); code == 0 || !strings.Contains(errs, "no space left") {
			t.Fatalf("%s export to a full disk: exit %d, %s", format, code, errs)
		}
		if b, err := os.ReadFile(file); err != nil || string(b) != "the last export" {
			t.Fatalf("%s: the file it was to replace holds %.40q (%v)", format, b, err)
		}
		names, _ := filepath.Glob(filepath.Join(dir, "*t.pickle*"))
		if len(names) != 1 {
			t.Fatalf("%s: left %v", format, names)
		}
	}
}
