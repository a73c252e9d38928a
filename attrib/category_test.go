package attrib_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"vramscope/attrib"
	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/store"
	"vramscope/tracer"
)

// smallTrain is the training loop at a size a test runs in a moment.
func smallTrain() tracer.Train {
	w := tracer.DefaultTrain()
	w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 4, 512, 8192, 4, 256, 3
	return w
}

// truthOf maps the roles the training loop gives its allocations to the
// categories they should get.
var truthOf = map[string]attrib.Category{
	tracer.RoleParameter: attrib.Parameters, tracer.RoleOptimizerState: attrib.OptimizerState,
	tracer.RoleActivation: attrib.Activations, tracer.RoleGradient: attrib.Gradients, tracer.RoleTemporary: attrib.Temporaries,
}

// recordWithTruth records w and returns its trace and the category each
// alloc event should get, by seq: the workload tells a hook in this test
// what each allocation is for, in the order it makes them, which is the
// order of the alloc events.
func recordWithTruth(t *testing.T, db *store.DB, w tracer.Workload, annotated bool) (gpu.Trace, map[int64]attrib.Category) {
	t.Helper()
	var roles []string
	id := testkit.Record(t, db, "train", w, 80<<30, "", func(env *tracer.Env) {
		env.Role = func(_ uint64, role string) { roles = append(roles, role) }
		if !annotated {
			env.Annotations = nil
		}
	})
	tr, err := db.Trace(id)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := db.Events(id, 0, tr.LastSeq+1)
	if err != nil {
		t.Fatal(err)
	}
	truth := map[int64]attrib.Category{}
	for _, e := range evs {
		if e.Action == gpu.ActionAlloc {
			if len(truth) >= len(roles) {
				t.Fatalf("more alloc events than allocations the workload made (%d)", len(roles))
			}
			truth[e.Seq] = truthOf[roles[len(truth)]]
		}
	}
	if len(truth) != len(roles) {
		t.Fatalf("%d alloc events, %d allocations", len(truth), len(roles))
	}
	return tr, truth
}

// score is how many of the live bytes got their true category: right and
// wrong bytes per category given (precision) and per true category (recall).
type score struct {
	right, total          uint64
	given, givenRight     map[attrib.Category]uint64
	actual, actualMatched map[attrib.Category]uint64
}

func scoreOf(l *attrib.Live, truth map[int64]attrib.Category) score {
	s := score{given: map[attrib.Category]uint64{}, givenRight: map[attrib.Category]uint64{},
		actual: map[attrib.Category]uint64{}, actualMatched: map[attrib.Category]uint64{}}
	for i, b := range l.Blocks {
		want, got := truth[b.Seq], l.Verdicts[i].Category
		s.total += b.Size
		s.given[got] += b.Size
		s.actual[want] += b.Size
		if got == want {
			s.right += b.Size
			s.givenRight[got] += b.Size
			s.actualMatched[want] += b.Size
		}
	}
	return s
}

func (s score) accuracy() float64 { return float64(s.right) / float64(s.total) }

func (s score) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%.1f %% of %.1f MiB right;", 100*s.accuracy(), float64(s.total)/(1<<20))
	for _, c := range attrib.AllCategories {
		if s.given[c] == 0 && s.actual[c] == 0 {
			continue
		}
		p, r := "–", "–"
		if s.given[c] > 0 {
			p = fmt.Sprintf("%.1f %%", 100*float64(s.givenRight[c])/float64(s.given[c]))
		}
		if s.actual[c] > 0 {
			r = fmt.Sprintf("%.1f %%", 100*float64(s.actualMatched[c])/float64(s.actual[c]))
		}
		fmt.Fprintf(&b, " %s: precision %s, recall %s (%.1f MiB);", c, p, r, float64(s.actual[c])/(1<<20))
	}
	return b.String()
}

// On the Go training loop, whose every allocation's purpose is known, at
// least 90 % of the live bytes get their true category at the peak and at
// each step's peak; the per-category figures are logged. Without its step
// and optimizer annotations the frames and lifetimes alone must do.
func TestCategoriesOfGoTraining(t *testing.T) {
	for _, c := range []struct{ ckpt, annotated bool }{{false, true}, {true, true}, {false, false}} {
		t.Run(fmt.Sprintf("checkpointing=%v,annotated=%v", c.ckpt, c.annotated), func(t *testing.T) {
			db := testkit.OpenDB(t)
			w := smallTrain()
			w.Checkpointing = c.ckpt
			tr, truth := recordWithTruth(t, db, w, c.annotated)
			cat, err := attrib.NewCategorizer(db, tr.ID)
			if err != nil {
				t.Fatal(err)
			}
			steps := attrib.Steps(cat.Regions())
			if c.annotated && len(steps) != w.Steps {
				t.Fatalf("%d steps, want %d", len(steps), w.Steps)
			}
			at := map[string]int64{"the peak": tr.PeakSeq}
			spans := make([]store.Span, len(steps))
			for i, s := range steps {
				spans[i] = store.Span{T0: s.StartUS, T1: s.EndUS}
			}
			peaks, err := db.Peaks(tr.ID, spans)
			if err != nil && len(spans) > 0 {
				t.Fatal(err)
			}
			for i, p := range peaks {
				at[fmt.Sprintf("step %d's peak", steps[i].Step)] = p.Seq
			}
			for _, n := range slices.Sorted(maps.Keys(at)) {
				l, err := cat.At(attrib.Instant{BySeq: true, Seq: at[n]})
				if err != nil {
					t.Fatal(err)
				}
				s := scoreOf(l, truth)
				t.Logf("%s (event %d): %v", n, at[n], s)
				if s.accuracy() < 0.9 {
					t.Errorf("%s: %.1f %% of the live bytes right, want at least 90 %%", n, 100*s.accuracy())
				}
			}
			// Across the whole run (every 50th event), for the record.
			var all score
			for seq := int64(0); seq <= tr.LastSeq; seq += 50 {
				l, err := cat.At(attrib.Instant{BySeq: true, Seq: seq})
				if err != nil {
					t.Fatal(err)
				}
				s := scoreOf(l, truth)
				all.right += s.right
				all.total += s.total
			}
			t.Logf("every 50th event: %.1f %% of the live bytes right", 100*all.accuracy())
		})
	}
}

// The top frame at the peak of the Go training loop is what a reader of
// its stacks would name: optimizer.step() in train_step, which makes the
// Adam states (the optimizer's own frames are torch's, in site-packages).
func TestTopFrameAtGoTrainingPeak(t *testing.T) {
	db := testkit.OpenDB(t)
	tr, _ := recordWithTruth(t, db, smallTrain(), true)
	l, err := attrib.At(db, tr.ID, attrib.Instant{BySeq: true, Seq: tr.PeakSeq})
	if err != nil {
		t.Fatal(err)
	}
	g := attrib.Group(l.LiveSet, attrib.ByFrame, attrib.Options{})
	if top := g.Rows[0]; top.Label != "train.py:93 train_step" {
		t.Errorf("top frame at the peak: %q (%d bytes), want train.py:93 train_step; rows %+v", top.Label, top.Bytes, g.Rows[:3])
	}
}

// The stacked areas by category hold, at each sampled instant, exactly the
// live set there, sorted as at that instant: on a recorded workload, and
// on real snapshots over the whole trace and over a window inside it.
func TestAreas(t *testing.T) {
	db := testkit.OpenDB(t)
	tr, _ := recordWithTruth(t, db, smallTrain(), true)
	checkAreas(t, db, tr, tr.FirstUS, tr.LastUS, 40)
	for _, name := range []string{"training_22k_user_metadata.pickle", "oom_nonexpandable.json"} {
		tr := importSnapshot(t, db, name)[0]
		checkAreas(t, db, tr, tr.FirstUS, tr.LastUS+1, 50)
		span := tr.LastUS - tr.FirstUS
		checkAreas(t, db, tr, tr.FirstUS+span/3, tr.FirstUS+span/2, 30)
	}
}

func checkAreas(t *testing.T, db *store.DB, tr gpu.Trace, t0, t1 int64, n int) {
	t.Helper()
	c, err := attrib.NewCategorizer(db, tr.ID)
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.Areas(store.BandsQuery{T0: t0, T1: t1, W: n})
	if err != nil {
		t.Fatal(err)
	}
	if len(a.T) != n || len(a.Bytes) != n || len(a.Categories) != len(attrib.AllCategories) {
		t.Fatalf("%s: %d instants, %d samples, %d categories", tr.Name, len(a.T), len(a.Bytes), len(a.Categories))
	}
	// Each column is shown at its peak: its greatest allocated bytes, by a
	// replay of the events (a column without events: the bytes it is at).
	peak := make([]uint64, n)
	l, _, err := db.LayoutAtSeq(tr.ID, -1)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := db.Events(tr.ID, 0, tr.LastSeq+1)
	if err != nil {
		t.Fatal(err)
	}
	dt, next := float64(t1-t0)/float64(n), 0
	for _, e := range evs {
		if e.TimeUS > t1 {
			break
		}
		c := min(n-1, int(float64(e.TimeUS-t0)/dt))
		if e.TimeUS < t0 {
			c = -1
		}
		for ; next < c; next++ {
			peak[next] = l.Figures().Allocated
		}
		if err := l.Apply(e); err != nil {
			t.Fatal(err)
		}
		if c >= 0 {
			if a := l.Figures().Allocated; next == c || a > peak[c] {
				peak[c] = a
			}
			next = c + 1
		}
	}
	for ; next < n; next++ {
		peak[next] = l.Figures().Allocated
	}
	for i := range a.Bytes {
		var sum uint64
		for _, b := range a.Bytes[i] {
			sum += b
		}
		if sum != peak[i] {
			t.Fatalf("%s: column %d holds %d bytes in its areas, its peak is %d", tr.Name, i, sum, peak[i])
		}
	}
	for i := range a.T {
		l, err := c.At(attrib.Instant{BySeq: true, Seq: a.Seq[i]})
		if err != nil {
			t.Fatal(err)
		}
		want := make([]uint64, len(attrib.AllCategories))
		for j, v := range l.Verdicts {
			for k, cat := range attrib.AllCategories {
				if cat == v.Category {
					want[k] += l.Blocks[j].Size
				}
			}
		}
		if l.Seq != a.Seq[i] || fmt.Sprint(want) != fmt.Sprint(a.Bytes[i]) {
			t.Fatalf("%s: instant %d: areas %v after %d, the live set %v after %d", tr.Name, i, a.Bytes[i], a.Seq[i], want, l.Seq)
		}
	}
}

// Lightning runs the forward and backward passes in a closure that
// torch.optim's step calls, so torch/optim frames sit at the far end of
// every activation's stack in oom_nonexpandable.json (a DiT trained with
// Adam). What the closure makes is activations (and gradients), not
// optimizer state: at the peak the attention activations (dit.py:125,
// under a forward frame nearer the allocation) are activations, and the
// optimizer state is no more than Adam's two moments of the parameters.
func TestOptimizerClosureOnRealSnapshot(t *testing.T) {
	db := testkit.OpenDB(t)
	tr := importSnapshot(t, db, "oom_nonexpandable.json")[0]
	l, err := attrib.At(db, tr.ID, attrib.Instant{BySeq: true, Seq: tr.PeakSeq})
	if err != nil {
		t.Fatal(err)
	}
	by := map[attrib.Category]uint64{}
	for i, b := range l.Blocks {
		by[l.Verdicts[i].Category] += b.Size
	}
	t.Logf("at the peak (seq %d): %v", tr.PeakSeq, by)
	if by[attrib.Activations] < l.Bytes()/2 {
		t.Errorf("activations %d of %d live bytes", by[attrib.Activations], l.Bytes())
	}
	if by[attrib.OptimizerState] > 3*by[attrib.Parameters] {
		t.Errorf("optimizer state %d bytes for %d bytes of parameters", by[attrib.OptimizerState], by[attrib.Parameters])
	}
}

// withRegions is a database of traces with steps and phases: the
// training loop and two real snapshots.
func withRegions(t *testing.T) (*store.DB, []gpu.Trace) {
	db := testkit.OpenDB(t)
	tr, _ := recordWithTruth(t, db, smallTrain(), true)
	traces := []gpu.Trace{tr}
	for _, name := range []string{"training_22k_user_metadata.pickle", "uint64_line_annotations.pickle"} {
		traces = append(traces, importSnapshot(t, db, name)[0])
	}
	return db, traces
}

// walking is trace id's categorizer walking at most limit events to a
// later boundary before it reads the layout there.
func walking(t *testing.T, db *store.DB, id string, limit int64) *attrib.Categorizer {
	c, err := attrib.NewCategorizer(db, id)
	if err != nil {
		t.Fatal(err)
	}
	attrib.SetWalkLimit(c, limit)
	return c
}

// Whether an allocation is still live at a later step or optimizer
// boundary is read from the frees up to it, or past a number of events
// from the layout there: both give the same category areas, on the
// training loop and on real snapshots.
func TestLaterBoundariesWalkedOrRead(t *testing.T) {
	db, traces := withRegions(t)
	for _, tr := range traces {
		var cs [3]*attrib.Categorizer
		for i, limit := range []int64{0, 64, 1 << 40} { // read, both, walked
			cs[i] = walking(t, db, tr.ID, limit)
		}
		if len(cs[0].Regions()) == 0 {
			t.Fatalf("%s: no regions: no boundary to look past", tr.Name)
		}
		var got [3]*attrib.Areas
		for i, c := range cs {
			a, err := c.Areas(store.BandsQuery{T0: tr.FirstUS, T1: tr.LastUS + 1, W: 80})
			if err != nil {
				t.Fatal(err)
			}
			got[i] = a
		}
		for k := range got[0].T {
			read, both, walked := fmt.Sprint(got[0].Bytes[k]), fmt.Sprint(got[1].Bytes[k]), fmt.Sprint(got[2].Bytes[k])
			if read != both || read != walked {
				t.Fatalf("%s at %d µs: layouts read %s, walked %s, both %s", tr.Name, got[0].T[k], read, walked, both)
			}
		}
	}
}

// The bands of a window are allocations of many instants, not the live set
// of one: each is sorted as the layouts at the boundaries after it say,
// never by frees walked from an instant it was not live at.
func TestBandCategoriesReadLayouts(t *testing.T) {
	db, traces := withRegions(t)
	for _, tr := range traces {
		bands, err := db.Bands(tr.ID, store.BandsQuery{T0: tr.FirstUS, T1: tr.LastUS + 1, W: 800, H: 400})
		if err != nil {
			t.Fatal(err)
		}
		var got [2]attrib.BandCategories
		for i, limit := range []int64{0, 1 << 40} {
			if got[i], err = walking(t, db, tr.ID, limit).BandCategories(bands); err != nil {
				t.Fatal(err)
			}
		}
		if len(bands.Bands) == 0 || fmt.Sprint(got[0]) != fmt.Sprint(got[1]) {
			t.Fatalf("%s: %d bands; read %v\nwalked %v", tr.Name, len(bands.Bands), got[0].Band, got[1].Band)
		}
	}
}
