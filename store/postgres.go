package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"vramscope/migrations"
)

// A team server: several vramscope processes on one PostgreSQL database.
// Each keeps the SQLite design (one writer connection and goroutine, a pool
// of readers); what SQLite got from being one process, PostgreSQL gets so:
//   - ownership: a process writing a live trace or an import is a session
//     with a lease it renews (sessionBeat); what a session whose lease
//     ran out owned is tidied by the others, as a dead pid's is on SQLite;
//   - find-then-change transactions (joining a run, tidying) take a
//     transaction-scoped advisory lock, as BEGIN IMMEDIATE serializes them
//     on SQLite;
//   - live fan-out: a commit to a live trace NOTIFYs its new tail on one
//     channel, delivered after the commit to every session LISTENing;
//   - what-if jobs are rows taken with a lease (see jobs.go).

const (
	// sessionLease: how long a session that stopped renewing is taken
	// for alive; sessionBeat: how often it renews.
	sessionLease = 15 * time.Second
	sessionBeat  = 3 * time.Second
	// tidyEvery: how often each session tidies after dead ones.
	tidyEvery = time.Minute
	// notifyChannel carries TraceChange JSON.
	notifyChannel = "vramscope_traces"
)

// connectListener connects the session that LISTENs (a variable for
// tests, which slow it).
var connectListener = pgx.ConnectConfig

type pgBackend struct {
	db  *DB
	cfg *pgx.ConnConfig

	stop chan struct{}
	wg   sync.WaitGroup

	mu   sync.Mutex
	live map[int64]bool // sessions whose lease had not run out at the last beat
}

// pgConnector hands database/sql connections that take the store's ?
// parameters.
type pgConnector struct{ driver.Connector }

func (c pgConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &pgConn{conn.(*stdlib.Conn)}, nil
}

// pgConn is a pgx connection reading SQLite's parameters (? and ?N) as
// PostgreSQL's ($N).
type pgConn struct{ *stdlib.Conn }

func (c *pgConn) Prepare(q string) (driver.Stmt, error) { return c.Conn.Prepare(rebind(q)) }

func (c *pgConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	return c.Conn.PrepareContext(ctx, rebind(q))
}

func (c *pgConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.ExecContext(ctx, rebind(q), args)
}

func (c *pgConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	r, err := c.Conn.QueryContext(ctx, rebind(q), args)
	return r, c.lost(err)
}

func (c *pgConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.Conn.BeginTx(ctx, opts)
	return tx, c.lost(err)
}

// lost makes the error of a connection the database closed (a restart)
// database/sql's ErrBadConn, so that it asks again on a new connection:
// a query or a BEGIN changed nothing, and reads of a pool that outlived a
// restart go on at once.
func (c *pgConn) lost(err error) error {
	if err != nil && c.Conn.Conn().IsClosed() {
		return fmt.Errorf("%w (%v)", driver.ErrBadConn, err)
	}
	return err
}

// rebind turns SQLite's parameters into PostgreSQL's: ?N is $N, and a bare
// ? is one more than the largest number before it, as SQLite counts them.
// Quoted strings and names are left as they are. (A scan of the text: a
// microsecond beside the round trip; not cached, as queries with values
// written in, such as LIMIT and OFFSET, are without end.)
func rebind(q string) string {
	var b strings.Builder
	b.Grow(len(q) + 8)
	n := 0
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch c {
		case '\'', '"':
			j := strings.IndexByte(q[i+1:], c)
			if j < 0 {
				b.WriteString(q[i:])
				i = len(q)
				continue
			}
			b.WriteString(q[i : i+j+2])
			i += j + 1
		case '?':
			j := i + 1
			for j < len(q) && q[j] >= '0' && q[j] <= '9' {
				j++
			}
			if j > i+1 {
				k, _ := strconv.Atoi(q[i+1 : j])
				n = max(n, k)
				b.WriteString("$" + q[i+1:j])
				i = j - 1
			} else {
				n++
				b.WriteString("$" + strconv.Itoa(n))
			}
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// openPostgres opens the PostgreSQL database at addr, bringing its schema
// up to date (one process at a time), and starts this process's session.
func openPostgres(addr string) (*DB, error) {
	shown := addr
	if u, err := url.Parse(addr); err == nil {
		shown = u.Redacted()
	}
	cfg, err := pgx.ParseConfig(addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", shown, err)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	cfg.RuntimeParams["application_name"] = "vramscope"
	conn := pgConnector{stdlib.GetConnector(*cfg)}
	w := sql.OpenDB(conn)
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	r := sql.OpenDB(conn)
	r.SetMaxOpenConns(max(4, runtime.NumCPU()))
	r.SetMaxIdleConns(max(4, runtime.NumCPU()))
	fail := func(err error) (*DB, error) {
		w.Close()
		r.Close()
		return nil, fmt.Errorf("%s: %w", shown, err)
	}
	if err := migratePostgres(w); err != nil {
		return fail(err)
	}
	be := &pgBackend{cfg: cfg, stop: make(chan struct{}), live: map[int64]bool{}}
	db := &DB{path: shown, be: be, w: w, r: r, jobs: make(chan job, 4), done: make(chan struct{})}
	be.db = db
	host, _ := os.Hostname()
	err = w.QueryRow("INSERT INTO sessions (host, pid, lease_until) VALUES (?, ?, now() + ?::interval) RETURNING id",
		host, os.Getpid(), sessionLease.String()).Scan(&db.owner)
	if err != nil {
		return fail(err)
	}
	if err := be.beat(); err != nil {
		return fail(err)
	}
	be.wg.Add(2)
	go be.renew()
	// Open returns once the handle LISTENs (or its first try failed), so
	// that what other handles commit after it returns is heard.
	listening := make(chan struct{})
	go be.listen(listening)
	<-listening
	if err := db.start(); err != nil {
		return nil, fmt.Errorf("%s: %w", shown, err)
	}
	return db, nil
}

// migratePostgres applies the PostgreSQL migrations the database lacks,
// under an advisory lock so that servers starting together apply each
// once, recording the version in schema_version.
func migratePostgres(c *sql.DB) error {
	ctx := context.Background()
	conn, err := c.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock(?)", lockKey("migrate")); err != nil {
		return err
	}
	defer conn.ExecContext(ctx, "SELECT pg_advisory_unlock(?)", lockKey("migrate"))
	var has bool
	if err := conn.QueryRowContext(ctx, "SELECT to_regclass('schema_version') IS NOT NULL").Scan(&has); err != nil {
		return err
	}
	cur := 0
	if has {
		if err := conn.QueryRowContext(ctx, "SELECT version FROM schema_version").Scan(&cur); err != nil {
			return err
		}
	} else {
		// A database of another program: vramscope's tables are not added to it.
		var other string
		err := conn.QueryRowContext(ctx, `SELECT table_name FROM information_schema.tables
			WHERE table_schema = current_schema() LIMIT 1`).Scan(&other)
		if err == nil {
			return fmt.Errorf("a database of another program (it has a table %q and no vramscope schema): name an empty database (createdb vramscope) for vramscope", other)
		} else if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
	}
	steps, err := migrationFiles(migrations.Postgres)
	if err != nil {
		return err
	}
	if latest := len(steps); cur > latest {
		return fmt.Errorf("database schema version %d is newer than this vramscope's %d; use a newer vramscope", cur, latest)
	}
	for _, s := range steps[cur:] {
		body, err := fs.ReadFile(migrations.Postgres, s.name)
		if err != nil {
			return err
		}
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		_, err = tx.Exec(string(body))
		if err == nil && s.version == 1 {
			_, err = tx.Exec("CREATE TABLE schema_version (version integer NOT NULL); INSERT INTO schema_version VALUES (0)")
		}
		if err == nil {
			_, err = tx.Exec("UPDATE schema_version SET version = " + strconv.Itoa(s.version))
		}
		if err == nil {
			err = tx.Commit()
		} else {
			tx.Rollback()
		}
		if err != nil {
			return fmt.Errorf("migration postgres/%s: %w", s.name, err)
		}
	}
	return nil
}

// lockKey is the advisory lock of a section of the store.
func lockKey(name string) int64 {
	var h int64 = 0x7672616d // "vram": apart from other programs' keys
	for _, c := range name {
		h = h*31 + int64(c)
	}
	return h
}

func (b *pgBackend) lockTx(tx *sql.Tx, name string) error {
	_, err := tx.Exec("SELECT pg_advisory_xact_lock(?)", lockKey(name))
	return err
}

// Every query of a read sees one snapshot, as a SQLite read transaction does.
func (b *pgBackend) readOptions() *sql.TxOptions {
	return &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead}
}

// alive: owner's lease had not run out at the last beat; a session that
// began since is asked for.
func (b *pgBackend) alive(owner int64) bool {
	b.mu.Lock()
	live := b.live[owner]
	b.mu.Unlock()
	if !live {
		b.db.r.QueryRow("SELECT lease_until > now() FROM sessions WHERE id = ?", owner).Scan(&live)
	}
	return live
}

// beat renews this session's lease and reads which sessions are alive.
func (b *pgBackend) beat() error {
	ctx, cancel := context.WithTimeout(context.Background(), sessionBeat)
	defer cancel()
	if _, err := b.db.r.ExecContext(ctx, "UPDATE sessions SET lease_until = now() + ?::interval WHERE id = ?", sessionLease.String(), b.db.owner); err != nil {
		return err
	}
	rows, err := b.db.r.QueryContext(ctx, "SELECT id FROM sessions WHERE lease_until > now()")
	if err != nil {
		return err
	}
	defer rows.Close()
	live := map[int64]bool{}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return err
		}
		live[id] = true
	}
	if err := rows.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	b.live = live
	b.mu.Unlock()
	return nil
}

// renew beats every sessionBeat and tidies every tidyEvery, until close.
func (b *pgBackend) renew() {
	defer b.wg.Done()
	beat := time.NewTicker(sessionBeat)
	defer beat.Stop()
	last := time.Now()
	for {
		select {
		case <-b.stop:
			return
		case <-beat.C:
		}
		if b.beat() != nil {
			continue // the database is away; the next beat tries again
		}
		if time.Since(last) >= tidyEvery {
			last = time.Now()
			b.db.tidy()
			b.db.r.Exec("DELETE FROM sessions WHERE lease_until < now() - interval '1 day'")
		}
	}
}

// listen hands the changes other sessions NOTIFY to the watchers, and
// connects again when the database went away. It closes listening after
// its first LISTEN, or its first failure to connect.
func (b *pgBackend) listen(listening chan<- struct{}) {
	defer b.wg.Done()
	first := sync.OnceFunc(func() { close(listening) })
	defer first()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-b.stop
		cancel()
	}()
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		conn, err := connectListener(ctx, b.cfg)
		if err == nil {
			_, err = conn.Exec(ctx, "LISTEN "+notifyChannel)
			first()
			if err == nil {
				wait = 100 * time.Millisecond
				for {
					n, err := conn.WaitForNotification(ctx)
					if err != nil {
						break
					}
					var ch TraceChange
					if json.Unmarshal([]byte(n.Payload), &ch) == nil {
						b.db.changed(ch)
					}
				}
			}
			conn.Close(context.Background())
		}
		first()
		select {
		case <-ctx.Done():
		case <-time.After(wait):
			wait = min(2*wait, 5*time.Second)
		}
	}
}

func (b *pgBackend) notify(tx *sql.Tx, ch TraceChange) error {
	ch.From = b.db.owner
	payload, _ := json.Marshal(ch)
	_, err := tx.Exec("SELECT pg_notify(?, ?)", notifyChannel, string(payload))
	return err
}

// clock: the database server's, as the sessions' leases are.
func (b *pgBackend) clock(q querier) (time.Time, error) {
	var t time.Time
	err := q.QueryRow("SELECT clock_timestamp()").Scan(&t)
	return t, err
}

func (b *pgBackend) skipLocked() string { return " FOR UPDATE SKIP LOCKED" }

// Rows are picked by their primary key; PostgreSQL needs no small batches
// to stay within a reserve, but they keep each transaction short.
func (b *pgBackend) deleteKey(table string) string {
	if key, ok := withoutRowid[table]; ok {
		return key
	}
	return pgKeys[table]
}

var pgKeys = map[string]string{
	"chunks": "tid, first_seq", "checkpoints": "tid, seq", "alloc_bins": "tid, sclass, dclass, min_free, first_seq",
	"alloc_open": "tid", "annotations": "aid", "traces": "tid",
}

// The database server's disk is not this process's to see.
func (b *pgBackend) freeSpace() (uint64, error) {
	return 0, errors.New("the database server's free space is not known here")
}

// The reserve is the database server operator's (a file to delete on its
// disk when it fills up).
func (b *pgBackend) takeReserve()      {}
func (b *pgBackend) giveReserve() bool { return false }

// compact leaves deleted rows' space to autovacuum, which reuses it.
func (b *pgBackend) compact(*DB) error { return nil }

// close ends the session: what it owned is at once another's to tidy.
func (b *pgBackend) close() error {
	close(b.stop)
	b.wg.Wait()
	_, err := b.db.r.Exec("DELETE FROM sessions WHERE id = ?", b.db.owner)
	return err
}

// Unavailable says whether err is the database being away (restarting,
// unreachable, the connection lost) rather than anything wrong with the
// request: asked again in a moment, it may well work.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// 08: connection exceptions; 57P01-03: shut down, crashed,
		// not yet taking connections.
		return strings.HasPrefix(pe.Code, "08") || pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03"
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false // the request's own time ran out
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || strings.Contains(err.Error(), "conn closed")
}
