package live_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"vramscope/attrib"
	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/server"
	"vramscope/store"
)

// wholeSteps checks a trace of testdata/standin_job.py against the job:
// each step makes 600 entries (200 allocations, each freed). The steps
// the server marks complete have all 600, alloc, free_requested and
// free_completed of the same 200 blocks, no gap within; there are at
// least want of them, in a row; the others, sampled, lost some.
func wholeSteps(t *testing.T, db *store.DB, id string, want int) {
	t.Helper()
	tr, err := db.Trace(id)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Status != gpu.StatusComplete || tr.Dropped == nil || tr.Dropped.GapCount == 0 || len(tr.Dropped.Whole) == 0 {
		t.Fatalf("trace %+v, dropped %+v: want a sampled trace with a read whole", tr, tr.Dropped)
	}
	c, err := attrib.NewCategorizer(db, id)
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.StepPeaks(0, 2000)
	if err != nil {
		t.Fatal(err)
	}
	events, err := db.Events(id, 0, tr.LastSeq+1)
	if err != nil {
		t.Fatal(err)
	}
	complete, run, best, sampledWhole := 0, 0, 0, 0
	for _, s := range st.Steps {
		var allocs, requested, completed int
		blocks := map[uint64]int{}
		for _, e := range events {
			if e.TimeUS < s.StartUS || e.TimeUS > s.EndUS {
				continue
			}
			switch e.Action {
			case gpu.ActionAlloc:
				allocs++
				blocks[e.Addr]++
			case gpu.ActionFreeRequested:
				requested++
				blocks[e.Addr]++
			case gpu.ActionFreeCompleted:
				completed++
				blocks[e.Addr]++
			}
		}
		whole := allocs == 200 && requested == 200 && completed == 200 && len(blocks) == 200
		for _, g := range tr.Dropped.Gaps {
			whole = whole && !(s.StartUS <= g.TimeUS && g.TimeUS <= s.EndUS)
		}
		switch {
		case s.Complete && !whole:
			t.Errorf("%s is marked complete; the trace has %d allocs, %d free_requested, %d free_completed of %d blocks in it (the job made 200 of 200)",
				s.Name, allocs, requested, completed, len(blocks))
		case s.Complete:
			complete++
			run++
			best = max(best, run)
		default:
			run = 0
			if whole {
				sampledWhole++
			}
		}
	}
	t.Logf("%d steps, %d complete (%d in a row), %d of the others happened to lose nothing; %d gaps, %d entries known lost; reads whole %+v",
		len(st.Steps), complete, best, sampledWhole, tr.Dropped.GapCount, tr.Dropped.Lost, tr.Dropped.Whole)
	if best < want || st.Complete != complete || !st.Sampled {
		t.Errorf("%d steps complete in a row, %d in all (the answer says %d, sampled %v); want %d asked for", best, complete, st.Complete, st.Sampled, want)
	}
	if sampledWhole > len(st.Steps)/2 {
		t.Errorf("%d of %d steps lost nothing while sampled: the test asks little of the reads whole", sampledWhole, len(st.Steps))
	}
}

// Asked from the job's side (N written into the watcher's request file),
// the watcher reads the next N steps whole: every entry of them reaches
// the trace, they are marked complete, and sampling resumes after them.
func TestPythonWatchStepsWholeAskedByFile(t *testing.T) {
	db := testkit.OpenDB(t)
	srv := httptest.NewServer(server.New(server.Options{DB: db, Addr: "127.0.0.1:0"}).Handler())
	defer srv.Close()
	text, _ := runWatched(t, []string{"STANDIN_ASK_WHOLE=60:20"}, "--url", srv.URL, "--interval", "0.02", "--max-entries", "300",
		"testdata/standin_job.py", "200")
	wholeSteps(t, db, traceIn(t, text), 20)
}

// Asked from the server (the API the trace page calls), or by a signal
// (SIGUSR1: 10 steps), the same.
func TestPythonWatchStepsWholeAskedByServerOrSignal(t *testing.T) {
	for _, how := range []string{"api", "signal"} {
		t.Run(how, func(t *testing.T) {
			py := python(t)
			db := testkit.OpenDB(t)
			srv := httptest.NewServer(server.New(server.Options{DB: db, Addr: "127.0.0.1:0"}).Handler())
			defer srv.Close()
			helper, _ := filepath.Abs("python")
			standin, _ := filepath.Abs("testdata/standin")
			cmd := exec.Command(py, "-u", "-m", "vramscope_watch", "--url", srv.URL, "--interval", "0.02", "--max-entries", "300",
				"testdata/standin_job.py", "600")
			cmd.Env = append(os.Environ(), "PYTHONPATH="+standin+string(os.PathListSeparator)+helper)
			out, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			lines := bufio.NewScanner(out)
			var id string
			var said []string
			for id == "" && lines.Scan() {
				said = append(said, lines.Text())
				if _, after, ok := strings.Cut(lines.Text(), "watching live at "); ok {
					id = after[strings.LastIndex(after, "/")+1:]
				}
			}
			for lines.Scan() { // the job runs once the watcher says how to ask
				said = append(said, lines.Text())
				if strings.Contains(lines.Text(), "to read the next N steps whole") {
					break
				}
			}
			want := 25
			if how == "signal" {
				want = 10
				if !strings.Contains(said[len(said)-1], fmt.Sprintf("kill -USR1 %d (10 steps)", cmd.Process.Pid)) {
					t.Fatalf("the watcher does not say it takes a signal:\n%s", strings.Join(said, "\n"))
				}
				if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
					t.Fatal(err)
				}
			} else {
				res, err := http.Post(fmt.Sprintf("%s/api/traces/%s/complete?steps=%d", srv.URL, id, want), "", nil)
				if err != nil {
					t.Fatal(err)
				}
				var r map[string]any
				json.NewDecoder(res.Body).Decode(&r)
				res.Body.Close()
				if res.StatusCode != http.StatusAccepted || r["steps"] != float64(want) {
					t.Fatalf("POST complete: %d %v", res.StatusCode, r)
				}
			}
			for lines.Scan() {
				said = append(said, lines.Text())
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("%v:\n%s", err, strings.Join(said, "\n"))
			}
			t.Logf("the watcher said:\n%s", strings.Join(said, "\n"))
			wholeSteps(t, db, id, want)
		})
	}
}
