package compare_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"vramscope/attrib"
	"vramscope/compare"
	"vramscope/incident"
	"vramscope/ingest"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/store"
	"vramscope/tracer"
)

// smallTrain is a training run small enough for tests, its attention
// probabilities (model.py:34) the largest activation.
func smallTrain(checkpointing bool, seq int) tracer.Train {
	w := tracer.DefaultTrain()
	w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 4, 512, 2048, 4, seq, 3
	w.Checkpointing = checkpointing
	return w
}

// Compared with itself, a trace differs nowhere: every moment is the same
// instant in both, every group has a zero delta, and the largest
// divergence is zero.
func TestCompareWithItself(t *testing.T) {
	db := testkit.OpenDB(t)
	id := testkit.Record(t, db, "train", smallTrain(false, 512), 80<<30, "")
	for _, al := range []compare.Align{compare.ByTime, compare.ByStep, compare.ByEvent} {
		for _, g := range []attrib.Grouping{attrib.ByFrame, attrib.ByStack, attrib.ByCategory} {
			r, err := compare.Compare(db, id, id, compare.Options{Align: al, Group: g, Rows: -1})
			if err != nil {
				t.Fatal(err)
			}
			if r.Align != al || len(r.Moments) != 3 {
				t.Fatalf("%s/%s: aligned by %s, %d moments", al, g, r.Align, len(r.Moments))
			}
			for _, m := range r.Moments {
				if m.A != m.B || m.Divergence != 0 || (len(m.Rows) == 0) != (m.A.Allocated == 0) || len(m.Rows) != m.RowsTotal {
					t.Errorf("%s/%s %s: A %+v B %+v divergence %d, %d of %d rows", al, g, m.Key, m.A, m.B, m.Divergence, len(m.Rows), m.RowsTotal)
				}
				var sum uint64
				for _, d := range m.Rows {
					if d.Delta != 0 || d.A != d.B || d.CountA != d.CountB {
						t.Errorf("%s/%s %s: %+v", al, g, m.Key, d)
					}
					sum += d.A
				}
				if sum != m.A.Allocated {
					t.Errorf("%s/%s %s: rows hold %d bytes of %d", al, g, m.Key, sum, m.A.Allocated)
				}
			}
			for _, f := range r.Figures {
				if f.Key != "memory_needed" && (f.Delta != 0 || f.A != f.B) {
					t.Errorf("%+v", f)
				}
			}
			for _, s := range r.Settings {
				if s.Differs {
					t.Errorf("%+v", s)
				}
			}
			for i := range r.Timeline.A.AllocMax {
				if r.Timeline.A.AllocMax[i] != r.Timeline.B.AllocMax[i] || r.Timeline.A.AllocMin[i] != r.Timeline.B.AllocMin[i] {
					t.Fatalf("%s/%s: column %d differs", al, g, i)
				}
			}
		}
	}
}

// Two runs whose steps take different times: by time their steps start
// apart, by step each step N of B starts where A's does, and the live sets
// at A's peak are read at A's own peak event.
func TestCompareByStep(t *testing.T) {
	db := testkit.OpenDB(t)
	a := testkit.Record(t, db, "long", smallTrain(false, 1024), 80<<30, "")
	b := testkit.Record(t, db, "short", smallTrain(false, 512), 80<<30, "")
	byTime, err := compare.Compare(db, a, b, compare.Options{Align: compare.ByTime})
	if err != nil {
		t.Fatal(err)
	}
	r, err := compare.Compare(db, a, b, compare.Options{Align: compare.ByStep})
	if err != nil {
		t.Fatal(err)
	}
	if r.Align != compare.ByStep || r.Note != "" || len(r.A.Steps) != 3 || len(r.B.Steps) != 3 {
		t.Fatalf("aligned by %s (%s), steps %v and %v", r.Align, r.Note, r.A.Steps, r.B.Steps)
	}
	for i := range r.A.Steps {
		if r.A.Steps[i] != r.B.Steps[i] || r.A.Steps[i].N != i {
			t.Errorf("step %d: A %+v, B %+v", i, r.A.Steps[i], r.B.Steps[i])
		}
		if i > 0 && byTime.A.Steps[i].X == byTime.B.Steps[i].X {
			t.Errorf("by time, step %d starts at the same place in both (%d): the test shows nothing", i, byTime.A.Steps[i].X)
		}
	}
	// A's time axis: A's steps sit where its annotations say.
	ta, _ := db.Trace(a)
	if r.A.Steps[1].X != byTime.A.Steps[1].X || r.Timeline.Unit != "us" {
		t.Errorf("A's step 1 at %d by step, %d by time", r.A.Steps[1].X, byTime.A.Steps[1].X)
	}
	peak := r.Moments[0]
	if peak.Key != "peak_a" || peak.A.Seq != ta.PeakSeq || peak.A.Allocated != ta.PeakAllocated {
		t.Errorf("A's peak %+v, the trace's %d bytes after %d", peak.A, ta.PeakAllocated, ta.PeakSeq)
	}
	// At A's peak (in step N), B is in step N too.
	tb, _ := db.Trace(b)
	stepOf := func(steps []compare.StepMark, x int64) int {
		n := -1
		for _, s := range steps {
			if s.X <= x {
				n = s.N
			}
		}
		return n
	}
	if sa, sb := stepOf(r.A.Steps, peak.X), stepOf(r.B.Steps, peak.X); sa != sb || sa < 0 {
		t.Errorf("A's peak is in step %d, B then in step %d (B's peak %d bytes)", sa, sb, tb.PeakAllocated)
	}

	// By event index the axis counts events.
	r, err = compare.Compare(db, a, b, compare.Options{Align: compare.ByEvent})
	if err != nil {
		t.Fatal(err)
	}
	if r.Timeline.Unit != "event" || r.Moments[0].X != ta.PeakSeq-ta.FirstSeq {
		t.Errorf("by event: unit %s, A's peak at %d", r.Timeline.Unit, r.Moments[0].X)
	}
}

// Real snapshots: two cs336 training runs of different models compare
// without error, and at every moment each side's groups add up to that
// side's allocated bytes there.
func TestCompareRealSnapshots(t *testing.T) {
	db := testkit.OpenDB(t)
	ids := importSnapshots(t, db, "training_22k_user_metadata.pickle", "uint64_line_annotations.pickle")
	for _, al := range []compare.Align{compare.ByTime, compare.ByStep, compare.ByEvent} {
		for _, g := range []attrib.Grouping{attrib.ByFrame, attrib.ByStack, attrib.ByCategory} {
			r, err := compare.Compare(db, ids[0], ids[1], compare.Options{Align: al, Group: g, Rows: -1})
			if err != nil {
				t.Fatalf("%s/%s: %v", al, g, err)
			}
			for _, m := range r.Moments {
				var sa, sb uint64
				for _, d := range m.Rows {
					sa, sb = sa+d.A, sb+d.B
				}
				if sa != m.A.Allocated || sb != m.B.Allocated || m.Divergence != int64(m.B.Allocated)-int64(m.A.Allocated) {
					t.Errorf("%s/%s %s: rows %d and %d, allocated %d and %d", al, g, m.Key, sa, sb, m.A.Allocated, m.B.Allocated)
				}
				for k, p := range []compare.Point{m.A, m.B} {
					ls, err := db.LiveAtSeq(ids[k], p.Seq)
					if err != nil {
						t.Fatal(err)
					}
					if ls.Bytes() != p.Allocated {
						t.Errorf("%s %s: side %d live set %d bytes, point %d", al, m.Key, k, ls.Bytes(), p.Allocated)
					}
				}
			}
			peakA, peakB := r.Moments[0], r.Moments[1]
			if peakA.A.Allocated != r.A.PeakAllocated || peakB.B.Allocated != r.B.PeakAllocated {
				t.Errorf("%s: peaks %d and %d, the traces' %d and %d", al, peakA.A.Allocated, peakB.B.Allocated, r.A.PeakAllocated, r.B.PeakAllocated)
			}
			div := r.Moments[2]
			for _, m := range r.Moments {
				if abs(m.Divergence) > abs(div.Divergence) && m.X >= max(r.A.Range[0], r.B.Range[0]) && m.X <= min(r.A.Range[1], r.B.Range[1]) {
					t.Errorf("%s: %s diverges by %d, more than the largest divergence %d", al, m.Key, m.Divergence, div.Divergence)
				}
			}
		}
	}
}

// A snapshot without time_us has event indexes for times: compared by
// time or step, with it or with a timed trace, the axis counts events
// and says why, so event #5317 never reads as 5.32 ms.
func TestCompareNoTime(t *testing.T) {
	db := testkit.OpenDB(t)
	ids := importSnapshots(t, db, "no_time_us_segment_churn.pickle", "training_22k_user_metadata.pickle")
	for _, pair := range [][2]string{{ids[0], ids[1]}, {ids[1], ids[0]}, {ids[0], ids[0]}} {
		for _, al := range []compare.Align{compare.ByTime, compare.ByStep, compare.ByEvent} {
			r, err := compare.Compare(db, pair[0], pair[1], compare.Options{Align: al})
			if err != nil {
				t.Fatal(err)
			}
			if r.Align != compare.ByEvent || r.Timeline.Unit != "event" || r.Asked != al {
				t.Errorf("%s: aligned by %s, unit %s", al, r.Align, r.Timeline.Unit)
			}
			if (al != compare.ByEvent) != strings.Contains(r.Note, "no time_us") {
				t.Errorf("%s: note %q", al, r.Note)
			}
			if pair[0] == ids[0] && r.A.Range[1] != r.A.LastSeq-r.A.FirstSeq {
				t.Errorf("%s: A's range %v, events %d..%d", al, r.A.Range, r.A.FirstSeq, r.A.LastSeq)
			}
		}
	}
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// EventTotals agree with the trace's peaks.
func TestEventTotals(t *testing.T) {
	db := testkit.OpenDB(t)
	id := testkit.Record(t, db, "train", smallTrain(true, 256), 80<<30, "")
	tr, _ := db.Trace(id)
	s, err := db.EventTotals(id, store.MaxEventTotals)
	if err != nil {
		t.Fatal(err)
	}
	var peak, res uint64
	at := int64(-1)
	for i, v := range s.Allocated {
		if v > peak {
			peak, at = v, s.Seq[i]
		}
		res = max(res, s.Reserved[i])
	}
	if int64(len(s.Seq)) != tr.Events || peak != tr.PeakAllocated || at != tr.PeakSeq || res != tr.PeakReserved {
		t.Errorf("%d events, peak %d after %d, reserved %d; the trace: %+v", len(s.Seq), peak, at, res, tr)
	}
}

// A trace of more events than a comparison holds is sampled: the kept
// events rise in seq from the first to the last, hold the peaks of
// allocated (at the peak's own event) and reserved bytes, and compared
// with itself it differs nowhere.
func TestSampledTrace(t *testing.T) {
	db := testkit.OpenDB(t)
	id := testkit.Record(t, db, "train", smallTrain(true, 256), 80<<30, "")
	tr, _ := db.Trace(id)
	const most = 300
	s, err := db.EventTotals(id, most)
	if err != nil {
		t.Fatal(err)
	}
	if s.Every < 2 || len(s.Seq) > most+2 || len(s.Seq) < most/4 {
		t.Fatalf("%d of %d events kept, every %d", len(s.Seq), tr.Events, s.Every)
	}
	if s.Seq[0] != tr.FirstSeq || s.Seq[len(s.Seq)-1] != tr.LastSeq {
		t.Errorf("kept events %d..%d, the trace's %d..%d", s.Seq[0], s.Seq[len(s.Seq)-1], tr.FirstSeq, tr.LastSeq)
	}
	var peak, res uint64
	at := int64(-1)
	for i, v := range s.Allocated {
		if i > 0 && s.Seq[i] <= s.Seq[i-1] {
			t.Fatalf("seq %d after %d", s.Seq[i], s.Seq[i-1])
		}
		if v > peak {
			peak, at = v, s.Seq[i]
		}
		res = max(res, s.Reserved[i])
	}
	if peak != tr.PeakAllocated || at != tr.PeakSeq || res != tr.PeakReserved {
		t.Errorf("sampled: peak %d after %d, reserved %d; the trace: %d after %d, %d", peak, at, res, tr.PeakAllocated, tr.PeakSeq, tr.PeakReserved)
	}
	for _, al := range []compare.Align{compare.ByTime, compare.ByEvent} {
		r, err := compare.Compare(db, id, id, compare.Options{Align: al, MaxEvents: most})
		if err != nil {
			t.Fatal(err)
		}
		if r.A.SampledEvery != s.Every || r.B.SampledEvery != s.Every {
			t.Errorf("%s: sampled every %d and %d, want %d", al, r.A.SampledEvery, r.B.SampledEvery, s.Every)
		}
		for _, m := range r.Moments {
			if m.Divergence != 0 || m.A != m.B {
				t.Errorf("%s: %s: %+v against %+v", al, m.Key, m.A, m.B)
			}
			for _, row := range m.Rows {
				if row.Delta != 0 {
					t.Errorf("%s: %s: %+v", al, m.Key, row)
				}
			}
		}
		if pa := r.Moments[0]; pa.A.Seq != tr.PeakSeq || pa.A.Allocated != tr.PeakAllocated {
			t.Errorf("%s: A's peak moment %+v, the trace peaks at %d after %d", al, pa.A, tr.PeakAllocated, tr.PeakSeq)
		}
	}
}

// importSnapshots imports real snapshots (of shared/testdata/pytorch, or
// SET/NAME of another set) and returns their first traces.
func importSnapshots(tb testing.TB, db *store.DB, names ...string) []string {
	var ids []string
	for _, name := range names {
		set, file, ok := strings.Cut(name, "/")
		if !ok {
			set, file = "pytorch", name
		}
		path := testkit.SnapshotOf(tb, set, file)
		f, err := os.Open(path)
		if err != nil {
			tb.Fatal(err)
		}
		got, err := ingest.Snapshot(db, f, name, pytorch.Options{})
		f.Close()
		if err != nil {
			tb.Fatal(err)
		}
		ids = append(ids, got[0])
	}
	return ids
}

// Snapshots without events (the state at one instant) compare too: every
// moment is that state.
func TestCompareStateOnly(t *testing.T) {
	db := testkit.OpenDB(t)
	f, err := os.Open(testkit.Snapshot(t, "two_gpus_expandable_state_only.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	devs, err := ingest.Snapshot(db, f, "state", pytorch.Options{})
	f.Close()
	if err != nil || len(devs) != 2 {
		t.Fatalf("%v %v", devs, err)
	}
	train := testkit.Record(t, db, "train", smallTrain(false, 256), 80<<30, "")
	for _, pair := range [][2]string{{devs[0], devs[1]}, {devs[0], train}, {train, devs[1]}} {
		for _, al := range []compare.Align{compare.ByTime, compare.ByStep, compare.ByEvent} {
			r, err := compare.Compare(db, pair[0], pair[1], compare.Options{Align: al, Rows: -1})
			if err != nil {
				t.Fatalf("%s: %v", al, err)
			}
			if al != compare.ByEvent && (r.Align != compare.ByEvent || !strings.Contains(r.Note, "no time_us")) {
				t.Errorf("by %s: %s (%s)", al, r.Align, r.Note)
			}
			for _, m := range r.Moments {
				var sa, sb uint64
				for _, d := range m.Rows {
					sa, sb = sa+d.A, sb+d.B
				}
				if sa != m.A.Allocated || sb != m.B.Allocated {
					t.Errorf("%s %s: rows %d, %d; allocated %d, %d", al, m.Key, sa, sb, m.A.Allocated, m.B.Allocated)
				}
			}
			if r.Timeline.X1 <= r.Timeline.X0 {
				t.Errorf("%s: timeline [%d, %d]", al, r.Timeline.X0, r.Timeline.X1)
			}
		}
	}
	r, _ := compare.Compare(db, devs[0], devs[1], compare.Options{})
	if r.Timeline.X0 != 0 || r.Timeline.X1 != 1 {
		t.Errorf("two traces of no events: timeline [%d, %d], want [0, 1]", r.Timeline.X0, r.Timeline.X1)
	}
	if r.Moments[0].A.Seq != -1 || r.Moments[0].A.Allocated == 0 || r.Settings[0].A != "True" {
		t.Errorf("state only: %+v, settings %+v", r.Moments[0], r.Settings)
	}
}

// The memory needed comes from the what-if replays: while they run it is
// not known and says so; once done, both figures and their delta are.
func TestCompareMemoryNeeded(t *testing.T) {
	db := testkit.OpenDB(t)
	a := testkit.Record(t, db, "with", smallTrain(true, 1024), 80<<30, "")
	b := testkit.Record(t, db, "without", smallTrain(false, 1024), 80<<30, "")
	jobs := incident.NewJobs(db, 4, make(chan struct{}, 1))
	r, err := compare.Compare(db, a, b, compare.Options{Needed: compare.FromJobs(jobs, 0)})
	if err != nil {
		t.Fatal(err)
	}
	need := r.Figures[2]
	if need.Key != "memory_needed" || need.Known || !strings.Contains(need.Note, "still running") || r.A.Needed.Status != "running" {
		t.Fatalf("while replaying: %+v, A %+v", need, r.A.Needed)
	}
	r, err = compare.Compare(db, a, b, compare.Options{Needed: compare.FromJobs(jobs, time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	need = r.Figures[2]
	if !need.Known || need.A != r.A.Needed.Bytes || need.B != r.B.Needed.Bytes || need.Delta != int64(need.B)-int64(need.A) ||
		need.A == 0 || need.B <= need.A || !strings.HasPrefix(r.A.Needed.Text, "Needs ") {
		t.Errorf("done: %+v, A %+v, B %+v", need, r.A.Needed, r.B.Needed)
	}
	// The replays need what the runs held at most, checkpointing less.
	if need.A > r.A.PeakReserved || need.B > r.B.PeakReserved {
		t.Errorf("needed %d and %d, peaks reserved %d and %d", need.A, need.B, r.A.PeakReserved, r.B.PeakReserved)
	}
}

// The settings of two snapshots: every PYTORCH_CUDA_ALLOC_CONF key, then
// the other keys of their allocator_settings as written, the differing
// ones marked.
func TestCompareSettings(t *testing.T) {
	db := testkit.OpenDB(t)
	ids := importSnapshots(t, db, "training_22k_user_metadata.pickle", "expandable_oom_multigpu.pickle")
	r, err := compare.Compare(db, ids[0], ids[1], compare.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]compare.Setting{}
	for _, s := range r.Settings {
		got[s.Key] = s
	}
	want := []compare.Setting{
		{Key: "expandable_segments", A: "default", B: "True", Differs: true},
		{Key: "max_split_size_mb", A: "default", B: "default"},
		{Key: "graph_capture_record_stream_reuse", A: "false", B: "–", Differs: true},
		{Key: "pinned_num_register_threads", A: "1", B: "1"},
	}
	for _, w := range want {
		if got[w.Key] != w {
			t.Errorf("%s: %+v, want %+v", w.Key, got[w.Key], w)
		}
	}
	if r.Settings[0].Key != "expandable_segments" || len(r.Settings) != 10 {
		t.Errorf("settings %+v", r.Settings)
	}
}

// The same 6-step program recorded under the default settings and under
// expandable_segments:True (PyTorch 2.11 on an H200): compared without an
// alignment asked for, it is aligned by request and says it is one
// program; every moment reads both at the same request, where what is
// allocated is the same (within the allocator's rounding: 1 %), and no
// group differs by more than that, while the allocator's figures
// (reserved) do; the plot opens on the steps, not on the model's loading.
// By time, at A's peak B was gigabytes away.
func TestCompareSameProgramByRequest(t *testing.T) {
	db := testkit.OpenDB(t)
	ids := importSnapshots(t, db, "pytorch-2.11/train_default.pickle", "pytorch-2.11/train_expandable.pickle")
	r, err := compare.Compare(db, ids[0], ids[1], compare.Options{Rows: -1})
	if err != nil {
		t.Fatal(err)
	}
	if r.Align != compare.ByRequest || !r.SameProgram || !strings.Contains(r.Reading, "allocator's") || r.Timeline.Unit != "request" {
		t.Fatalf("aligned by %s (asked %s), same program %v: %q", r.Align, r.Asked, r.SameProgram, r.Reading)
	}
	within := func(a, b uint64) bool { return diffU(a, b)*100 <= max(a, b) }
	for _, m := range r.Moments {
		if !within(m.A.Allocated, m.B.Allocated) {
			t.Errorf("%s at request %d: A %d B %d allocated", m.Key, m.X, m.A.Allocated, m.B.Allocated)
		}
		for _, d := range m.Rows {
			if diffU(d.A, d.B)*100 > m.A.Allocated {
				t.Errorf("%s: group %q differs by %d B", m.Key, d.Label, d.Delta)
			}
			if d.Label == "(no stack)" {
				t.Errorf("%s: a group is %q alone", m.Key, d.Label)
			}
		}
	}
	reserved := map[string]compare.Figure{}
	for _, f := range r.Figures {
		reserved[f.Key] = f
	}
	if f := reserved["peak_reserved"]; f.Delta >= 0 || !within(r.A.PeakAllocated, r.B.PeakAllocated) {
		t.Errorf("peak reserved %+v, peaks allocated %d and %d", f, r.A.PeakAllocated, r.B.PeakAllocated)
	}
	if f, ok := reserved["most_cached"]; !ok || f.A == 0 {
		t.Errorf("most cached: %+v", f)
	}
	// The steps fill the plot: by request the model's loading is a few
	// requests; by time, its seconds are left out of the opening window.
	stepsFill := func(r *compare.Result) {
		t.Helper()
		tl := r.Timeline
		if tl.X1 != tl.Whole[1] || tl.X0 < tl.Whole[0] {
			t.Errorf("%s: window [%d, %d] of [%d, %d]", r.Align, tl.X0, tl.X1, tl.Whole[0], tl.Whole[1])
		}
		if len(r.A.Steps) != 6 || len(r.B.Steps) != 6 {
			t.Fatalf("steps %+v and %+v", r.A.Steps, r.B.Steps)
		}
		first := min(r.A.Steps[0].X, r.B.Steps[0].X)
		if first < tl.X0 || float64(first-tl.X0) > 0.05*float64(tl.X1-tl.X0) {
			t.Errorf("%s: steps %+v and %+v in the window [%d, %d]", r.Align, r.A.Steps, r.B.Steps, tl.X0, tl.X1)
		}
	}
	stepsFill(r)
	// By time, the moments read different work in each.
	byTime, err := compare.Compare(db, ids[0], ids[1], compare.Options{Align: compare.ByTime})
	if err != nil {
		t.Fatal(err)
	}
	stepsFill(byTime)
	if !byTime.Timeline.Steps {
		t.Errorf("by time the window is not the steps': %+v", byTime.Timeline.Whole)
	}
	// By time, at A's peak B was gigabytes from it: B's allocated bytes
	// at the event the moment reads, as the store lays B out there,
	// against A's peak.
	pa := byTime.Moments[0]
	if pa.Key != "peak_a" || pa.A.Allocated != r.A.PeakAllocated {
		t.Fatalf("by time, the first moment is %s reading A at %d B, want A's peak of %d B", pa.Key, pa.A.Allocated, r.A.PeakAllocated)
	}
	lb, _, err := db.LayoutAtSeq(ids[1], pa.B.Seq)
	if err != nil {
		t.Fatal(err)
	}
	gap := int64(lb.Figures().Allocated) - int64(r.A.PeakAllocated)
	if gap > -1<<30 && gap < 1<<30 || gap != pa.Divergence {
		t.Errorf("by time, at A's peak B is %d B from it (the comparison says %d B), want a gigabyte or more", gap, pa.Divergence)
	}
	t.Logf("A's peak: B − A %d B by request, %d B by time", r.Moments[0].Divergence, gap)

	// Two different programs are not aligned by request unless asked,
	// and then the page says they differ.
	other := importSnapshots(t, db, "pytorch-2.11/train_stacks_all.pickle")[0]
	r, err = compare.Compare(db, ids[0], other, compare.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Align != compare.ByTime || r.SameProgram {
		t.Errorf("two programs: aligned by %s, same program %v", r.Align, r.SameProgram)
	}
	r, err = compare.Compare(db, ids[0], other, compare.Options{Align: compare.ByRequest})
	if err != nil {
		t.Fatal(err)
	}
	if r.Align != compare.ByRequest || !strings.HasPrefix(r.Reading, "Not the same program: their alloc requests differ from the ") {
		t.Errorf("two programs by request: %s, %q", r.Align, r.Reading)
	}
}

func diffU(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}
