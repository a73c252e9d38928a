package store

import (
	"database/sql"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"vramscope/gpu"
	"vramscope/internal/hostile"
)

// importTrace writes n events and bigStacks stacks of about 2 KiB each
// into a new import writer, without publishing it.
func importTrace(t testing.TB, db *DB, seed uint64, n, bigStacks int) (*Writer, error) {
	t.Helper()
	w, err := db.ImportTrace(gpu.TraceMeta{Name: fmt.Sprintf("import %d", seed), Source: gpu.SourceSnapshot, DeviceName: "cuda:0"}, nil)
	if err != nil {
		return nil, err
	}
	for i := range bigStacks {
		w.Stack(gpu.Stack{{Name: fmt.Sprintf("%d.%d ", seed, i) + strings.Repeat("x", 2048), Filename: "big.py", Line: uint64(i)}})
	}
	evs := newGen(seed, 300).events(n)
	for i := 0; i < len(evs); i += 4096 {
		w.Emit(evs[i:min(i+4096, len(evs))])
	}
	return w, w.Flush()
}

// A sealed import is stored whole but still hidden; once published it
// reads exactly as the same import published unsealed.
func TestSealedImport(t *testing.T) { eachBackend(t, testSealedImport) }

func testSealedImport(t *testing.T) {
	db, _ := openTemp(t)
	dropped := gpu.Dropped{Count: 1, First: []gpu.DroppedEvent{{Seq: 7, Reason: "undo: no block"}}}
	var ws [2]*Writer
	for i := range ws {
		w, err := importTrace(t, db, 3, 40000, 2)
		if err != nil {
			t.Fatal(err)
		}
		w.SetDropped(dropped)
		ws[i] = w
	}
	sealed, plain := ws[0], ws[1]
	if err := sealed.Seal(); err != nil {
		t.Fatal(err)
	}
	if err := sealed.Seal(); err == nil {
		t.Error("a second Seal was taken")
	}
	if _, err := db.Trace(sealed.ID()); !errors.Is(err, ErrNotFound) {
		t.Errorf("a sealed trace before Publish: %v, want not found", err)
	}
	var openRows int // Publish of a sealed import writes no row but its status
	if err := db.r.QueryRow("SELECT length(data) FROM alloc_open WHERE tid = ?", sealed.tid).Scan(&openRows); err != nil || openRows == 0 {
		t.Fatalf("the sealed import's live allocations: %d bytes, %v", openRows, err)
	}
	if err := db.Publish(sealed); err != nil {
		t.Fatal(err)
	}
	if err := db.Publish(plain); err != nil {
		t.Fatal(err)
	}
	if err := db.Publish(sealed); err == nil {
		t.Error("a published import was published again")
	}
	a, err := db.Trace(sealed.ID())
	if err != nil {
		t.Fatal(err)
	}
	b, err := db.Trace(plain.ID())
	if err != nil {
		t.Fatal(err)
	}
	a.ID, a.Created, b.ID, b.Created = "", time.Time{}, "", time.Time{}
	if !reflect.DeepEqual(a, b) || a.Status != gpu.StatusComplete || a.Dropped == nil {
		t.Fatalf("sealed %+v\nplain %+v", a, b)
	}
	same := func(what string, get func(id string) (any, error)) {
		t.Helper()
		x, err := get(sealed.ID())
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		y, err := get(plain.ID())
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !reflect.DeepEqual(x, y) {
			t.Errorf("%s differs between the sealed and the plain import", what)
		}
	}
	mid := (a.FirstUS + a.LastUS) / 2
	same("events", func(id string) (any, error) { return db.Events(id, 0, 1<<62) })
	same("final layout", func(id string) (any, error) { l, _, err := db.LayoutAtSeq(id, a.LastSeq); return l, err })
	same("usage", func(id string) (any, error) { return db.Usage(id, a.FirstUS, a.LastUS, 200) })
	same("allocations", func(id string) (any, error) { return db.Allocations(id, a.FirstUS, a.LastUS, 0, 1<<20) })
	same("live set", func(id string) (any, error) {
		l, err := db.LiveAt(id, mid)
		if l != nil {
			l.Trace = ""
		}
		return l, err
	})
	same("statistics", func(id string) (any, error) { st, _, err := db.StatsAt(id, a.LastUS); return st, err })
	same("stacks", func(id string) (any, error) { return db.Stack(id, 2) })
}

// rows counts a table's rows of every trace.
func rows(t *testing.T, db *DB, table string) int {
	t.Helper()
	var n int
	if err := db.r.QueryRow("SELECT count(*) FROM " + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// An import is seen by no reader until Publish, and then whole: every
// device's trace at once.
func TestImportShownWhole(t *testing.T) { eachBackend(t, testImportShownWhole) }

func testImportShownWhole(t *testing.T) {
	db, _ := openTemp(t)
	a, err := importTrace(t, db, 1, 20000, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := importTrace(t, db, 2, 30000, 0)
	if err != nil {
		t.Fatal(err)
	}
	if rows(t, db, "chunks") == 0 {
		t.Fatal("the imports committed nothing before Publish; the test shows nothing")
	}
	for _, w := range []*Writer{a, b} {
		if _, err := db.Trace(w.ID()); !errors.Is(err, ErrNotFound) {
			t.Errorf("trace %s before Publish: %v, want not found", w.ID(), err)
		}
		if _, err := db.Events(w.ID(), 0, 10); !errors.Is(err, ErrNotFound) {
			t.Errorf("events of %s before Publish: %v, want not found", w.ID(), err)
		}
		if err := db.DeleteTrace(w.ID()); !errors.Is(err, ErrNotFound) {
			t.Errorf("delete of %s before Publish: %v, want not found", w.ID(), err)
		}
	}
	if ts, total, err := db.TraceList(ListQuery{}); err != nil || len(ts) != 0 || total != 0 {
		t.Fatalf("list before Publish: %d of %d, %v", len(ts), total, err)
	}
	a.SetDropped(gpu.Dropped{Count: 1, First: []gpu.DroppedEvent{{Seq: 7, Reason: "undo: no block"}}})
	if err := db.Publish(a, b); err != nil {
		t.Fatal(err)
	}
	ts, err := db.Traces()
	if err != nil || len(ts) != 2 {
		t.Fatalf("%d traces after Publish, %v", len(ts), err)
	}
	for _, tr := range ts {
		want := map[string]int64{a.ID(): 20000, b.ID(): 30000}[tr.ID]
		if tr.Status != gpu.StatusComplete || tr.Events != want {
			t.Errorf("trace %s: %s with %d events, want complete with %d", tr.ID, tr.Status, tr.Events, want)
		}
	}
	tr, _ := db.Trace(a.ID())
	if tr.Dropped == nil || tr.Dropped.Count != 1 || tr.Dropped.First[0].Seq != 7 {
		t.Errorf("dropped %+v", tr.Dropped)
	}
}

// An import whose process died is removed at the next Open, rows and all.
func TestUnfinishedImportRemovedAtOpen(t *testing.T) {
	eachBackend(t, testUnfinishedImportRemovedAtOpen)
}

func testUnfinishedImportRemovedAtOpen(t *testing.T) {
	db, path := openTemp(t)
	keep := writeTrace(t, db, nil, newGen(3, 300).events(1000), 0)
	if err := keep.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	w, err := importTrace(t, db, 4, 20000, 10)
	if err != nil {
		t.Fatal(err)
	}
	w.unregister() // as if its process had died
	db.Close()
	db, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ts, err := db.Traces()
	if err != nil || len(ts) != 1 || ts[0].ID != keep.ID() {
		t.Fatalf("traces %v, %v; want only %s", ts, err, keep.ID())
	}
	for _, table := range traceTables {
		var n int
		db.r.QueryRow("SELECT count(*) FROM "+table+" WHERE tid = ?", w.tid).Scan(&n)
		if n != 0 {
			t.Errorf("%d rows of the unfinished import left in %s", n, table)
		}
	}
}

// pages is the database's size in pages.
func pages(t *testing.T, db *DB) int64 {
	var n int64
	if err := db.r.QueryRow("PRAGMA page_count").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A delete gives the trace's space back to the file system.
func TestDeleteGivesSpaceBack(t *testing.T) {
	db, path := openTemp(t)
	small := writeTrace(t, db, nil, newGen(5, 300).events(1000), 0)
	small.Close(gpu.StatusComplete)
	big := writeTrace(t, db, nil, newGen(6, 300).events(300_000), 0)
	big.Close(gpu.StatusComplete)
	before := pages(t, db)
	if err := db.DeleteTrace(big.ID()); err != nil {
		t.Fatal(err)
	}
	after := pages(t, db)
	if after > before/5 {
		t.Errorf("%d pages after deleting the big trace, %d before", after, before)
	}
	db.direct(func(c *sql.DB) error { _, err := c.Exec("PRAGMA wal_checkpoint(TRUNCATE)"); return err })
	if st, err := os.Stat(path); err != nil || st.Size() > 2*after*4096 {
		t.Errorf("the file holds %d bytes after the delete (%d pages of 4 KiB): %v", st.Size(), after, err)
	}
	if _, err := db.Trace(small.ID()); err != nil {
		t.Errorf("the other trace: %v", err)
	}
}

// A database made without auto_vacuum is converted when it is opened.
func TestOldDatabaseGetsAutoVacuum(t *testing.T) {
	path := t.TempDir() + "/old.db"
	raw, err := sql.Open("sqlite3", dsn(path, "_journal_mode=WAL"))
	if err != nil {
		t.Fatal(err)
	}
	if err := migrateSQLite(raw); err != nil {
		t.Fatal(err)
	}
	var mode int
	raw.QueryRow("PRAGMA auto_vacuum").Scan(&mode)
	raw.Close()
	if mode != 0 {
		t.Fatalf("auto_vacuum %d in the old database", mode)
	}
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.r.QueryRow("PRAGMA auto_vacuum").Scan(&mode)
	if mode != autoVacuumIncremental {
		t.Errorf("auto_vacuum %d after Open, want incremental", mode)
	}
}

// On a full disk (a small tmpfs, for real): an import fails with
// ErrDiskFull and leaves nothing; the database opens with no byte free;
// a delete goes through and gives the space back; imports work again.
func TestFullDisk(t *testing.T) {
	dir := hostile.SmallDisk(t, 128<<20)
	path := dir + "/full.db"
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { db.Close() }()
	if _, err := os.Stat(db.be.(*sqliteBackend).reservePath()); err != nil {
		t.Fatalf("no reserve: %v", err)
	}
	hostile.Fill(t, dir, 40<<20)
	var kept []string
	var full error
	for seed := uint64(10); full == nil && seed < 100; seed++ {
		w, err := importTrace(t, db, seed, 5000, 2000)
		if err == nil {
			err = db.Publish(w)
		}
		if err != nil {
			full = err
			if w != nil {
				if aerr := w.Abort(); aerr != nil {
					t.Fatalf("abort on a full disk: %v", aerr)
				}
			}
			break
		}
		kept = append(kept, w.ID())
	}
	if !errors.Is(full, ErrDiskFull) || len(kept) < 2 {
		t.Fatalf("after %d imports: %v, want ErrDiskFull", len(kept), full)
	}
	if _, err := os.Stat(db.be.(*sqliteBackend).reservePath()); err != nil {
		t.Errorf("no reserve after the failed import was aborted: %v", err)
	}
	if ts, _ := db.Traces(); len(ts) != len(kept) {
		t.Fatalf("%d traces listed, %d imported whole", len(ts), len(kept))
	}

	// Not a byte left: the database still opens, lists and deletes.
	db.Close()
	hostile.Fill(t, dir, 0)
	if free, _ := freeSpace(dir); free > 64<<10 {
		t.Fatalf("%d bytes still free", free)
	}
	if db, err = Open(path); err != nil {
		t.Fatalf("open on a full disk: %v", err)
	}
	ts, err := db.Traces()
	if err != nil || len(ts) != len(kept) {
		t.Fatalf("%d traces on a full disk, %v", len(ts), err)
	}
	// Free space counts the reserve, which the open gave up and the
	// delete takes again.
	room := func() uint64 {
		free, _ := freeSpace(dir)
		if st, err := os.Stat(db.be.(*sqliteBackend).reservePath()); err == nil {
			free += uint64(st.Size())
		}
		return free
	}
	freeBefore := room()
	if err := db.DeleteTrace(kept[0]); err != nil {
		t.Fatalf("delete on a full disk: %v", err)
	}
	if _, err := db.Trace(kept[0]); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted trace: %v", err)
	}
	db.direct(func(c *sql.DB) error { _, err := c.Exec("PRAGMA wal_checkpoint(TRUNCATE)"); return err })
	if _, err := os.Stat(db.be.(*sqliteBackend).reservePath()); err != nil {
		t.Errorf("no reserve after the delete: %v", err)
	}
	freeAfter := room()
	if freeAfter < freeBefore+4<<20 {
		t.Errorf("%d bytes free after the delete, %d before: the space was not given back", freeAfter, freeBefore)
	}
	w, err := importTrace(t, db, 200, 2000, 10)
	if err == nil {
		err = db.Publish(w)
	}
	if err != nil {
		t.Errorf("an import after the delete: %v", err)
	}
}

// Live traces that never got an event are deleted once old enough, unless
// a writer holds them.
func TestExpireEmpty(t *testing.T) { eachBackend(t, testExpireEmpty) }

func testExpireEmpty(t *testing.T) {
	db, _ := openTemp(t)
	meta := testMeta
	meta.Source = gpu.SourceLive
	empty, _ := db.CreateTrace(meta, nil)
	empty.Close(gpu.StatusIncomplete)
	open, _ := db.CreateTrace(meta, nil) // still being written
	full, _ := db.CreateTrace(meta, nil)
	full.Emit(newGen(7, 300).events(10))
	full.Close(gpu.StatusIncomplete)
	if n, err := db.ExpireEmpty(gpu.SourceLive, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("expired %d younger than an hour: %v", n, err)
	}
	n, err := db.ExpireEmpty(gpu.SourceLive, time.Now().Add(time.Second))
	if err != nil || n != 1 {
		t.Fatalf("expired %d, %v; want 1", n, err)
	}
	if _, err := db.Trace(empty.ID()); !errors.Is(err, ErrNotFound) {
		t.Errorf("the empty trace: %v", err)
	}
	for _, w := range []*Writer{open, full} {
		if _, err := db.Trace(w.ID()); err != nil {
			t.Errorf("trace %s: %v", w.ID(), err)
		}
	}
	open.Close(gpu.StatusComplete)
}

// The list pages, sorts and filters.
func TestTraceList(t *testing.T) { eachBackend(t, testTraceList) }

func testTraceList(t *testing.T) {
	db, _ := openTemp(t)
	for i := range 7 {
		meta := testMeta
		meta.Name = fmt.Sprintf("run %d", i)
		if i%2 == 1 {
			meta.Name = fmt.Sprintf("Probe_%d%%", i)
			meta.Source = gpu.SourceLive
		}
		w, err := db.CreateTrace(meta, nil)
		if err != nil {
			t.Fatal(err)
		}
		w.Emit(newGen(uint64(i), 300).events(100 * (i + 1)))
		w.Close([]gpu.TraceStatus{gpu.StatusComplete, gpu.StatusFailed}[i%3/2])
	}
	names := func(ts []gpu.Trace) string {
		var out []string
		for _, t := range ts {
			out = append(out, t.Name)
		}
		return strings.Join(out, ",")
	}
	for _, c := range []struct {
		q     ListQuery
		want  string
		total int
	}{
		{ListQuery{Limit: 3}, "run 6,Probe_5%,run 4", 7},
		{ListQuery{Limit: 3, Offset: 6}, "run 0", 7},
		{ListQuery{Sort: "name", Asc: true, Limit: 2}, "Probe_1%,Probe_3%", 7},
		{ListQuery{Sort: "events", Limit: 2}, "run 6,Probe_5%", 7},
		{ListQuery{Source: gpu.SourceLive}, "Probe_5%,Probe_3%,Probe_1%", 3},
		{ListQuery{Status: gpu.StatusFailed}, "Probe_5%,run 2", 2},
		{ListQuery{Name: "probe_3"}, "Probe_3%", 1},
		{ListQuery{Name: "%"}, "Probe_5%,Probe_3%,Probe_1%", 3},
		{ListQuery{Name: "_"}, "Probe_5%,Probe_3%,Probe_1%", 3},
	} {
		ts, total, err := db.TraceList(c.q)
		if err != nil || names(ts) != c.want || total != c.total {
			t.Errorf("%+v: %s of %d, %v; want %s of %d", c.q, names(ts), total, err, c.want, c.total)
		}
	}
}

// Settings that do not parse are refused at creation, naming them.
func TestBadSettingsRefused(t *testing.T) { eachBackend(t, testBadSettingsRefused) }

func testBadSettingsRefused(t *testing.T) {
	db, _ := openTemp(t)
	meta := testMeta
	meta.Settings = "max_split_size_mb:banana"
	_, err := db.ImportTrace(meta, nil)
	if !errors.Is(err, ErrBadSettings) || !strings.Contains(err.Error(), "banana") {
		t.Fatalf("got %v, want ErrBadSettings naming the value", err)
	}
}
