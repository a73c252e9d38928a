package store

import (
	"errors"
	"reflect"
	"testing"

	"vramscope/gpu"
)

// An upload of two devices keeps what it said: settings and top level,
// annotations in the order written (one for a device without a trace),
// event extras by runs of events, segments as written, every stack.
func TestUploadKeepsWhatItSaid(t *testing.T) { eachBackend(t, testUploadKeepsWhatItSaid) }

func testUploadKeepsWhatItSaid(t *testing.T) {
	db, _ := openTemp(t)
	up := gpu.Upload{Name: "snap", Settings: `{"PYTORCH_CUDA_ALLOC_CONF":"","max_split_size":-1}`, Top: `{"device_traces":3}`}
	id, err := db.CreateUpload(up)
	if err != nil {
		t.Fatal(err)
	}
	var ws []*Writer
	for dev := 0; dev < 2; dev++ {
		meta := testMeta
		meta.DeviceOrdinal, meta.Upload = dev, id
		w, err := db.CreateTrace(meta, nil)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	w := ws[1]
	for i := 1; i <= 3; i++ {
		w.Stack(testStack(i))
	}
	g := newGen(7, 40)
	evs := g.events(200)
	w.Emit(evs)
	extras := []gpu.EventExtra{{CompileContext: "N/A", UserMetadata: "step 1"}, {Action: "annotate", Form: `{"keys":["action","addr"]}`}}
	runs := []gpu.ExtraRun{{Seq: 0, Extra: 1}, {Seq: 50, Extra: 0}, {Seq: 120, Extra: 2}}
	w.EventExtras(extras, runs)
	seg := gpu.Segment{Addr: 1 << 30, Size: 4 << 20, Stream: 7, Pool: gpu.PoolLarge, Blocks: []gpu.Block{
		{Addr: 1 << 30, Size: 1 << 20, Requested: 1000, State: gpu.BlockAllocated, Stack: 2, Seq: -1},
		{Addr: 1<<30 + 1<<20, Size: 3 << 20, Requested: 77, State: gpu.BlockFree, Seq: -1}}}
	segs := []gpu.SnapshotSegment{{Index: 3, Segment: seg, PoolID: [2]int64{1, 2}, Stack: 3, Form: `{"keys":["device"]}`, BlockForms: []string{"", `{"keys":["size"]}`}}}
	w.SnapshotSegments(segs)
	anns := []gpu.Annotation{{Device: 1, TimeUS: 5, Stage: "START", Name: "a"}, {Device: 2, TimeUS: 6, Stage: "START", Name: "b"},
		{Device: 0, TimeUS: 7, Stage: "END", Name: "c", Form: `{"keys":["stage","name","device"]}`}}
	if err := db.AddAnnotations(id, anns); err != nil {
		t.Fatal(err)
	}
	w.Annotate(gpu.Annotation{Device: 1, TimeUS: 9, Stage: "END", Name: "a"})
	for _, w := range ws {
		if err := w.Close(gpu.StatusComplete); err != nil {
			t.Fatal(err)
		}
	}

	got, err := db.Upload(id)
	if err != nil || got.Name != up.Name || got.Settings != up.Settings || got.Top != up.Top || got.Created.IsZero() {
		t.Errorf("upload %+v, %v", got, err)
	}
	traces, err := db.UploadTraces(id)
	if err != nil || len(traces) != 2 || traces[0].DeviceOrdinal != 0 || traces[1].ID != w.ID() || traces[1].Upload != id {
		t.Fatalf("traces %+v, %v", traces, err)
	}
	if tr, _ := db.Trace(w.ID()); tr.Upload != id {
		t.Errorf("trace %s: upload %q", tr.ID, tr.Upload)
	}
	all, err := db.UploadAnnotations(id)
	if want := append(anns, gpu.Annotation{Device: 1, TimeUS: 9, Stage: "END", Name: "a"}); err != nil || !reflect.DeepEqual(all, want) {
		t.Errorf("upload annotations %+v, %v", all, err)
	}
	mine, err := db.Annotations(w.ID())
	if err != nil || len(mine) != 2 || mine[0].Name != "a" || mine[1].Stage != "END" {
		t.Errorf("trace annotations %+v, %v", mine, err)
	}
	gx, gr, err := db.EventExtras(w.ID())
	if err != nil || !reflect.DeepEqual(gx, extras) || !reflect.DeepEqual(gr, runs) {
		t.Errorf("extras %+v runs %+v, %v", gx, gr, err)
	}
	for seq, want := range map[int64]int{0: 1, 49: 1, 50: 0, 119: 0, 120: 2, 199: 2} {
		x, ok, err := db.EventExtra(w.ID(), seq)
		if err != nil || ok != (want > 0) || ok && x != extras[want-1] {
			t.Errorf("event %d: %+v %v %v, want extra %d", seq, x, ok, err, want)
		}
	}
	gs, err := db.SnapshotSegments(w.ID())
	if err != nil || !reflect.DeepEqual(gs, segs) {
		t.Errorf("segments %+v, %v", gs, err)
	}
	if gs, _ := db.SnapshotSegments(ws[0].ID()); len(gs) != 0 {
		t.Errorf("device 0 has segments %+v", gs)
	}
	stacks, err := db.Stacks(w.ID())
	if err != nil || len(stacks) != 3 || !reflect.DeepEqual(stacks[1], testStack(2)) {
		t.Errorf("stacks %v, %v", stacks, err)
	}
}

// Deleting an upload's traces deletes it once the last one is gone;
// DeleteUpload takes everything; a trace cannot join an upload that does
// not exist.
func TestUploadsGoWithTheirTraces(t *testing.T) { eachBackend(t, testUploadsGoWithTheirTraces) }

func testUploadsGoWithTheirTraces(t *testing.T) {
	db, _ := openTemp(t)
	empty := countRows(t, db)
	id, err := db.CreateUpload(gpu.Upload{Name: "u", Top: "{}"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for dev := 0; dev < 2; dev++ {
		meta := testMeta
		meta.DeviceOrdinal, meta.Upload = dev, id
		w, err := db.CreateTrace(meta, nil)
		if err != nil {
			t.Fatal(err)
		}
		w.Emit(newGen(1, 10).events(100))
		w.EventExtras([]gpu.EventExtra{{UserMetadata: "x"}}, []gpu.ExtraRun{{Seq: 3, Extra: 1}})
		if err := w.Close(gpu.StatusComplete); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, w.ID())
	}
	if err := db.AddAnnotations(id, []gpu.Annotation{{Device: 0, Stage: "START"}, {Device: 5, Stage: "START"}}); err != nil {
		t.Fatal(err)
	}
	if err := db.DeleteTrace(ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Upload(id); err != nil {
		t.Fatalf("the upload went with its first trace: %v", err)
	}
	if err := db.DeleteTrace(ids[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Upload(id); !errors.Is(err, ErrNotFound) {
		t.Errorf("the upload outlived its traces: %v", err)
	}
	var n int
	db.r.QueryRow("SELECT count(*) FROM annotations").Scan(&n)
	if n != 0 || countRows(t, db) != empty {
		t.Errorf("%d annotations, %d rows left", n, countRows(t, db)-empty)
	}

	id, _ = db.CreateUpload(gpu.Upload{Name: "v", Top: "{}"})
	meta := testMeta
	meta.Upload = id
	w, err := db.CreateTrace(meta, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.Emit(newGen(2, 10).events(100))
	w.Annotate(gpu.Annotation{Stage: "START"})
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	if err := db.DeleteUpload(id); err != nil {
		t.Fatal(err)
	}
	db.r.QueryRow("SELECT count(*) FROM uploads").Scan(&n)
	if n != 0 || countRows(t, db) != empty {
		t.Errorf("%d uploads, %d rows left", n, countRows(t, db)-empty)
	}

	meta.Upload = "nonesuch"
	if _, err := db.CreateTrace(meta, nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("joined a missing upload: %v", err)
	}
}

// Marks are a trace's annotations in time order (ties as written), with
// time, stage and name.
func TestMarks(t *testing.T) { eachBackend(t, testMarks) }

func testMarks(t *testing.T) {
	db, _ := openTemp(t)
	w, err := db.CreateTrace(testMeta, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.Annotate(gpu.Annotation{TimeUS: 9, Stage: "END", Name: "a", Form: `{"keys":["name"]}`, Device: 3},
		gpu.Annotation{TimeUS: 5, Stage: "START", Name: "a"}, gpu.Annotation{TimeUS: 9, Stage: "START", Name: "b"})
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	got, err := db.Marks(w.ID())
	want := []gpu.Annotation{{TimeUS: 5, Stage: "START", Name: "a"}, {TimeUS: 9, Stage: "END", Name: "a"}, {TimeUS: 9, Stage: "START", Name: "b"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("marks %+v, %v", got, err)
	}
	if _, err := db.Marks("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("an unknown trace: %v", err)
	}
}
