package store

import (
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/internal/pgtest"
	"vramscope/migrations"
)

// eachBackend runs test on SQLite, then on PostgreSQL: openTemp opens the
// database its subtest names.
func eachBackend(t *testing.T, test func(t *testing.T)) {
	t.Run("sqlite", test)
	t.Run("postgres", test)
}

// onPostgres says whether t is (within) eachBackend's postgres subtest.
func onPostgres(t testing.TB) bool { return strings.Contains(t.Name()+"/", "/postgres/") }

// openTemp opens a new database: a SQLite file, or within eachBackend's
// postgres subtest a PostgreSQL database. The path reopens it.
func openTemp(t testing.TB) (*DB, string) {
	t.Helper()
	path := t.TempDir() + "/test.db"
	if onPostgres(t) {
		path = pgtest.Addr(t)
	}
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, path
}

var testMeta = gpu.TraceMeta{Name: "test", Source: gpu.SourceTrace, DeviceName: "sim", Capacity: 80 << 30, Settings: "expandable_segments:False"}

// writeTrace stores events in batches of random sizes.
func writeTrace(t testing.TB, db *DB, initial *gpu.Layout, evs []gpu.Event, stacks int) *Writer {
	t.Helper()
	w, err := db.CreateTrace(testMeta, initial)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= stacks; i++ {
		if id := w.Stack(testStack(i)); id != gpu.StackID(i) {
			t.Fatalf("stack %d interned as %d", i, id)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(evs); {
		n := min(len(evs)-i, 1+rng.IntN(3000))
		batch := append([]gpu.Event(nil), evs[i:i+n]...)
		w.Emit(batch)
		for j := range batch {
			batch[j] = gpu.Event{} // the writer must not keep the batch
		}
		i += n
	}
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	return w
}

func testStack(i int) gpu.Stack {
	return gpu.Stack{{Name: fmt.Sprintf("f%d", i), Filename: "model.py", Line: uint64(i)}, {Name: "main", Filename: "train.py", Line: 1<<64 - 1}}
}

func TestMigrationsAndNewerVersion(t *testing.T) {
	db, path := openTemp(t)
	steps, err := migrationFiles(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	var v int
	if err := db.r.QueryRow("PRAGMA user_version").Scan(&v); err != nil || v != len(steps) {
		t.Fatalf("user_version %d, %v; want %d", v, err, len(steps))
	}
	if _, err := db.w.Exec(fmt.Sprintf("PRAGMA user_version = %d", len(steps)+5)); err != nil {
		t.Fatal(err)
	}
	db.Close()
	_, err = Open(path)
	if err == nil {
		t.Fatal("a database from a newer version opened")
	}
	for _, want := range []string{fmt.Sprint(len(steps) + 5), fmt.Sprint(len(steps))} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name version %s", err, want)
		}
	}
}

// reference replays events the slow way: the oracle for every reader.
type reference struct {
	initial *gpu.Layout
	evs     []gpu.Event
}

// totals returns the totals after each event (index i: after evs[i]),
// and before the first.
func (ref *reference) totals() (before gpu.Totals, after []gpu.Totals) {
	l := ref.initial.Clone()
	f := l.Figures()
	before = gpu.Totals{Reserved: f.Reserved, Allocated: f.Allocated, Active: f.Active}
	for _, e := range ref.evs {
		if err := l.Apply(e); err != nil {
			panic(err)
		}
		f := l.Figures()
		after = append(after, gpu.Totals{Reserved: f.Reserved, Allocated: f.Allocated, Active: f.Active})
	}
	return before, after
}

func (ref *reference) layoutAtSeq(seq int64) *gpu.Layout {
	l := ref.initial.Clone()
	for _, e := range ref.evs {
		if e.Seq > seq {
			break
		}
		if err := l.Apply(e); err != nil {
			panic(err)
		}
	}
	return l
}

// allocations lists every allocation interval.
func (ref *reference) allocations() []gpu.Allocation {
	l := ref.initial.Clone()
	open := map[uint64]gpu.Allocation{}
	for _, s := range l.Segments {
		for _, b := range s.Blocks {
			if b.State == gpu.BlockAllocated {
				open[b.Addr] = gpu.Allocation{Seq: b.Seq, FreeSeq: -1, Addr: b.Addr, Size: b.Size, Requested: b.Requested,
					Stream: s.Stream, AllocUS: gpu.BeforeTraceUS, FreeUS: gpu.NeverFreedUS, Stack: b.Stack}
			}
		}
	}
	var out []gpu.Allocation
	for _, e := range ref.evs {
		var prior gpu.BlockState
		if b := l.BlockAt(e.Addr); b != nil {
			prior = b.State
		}
		if err := l.Apply(e); err != nil {
			panic(err)
		}
		switch {
		case e.Action == gpu.ActionAlloc:
			b := l.BlockAt(e.Addr)
			open[e.Addr] = gpu.Allocation{Seq: e.Seq, FreeSeq: -1, Addr: e.Addr, Size: b.Size, Requested: e.Size,
				Stream: e.Stream, AllocUS: e.TimeUS, FreeUS: gpu.NeverFreedUS, Stack: e.Stack}
		case e.Action == gpu.ActionFreeRequested || e.Action == gpu.ActionFreeCompleted && prior == gpu.BlockAllocated:
			a := open[e.Addr]
			delete(open, e.Addr)
			a.FreeSeq, a.FreeUS = e.Seq, e.TimeUS
			out = append(out, a)
		}
	}
	for _, a := range open {
		out = append(out, a)
	}
	return out
}

func sameLayout(t *testing.T, what string, got, want *gpu.Layout) {
	t.Helper()
	norm := func(l *gpu.Layout) string {
		var b strings.Builder
		for _, s := range l.Segments {
			fmt.Fprintf(&b, "seg %#x %d %d %v %v\n", s.Addr, s.Size, s.Stream, s.Pool, s.Expandable)
			for _, bl := range s.Blocks {
				fmt.Fprintf(&b, "  %+v\n", bl)
			}
		}
		return b.String()
	}
	if g, w := norm(got), norm(want); g != w {
		t.Fatalf("%s: layouts differ\ngot:\n%.2000s\nwant:\n%.2000s", what, g, w)
	}
	if got.Rules != want.Rules {
		t.Fatalf("%s: rules %+v, want %+v", what, got.Rules, want.Rules)
	}
}

func TestRoundTrip(t *testing.T) { eachBackend(t, testRoundTrip) }

func testRoundTrip(t *testing.T) {
	db, _ := openTemp(t)
	g := newGen(1, 300)
	g.stacks = 20
	evs := g.events(30000)
	w := writeTrace(t, db, nil, evs, 20)
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	got, err := db.Events(w.ID(), 0, 1<<62)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, evs) {
		t.Fatalf("events differ: %d out, %d in", len(got), len(evs))
	}
	part, err := db.Events(w.ID(), 5000, 9000)
	if err != nil || !reflect.DeepEqual(part, evs[5000:9000]) {
		t.Fatalf("events [5000, 9000): %d, %v", len(part), err)
	}
	tr, err := db.Trace(w.ID())
	if err != nil {
		t.Fatal(err)
	}
	ref := &reference{gpu.NewLayout(gpu.DefaultRules()), evs}
	_, after := ref.totals()
	var peak gpu.Totals
	var ooms int64
	peakAt := -1 // the first event at the peak of allocated bytes
	for i, v := range after {
		if peakAt < 0 || v.Allocated > peak.Allocated {
			peakAt = i
		}
		peak = maxTotals(peak, v)
		if evs[i].Action == gpu.ActionOOM {
			ooms++
		}
	}
	want := gpu.Trace{ID: w.ID(), TraceMeta: testMeta, Status: gpu.StatusComplete, Events: int64(len(evs)), FirstSeq: 0, LastSeq: evs[len(evs)-1].Seq,
		FirstUS: evs[0].TimeUS, LastUS: evs[len(evs)-1].TimeUS, PeakReserved: peak.Reserved, PeakAllocated: peak.Allocated,
		PeakActive: peak.Active, OOMs: ooms, PeakSeq: evs[peakAt].Seq, PeakUS: evs[peakAt].TimeUS, Created: tr.Created, Rules: gpu.DefaultRules()}
	if !reflect.DeepEqual(tr, want) {
		t.Fatalf("trace\n%+v\nwant\n%+v", tr, want)
	}
	if ooms == 0 {
		t.Fatal("the generator made no OOM events")
	}
	list, err := db.Traces()
	if err != nil || len(list) != 1 || list[0].ID != w.ID() {
		t.Fatalf("Traces: %v, %v", list, err)
	}
	st, err := db.Stack(w.ID(), 7)
	if err != nil || !reflect.DeepEqual(st, testStack(7)) {
		t.Fatalf("stack 7: %v, %v", st, err)
	}
	if _, err := db.Stack(w.ID(), 99); err == nil {
		t.Fatal("unknown stack found")
	}
}

// Sources that do not know block sizes get them from the layout.
func TestBlockSizeDerived(t *testing.T) { eachBackend(t, testBlockSizeDerived) }

func testBlockSizeDerived(t *testing.T) {
	db, _ := openTemp(t)
	evs := newGen(2, 100).events(5000)
	in := append([]gpu.Event(nil), evs...)
	for i := range in {
		in[i].BlockSize = 0
	}
	w := writeTrace(t, db, nil, in, 0)
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	got, err := db.Events(w.ID(), 0, 1<<62)
	if err != nil || !reflect.DeepEqual(got, evs) {
		t.Fatalf("events differ (%v)", err)
	}
}

func TestBadEventFails(t *testing.T) { eachBackend(t, testBadEventFails) }

func testBadEventFails(t *testing.T) {
	db, _ := openTemp(t)
	w, err := db.CreateTrace(testMeta, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.Emit([]gpu.Event{{Seq: 0, Action: gpu.ActionAlloc, Addr: 0x1000, Size: 512}})
	if w.Err() == nil || !strings.Contains(w.Err().Error(), "event 0") {
		t.Fatalf("alloc outside any segment: err %v", w.Err())
	}
	if err := w.Close(gpu.StatusComplete); err == nil {
		t.Fatal("Close after a bad event succeeded")
	}
	tr, _ := db.Trace(w.ID())
	if tr.Status != gpu.StatusFailed {
		t.Fatalf("status %s, want failed", tr.Status)
	}
}

// A trace that starts from a snapshot's state, with blocks allocated before
// the first event.
func initialLayout() (*gpu.Layout, *gen) {
	g := newGen(3, 200)
	g.events(20000)
	l := g.l.Clone()
	for i := range l.Segments {
		for j := range l.Segments[i].Blocks {
			if l.Segments[i].Blocks[j].State != gpu.BlockFree {
				l.Segments[i].Blocks[j].Seq = -1
			}
		}
	}
	g.l = l.Clone()
	g.seq = 0
	return l, g
}

// A layout of more blocks than checkpointEvery is checkpointed every as
// many events as it has blocks, not every checkpointEvery: its
// checkpoints stay in proportion to the events; and the layout at any
// event still reads back exactly.
func TestLargeLayoutCheckpoints(t *testing.T) { eachBackend(t, testLargeLayoutCheckpoints) }

func testLargeLayoutCheckpoints(t *testing.T) {
	db, _ := openTemp(t)
	g := newGen(11, 2*checkpointEvery+4000)
	g.events(12 * checkpointEvery) // up to the target: a large layout to start from
	initial := g.l.Clone()
	g.seq = 0
	blocks := 0
	for _, s := range initial.Segments {
		blocks += len(s.Blocks)
	}
	if blocks <= 2*checkpointEvery {
		t.Fatalf("the starting layout has %d blocks, want more than %d", blocks, 2*checkpointEvery)
	}
	evs := g.events(5 * checkpointEvery)
	w := writeTrace(t, db, initial, evs, 0)
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.r.QueryRow("SELECT count(*) FROM checkpoints WHERE tid = ?", w.tid).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if most := 1 + len(evs)/(2*checkpointEvery); n > most {
		t.Errorf("%d checkpoints for %d events of a %d-block layout, want at most %d", n, len(evs), blocks, most)
	}
	ref := &reference{initial, evs}
	for _, seq := range []int64{-1, 0, checkpointEvery, 2*checkpointEvery + 1, int64(blocks), int64(blocks) + 7, int64(len(evs) - 1)} {
		got, _, err := db.LayoutAtSeq(w.ID(), seq)
		if err != nil {
			t.Fatal(err)
		}
		sameLayout(t, fmt.Sprintf("seq %d", seq), got, ref.layoutAtSeq(seq))
	}
}

func TestLayoutAt(t *testing.T) { eachBackend(t, testLayoutAt) }

func testLayoutAt(t *testing.T) {
	db, _ := openTemp(t)
	initial, g := initialLayout()
	evs := g.events(25000)
	w := writeTrace(t, db, initial, evs, 0)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	ref := &reference{initial, evs}
	check := func() {
		for _, seq := range []int64{-5, 0, 1, 4095, 4096, 8191, 8192, 8193, 12345, 24999, 40000} {
			got, last, err := db.LayoutAtSeq(w.ID(), seq)
			if err != nil {
				t.Fatal(err)
			}
			sameLayout(t, fmt.Sprintf("seq %d", seq), got, ref.layoutAtSeq(seq))
			if want := min(max(seq, -1), 24999); last != want {
				t.Fatalf("seq %d: last %d, want %d", seq, last, want)
			}
		}
		for _, i := range []int{0, 1, 100, 4095, 4096, 9000, 16384, 20000, 24999} {
			tm := evs[i].TimeUS
			var want int64 = -1
			for _, e := range evs {
				if e.TimeUS <= tm {
					want = e.Seq
				}
			}
			got, last, err := db.LayoutAt(w.ID(), tm)
			if err != nil {
				t.Fatal(err)
			}
			if last != want {
				t.Fatalf("t %d: seq %d, want %d", tm, last, want)
			}
			sameLayout(t, fmt.Sprintf("t %d", tm), got, ref.layoutAtSeq(want))
		}
		got, last, err := db.LayoutAt(w.ID(), evs[0].TimeUS-1)
		if err != nil || last != -1 {
			t.Fatalf("before the trace: %d, %v", last, err)
		}
		sameLayout(t, "before", got, initial)
	}
	check() // live, partly committed chunk
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	check()
}

// bruteUsage computes what Usage should say for the buckets it returned.
func bruteUsage(ref *reference, u Usage) []UsageBucket {
	before, after := ref.totals()
	out := make([]UsageBucket, len(u.Buckets))
	for i, b := range u.Buckets {
		end := b.StartUS + u.BucketUS
		carry := before
		for j, e := range ref.evs {
			if e.TimeUS >= b.StartUS {
				break
			}
			carry = after[j]
		}
		lo, hi := carry, carry
		var n int64
		for j, e := range ref.evs {
			if e.TimeUS >= b.StartUS && e.TimeUS < end {
				lo, hi = minTotals(lo, after[j]), maxTotals(hi, after[j])
				n++
			}
		}
		out[i] = UsageBucket{StartUS: b.StartUS, Events: n, Reserved: Range{lo.Reserved, hi.Reserved},
			Allocated: Range{lo.Allocated, hi.Allocated}, Active: Range{lo.Active, hi.Active}}
	}
	return out
}

func TestUsage(t *testing.T) { eachBackend(t, testUsage) }

func testUsage(t *testing.T) {
	db, _ := openTemp(t)
	initial, g := initialLayout()
	evs := g.events(20000)
	w := writeTrace(t, db, initial, evs, 0)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	ref := &reference{initial, evs}
	first, last := evs[0].TimeUS, evs[len(evs)-1].TimeUS
	check := func() {
		for _, q := range []struct {
			t0, t1 int64
			n      int
		}{
			{first, last, 2000}, {first, last, 100}, {first, last, 7}, {first - 1000, last + 1000, 300},
			{first + 100, first + 110, 2000}, {first + 5000, first + 9000, 50}, {last - 64, last, 1}, {first - 50, first - 10, 4},
		} {
			u, err := db.Usage(w.ID(), q.t0, q.t1, q.n)
			if err != nil {
				t.Fatal(err)
			}
			if len(u.Buckets) > q.n || u.Buckets[0].StartUS > q.t0 || u.Buckets[len(u.Buckets)-1].StartUS+u.BucketUS <= q.t1 {
				t.Fatalf("%+v: %d buckets of %d from %d do not cover the window", q, len(u.Buckets), u.BucketUS, u.Buckets[0].StartUS)
			}
			want := bruteUsage(ref, u)
			for i := range want {
				if u.Buckets[i] != want[i] {
					t.Fatalf("%+v: bucket %d of %d us:\n got %+v\nwant %+v", q, i, u.BucketUS, u.Buckets[i], want[i])
				}
			}
		}
	}
	check()
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	check()
	var rows int
	db.r.QueryRow("SELECT count(*) FROM usage_levels").Scan(&rows)
	if rows == 0 {
		t.Fatal("no usage rows stored: the test exercises only decoding")
	}
}

func bruteAllocations(ref *reference, t0, t1 int64, minBytes uint64, limit int) Allocations {
	var out Allocations
	var kept []gpu.Allocation
	for _, a := range ref.allocations() {
		if a.AllocUS <= t1 && a.FreeUS > t0 {
			out.Total++
			out.TotalBytes += a.Size
			if a.Size >= minBytes {
				kept = append(kept, a)
			}
		}
	}
	sort.Slice(kept, func(i, j int) bool {
		if kept[i].Size != kept[j].Size {
			return kept[i].Size > kept[j].Size
		}
		if kept[i].Seq != kept[j].Seq {
			return kept[i].Seq < kept[j].Seq
		}
		return kept[i].Addr < kept[j].Addr
	})
	if limit > 0 && len(kept) > limit {
		kept = kept[:limit]
	}
	out.Allocations = kept
	out.Omitted = out.Total - int64(len(kept))
	out.OmittedBytes = out.TotalBytes
	for _, a := range kept {
		out.OmittedBytes -= a.Size
	}
	return out
}

func TestAllocations(t *testing.T) { eachBackend(t, testAllocations) }

func testAllocations(t *testing.T) {
	db, _ := openTemp(t)
	initial, g := initialLayout()
	g.stacks = 10
	evs := g.events(20000)
	w := writeTrace(t, db, initial, evs, 10)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	ref := &reference{initial, evs}
	first, last := evs[0].TimeUS, evs[len(evs)-1].TimeUS
	check := func() {
		for _, q := range []struct {
			t0, t1   int64
			minBytes uint64
			limit    int
		}{
			{first, last, 0, 0}, {first, last, 1 << 20, 0}, {first, last, 1 << 20, 50}, {first, last, 64 << 20, 5},
			{first + 100, first + 100, 0, 0}, {first + 3000, first + 3500, 4096, 100}, {last, last + 10, 0, 0},
			{first - 100, first - 1, 0, 0}, {last + 1, last + 100, 1 << 20, 0},
		} {
			got, err := db.Allocations(w.ID(), q.t0, q.t1, q.minBytes, q.limit)
			if err != nil {
				t.Fatal(err)
			}
			want := bruteAllocations(ref, q.t0, q.t1, q.minBytes, q.limit)
			if len(got.Allocations) == 0 && len(want.Allocations) == 0 {
				got.Allocations, want.Allocations = nil, nil
			}
			for i := range min(len(got.Allocations), len(want.Allocations)) {
				if got.Allocations[i] != want.Allocations[i] {
					t.Fatalf("%+v: allocation %d:\n got %+v\nwant %+v", q, i, got.Allocations[i], want.Allocations[i])
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%+v:\n got %d allocations, total %d/%d omitted %d/%d\nwant %d allocations, total %d/%d omitted %d/%d",
					q, len(got.Allocations), got.Total, got.TotalBytes, got.Omitted, got.OmittedBytes,
					len(want.Allocations), want.Total, want.TotalBytes, want.Omitted, want.OmittedBytes)
			}
		}
		all := ref.allocations()
		for _, i := range []int{0, 7, len(all) / 2, len(all) - 1} {
			a := all[i]
			if a.Seq < 0 {
				continue
			}
			got, st, err := db.Allocation(w.ID(), a.Seq)
			if err != nil {
				t.Fatal(err)
			}
			if got != a || !reflect.DeepEqual(st, testStack(int(a.Stack))) {
				t.Fatalf("allocation %d: %+v %v\nwant %+v", a.Seq, got, st, a)
			}
		}
	}
	check()
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	check()
}

func countRows(t *testing.T, db *DB) int {
	total := 0
	for _, tb := range traceTables {
		var n int
		if err := db.r.QueryRow("SELECT count(*) FROM " + tb).Scan(&n); err != nil {
			t.Fatal(err)
		}
		total += n
	}
	return total
}

func TestAbortLeavesNothing(t *testing.T) { eachBackend(t, testAbortLeavesNothing) }

func testAbortLeavesNothing(t *testing.T) {
	db, _ := openTemp(t)
	keep := writeTrace(t, db, nil, newGen(5, 50).events(3000), 0)
	if err := keep.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	before := countRows(t, db)
	initial, g := initialLayout()
	w := writeTrace(t, db, initial, g.events(20000), 3)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	w.Emit(g.events(100))
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if after := countRows(t, db); after != before {
		t.Fatalf("abort left %d rows", after-before)
	}
	if _, err := db.Trace(w.ID()); err == nil {
		t.Fatal("aborted trace still listed")
	}
	if err := db.DeleteTrace(keep.ID()); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, db); n != 0 {
		t.Fatalf("delete left %d rows", n)
	}
}

// Trace ids never start with '-' or '_', even from the bytes whose plain
// encoding would.
func TestTraceIDsNeverStartWithADash(t *testing.T) {
	for _, first := range []byte{0xf8, 0xfc, 0xff} { // "-", "_", "_" in plain base64url
		var b [12]byte
		b[0] = first
		if plain := base64.RawURLEncoding.EncodeToString(b[:]); plain[0] != '-' && plain[0] != '_' {
			t.Fatalf("test bytes %#x encode to %q", first, plain)
		}
		if id := traceID(b); id[0] == '-' || id[0] == '_' || len(id) != 16 {
			t.Errorf("bytes starting %#x give id %q", first, id)
		}
	}
	for range 2000 {
		if id := newTraceID(); id[0] == '-' || id[0] == '_' {
			t.Fatalf("new id %q", id)
		}
	}
}

// memory_summary()'s statistics at any event come from the latest
// checkpoint and the events after it; they equal a count from the start,
// also for a trace whose checkpoints hold no statistics (stored before
// they did).
func TestStatsAtUseCheckpoints(t *testing.T) { eachBackend(t, testStatsAtUseCheckpoints) }

func testStatsAtUseCheckpoints(t *testing.T) {
	db, _ := openTemp(t)
	initial, g := initialLayout()
	evs := g.events(3*checkpointEvery + 500)
	w := writeTrace(t, db, initial, evs, 0)
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	want := func(seq int64) map[string]int64 {
		c := caching.NewStatCounter(initial.Clone(), initial.Rules)
		for _, e := range evs {
			if e.Seq > seq {
				break
			}
			c.Apply(e)
		}
		return c.Stats().Flat()
	}
	check := func(what string) {
		for _, seq := range []int64{-1, 0, checkpointEvery - 2, checkpointEvery - 1, checkpointEvery, 2*checkpointEvery + 77, int64(len(evs) - 1)} {
			st, last, err := db.StatsAtSeq(w.ID(), seq)
			if err != nil || last != seq {
				t.Fatalf("%s: seq %d: last %d, %v", what, seq, last, err)
			}
			if got, w := st.Flat(), want(seq); !reflect.DeepEqual(got, w) {
				t.Fatalf("%s: seq %d: statistics differ\n%v\n%v", what, seq, got, w)
			}
		}
		st, last, err := db.StatsAt(w.ID(), evs[100].TimeUS)
		if err != nil || !reflect.DeepEqual(st.Flat(), want(last)) || evs[last].TimeUS != evs[100].TimeUS {
			t.Fatalf("%s: at time %d: seq %d, %v", what, evs[100].TimeUS, last, err)
		}
	}
	check("checkpointed")
	if _, err := db.w.Exec("UPDATE checkpoints SET stats = NULL"); err != nil {
		t.Fatal(err)
	}
	check("counted from the start")
}

// Search finds exactly the allocations whose stack names the text or whose
// range holds the address, first by seq.
func TestSearchFindsEveryMatch(t *testing.T) { eachBackend(t, testSearchFindsEveryMatch) }

func testSearchFindsEveryMatch(t *testing.T) {
	db, _ := openTemp(t)
	g := newGen(5, 300)
	g.stacks = 20
	evs := g.events(20000)
	w := writeTrace(t, db, nil, evs, 20)
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	all := (&reference{gpu.NewLayout(gpu.DefaultRules()), evs}).allocations()
	sort.Slice(all, func(i, j int) bool { return all[i].Seq < all[j].Seq })
	for _, c := range []struct {
		q    string
		want func(a gpu.Allocation) bool
	}{
		{"F7", func(a gpu.Allocation) bool { return a.Stack == 7 }}, // f7 only: there is no f70
		{"MODEL.PY", func(a gpu.Allocation) bool { return a.Stack != 0 }},
		{fmt.Sprintf("%#x", all[100].Addr+1), func(a gpu.Allocation) bool { return a.Addr <= all[100].Addr+1 && all[100].Addr+1 < a.Addr+a.Size }},
	} {
		res, err := db.Search(w.ID(), c.q, 50)
		if err != nil {
			t.Fatal(err)
		}
		var want []gpu.Allocation
		for _, a := range all {
			if c.want(a) {
				want = append(want, a)
			}
		}
		if res.Total != int64(len(want)) || len(want) == 0 {
			t.Fatalf("%q: total %d, want %d", c.q, res.Total, len(want))
		}
		if !reflect.DeepEqual(res.Matches, want[:min(50, len(want))]) {
			t.Fatalf("%q: matches differ\n%v\n%v", c.q, res.Matches[:2], want[:2])
		}
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop()
	os.Exit(code)
}
