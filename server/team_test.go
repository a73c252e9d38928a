package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"vramscope/gpu"
	"vramscope/incident"
	"vramscope/internal/pgtest"
	"vramscope/internal/testkit"
	"vramscope/live"
	"vramscope/store"
	"vramscope/tracer"
)

// teamServer is one server of a team: its own handle (its own session) of
// the shared PostgreSQL database at addr.
func teamServer(t *testing.T, addr string) (*store.DB, *Server, *httptest.Server) {
	t.Helper()
	db, err := store.Open(addr)
	if err != nil {
		t.Fatal(err)
	}
	s := New(Options{DB: db, Logger: quietLogger()})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		srv.Close()
		db.Close()
	})
	return db, s, srv
}

// traceList is GET /api/traces's answer.
func traceList(t *testing.T, base string) []gpu.Trace {
	t.Helper()
	var list struct {
		Traces []gpu.Trace `json:"traces"`
	}
	getJSON(t, base+"/api/traces", http.StatusOK, &list)
	return list.Traces
}

// Two servers on one PostgreSQL behave as one: an upload through A is
// listed and opens through B, a permalink made on A opens on B, a live
// stream into A is followed by a viewer on B as it grows, a what-if is
// computed once for both, and one whose server died is finished by the
// other; PostgreSQL restarted during an upload fails that upload, whole,
// and both servers carry on.
func TestTeamServers(t *testing.T) {
	pg := pgtest.Start(t)
	addr := pg.NewDatabase(t)
	dbA, _, a := teamServer(t, addr)
	_, sB, b := teamServer(t, addr)

	t.Run("upload", func(t *testing.T) {
		data, err := os.ReadFile(testkit.Snapshot(t, "oom_nonexpandable.json"))
		if err != nil {
			t.Fatal(err)
		}
		code, body := post(t, a.URL+"/api/traces?name=team.json", bytes.NewReader(data))
		if code != http.StatusCreated {
			t.Fatalf("upload on A: %d %s", code, body)
		}
		var up uploadJSON
		json.Unmarshal(body, &up)
		listed := false
		for _, tr := range traceList(t, b.URL) {
			listed = listed || tr.ID == up.Traces[0].ID
		}
		if !listed {
			t.Fatalf("B does not list the upload A took: %s", body)
		}
		getPage(t, b.URL+up.URL, http.StatusOK)
		getJSON(t, b.URL+"/api/traces/"+up.Traces[0].ID+"/incidents", http.StatusOK, nil)
	})

	t.Run("permalink", func(t *testing.T) {
		id := makeTrace(t, dbA, "linked", workload{Steps: 1, Layers: 2, Seed: 1})
		view := "/traces/" + id + "?t0=1&t1=2&c=1&panel=cursor"
		code, out := share(t, a.URL, "application/json", shareJSON(id, view))
		if code != http.StatusCreated {
			t.Fatalf("share on A: %d %v", code, out)
		}
		code, loc, _ := open(t, b.URL, out["url"])
		if code != http.StatusSeeOther || loc != view {
			t.Fatalf("A's link on B: %d %q; want 303 to %q", code, loc, view)
		}
	})

	t.Run("live", func(t *testing.T) {
		c, err := live.Dial(a.URL, "", live.ClientOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ws, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(b.URL, "http")+"/ws/traces/"+c.TraceID(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.Close()
		tails := make(chan live.Tail, 100)
		go func() {
			defer close(tails)
			for {
				var tl live.Tail
				if ws.ReadJSON(&tl) != nil {
					return
				}
				tails <- tl
				ws.WriteJSON(map[string]string{"type": "more"})
			}
		}()
		// Each batch is seen on B before the next is sent.
		seq := int64(0)
		addr := uint64(1 << 21)
		c.Emit([]gpu.Event{{Seq: 0, TimeUS: 1, Action: gpu.ActionSegmentAlloc, Addr: addr, Size: 64 << 20}})
		for batch := 1; batch <= 5; batch++ {
			var evs []gpu.Event
			for range 100 {
				seq++
				evs = append(evs, gpu.Event{Seq: seq, TimeUS: seq + 1, Action: gpu.ActionAlloc, Addr: addr, Size: 512})
				seq++
				evs = append(evs, gpu.Event{Seq: seq, TimeUS: seq + 1, Action: gpu.ActionFreeCompleted, Addr: addr, Size: 512})
			}
			sent := time.Now()
			c.Emit(evs)
			waitTail(t, tails, func(tl live.Tail) bool { return tl.Seq == seq && tl.Status == gpu.StatusLive })
			t.Logf("batch %d seen on B %v after it was sent to A", batch, time.Since(sent).Round(time.Millisecond))
		}
		if err := c.Close(gpu.StatusComplete); err != nil {
			t.Fatal(err)
		}
		waitTail(t, tails, func(tl live.Tail) bool { return tl.Status == gpu.StatusComplete && tl.Events == seq+1 })
	})

	t.Run("whatif once", func(t *testing.T) {
		id := testkit.Record(t, dbA, "frag", tracer.DefaultFrag(), fragCapacity, "")
		var wg sync.WaitGroup
		answers := make([]whatifJSON, 2)
		for i, srv := range []*httptest.Server{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				answers[i] = whatIf(t, srv.URL+"/api/traces/"+id+"/incidents/1")
			}()
		}
		wg.Wait()
		if answers[0].Needed == "" || answers[0].Needed != answers[1].Needed || len(answers[0].Rows) != len(answers[1].Rows) {
			t.Fatalf("A and B answer apart: %+v / %+v", answers[0], answers[1])
		}
		tr, _ := dbA.Trace(id)
		j, err := dbA.TakeJob(incident.JobKey(id, tr.LastSeq), id, time.Second)
		if err != nil || !j.Done || j.Takes != 1 {
			t.Fatalf("the job: %+v, %v; want done, taken once", j, err)
		}
	})

	t.Run("whatif takeover", func(t *testing.T) {
		id := testkit.Record(t, dbA, "frag again", tracer.DefaultFrag(), fragCapacity, "")
		tr, _ := dbA.Trace(id)
		key := incident.JobKey(id, tr.LastSeq)
		takeAndDie(t, addr, key, id)
		died := time.Now()
		w := whatIf(t, b.URL+"/api/traces/"+id+"/incidents/1")
		j, err := dbA.TakeJob(key, id, time.Second)
		if err != nil || !j.Done || j.Takes != 2 || w.Needed == "" {
			t.Fatalf("the job: %+v, %v (%+v); want done, taken twice", j, err, w)
		}
		t.Logf("B finished the dead server's what-if %v after it died", time.Since(died).Round(time.Millisecond))
	})

	t.Run("whatif adopted", func(t *testing.T) {
		id := testkit.Record(t, dbA, "frag unasked", tracer.DefaultFrag(), fragCapacity, "")
		tr, _ := dbA.Trace(id)
		key := incident.JobKey(id, tr.LastSeq)
		takeAndDie(t, addr, key, id)
		// No page asks: B's sweep (every JobLease when serving) adopts it.
		for deadline := time.Now().Add(time.Minute); !sB.whatifs.Adopt(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("B adopted no job")
			}
		}
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			j, err := dbA.TakeJob(key, id, time.Minute)
			if err != nil || j.Mine {
				t.Fatalf("while B runs it: %+v, %v", j, err)
			}
			if j.Done {
				if j.Takes != 2 {
					t.Fatalf("the adopted job was taken %d times; want 2", j.Takes)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("B did not finish the job it adopted")
			}
		}
	})

	t.Run("live across a restart", func(t *testing.T) {
		c, err := live.Dial(a.URL, "", live.ClientOptions{RetryFor: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		addr := uint64(1 << 21)
		c.Emit([]gpu.Event{{Seq: 0, TimeUS: 1, Action: gpu.ActionSegmentAlloc, Addr: addr, Size: 64 << 20}})
		seq := int64(0)
		for batch := 0; batch < 40; batch++ {
			if batch == 15 {
				pg.Down()
			}
			if batch == 25 {
				if err := pg.Up(); err != nil {
					t.Fatal(err)
				}
			}
			var evs []gpu.Event
			for range 50 {
				seq++
				evs = append(evs, gpu.Event{Seq: seq, TimeUS: seq + 1, Action: gpu.ActionAlloc, Addr: addr, Size: 512})
				seq++
				evs = append(evs, gpu.Event{Seq: seq, TimeUS: seq + 1, Action: gpu.ActionFreeCompleted, Addr: addr, Size: 512})
			}
			c.Emit(evs)
			time.Sleep(20 * time.Millisecond)
		}
		if err := c.Close(gpu.StatusComplete); err != nil {
			t.Fatal(err)
		}
		var tr gpu.Trace
		getJSON(t, b.URL+"/api/traces/"+c.TraceID(), http.StatusOK, &tr)
		if tr.Status != gpu.StatusComplete || tr.Events != seq+1 || tr.LastSeq != seq {
			t.Fatalf("the stream across a restart, on B: %s, %d events, last %d; want complete, %d, %d", tr.Status, tr.Events, tr.LastSeq, seq+1, seq)
		}
		evs, err := dbA.Events(c.TraceID(), 0, seq+1)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range evs {
			if e.Seq != int64(i) {
				t.Fatalf("event %d has seq %d: a gap or a duplicate", i, e.Seq)
			}
		}
	})

	t.Run("restart mid-upload", func(t *testing.T) {
		before := len(traceList(t, b.URL))
		data, err := os.ReadFile(testkit.SyntheticSnapshot(t, 400_000))
		if err != nil {
			t.Fatal(err)
		}
		type answer struct {
			code int
			body []byte
		}
		done := make(chan answer, 1)
		go func() {
			res, err := http.Post(a.URL+"/api/traces?name=restarted.pickle", "application/octet-stream", bytes.NewReader(data))
			if err != nil {
				done <- answer{0, []byte(err.Error())}
				return
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			done <- answer{res.StatusCode, body}
		}()
		// Restart once the import has begun storing rows.
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
			n, err := pg.Value(addr, "SELECT count(*) FROM traces WHERE status = 'importing'")
			if err == nil && n != "0" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the upload never began storing")
			}
		}
		pg.Down()
		if err := pg.Up(); err != nil {
			t.Fatal(err)
		}
		got := <-done
		if got.code < 500 || !strings.Contains(string(got.body), `"error"`) {
			t.Fatalf("the upload across a restart: %d %s; want a 5xx with the error", got.code, got.body)
		}
		t.Logf("the upload across a restart: %d %s", got.code, got.body)
		for _, srv := range []*httptest.Server{a, b} {
			deadline := time.Now().Add(10 * time.Second)
			for {
				res, err := http.Get(srv.URL + "/api/traces")
				if err == nil && res.StatusCode == http.StatusOK {
					res.Body.Close()
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s did not reconnect: %v", srv.URL, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if n := len(traceList(t, srv.URL)); n != before {
				t.Fatalf("%d traces listed after the failed upload, %d before", n, before)
			}
		}
		small, _ := os.ReadFile(testkit.Snapshot(t, "oom_nonexpandable.json"))
		if code, body := post(t, a.URL+"/api/traces?name=after.json", bytes.NewReader(small)); code != http.StatusCreated {
			t.Fatalf("an upload after the restart: %d %s", code, body)
		}
		if n := len(traceList(t, b.URL)); n != before+1 {
			t.Fatalf("B lists %d traces after A's next upload; want %d", n, before+1)
		}
	})
}

// takeAndDie runs a server that takes the what-if job key of trace id,
// then dies (SIGKILL) before it ends.
func takeAndDie(t *testing.T, addr, key, id string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestTakeJobAndHang$", "-test.count=1")
	cmd.Env = append(os.Environ(), takeJobEnv+"="+addr+" "+key+" "+id)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != "taken" {
		if strings.HasPrefix(sc.Text(), "error") {
			t.Fatal(sc.Text())
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
}

// waitTail reads tails until one is what ok wants.
func waitTail(t *testing.T, tails <-chan live.Tail, ok func(live.Tail) bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case tl, open := <-tails:
			if !open {
				t.Fatal("the viewer's connection closed")
			}
			if ok(tl) {
				return
			}
		case <-timeout:
			t.Fatal("the viewer on B did not see it within 10 s")
		}
	}
}

const takeJobEnv = "VRAMSCOPE_TAKE_JOB"

// TestTakeJobAndHang is a server that takes a what-if job and hangs until
// it is killed (TestTeamServers); it does nothing in a normal run.
func TestTakeJobAndHang(t *testing.T) {
	args := strings.Fields(os.Getenv(takeJobEnv))
	if len(args) != 3 {
		t.Skip("runs as the child of TestTeamServers")
	}
	db, err := store.Open(args[0])
	if err != nil {
		fmt.Println("error", err)
		return
	}
	j, err := db.TakeJob(args[1], args[2], incident.JobLease)
	if err != nil || !j.Mine {
		fmt.Println("error", j, err)
		return
	}
	fmt.Println("taken")
	select {}
}
