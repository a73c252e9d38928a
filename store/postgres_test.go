package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"vramscope/gpu"
	"vramscope/internal/pgtest"
	"vramscope/migrations"
)

func TestRebind(t *testing.T) {
	for q, want := range map[string]string{
		"SELECT a FROM t WHERE b = ? AND c = ?":                              "SELECT a FROM t WHERE b = $1 AND c = $2",
		"x LIKE ?1 ESCAPE '\\' OR y LIKE ?1 AND s = ?":                       "x LIKE $1 ESCAPE '\\' OR y LIKE $1 AND s = $2",
		"SELECT '?', \"a?\" FROM t WHERE a = ? AND b = 'it''s ?'":            "SELECT '?', \"a?\" FROM t WHERE a = $1 AND b = 'it''s ?'",
		"UPDATE r SET w = CASE WHEN w > ?1 THEN w ELSE ?1 END WHERE id = ?2": "UPDATE r SET w = CASE WHEN w > $1 THEN w ELSE $1 END WHERE id = $2",
	} {
		if got := rebind(q); got != want {
			t.Errorf("rebind(%q) = %q; want %q", q, got, want)
		}
	}
}

// The schema version is kept, a newer one refused, and a database of
// another program left alone.
func TestPostgresMigrations(t *testing.T) {
	addr := pgtest.Addr(t)
	db, err := Open(addr)
	if err != nil {
		t.Fatal(err)
	}
	steps, err := migrationFiles(migrations.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	var v int
	if err := db.r.QueryRow("SELECT version FROM schema_version").Scan(&v); err != nil || v != len(steps) {
		t.Fatalf("schema version %d, %v; want %d", v, err, len(steps))
	}
	if _, err := db.w.Exec("UPDATE schema_version SET version = ?", len(steps)+5); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := Open(addr); err == nil || !strings.Contains(err.Error(), "is newer than this vramscope's") {
		t.Fatalf("a newer schema: %v", err)
	}

	other := pgtest.Addr(t)
	db, err = Open(other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.w.Exec("DROP TABLE schema_version; DROP TABLE sessions CASCADE"); err != nil {
		t.Fatal(err)
	}
	db.be.(*pgBackend).close() // its session row is gone with the table
	db.be = &sqliteBackend{}
	db.Close()
	_, err = Open(other)
	if err == nil || !strings.Contains(err.Error(), "a database of another program") {
		t.Fatalf("another program's database: %v", err)
	}
}

// Two handles of one database (two servers): what one writes live the
// other lists, hears of as it grows, and finishes as incomplete once the
// writer's session is gone; an import the other is writing stays hidden
// and untouched while its session lives. The LISTEN connects slowly, so
// that a handle whose Open returned before it LISTENs misses the commit.
func TestPostgresTwoHandles(t *testing.T) {
	addr := pgtest.Addr(t)
	defer func(c func(context.Context, *pgx.ConnConfig) (*pgx.Conn, error)) { connectListener = c }(connectListener)
	connectListener = func(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
		time.Sleep(200 * time.Millisecond)
		return pgx.ConnectConfig(ctx, cfg)
	}
	a, err := Open(addr)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	heard := make(chan TraceChange, 100)
	defer b.Watch(func(ch TraceChange) { heard <- ch })()
	ownHeard := make(chan TraceChange, 100)
	defer a.Watch(func(ch TraceChange) { ownHeard <- ch })()

	w, err := a.CreateTrace(testMeta, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.Emit(newGen(1, 100).events(500))
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(5 * time.Second)
	for got := false; !got; {
		select {
		case ch := <-heard:
			got = ch.ID == w.ID() && ch.Events == 500 && ch.Status == gpu.StatusLive && ch.LastSeq == 499
		case <-deadline:
			t.Fatal("the other handle did not hear of the commit")
		}
	}
	// Notifications come in commit order: once the writing handle hears
	// of a commit the other made after its own, it would have heard of
	// its own by then.
	later, err := b.CreateTrace(testMeta, nil)
	if err != nil {
		t.Fatal(err)
	}
	later.Emit(newGen(3, 100).events(10))
	if err := later.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	deadline = time.After(30 * time.Second)
	for got := false; !got; {
		select {
		case ch := <-ownHeard:
			if ch.ID == w.ID() {
				t.Errorf("the writing handle heard of its own commit: %+v", ch)
			}
			got = ch.ID == later.ID()
		case <-deadline:
			t.Fatal("the writing handle did not hear of the other's commit")
		}
	}
	imp, err := b.ImportTrace(testMeta, nil)
	if err != nil {
		t.Fatal(err)
	}
	imp.Emit(newGen(2, 100).events(300))
	if err := imp.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteTrace(w.ID()); err == nil {
		t.Fatal("deleted a trace another server is writing")
	}
	if err := b.tidy(); err != nil {
		t.Fatal(err)
	}
	if tr, err := b.Trace(w.ID()); err != nil || tr.Status != gpu.StatusLive {
		t.Fatalf("a live trace of a live server: %v, %v", tr.Status, err)
	}

	w.unregister() // as if a's process had died...
	a.Close()      // ...and its session with it
	c, err := Open(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tr, err := c.Trace(w.ID())
	if err != nil || tr.Status != gpu.StatusIncomplete || tr.Events != 500 {
		t.Fatalf("the dead server's trace: %+v, %v; want incomplete with 500 events", tr, err)
	}
	if err := b.Publish(imp); err != nil {
		t.Fatal(err)
	}
	if tr, err := c.Trace(imp.ID()); err != nil || tr.Events != 300 {
		t.Fatalf("the live server's import after another opened: %+v, %v", tr, err)
	}
}
