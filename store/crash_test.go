package store

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"vramscope/gpu"
)

const crashEnv = "VRAMSCOPE_STORE_CRASH_DB"

// TestCrashWriter is the writer process that TestSIGKILL kills; it does
// nothing in a normal run.
func TestCrashWriter(t *testing.T) {
	path := os.Getenv(crashEnv)
	if path == "" {
		t.Skip("runs as the child of TestSIGKILL")
	}
	db, err := Open(path)
	if err != nil {
		fmt.Println("error", err)
		return
	}
	w, err := db.CreateTrace(testMeta, nil)
	if err != nil {
		fmt.Println("error", err)
		return
	}
	fmt.Println("trace", w.ID())
	g := newGen(11, 300)
	for i := 0; ; i++ {
		var batch []gpu.Event
		for len(batch) < 1000 {
			batch = g.next(batch)
		}
		w.Emit(batch)
		if i%10 == 9 {
			if err := w.Flush(); err != nil {
				fmt.Println("error", err)
				return
			}
			fmt.Println("flushed", g.seq-1)
		}
	}
}

// A writer killed mid-run leaves a database that opens, with the trace
// incomplete and every committed event readable; the trace can be resumed.
func TestSIGKILL(t *testing.T) {
	path := t.TempDir() + "/crash.db"
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashWriter$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var id string
	var flushed int64 = -1
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == "trace" {
			id = f[1]
		} else if len(f) == 2 && f[0] == "flushed" {
			flushed, _ = strconv.ParseInt(f[1], 10, 64)
			if flushed >= 30000 {
				break
			}
		} else if len(f) > 0 && f[0] == "error" {
			t.Fatal(sc.Text())
		}
	}
	// Let it write on past the flush, then kill it mid-run.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if id == "" || flushed < 0 {
		t.Fatalf("child gave no trace (id %q, flushed %d)", id, flushed)
	}

	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tr, err := db.Trace(id)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Status != gpu.StatusIncomplete {
		t.Fatalf("status %s after the writer was killed, want incomplete", tr.Status)
	}
	if tr.LastSeq < flushed {
		t.Fatalf("last seq %d, but %d was flushed", tr.LastSeq, flushed)
	}
	evs := newGen(11, 300).events(int(tr.LastSeq) + 1 + 20000)
	stored, err := db.Events(id, 0, 1<<62)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(stored)) != tr.Events || !reflect.DeepEqual(stored, evs[:len(stored)]) {
		t.Fatalf("%d committed events do not match what was written", len(stored))
	}

	// Resume it, append the rest, and check it reads as if written at once.
	w, last, err := db.ResumeTrace(id)
	if err != nil {
		t.Fatal(err)
	}
	if last != tr.LastSeq {
		t.Fatalf("resumed at %d, want %d", last, tr.LastSeq)
	}
	if _, _, err := db.ResumeTrace(id); err == nil {
		t.Fatal("a trace being written was resumed twice")
	}
	w.Emit(evs[last+1:])
	if err := w.Close(gpu.StatusComplete); err != nil {
		t.Fatal(err)
	}
	all, err := db.Events(id, 0, 1<<62)
	if err != nil || !reflect.DeepEqual(all, evs) {
		t.Fatalf("after resuming: %d events (%v), want %d", len(all), err, len(evs))
	}
	ref := &reference{newGen(0, 0).l, evs}
	first, lastUS := evs[0].TimeUS, evs[len(evs)-1].TimeUS
	for _, n := range []int{3000, 200, 9} {
		u, err := db.Usage(id, first, lastUS, n)
		if err != nil {
			t.Fatal(err)
		}
		want := bruteUsage(ref, u)
		if !reflect.DeepEqual(u.Buckets, want) {
			t.Fatalf("usage in %d buckets differs after resume", n)
		}
	}
	mid := evs[tr.LastSeq].TimeUS
	for _, win := range [][2]int64{{first, lastUS}, {mid - 50, mid + 50}} {
		got, err := db.Allocations(id, win[0], win[1], 1<<20, 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := bruteAllocations(ref, win[0], win[1], 1<<20, 0); !reflect.DeepEqual(got, want) {
			t.Fatalf("allocations in %v differ after resume: %d, want %d", win, len(got.Allocations), len(want.Allocations))
		}
	}
	l, _, err := db.LayoutAt(id, lastUS)
	if err != nil {
		t.Fatal(err)
	}
	sameLayout(t, "end", l, ref.layoutAtSeq(1<<62))
}
