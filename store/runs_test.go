package store

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"vramscope/gpu"
)

// rankTrace stores a trace of n generated events as device dev of a new
// upload that is rank of run.
func rankTrace(t *testing.T, db *DB, run string, rank, dev, n int, seed uint64) gpu.Trace {
	t.Helper()
	up, err := db.CreateUpload(gpu.Upload{Name: fmt.Sprintf("rank %d", rank), Top: "{}", Run: run, Rank: rank})
	if err != nil {
		t.Fatal(err)
	}
	return deviceTrace(t, db, up, dev, n, seed)
}

func deviceTrace(t *testing.T, db *DB, upload string, dev, n int, seed uint64) gpu.Trace {
	t.Helper()
	meta := testMeta
	meta.Upload, meta.DeviceOrdinal = upload, dev
	w, err := db.CreateTrace(meta, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.Emit(newGen(seed, 50).events(n))
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	tr, err := db.Trace(w.ID())
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestRunGroupsRanks(t *testing.T) { eachBackend(t, testRunGroupsRanks) }

func testRunGroupsRanks(t *testing.T) {
	db, _ := openTemp(t)
	empty := countRows(t, db)
	run, err := db.CreateRun("job", 4)
	if err != nil {
		t.Fatal(err)
	}
	r2 := rankTrace(t, db, run, 2, 0, 300, 1)
	r0 := rankTrace(t, db, run, 0, 0, 200, 2)
	r0b := deviceTrace(t, db, r0.Upload, 1, 100, 3) // rank 0's second device
	alone := deviceTrace(t, db, "", 0, 50, 4)

	got, err := db.Run(run)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "job" || got.WorldSize != 4 || len(got.Ranks) != 2 {
		t.Fatalf("run %+v", got)
	}
	ids := func(ts []gpu.Trace) (out []string) {
		for _, t := range ts {
			out = append(out, t.ID)
		}
		return out
	}
	if rk := got.Ranks[0]; rk.Rank != 0 || rk.Upload != r0.Upload || !reflect.DeepEqual(ids(rk.Traces), []string{r0.ID, r0b.ID}) {
		t.Errorf("rank 0: %+v", rk)
	}
	if rk := got.Ranks[1]; rk.Rank != 2 || !reflect.DeepEqual(ids(rk.Traces), []string{r2.ID}) {
		t.Errorf("rank 2: %+v", rk)
	}
	of, ok, err := db.RunOf(r2.Upload)
	if err != nil || !ok || of != (gpu.RunOf{ID: run, Name: "job", Rank: 2, WorldSize: 4}) {
		t.Errorf("RunOf = %+v, %v, %v", of, ok, err)
	}
	if _, ok, err := db.RunOf(alone.Upload); ok || err != nil {
		t.Errorf("a trace on its own is in a run: %v %v", ok, err)
	}
	if u, err := db.Upload(r2.Upload); err != nil || u.Run != run || u.Rank != 2 {
		t.Errorf("upload %+v, %v", u, err)
	}

	// A rank is one upload.
	if _, err := db.CreateUpload(gpu.Upload{Name: "again", Top: "{}", Run: run, Rank: 2}); !errors.Is(err, ErrRankTaken) {
		t.Errorf("a second rank 2: %v", err)
	}
	if _, err := db.CreateUpload(gpu.Upload{Name: "x", Top: "{}", Run: "nonesuch", Rank: 0}); !errors.Is(err, ErrNotFound) {
		t.Errorf("an upload of a missing run: %v", err)
	}

	// Deleting every trace of a rank removes it; the last rank takes the run.
	if err := db.DeleteTrace(r2.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := db.Run(run); len(got.Ranks) != 1 {
		t.Errorf("after deleting rank 2: %+v", got.Ranks)
	}
	if err := db.DeleteRun(run); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Run(run); !errors.Is(err, ErrNotFound) {
		t.Errorf("run after DeleteRun: %v", err)
	}
	if err := db.DeleteRun(run); !errors.Is(err, ErrNotFound) {
		t.Errorf("second DeleteRun: %v", err)
	}
	if _, err := db.Trace(alone.ID); err != nil {
		t.Errorf("DeleteRun took a trace of no run: %v", err)
	}
	if err := db.DeleteTrace(alone.ID); err != nil {
		t.Fatal(err)
	}
	var n int
	db.r.QueryRow("SELECT (SELECT count(*) FROM uploads) + (SELECT count(*) FROM runs)").Scan(&n)
	if n != 0 || countRows(t, db) != empty {
		t.Errorf("%d uploads and runs, %d rows left", n, countRows(t, db)-empty)
	}

	// The last trace of a run's last rank takes the run with it.
	run, _ = db.CreateRun("short", 0)
	one := rankTrace(t, db, run, 0, 0, 10, 5)
	if err := db.DeleteTrace(one.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Run(run); !errors.Is(err, ErrNotFound) {
		t.Errorf("an empty run is left: %v", err)
	}
}

// A grouped list shows a run once, as its rank that peaked highest, and
// finds it by the run's name; traces of no run are listed as they are.
func TestTraceListGroupsRuns(t *testing.T) { eachBackend(t, testTraceListGroupsRuns) }

func testTraceListGroupsRuns(t *testing.T) {
	db, _ := openTemp(t)
	run, err := db.CreateRun("pipeline job", 3)
	if err != nil {
		t.Fatal(err)
	}
	var ranks []gpu.Trace
	for r, n := range []int{100, 400, 200} {
		ranks = append(ranks, rankTrace(t, db, run, r, 0, n, uint64(r+1)))
	}
	worst := ranks[0]
	for _, tr := range ranks {
		if tr.PeakReserved > worst.PeakReserved || tr.PeakReserved == worst.PeakReserved && tr.PeakAllocated > worst.PeakAllocated {
			worst = tr
		}
	}
	alone := deviceTrace(t, db, "", 0, 50, 9)
	ids := func(q ListQuery) (out []string, total int) {
		ts, total, err := db.TraceList(q)
		if err != nil {
			t.Fatal(err)
		}
		for _, tr := range ts {
			out = append(out, tr.ID)
		}
		return out, total
	}
	if got, total := ids(ListQuery{GroupRuns: true}); !reflect.DeepEqual(got, []string{alone.ID, worst.ID}) || total != 2 {
		t.Errorf("grouped: %v of %d; want %v", got, total, []string{alone.ID, worst.ID})
	}
	if got, total := ids(ListQuery{GroupRuns: true, Name: "PIPELINE"}); !reflect.DeepEqual(got, []string{worst.ID}) || total != 1 {
		t.Errorf("grouped by the run's name: %v of %d", got, total)
	}
	if _, total := ids(ListQuery{}); total != 4 {
		t.Errorf("flat: %d traces, want 4", total)
	}
}

func TestJoinRun(t *testing.T) { eachBackend(t, testJoinRun) }

func testJoinRun(t *testing.T) {
	db, _ := openTemp(t)
	join := func(name string, rank, world int) gpu.Upload {
		t.Helper()
		u, err := db.JoinRun(name, world, gpu.Upload{Name: fmt.Sprintf("%s rank %d", name, rank), Top: "{}", Rank: rank})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := db.Upload(u.ID); err != nil || got.Run != u.Run || got.Rank != rank {
			t.Fatalf("stored %+v, %v; want %+v", got, err, u)
		}
		return u
	}
	a := join("job", 0, 0)
	// Rank 1 of the same job finds the run; the world size it says is kept.
	if b := join("job", 1, 2); b.Run != a.Run {
		t.Fatalf("rank 1 joined %q, want %q", b.Run, a.Run)
	}
	if r, _ := db.Run(a.Run); r.WorldSize != 2 {
		t.Errorf("world size %d", r.WorldSize)
	}
	// Rank 0 again is the next job of that name.
	c := join("job", 0, 0)
	if c.Run == a.Run {
		t.Fatal("a second rank 0 joined the first run")
	}
	if d := join("job", 1, 0); d.Run != c.Run {
		t.Errorf("rank 1 of the newer job joined %q, want %q", d.Run, c.Run)
	}
	if e := join("other", 1, 0); e.Run == a.Run || e.Run == c.Run {
		t.Errorf("another name joined %q", e.Run)
	}
	if _, err := db.JoinRun("job", 0, gpu.Upload{Top: "{}", Rank: -1}); err == nil {
		t.Error("a negative rank joined")
	}
}

// Usages answers for each trace what walking its own events gives
// (bucketsOf), in the series it is asked for, the others zero; so does
// Usage (all series), which is Usages of one trace.
func TestUsagesOfARun(t *testing.T) { eachBackend(t, testUsagesOfARun) }

func testUsagesOfARun(t *testing.T) {
	db, _ := openTemp(t)
	run, _ := db.CreateRun("job", 0)
	var ids []string
	var walks []*walked
	t0, t1 := int64(1<<62), int64(0)
	for rank := range 5 {
		n, seed := 3000+1000*rank, uint64(rank+1)
		tr := rankTrace(t, db, run, rank, 0, n, seed)
		ids = append(ids, tr.ID)
		walks = append(walks, walk(&reference{gpu.NewLayout(gpu.DefaultRules()), newGen(seed, 50).events(n)}))
		t0, t1 = min(t0, tr.FirstUS), max(t1, tr.LastUS)
	}
	check := func(what string, u Usage, w *walked, series Series, t0, t1 int64, n int) {
		t.Helper()
		if len(u.Buckets) == 0 || len(u.Buckets) > n || u.Buckets[0].StartUS > t0 || u.Buckets[len(u.Buckets)-1].StartUS+u.BucketUS <= t1 {
			t.Fatalf("%s [%d, %d]: %d buckets of %d µs do not cover it", what, t0, t1, len(u.Buckets), u.BucketUS)
		}
		want := w.bucketsOf(u)
		if len(u.Buckets) <= 30 && !reflect.DeepEqual(want, bruteUsage(w.ref, u)) {
			t.Fatalf("%s: the one-pass walk is not bruteUsage", what)
		}
		for j, want := range want {
			want.Reserved = series.pick(SeriesReserved, want.Reserved)
			want.Allocated = series.pick(SeriesAllocated, want.Allocated)
			want.Active = series.pick(SeriesActive, want.Active)
			if u.Buckets[j] != want {
				t.Fatalf("%s [%d, %d], series %03b, bucket %d of %d µs:\n got %+v\nwant %+v", what, t0, t1, series, j, u.BucketUS, u.Buckets[j], want)
			}
		}
	}
	// Whole and part windows, coarse and fine buckets (fine ones decode
	// the chunks around empty buckets), in one batch and in batches of 2.
	defer func(n int) { inBatch = n }(inBatch)
	mid := (t0 + t1) / 2
	for _, batch := range []int{inBatch, 2} {
		inBatch = batch
		for _, w := range []struct{ t0, t1 int64 }{{t0, t1}, {mid, t1}, {mid - 200, mid + 300}, {t1 + 10, t1 + 50}} {
			for _, n := range []int{30, 3000} {
				for _, series := range []Series{SeriesAllocated, SeriesReserved | SeriesActive} {
					got, err := db.Usages(ids, w.t0, w.t1, n, series)
					if err != nil {
						t.Fatal(err)
					}
					for i := range ids {
						check(fmt.Sprintf("Usages, trace %d", i), got[i], walks[i], series, w.t0, w.t1, n)
					}
				}
				for i, id := range ids {
					u, err := db.Usage(id, w.t0, w.t1, n)
					if err != nil {
						t.Fatal(err)
					}
					check(fmt.Sprintf("Usage, trace %d", i), u, walks[i], AllSeries, w.t0, w.t1, n)
				}
			}
		}
	}
	if _, err := db.Usages(append(ids, "nonesuch"), t0, t1, 300, AllSeries); !errors.Is(err, ErrNotFound) {
		t.Errorf("a missing trace: %v", err)
	}
}

// walked is a trace's events and its totals before the first and after
// each, found by applying them to a layout one by one.
type walked struct {
	ref    *reference
	evs    []gpu.Event
	before gpu.Totals
	after  []gpu.Totals
}

func walk(ref *reference) *walked {
	before, after := ref.totals()
	return &walked{ref, ref.evs, before, after}
}

// bucketsOf is what bruteUsage gives, in one pass over the events (the
// buckets ascend): each bucket's events, and the least and greatest
// totals from those entering it to those after each of its events.
func (w *walked) bucketsOf(u Usage) []UsageBucket {
	out := make([]UsageBucket, len(u.Buckets))
	carry, j := w.before, 0
	for i, b := range u.Buckets {
		for j < len(w.evs) && w.evs[j].TimeUS < b.StartUS {
			carry = w.after[j]
			j++
		}
		lo, hi := carry, carry
		var n int64
		for ; j < len(w.evs) && w.evs[j].TimeUS < b.StartUS+u.BucketUS; j++ {
			a := w.after[j]
			lo = gpu.Totals{Reserved: min(lo.Reserved, a.Reserved), Allocated: min(lo.Allocated, a.Allocated), Active: min(lo.Active, a.Active)}
			hi = gpu.Totals{Reserved: max(hi.Reserved, a.Reserved), Allocated: max(hi.Allocated, a.Allocated), Active: max(hi.Active, a.Active)}
			carry = a
			n++
		}
		out[i] = UsageBucket{StartUS: b.StartUS, Events: n, Reserved: Range{lo.Reserved, hi.Reserved},
			Allocated: Range{lo.Allocated, hi.Allocated}, Active: Range{lo.Active, hi.Active}}
	}
	return out
}

// A run's heatmap: a row per trace in rank order, each bucket the
// greatest value of its series, the peaks and the first OOM marked.
func TestRunHeatmap(t *testing.T) { eachBackend(t, testRunHeatmap) }

func testRunHeatmap(t *testing.T) {
	db, _ := openTemp(t)
	run, _ := db.CreateRun("job", 2)
	a := rankTrace(t, db, run, 1, 0, 4000, 1)
	up, _ := db.CreateUpload(gpu.Upload{Name: "rank 0", Top: "{}", Run: run, Rank: 0})
	meta := testMeta
	meta.Upload = up
	w, err := db.CreateTrace(meta, nil)
	if err != nil {
		t.Fatal(err)
	}
	evs := newGen(2, 50).events(3000)
	last := evs[len(evs)-1]
	evs = append(evs, gpu.Event{Seq: last.Seq + 1, TimeUS: last.TimeUS + 5, Action: gpu.ActionOOM, Size: 1 << 40, DeviceFree: 1 << 20})
	w.Emit(evs)
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	b, _ := db.Trace(w.ID())
	r, err := db.Run(run)
	if err != nil {
		t.Fatal(err)
	}
	t0, t1 := RunWindow(r)
	if t0 != min(a.FirstUS, b.FirstUS) || t1 != max(a.LastUS, b.LastUS) {
		t.Fatalf("window [%d, %d]", t0, t1)
	}
	for _, series := range []string{"allocated", "reserved"} {
		h, err := db.RunHeatmap(r, t0, t1, 40, series)
		if err != nil {
			t.Fatal(err)
		}
		if len(h.Rows) != 2 || h.Rows[0].Trace != b.ID || h.Rows[1].Trace != a.ID || h.Rows[0].Rank != 0 {
			t.Fatalf("%s rows %+v", series, h.Rows)
		}
		for i, tr := range []gpu.Trace{b, a} {
			row := h.Rows[i]
			u, err := db.Usage(tr.ID, t0, t1, 40)
			if err != nil {
				t.Fatal(err)
			}
			if h.BucketUS != u.BucketUS || h.StartUS != u.Buckets[0].StartUS || len(row.Max) != len(u.Buckets) {
				t.Fatalf("%s row %d: %d buckets of %d µs from %d", series, i, len(row.Max), h.BucketUS, h.StartUS)
			}
			top := uint64(0)
			for j, bk := range u.Buckets {
				want := bk.Allocated.Max
				if series == "reserved" {
					want = bk.Reserved.Max
				}
				if row.Max[j] != want {
					t.Fatalf("%s row %d bucket %d: %d, want %d", series, i, j, row.Max[j], want)
				}
				top = max(top, want)
			}
			peak := tr.PeakAllocated
			if series == "reserved" {
				peak = tr.PeakReserved
			}
			if row.Peak != peak || top != peak {
				t.Errorf("%s row %d: peak %d, buckets reach %d, the trace %d", series, i, row.Peak, top, peak)
			}
			if series == "allocated" && (row.PeakUS != tr.PeakUS || row.PeakSeq != tr.PeakSeq) {
				t.Errorf("row %d: peak at %d (#%d), the trace's at %d (#%d)", i, row.PeakUS, row.PeakSeq, tr.PeakUS, tr.PeakSeq)
			}
			if series == "reserved" && (row.PeakSeq != -1 || row.PeakUS < t0 || row.Max[(row.PeakUS-h.StartUS)/h.BucketUS] != peak) {
				t.Errorf("row %d: reserved peak at %d", i, row.PeakUS)
			}
		}
		for i, tr := range []gpu.Trace{b, a} {
			ins, err := db.Incidents(tr.ID)
			if err != nil || len(ins) == 0 {
				t.Fatalf("incidents %v %v", ins, err)
			}
			if row := h.Rows[i]; row.OOMs != int64(len(ins)) || row.OOMSeq != ins[0].Seq || row.OOMUS != ins[0].TimeUS {
				t.Errorf("row %d: OOMs %d, first #%d at %d; the trace's %+v", i, row.OOMs, row.OOMSeq, row.OOMUS, ins[0])
			}
		}
		if ins, _ := db.Incidents(b.ID); ins[len(ins)-1].Seq != last.Seq+1 {
			t.Errorf("the last OOM is #%d", ins[len(ins)-1].Seq)
		}
	}
	if _, err := db.RunHeatmap(r, t0, t1, 40, "active"); err == nil {
		t.Error("series active accepted")
	}
}
