// Package pgtest starts throwaway PostgreSQL servers for tests, from the
// Debian packages (postgresql-15), in temporary folders: one server shared
// by a test binary, with a fresh database per test, or a server of a
// test's own to stop and start. Without PostgreSQL the tests that need it
// are skipped, unless CI=true, where they fail (need.Missing).
package pgtest

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"vramscope/internal/testkit/need"
)

// Server is one running PostgreSQL, listening on a Unix socket in its folder.
type Server struct {
	bin  string
	dir  string // data in dir/data, the socket in dir
	cred *syscall.Credential
	cmd  *exec.Cmd
	mu   sync.Mutex
}

var (
	shared     *Server
	sharedErr  error
	sharedOnce sync.Once
	dbs        atomic.Int64
)

// bindir is where the PostgreSQL programs are, or why there are none.
func bindir() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		d := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	ds, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(ds) == 0 {
		return "", fmt.Errorf("no PostgreSQL server programs (apt-get install postgresql-15)")
	}
	return filepath.Dir(ds[len(ds)-1]), nil
}

// unavailable skips t, or fails it on CI.
func unavailable(t testing.TB, err error) {
	t.Helper()
	need.Missing(t, "PostgreSQL: %v", err)
}

// Start starts a server of t's own, stopped when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := start()
	if err != nil {
		unavailable(t, err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Addr is the address of a new, empty database on the shared server.
func Addr(t testing.TB) string {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = start() })
	if sharedErr != nil {
		unavailable(t, sharedErr)
	}
	return shared.NewDatabase(t)
}

// Stop stops the shared server, if one was started: for TestMain.
func Stop() {
	if shared != nil {
		shared.Stop()
	}
}

func start() (*Server, error) {
	bin, err := bindir()
	if err != nil {
		return nil, err
	}
	// Not t.TempDir, nor $TMPDIR: postgres, when run as root's postgres
	// user, must reach the folder, and a socket's path is at most 107
	// bytes.
	dir, err := os.MkdirTemp("/tmp", "vspg")
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir}
	// PostgreSQL refuses to run as root: then it runs as postgres.
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root, and no postgres user to run PostgreSQL as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	initdb := s.command("initdb", "-D", s.data(), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "-N")
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	if err := s.Up(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

func (s *Server) command(name string, args ...string) *exec.Cmd {
	c := exec.Command(filepath.Join(s.bin, name), args...)
	c.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGQUIT}
	return c
}

// Up starts the server (again) and waits until it takes connections.
func (s *Server) Up() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Durability is not what the tests test: no fsync.
	s.cmd = s.command("postgres", "-D", s.data(), "-k", s.dir, "-c", "listen_addresses=", "-p", "5432",
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=200")
	s.cmd.Stdout, s.cmd.Stderr = nil, nil
	if err := s.cmd.Start(); err != nil {
		return err
	}
	for i := 0; ; i++ {
		if exec.Command(filepath.Join(s.bin, "pg_isready"), "-q", "-h", s.dir, "-p", "5432").Run() == nil {
			return nil
		}
		if i > 300 {
			return fmt.Errorf("PostgreSQL in %s did not start within 15 s", s.dir)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Down stops the server as an operator's fast shutdown does: open
// connections are ended, transactions rolled back.
func (s *Server) Down() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGINT)
	s.cmd.Wait()
	s.cmd = nil
}

// Stop stops the server at once and removes its folder.
func (s *Server) Stop() {
	s.mu.Lock()
	if s.cmd != nil {
		s.cmd.Process.Signal(syscall.SIGQUIT)
		s.cmd.Wait()
		s.cmd = nil
	}
	s.mu.Unlock()
	os.RemoveAll(s.dir)
}

// psql runs one statement as the postgres user.
func (s *Server) psql(db, stmt string) error {
	c := exec.Command(filepath.Join(s.bin, "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", s.dir, "-p", "5432", "-U", "postgres", "-d", db, "-c", stmt)
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("psql %q: %v: %s", stmt, err, out)
	}
	return nil
}

// NewDatabase creates an empty database, dropped when t ends, and
// returns its address.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d", dbs.Add(1))
	if err := s.psql("postgres", "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.psql("postgres", "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") })
	return s.Addr(name)
}

// Addr is the address of database name.
func (s *Server) Addr(name string) string {
	return "postgres://postgres@/" + name + "?host=" + s.dir + "&port=5432&sslmode=disable"
}

// Value runs a query of one value on the database at addr (one of this
// server's) as psql prints it.
func (s *Server) Value(addr, query string) (string, error) {
	name := strings.TrimPrefix(addr, "postgres://postgres@/")
	name, _, _ = strings.Cut(name, "?")
	c := exec.Command(filepath.Join(s.bin, "psql"), "-X", "-qtA", "-h", s.dir, "-p", "5432", "-U", "postgres", "-d", name, "-c", query)
	out, err := c.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("psql %q: %v: %s", query, err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// BenchEnv names the PostgreSQL server benchmarks run on besides SQLite, as
// postgres://USER@HOST:PORT/ (a server with its production settings: the
// throwaway servers of tests do not fsync).
const BenchEnv = "VRAMSCOPE_BENCH_PG"

// BenchAddr is, when BenchEnv names a server, the address of its database
// name, made if missing and made anew when fresh; ok is false without it.
func BenchAddr(tb testing.TB, name string, fresh bool) (addr string, ok bool) {
	tb.Helper()
	base := os.Getenv(BenchEnv)
	if base == "" {
		return "", false
	}
	u, err := url.Parse(base)
	if err != nil {
		tb.Fatalf("%s: %v", BenchEnv, err)
	}
	admin := *u
	admin.Path = "/postgres"
	run := func(stmt string) error {
		out, err := exec.Command("psql", "-X", "-q", admin.String(), "-c", stmt).CombinedOutput()
		if err != nil {
			return fmt.Errorf("psql %q: %v: %s", stmt, err, out)
		}
		return nil
	}
	if fresh {
		if err := run("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); err != nil {
			tb.Fatal(err)
		}
	}
	if err := run("CREATE DATABASE " + name); err != nil && !strings.Contains(err.Error(), "already exists") {
		tb.Fatal(err)
	}
	u.Path = "/" + name
	return u.String(), true
}
