package live_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"vramscope/gpu"
	"vramscope/ingest"
	"vramscope/internal/testkit"
	"vramscope/internal/testkit/need"
	"vramscope/pytorch"
	"vramscope/server"
	"vramscope/store"
)

func python(t *testing.T) string {
	return need.Program(t, "python3")
}

// TestPythonWatch runs the Python helper, with entries from a real PyTorch
// snapshot standing in for torch, against the real server; the driver cuts
// the connection once in the middle of a message.
func TestPythonWatch(t *testing.T) {
	want, db, srv, text := watchDriver(t, "oom_nonexpandable.json", 200)
	var liveID, incident string
	for _, line := range strings.Split(text, "\n") {
		if s, ok := strings.CutPrefix(line, "traces "); ok {
			liveID = s
		}
		if s, ok := strings.CutPrefix(line, "incidents "); ok {
			incident = s
		}
	}
	tr, err := db.Trace(liveID)
	if err != nil {
		t.Fatalf("live trace %q: %v", liveID, err)
	}
	if tr.Status != gpu.StatusComplete || tr.Source != gpu.SourceLive || tr.OOMs != 1 {
		t.Fatalf("live trace %+v", tr)
	}
	sameEvents(t, db, liveID, want)
	// The upload made a snapshot trace whose incident the link names.
	all, err := db.Traces()
	if err != nil {
		t.Fatal(err)
	}
	var up *gpu.Trace
	for i := range all {
		if all[i].Source == gpu.SourceSnapshot {
			up = &all[i]
		}
	}
	if up == nil || up.OOMs != 1 || incident != srv.URL+"/traces/"+up.ID+"/incidents/1" {
		t.Fatalf("uploaded %+v, incident link %q", up, incident)
	}
}

// The helper sends the job's annotations (record_function regions: steps
// and phases) with its entries, as a snapshot's external_annotations: a
// real job's 714, read as they come, resent after a cut connection. When
// the annotations' ring drops some between two polls (688 come within 37
// entries), the helper goes on after the last it read: what it sends are
// the job's, in order, once each.
func TestPythonWatchAnnotations(t *testing.T) {
	for _, ring := range []int{1000, 200} {
		want, db, _, text := watchDriver(t, "uint64_line_annotations.pickle", ring)
		var liveID string
		for _, line := range strings.Split(text, "\n") {
			if s, ok := strings.CutPrefix(line, "traces "); ok {
				liveID = s
			}
		}
		sameEvents(t, db, liveID, want)
		got, err := db.Annotations(liveID)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(testkit.Snapshot(t, "uint64_line_annotations.pickle"))
		if err != nil {
			t.Fatal(err)
		}
		ids, err := ingest.Snapshot(db, f, "imported", pytorch.Options{})
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		all, err := db.Annotations(ids[0])
		if err != nil {
			t.Fatal(err)
		}
		if ring == 1000 {
			if len(all) != 714 || !reflect.DeepEqual(got, all) {
				t.Fatalf("live trace: %d annotations, the snapshot %d", len(got), len(all))
			}
			continue
		}
		// got is a subsequence of all, and ends as it does.
		t.Logf("ring %d: %d of the job's %d annotations sent", ring, len(got), len(all))
		i := 0
		for _, a := range got {
			for i < len(all) && all[i] != a {
				i++
			}
			if i == len(all) {
				t.Fatalf("ring %d: annotation %+v is not the job's, or out of order", ring, a)
			}
			i++
		}
		if len(got) <= ring || got[len(got)-1] != all[len(all)-1] {
			t.Fatalf("ring %d: %d annotations of %d sent, the last %+v", ring, len(got), len(all), got[len(got)-1])
		}
	}
}

// sameEvents fails unless live trace id holds want's entries.
func sameEvents(t *testing.T, db *store.DB, id string, want *pytorch.Trace) {
	t.Helper()
	got, err := db.Events(id, 0, 1<<40)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want.Events) {
		t.Fatalf("stored %d events, the snapshot has %d", len(got), len(want.Events))
	}
	for i, e := range got {
		w := want.Events[i]
		if e.Seq != int64(i) || e.Action != w.Action || e.Addr != w.Addr || e.Size != w.Size || e.TimeUS != w.TimeUS || (e.Stack == 0) != (w.Stack == 0) {
			t.Fatalf("event %d: stored %v, the snapshot has %v", i, e, w)
		}
	}
}

// watchDriver runs the driver on the entries of real snapshot name (and
// its annotations, in a ring of annotationRing) against the whole server,
// and returns device 0's trace, the server's database
// and the driver's output.
func watchDriver(t *testing.T, name string, annotationRing int) (*pytorch.Trace, *store.DB, *httptest.Server, string) {
	t.Helper()
	py := python(t)
	snap := testkit.Snapshot(t, name)
	traces, err := pytorch.DecodeFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	want := traces[0]
	// The job's state after every read the driver makes: 37 entries
	// each, until the one that reaches the OOM reads the rest.
	oom := len(want.Events)
	for _, e := range want.Events {
		if e.Action == gpu.ActionOOM {
			oom = int(e.Seq)
			break
		}
	}
	var reads []int
	for n := 0; n <= oom; n += 37 {
		reads = append(reads, n)
	}
	states := writeStates(t, want, reads...)

	db := testkit.OpenDB(t)
	const token = "tok"
	// The whole server, as vramscope serve runs it.
	srv := httptest.NewServer(server.New(server.Options{DB: db, Token: token, Addr: "127.0.0.1:0"}).Handler())
	t.Cleanup(srv.Close)
	servedAsIs(t, srv.URL, "vramscope_watch.py")

	helper, _ := filepath.Abs("python")
	cmd := exec.Command(py, "testdata/watch_driver.py", helper, srv.URL, snap, states, "200", "37", token, fmt.Sprint(annotationRing))
	out, err := cmd.CombinedOutput()
	t.Logf("driver:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
	text := string(out)
	if !strings.Contains(text, "recording [100000]") {
		t.Fatal("the helper did not turn recording on")
	}
	if !strings.Contains(text, "cut 1") {
		t.Fatal("the connection was not cut")
	}
	return want, db, srv, text
}

// writeStates writes tr's state (its segments, with the stacks of their
// blocks) after each count of its entries into a folder, state-N.pickle,
// for a driver that stands in for the job: PyTorch's snapshots give the
// segments of the instant they are taken.
func writeStates(t *testing.T, tr *pytorch.Trace, counts ...int) string {
	t.Helper()
	dir := t.TempDir()
	l := tr.Initial.Clone()
	i := 0
	for _, n := range counts {
		for ; i < len(tr.Events) && tr.Events[i].Seq < int64(n); i++ {
			if err := l.Apply(tr.Events[i]); err != nil {
				t.Fatal(err)
			}
		}
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("state-%d.pickle", n)))
		if err != nil {
			t.Fatal(err)
		}
		if err := pytorch.Export(f, &pytorch.Trace{Device: 0, Final: l.Clone(), Stacks: tr.Stacks, Settings: tr.Settings}); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	return dir
}

func TestIngestBeyondLoopbackNeedsToken(t *testing.T) {
	db := testkit.OpenDB(t)
	for _, c := range []struct {
		addr, token, send string
		want              int
	}{
		{"0.0.0.0:8080", "", "", http.StatusUnauthorized},
		{"0.0.0.0:8080", "k", "x", http.StatusUnauthorized},
		{"0.0.0.0:8080", "k", "k", http.StatusSwitchingProtocols},
		{"127.0.0.1:8080", "", "", http.StatusSwitchingProtocols},
	} {
		srv := httptest.NewServer(server.New(server.Options{DB: db, Token: c.token, Addr: c.addr}).Handler())
		hdr := http.Header{}
		if c.send != "" {
			hdr.Set("Authorization", "Bearer "+c.send)
		}
		conn, resp, _ := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http")+"/ws/ingest", hdr)
		if resp == nil || resp.StatusCode != c.want {
			t.Errorf("%+v: answered %v", c, resp)
		}
		if conn != nil {
			conn.Close()
		}
		srv.Close()
	}
	if trs, _ := db.Traces(); len(trs) != 0 {
		t.Fatalf("%d traces stored", len(trs))
	}
}

// TestPythonWatchRanks streams two ranks of one job through the Python
// helper: one names its run and rank, the other takes them from the
// environment torchrun sets; the server groups them as one run.
func TestPythonWatchRanks(t *testing.T) {
	py := python(t)
	snap := testkit.Snapshot(t, "oom_nonexpandable.json")
	db := testkit.OpenDB(t)
	srv := httptest.NewServer(server.New(server.Options{DB: db, Addr: "127.0.0.1:0"}).Handler())
	defer srv.Close()
	helper, _ := filepath.Abs("python")
	states := rankStates(t, snap)
	drive := func(run, rank string, env ...string) string {
		cmd := exec.Command(py, "testdata/watch_rank_driver.py", helper, srv.URL, snap, states, run, rank)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("driver: %v\n%s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if s, ok := strings.CutPrefix(line, "traces "); ok {
				return s
			}
		}
		t.Fatalf("no trace in\n%s", out)
		return ""
	}
	a := drive("job", "0")
	b := drive("-", "-", "VRAMSCOPE_RUN=job", "RANK=1", "WORLD_SIZE=2")
	var runs []string
	for i, id := range []string{a, b} {
		tr, err := db.Trace(id)
		if err != nil {
			t.Fatal(err)
		}
		of, ok, err := db.RunOf(tr.Upload)
		if err != nil || !ok || of.Name != "job" || of.Rank != i {
			t.Fatalf("trace %s: run %+v, %v, %v", id, of, ok, err)
		}
		if tr.Events == 0 || tr.Status != gpu.StatusComplete {
			t.Errorf("trace %+v", tr)
		}
		// A list of many jobs' traces tells them apart: script, rank,
		// host, device and start time.
		host, _ := os.Hostname()
		if !regexp.MustCompile(fmt.Sprintf(`^watch_rank_driver\.py rank %d · %s cuda:\d+ · \d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`, i, regexp.QuoteMeta(host))).MatchString(tr.Name) {
			t.Errorf("trace named %q", tr.Name)
		}
		runs = append(runs, of.ID)
	}
	if runs[0] != runs[1] {
		t.Fatalf("the ranks are in runs %v", runs)
	}
	if r, _ := db.Run(runs[0]); r.WorldSize != 2 || len(r.Ranks) != 2 {
		t.Errorf("run %+v", r)
	}
}

// rankStates writes the states watch_rank_driver.py reads: every 500
// entries until the OOM, and there.
func rankStates(t *testing.T, snap string) string {
	t.Helper()
	traces, err := pytorch.DecodeFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	tr := traces[0]
	oom := len(tr.Events)
	for _, e := range tr.Events {
		if e.Action == gpu.ActionOOM {
			oom = int(e.Seq)
			break
		}
	}
	var reads []int
	for n := 0; n < oom; n += 500 {
		reads = append(reads, n)
	}
	return writeStates(t, tr, append(reads, oom)...)
}

// watch() against a server that is not there raises after one try, as
// Dial does, instead of holding the job up retrying.
func TestPythonWatchUnreachable(t *testing.T) {
	py := python(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	helper, _ := filepath.Abs("python")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, "testdata/watch_unreachable.py", helper, url).CombinedOutput()
	t.Logf("driver:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "raised vramscope: server unreachable: ") || !strings.Contains(string(out), "tries 1\n") {
		t.Fatal("watch() did not raise after one try")
	}
}

// The connection drops while the trace ends, between the helper's end and
// the server's done: close() makes it again and ends the trace, whether
// the server had read the end (only done was lost) or not.
func TestPythonWatchCutAtTheEnd(t *testing.T) {
	py := python(t)
	snap := testkit.Snapshot(t, "oom_nonexpandable.json")
	db := testkit.OpenDB(t)
	srv := httptest.NewServer(server.New(server.Options{DB: db, Addr: "127.0.0.1:0"}).Handler())
	defer srv.Close()
	helper, _ := filepath.Abs("python")
	states := rankStates(t, snap)
	for _, where := range []string{"after-end", "in-end"} {
		out, err := exec.Command(py, "testdata/watch_rank_driver.py", helper, srv.URL, snap, states, "-", "-", where).CombinedOutput()
		text := string(out)
		t.Logf("%s: driver:\n%s", where, text)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(text, "cut 1\n") || strings.Contains(text, "failed") {
			t.Fatalf("%s: the end was not cut, or not finished", where)
		}
		var id string
		for _, line := range strings.Split(text, "\n") {
			if s, ok := strings.CutPrefix(line, "traces "); ok {
				id = s
			}
		}
		tr, err := db.Trace(id)
		if err != nil || tr.Status != gpu.StatusComplete || tr.Events == 0 {
			t.Fatalf("%s: trace %q: %+v, %v", where, id, tr, err)
		}
	}
}

// servedAsIs checks that the server at url serves the module python/name
// byte for byte.
func servedAsIs(t *testing.T, url, name string) {
	t.Helper()
	resp, err := http.Get(url + "/" + name)
	if err != nil {
		t.Fatal(err)
	}
	served, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if src, _ := os.ReadFile("python/" + name); resp.StatusCode != 200 || string(served) != string(src) {
		t.Fatalf("GET /%s: %s, %d bytes", name, resp.Status, len(served))
	}
}
