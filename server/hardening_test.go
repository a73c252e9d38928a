package server

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"vramscope/gpu"
	"vramscope/internal/hostile"
	"vramscope/internal/testkit"
	"vramscope/server/guard"
	"vramscope/store"
	"vramscope/tracer"
)

// syncBuffer is a log that tests read while the server writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// realServer is a real server on 127.0.0.1, through ListenAndServe with its
// timeouts, over a fresh database.
type realServer struct {
	db   *store.DB
	base string
	addr string
	log  *syncBuffer
}

func listen(t *testing.T, db *store.DB, opt Options) *realServer {
	t.Helper()
	if db == nil {
		db = testkit.OpenDB(t)
	}
	l := &realServer{db: db, log: &syncBuffer{}}
	opt.DB, opt.Addr = db, "127.0.0.1:0"
	opt.Logger = slog.New(slog.NewTextHandler(l.log, nil))
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- New(opt).ListenAndServe(ctx, func(a net.Addr) { ready <- a.String() }) }()
	select {
	case l.addr = <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	l.base = "http://" + l.addr
	t.Cleanup(func() { cancel(); <-done })
	return l
}

// do sends a request with a Host header of host ("" for the address) and
// returns the status and body.
func (l *realServer) do(t *testing.T, method, path, host string, body io.Reader, header map[string]string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, l.base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// DNS rebinding: a page at http://rebind.evil.example:8080 resolved to
// 127.0.0.1 uploaded, listed and deleted traces and opened both websockets.
// A server on loopback answers such a Host with 421 and nothing else.
func TestRebindingRefused(t *testing.T) { testkit.EachBackend(t, testRebindingRefused) }

func testRebindingRefused(t *testing.T) {
	l := listen(t, nil, Options{AllowedHosts: []string{"vram.lan"}})
	id := makeTrace(t, l.db, "kept", workload{Steps: 2, Layers: 2, Seed: 1})
	evil := "rebind.evil.example:8080"
	origin := map[string]string{"Origin": "http://" + evil}
	snap, _ := os.ReadFile(testkit.Snapshot(t, "empty_four_devices.pickle"))
	for _, c := range []struct{ method, path string }{
		{"POST", "/api/traces?name=x"}, {"GET", "/api/traces"}, {"GET", "/"}, {"DELETE", "/api/traces/" + id},
		{"GET", "/api/traces/" + id + "/usage?t0=0&t1=10"}, {"POST", "/api/permalinks"},
	} {
		code, b := l.do(t, c.method, c.path, evil, bytes.NewReader(snap), origin)
		if code != http.StatusMisdirectedRequest || !strings.Contains(errorOf(t, b), "rebind.evil.example") {
			t.Errorf("%s %s with Host %s: %d %s, want 421", c.method, c.path, evil, code, b)
		}
	}
	for _, path := range []string{"/ws/ingest", "/ws/traces/" + id} {
		_, res, err := websocket.DefaultDialer.Dial("ws://"+l.addr+path, http.Header{"Host": {evil}, "Origin": {"http://" + evil}})
		if err == nil || res == nil || res.StatusCode != http.StatusMisdirectedRequest {
			t.Errorf("websocket %s with Host %s: %v, want 421", path, evil, err)
		}
		c, _, err := websocket.DefaultDialer.Dial("ws://"+l.addr+path, nil)
		if err != nil {
			t.Errorf("websocket %s with the server's own Host: %v", path, err)
		} else {
			c.Close()
		}
	}
	if ts, _ := l.db.Traces(); len(ts) != 1 {
		t.Errorf("%d traces after the refused requests, want 1", len(ts))
	}
	_, port, _ := net.SplitHostPort(l.addr)
	for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port, "app.localhost:" + port, "vram.lan:" + port, "VRAM.LAN"} {
		if code, b := l.do(t, "GET", "/api/traces", host, nil, nil); code != http.StatusOK {
			t.Errorf("Host %s: %d %s", host, code, b)
		}
	}
	// Beyond loopback the token guards writes, and any Host is answered.
	db := testkit.OpenDB(t)
	wide := New(Options{DB: db, Addr: "0.0.0.0:8080", Token: "t", Logger: quietLogger()})
	req := mustReq(t, "GET", "/api/traces", nil)
	req.Host = evil
	rec := &recorder{header: http.Header{}}
	wide.Handler().ServeHTTP(rec, req)
	if rec.code != http.StatusOK {
		t.Errorf("beyond loopback, Host %s: %d", evil, rec.code)
	}
}

type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *recorder) WriteHeader(code int)        { r.code = code }

// rawConn opens a TCP connection to the server.
func rawConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readUntilClosed reads c until the server closes it, and returns what it
// read; it fails if the server keeps it open for a minute.
func readUntilClosed(t *testing.T, c net.Conn) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	b, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server kept the connection open for a minute (read %d bytes)", len(b))
	}
	return b
}

// Slow clients are cut off: a body at 1 B/s gets 408, an idle kept-alive
// connection is closed, and a client that never reads its answers loses
// the connection at the write deadline.
func TestSlowClientsCutOff(t *testing.T) { testkit.EachBackend(t, testSlowClientsCutOff) }

func testSlowClientsCutOff(t *testing.T) {
	l := listen(t, nil, Options{Timeouts: guard.Timeouts{BodyGrace: time.Second, BodyRate: 1 << 10, Idle: time.Second, Write: 2 * time.Second}})

	c := rawConn(t, l.addr)
	fmt.Fprintf(c, "POST /api/traces?name=slow HTTP/1.1\r\nHost: %s\r\nContent-Length: 100000\r\n\r\n\x80\x04", l.addr)
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				if _, err := c.Write([]byte{'N'}); err != nil {
					return
				}
			}
		}
	}()
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	close(stop)
	if err != nil {
		t.Fatalf("a 10 B/s body: %v", err)
	}
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusRequestTimeout || !strings.Contains(errorOf(t, b), "too slowly") {
		t.Errorf("a 10 B/s body: %d %s, want 408", res.StatusCode, b)
	}

	c = rawConn(t, l.addr)
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", l.addr)
	if b := readUntilClosed(t, c); !bytes.Contains(b, []byte("200 OK")) {
		t.Errorf("idle connection: read %q", b)
	}

	// Twenty pipelined requests of a 1.3 MB answer, not read: more than
	// the socket buffers hold, so a write blocks until its deadline, and
	// the server drops the connection with that answer cut short.
	id := makeTrace(t, l.db, "big", workload{Steps: 200, Layers: 12, Seed: 2})
	tr, _ := l.db.Trace(id)
	if tr.Events < 10000 {
		t.Fatalf("only %d events", tr.Events)
	}
	c = rawConn(t, l.addr)
	for range 20 {
		fmt.Fprintf(c, "GET /api/traces/%s/events?from=0&to=10000 HTTP/1.1\r\nHost: %s\r\n\r\n", id, l.addr)
	}
	time.Sleep(4 * time.Second) // past the write deadline, reading nothing
	b = readUntilClosed(t, c)
	if n := bytes.Count(b, []byte("HTTP/1.1 200")); n == 20 {
		t.Errorf("all 20 answers came (%d bytes) to a client that did not read", len(b))
	}
	sizes := regexp.MustCompile(`path=/api/traces/[\w-]+/events status=200 bytes=(\d+)`).FindAllStringSubmatch(l.log.String(), -1)
	if len(sizes) < 2 || sizes[len(sizes)-1][1] == sizes[0][1] {
		t.Errorf("no answer was cut short at the write deadline:\n%s", l.log.String())
	}
}

// uploadOf posts body to /api/traces and returns the status and body.
func (l *realServer) upload(t *testing.T, name string, body io.Reader, header map[string]string) (int, []byte) {
	t.Helper()
	if header == nil {
		header = map[string]string{}
	}
	if header["Content-Type"] == "" {
		header["Content-Type"] = "application/octet-stream"
	}
	return l.do(t, "POST", "/api/traces?name="+name, "", body, header)
}

// allocs is the bytes this process has allocated so far.
func allocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	runtime.GC()
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// Each input of the attack run, uploaded: the status it gets now, and the
// memory the server allocated answering it, against the budget of what
// the decoder could read (16 bytes per decompressed byte, 32 MiB
// base) plus the read-ahead and the answer.
func TestHostileUploads(t *testing.T) { testkit.EachBackend(t, testHostileUploads) }

func testHostileUploads(t *testing.T) {
	l := listen(t, nil, Options{MaxUploadBytes: 8 << 20, MaxDecompressedBytes: 64 << 20})
	badSettings := []byte(`{"segments": [{"device": 0, "address": 1048576, "total_size": 2097152, "blocks": [{"size": 2097152, "state": "inactive"}]}],
	  "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:banana"}}`)
	snap := readSnapshot(t, "settings_no_annotations.pickle")
	badCRC := hostile.Gzip(snap)
	badCRC[len(badCRC)-6] ^= 1 // the CRC-32 after the deflate data
	for _, c := range []struct {
		name         string
		body         []byte
		decompressed int64
		status       int
		want         string
	}{
		{"512 KiB text line", hostile.LongLine('V', 512<<10), 512 << 10, 400, "want a dict or a list of segments"},
		{"64 MiB INT line", hostile.GzipLongLine('I', 64<<20), 64 << 20, 400, "INT: a line longer than 4302 bytes"},
		{"empty trace lists", hostile.EmptyTraceLists(4 << 20), 4 << 20, 413, "expands to more values"},
		{"dup/list rounds", hostile.DupListRounds(1000, 100_000), 100 << 20, 413, "expands to more values"},
		{"1 GiB bytes", hostile.BigBytes(1 << 30), 1 << 30, 400, "more than the limit of 1048576 for one string"},
		{"1000 MB frame name", hostile.LongFrameName(1000 << 20), 1000 << 20, 400, "BINUNICODE8 declares a string of 1048576000 bytes"},
		{"100 MB frame name", hostile.LongFrameName(100 << 20), 100 << 20, 400, "BINUNICODE8 declares a string of 104857600 bytes"},
		{"gzip past the cap", hostile.DupPop(64 << 20), 64 << 20, 413, "larger than 67108864 bytes once decompressed"},
		{"bad settings", badSettings, int64(len(badSettings)), 400, `invalid allocator settings "max_split_size_mb:banana"`},
		{"gzip with a corrupt CRC", badCRC, int64(len(snap)), 400, "gzip: invalid checksum"},
	} {
		before := allocs()
		code, b := l.upload(t, "hostile", bytes.NewReader(c.body), nil)
		grew := allocs() - before
		if code != c.status || !strings.Contains(errorOf(t, b), c.want) {
			t.Errorf("%s: %d %s, want %d with %q", c.name, code, b, c.status, c.want)
		}
		if bound := uint64(2*(32<<20+16*c.decompressed) + 16<<20); grew > bound {
			t.Errorf("%s: the server allocated %d MiB, over %d MiB", c.name, grew>>20, bound>>20)
		}
	}
	if ts, _ := l.db.Traces(); len(ts) != 0 {
		t.Errorf("%d traces stored from hostile uploads", len(ts))
	}

	// A chunked body past the limit is 413, not 400; a form that does
	// not parse is 400, not 500.
	c := rawConn(t, l.addr)
	fmt.Fprintf(c, "POST /api/traces?name=chunked HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n", l.addr)
	go func() {
		fmt.Fprintf(c, "3\r\n\x80\x04N\r\n")
		chunk := bytes.Repeat([]byte("20"), 1<<19) // DUP, POP: no memory
		for range 9 {
			if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(chunk), chunk); err != nil {
				return // the server answered and closed
			}
		}
	}()
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(errorOf(t, b), "larger than this server accepts") {
		t.Errorf("a chunked body over the limit: %d %s", res.StatusCode, b)
	}
	code, b := l.upload(t, "form", strings.NewReader("--xx\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a\"\r\n\r\n\x80\x04N.\r\n-"), map[string]string{"Content-Type": "multipart/form-data; boundary=xx"})
	if code != http.StatusBadRequest || !strings.Contains(errorOf(t, b), "snapshot") {
		t.Errorf("a broken multipart form: %d %s", code, b)
	}
	code, b = l.upload(t, "form", strings.NewReader("garbage"), map[string]string{"Content-Type": "multipart/form-data; boundary=xx"})
	if code != http.StatusBadRequest || !strings.Contains(errorOf(t, b), "multipart") {
		t.Errorf("a form with no part: %d %s", code, b)
	}
}

// An upload stops decoding when its client goes away, and when its time
// budget is spent (413).
func TestUploadStopsWhenClientGoes(t *testing.T) {
	testkit.EachBackend(t, testUploadStopsWhenClientGoes)
}

func testUploadStopsWhenClientGoes(t *testing.T) {
	l := listen(t, nil, Options{MaxDecompressedBytes: 1 << 30, UploadTimeout: time.Minute})
	bomb := hostile.DupPop(256 << 20) // 512 MiB decompressed, in about 1 MiB
	c := rawConn(t, l.addr)
	fmt.Fprintf(c, "POST /api/traces?name=gone HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", l.addr, len(bomb))
	c.Write(bomb)
	c.Close() // the client gives up at once
	deadline := time.Now().Add(2 * time.Minute)
	re := regexp.MustCompile(`msg="upload: the client went away" err="([^"]*)"`)
	var m []string
	for m == nil {
		if time.Now().After(deadline) {
			t.Fatalf("the server did not notice the client leave:\n%s", l.log.String())
		}
		time.Sleep(50 * time.Millisecond)
		m = re.FindStringSubmatch(l.log.String())
	}
	// It stopped before decoding, or at a byte offset short of the end.
	if at := regexp.MustCompile(`byte offset (\d+)`).FindStringSubmatch(m[1]); at != nil {
		if n, _ := strconv.ParseInt(at[1], 10, 64); n >= 512<<20 {
			t.Errorf("the decode went on to byte %d of %d", n, 512<<20)
		}
	}

	l = listen(t, nil, Options{MaxDecompressedBytes: 1 << 30, UploadTimeout: 100 * time.Millisecond})
	code, b := l.upload(t, "slow", bytes.NewReader(bomb), nil)
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(errorOf(t, b), "took longer than 100ms") {
		t.Errorf("past the time budget: %d %s", code, b)
	}
}

// Permalinks need the token where writes do, and a client may make only
// so many a minute.
func TestPermalinkTokenAndRate(t *testing.T) { testkit.EachBackend(t, testPermalinkTokenAndRate) }

func testPermalinkTokenAndRate(t *testing.T) {
	l := listen(t, nil, Options{Token: "s3cret"})
	id := makeTrace(t, l.db, "linked", workload{Steps: 2, Layers: 2, Seed: 1})
	body := func() io.Reader { return strings.NewReader(shareJSON(id, "/traces/"+id+"?t0=1")) }
	js := map[string]string{"Content-Type": "application/json"}
	if code, b := l.do(t, "POST", "/api/permalinks", "", body(), js); code != http.StatusUnauthorized {
		t.Errorf("without the token: %d %s", code, b)
	}
	js["Authorization"] = "Bearer s3cret"
	made := 0
	for range permalinkRate + 5 {
		code, b := l.do(t, "POST", "/api/permalinks", "", body(), js)
		if code == http.StatusTooManyRequests {
			if !strings.Contains(errorOf(t, b), "permalinks a") {
				t.Errorf("429 without a JSON error: %s", b)
			}
			break
		}
		if code != http.StatusCreated {
			t.Fatalf("permalink %d: %d %s", made, code, b)
		}
		made++
	}
	if made != permalinkRate {
		t.Errorf("%d permalinks made before a 429, want %d", made, permalinkRate)
	}
}

// An upload whose events contradict its segments names what it left out,
// in its 201 and on the trace page.
func TestDroppedEventsNamed(t *testing.T) { testkit.EachBackend(t, testDroppedEventsNamed) }

func testDroppedEventsNamed(t *testing.T) {
	l := listen(t, nil, Options{})
	js := `{"segments": [{"device": 0, "address": 1048576, "total_size": 2097152, "segment_type": "small",
	  "blocks": [{"address": 1048576, "size": 2097152, "state": "inactive"}]}],
	 "device_traces": [[
	  {"action": "alloc", "addr": 1048576, "size": 100, "stream": 0},
	  {"action": "alloc", "addr": 9437184, "size": 512, "stream": 0},
	  {"action": "free_requested", "addr": 1048576, "size": 100, "stream": 0},
	  {"action": "free_completed", "addr": 1048576, "size": 100, "stream": 0}]]}`
	code, b := l.upload(t, "contradicts", strings.NewReader(js), nil)
	if code != http.StatusCreated {
		t.Fatalf("upload: %d %s", code, b)
	}
	var up uploadJSON
	json.Unmarshal(b, &up)
	d := up.Traces[0].Dropped
	if d == nil || d.Count != 1 || len(d.First) != 1 || d.First[0].Seq != 1 || d.First[0].Reason == "" {
		t.Fatalf("dropped %+v in %s", d, b)
	}
	if up.Traces[0].Events != 3 {
		t.Errorf("%d events stored, want 3", up.Traces[0].Events)
	}
	code, page := l.do(t, "GET", up.URL, "", nil, nil)
	if code != 200 || !bytes.Contains(page, []byte("1 event was left out")) || !bytes.Contains(page, []byte("event 1: "+d.First[0].Reason)) {
		t.Errorf("the trace page does not say what was left out:\n%s", page)
	}
}

// The list pages, sorts and filters; 5,000 traces no longer make a page
// of megabytes.
func TestListPages(t *testing.T) { testkit.EachBackend(t, testListPages) }

func testListPages(t *testing.T) {
	l := listen(t, nil, Options{})
	for i := range 120 {
		meta := gpu.TraceMeta{Name: fmt.Sprintf("trace %03d", i), Source: gpu.SourceTrace, DeviceName: "sim"}
		if i%4 == 0 {
			meta.Source = gpu.SourceLive
		}
		w, err := l.db.CreateTrace(meta, nil)
		if err != nil {
			t.Fatal(err)
		}
		w.Close(gpu.StatusComplete)
	}
	rowsOf := func(page []byte) int { return bytes.Count(page, []byte(`<tr data-id=`)) }
	_, page := l.do(t, "GET", "/", "", nil, nil)
	if rowsOf(page) != listPer || !bytes.Contains(page, []byte("1–50 of 120")) || !bytes.Contains(page, []byte("page 1 of 3")) {
		t.Errorf("first page: %d rows", rowsOf(page))
	}
	_, page = l.do(t, "GET", "/?page=3&sort=name&order=asc", "", nil, nil)
	if rowsOf(page) != 20 || !bytes.Contains(page, []byte("trace 100")) || bytes.Contains(page, []byte("trace 099")) {
		t.Errorf("third page by name: %d rows", rowsOf(page))
	}
	_, page = l.do(t, "GET", "/?source=live&name=trace+1", "", nil, nil)
	if n := rowsOf(page); n != 5 { // trace 100, 104, ..., 116
		t.Errorf("live traces named like trace 1: %d rows", n)
	}
	var list struct {
		Traces []gpu.Trace
		Total  int
	}
	code, b := l.do(t, "GET", "/api/traces?limit=10&offset=115&sort=name&order=asc", "", nil, nil)
	json.Unmarshal(b, &list)
	if code != 200 || len(list.Traces) != 5 || list.Total != 120 || list.Traces[0].Name != "trace 115" {
		t.Errorf("API page: %d, %d traces of %d", code, len(list.Traces), list.Total)
	}
	for _, q := range []string{"sort=size", "order=up", "limit=0", "offset=-1"} {
		if code, b := l.do(t, "GET", "/api/traces?"+q, "", nil, nil); code != 400 {
			t.Errorf("?%s: %d %s", q, code, b)
		}
	}
}

// What-if on a trace whose stored settings do not parse (a database from
// before imports checked them) is a 422 with the reason, not a 500.
func TestWhatIfOnBadStoredSettings(t *testing.T) {
	dir := t.TempDir()
	db, err := store.Open(filepath.Join(dir, "w.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	id := testkit.Record(t, db, "frag", tracer.DefaultFrag(), fragCapacity, "")
	raw, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, "w.db")+"?_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec("UPDATE traces SET settings = 'max_split_size_mb:banana' WHERE id = ?", id); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	l := listen(t, db, Options{})
	code, b := l.do(t, "GET", "/api/traces/"+id+"/incidents/1/whatif", "", nil, nil)
	if code != http.StatusUnprocessableEntity || !strings.Contains(errorOf(t, b), "banana") {
		t.Errorf("what-if: %d %s", code, b)
	}
}

// On a full disk (a real small tmpfs): uploads are refused at once with
// 507 when space is clearly short, DELETE works and answers 204, and 507
// when even the reserve is gone.
func TestFullDiskOverHTTP(t *testing.T) {
	dir := hostile.SmallDisk(t, 128<<20)
	db, err := store.Open(filepath.Join(dir, "full.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var ids []string
	for i := range 3 {
		ids = append(ids, makeTrace(t, db, fmt.Sprintf("t%d", i), workload{Steps: 20, Layers: 4, Seed: uint64(i)}))
	}
	l := listen(t, db, Options{})
	hostile.Fill(t, dir, 0)
	snap, _ := os.ReadFile(testkit.Snapshot(t, "oom_nonexpandable.json"))
	code, b := l.upload(t, "full", bytes.NewReader(snap), nil)
	if code != http.StatusInsufficientStorage || !strings.Contains(errorOf(t, b), "bytes free") {
		t.Errorf("upload on a full disk: %d %s", code, b)
	}
	if code, b := l.do(t, "DELETE", "/api/traces/"+ids[0], "", nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete on a full disk: %d %s", code, b)
	}
	// No reserve and no byte free: the delete cannot even begin.
	os.Remove(filepath.Join(dir, "full.db-reserve"))
	hostile.Fill(t, dir, 0)
	code, b = l.do(t, "DELETE", "/api/traces/"+ids[1], "", nil, nil)
	if code != http.StatusInsufficientStorage && code != http.StatusNoContent {
		t.Errorf("delete with no room at all: %d %s, want 507 (or 204)", code, b)
	}
	if code == http.StatusInsufficientStorage {
		errorOf(t, b)
	}
}
