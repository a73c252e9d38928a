package main

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/server"
	"vramscope/store"
)

// trace --live stores on the server what it records locally: the same
// events with the same stacks, the same annotations (steps and phases),
// figures and OOMs.
func TestTraceLiveStoresWhatItRecords(t *testing.T) {
	remote := testkit.OpenDB(t)
	srv := httptest.NewServer(server.New(server.Options{DB: remote, Addr: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).Handler())
	t.Cleanup(srv.Close)
	for _, args := range [][]string{
		{"--workload", "train", "--steps", "2", "--layers", "4", "--hidden", "1024"},
		{"--workload", "frag", "--capacity", "8GiB"}, // runs out of memory
		{"--workload", "frag", "--capacity", "8GiB", "--alloc-conf", "max_split_size_mb:256"},
		{"--workload", "replay", testkit.Snapshot(t, "oom_nonexpandable.json")},     // a real job's stacks; no annotations
		{"--workload", "replay", testkit.Snapshot(t, "windows_paths_small.pickle")}, // blocks live before it, two with frames
	} {
		t.Run(strings.Join(args[1:], " "), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "v.db")
			code, out, errs := runCmd(append([]string{"trace", "--db", path, "--live", srv.URL, "--quiet"}, args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s\n%s", code, errs, out)
			}
			// The live page first, then the local trace, and at the end
			// the links a person opens, all on the live server.
			m := regexp.MustCompile(`^live: (\S+)/traces/(\S+)\ntrace (\S+):`).FindStringSubmatch(out)
			if m == nil || m[1] != srv.URL {
				t.Fatalf("no live and trace lines in\n%s", out)
			}
			m[1] = m[3] // the local trace, as sameTrace takes them
			links := regexp.MustCompile(`(?m)^(?:incident \d+: )?(http\S+)$`).FindAllStringSubmatch(out, -1)
			if len(links) == 0 || links[0][1] != srv.URL+"/traces/"+m[2] {
				t.Errorf("the link printed is not the live trace's page %s/traces/%s:\n%s", srv.URL, m[2], out)
			}
			for _, l := range links {
				if resp, err := http.Get(l[1]); err != nil || resp.StatusCode != http.StatusOK {
					t.Errorf("%s: %v %v", l[1], err, resp.Status)
				} else {
					resp.Body.Close()
				}
			}
			local, err := store.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer local.Close()
			sameTrace(t, local, m[1], remote, m[2], args[1] != "replay")
		})
	}
}

// sameTrace fails unless trace a of db x and trace b of db y hold the same
// recording, annotated when it should be.
func sameTrace(t *testing.T, x *store.DB, a string, y *store.DB, b string, annotated bool) {
	t.Helper()
	ta, err := x.Trace(a)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := y.Trace(b)
	if err != nil {
		t.Fatal(err)
	}
	if tb.Source != gpu.SourceLive {
		t.Errorf("the server's trace is a %s trace", tb.Source)
	}
	ta.ID, ta.Source, ta.Upload, ta.Created = tb.ID, tb.Source, tb.Upload, tb.Created
	if !reflect.DeepEqual(ta, tb) {
		t.Errorf("traces differ:\nlocal %+v\nlive  %+v", ta, tb)
	}
	ea, err := x.Events(a, 0, ta.LastSeq+1)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := y.Events(b, 0, tb.LastSeq+1)
	if err != nil {
		t.Fatal(err)
	}
	if len(ea) != len(eb) || len(ea) == 0 {
		t.Fatalf("local %d events, live %d", len(ea), len(eb))
	}
	for i := range ea {
		sa, err := x.Stack(a, ea[i].Stack)
		if err != nil && ea[i].Stack != 0 {
			t.Fatal(err)
		}
		sb, err := y.Stack(b, eb[i].Stack)
		if err != nil && eb[i].Stack != 0 {
			t.Fatal(err)
		}
		ea[i].Stack, eb[i].Stack = 0, 0
		if ea[i] != eb[i] || !reflect.DeepEqual(sa, sb) {
			t.Fatalf("event %d: local %+v %v, live %+v %v", i, ea[i], sa, eb[i], sb)
		}
	}
	la, _, err := x.LayoutAtSeq(a, -1)
	if err != nil {
		t.Fatal(err)
	}
	lb, _, err := y.LayoutAtSeq(b, -1)
	if err != nil {
		t.Fatal(err)
	}
	if len(la.Segments) != len(lb.Segments) {
		t.Fatalf("starting layouts: local %d segments, live %d", len(la.Segments), len(lb.Segments))
	}
	for i := range la.Segments {
		sa, sb := la.Segments[i], lb.Segments[i]
		if len(sa.Blocks) != len(sb.Blocks) {
			t.Fatalf("starting segment %d: local %d blocks, live %d", i, len(sa.Blocks), len(sb.Blocks))
		}
		for j := range sa.Blocks {
			ba, bb := sa.Blocks[j], sb.Blocks[j]
			fa, _ := x.Stack(a, ba.Stack)
			fb, _ := y.Stack(b, bb.Stack)
			ba.Stack, bb.Stack = 0, 0
			if ba != bb || !reflect.DeepEqual(fa, fb) {
				t.Fatalf("starting block %d.%d: local %+v %v, live %+v %v", i, j, ba, fa, bb, fb)
			}
		}
	}
	aa, err := x.Annotations(a)
	if err != nil {
		t.Fatal(err)
	}
	ab, err := y.Annotations(b)
	if err != nil {
		t.Fatal(err)
	}
	if annotated && len(aa) == 0 || !reflect.DeepEqual(aa, ab) {
		t.Errorf("local %d annotations, live %d", len(aa), len(ab))
	}
	ia, err := x.Incidents(a)
	if err != nil {
		t.Fatal(err)
	}
	ib, err := y.Incidents(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(ia) != len(ib) || len(ia) != int(ta.OOMs) {
		t.Errorf("local %d incidents, live %d, OOMs %d", len(ia), len(ib), ta.OOMs)
	}
}

// A live server lists many jobs' traces: trace --live names each by its
// workload, rank, machine and start time, and prints the pages of the
// live server (each rank's as it starts, and the run's), not of --db.
func TestTraceLiveNamesAndLinks(t *testing.T) {
	remote := testkit.OpenDB(t)
	srv := httptest.NewServer(server.New(server.Options{DB: remote, Addr: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).Handler())
	t.Cleanup(srv.Close)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now().Truncate(time.Second)
	code, out, errs := runCmd("trace", "--db", filepath.Join(t.TempDir(), "other.db"), "--live", srv.URL, "--quiet",
		"--workload", "train", "--steps", "1", "--layers", "2", "--hidden", "512", "--ranks", "2")
	after := time.Now()
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errs, out)
	}
	ts, err := remote.Traces()
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 {
		t.Fatalf("%d traces on the live server", len(ts))
	}
	name := regexp.MustCompile(`^train pp×2 rank (\d) · (.+) · (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)$`)
	for _, tr := range ts {
		m := name.FindStringSubmatch(tr.Name)
		if m == nil || m[2] != host {
			t.Errorf("live trace named %q; want its rank, host %s and start time", tr.Name, host)
			continue
		}
		if at, err := time.ParseInLocation("2006-01-02 15:04:05", m[3], time.Local); err != nil || at.Before(before) || at.After(after) {
			t.Errorf("%q: the start time is not when the command ran (%v to %v)", tr.Name, before, after)
		}
		if !strings.Contains(out, "rank "+m[1]+" live: "+srv.URL+"/traces/"+tr.ID+"\n") {
			t.Errorf("rank %s's live page is not printed:\n%s", m[1], out)
		}
	}
	run := regexp.MustCompile(`(?m)^run train pp×2 · .+: (\S+)$`).FindStringSubmatch(out)
	if run == nil || !strings.HasPrefix(run[1], srv.URL+"/runs/") {
		t.Fatalf("no run page of the live server in\n%s", out)
	}
	if resp, err := http.Get(run[1]); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("%s: %v %v", run[1], err, resp.Status)
	} else {
		resp.Body.Close()
	}
}
