package main

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

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
			m := regexp.MustCompile(`(?s)^trace (\S+):.*\nlive: \S+/traces/(\S+)\n`).FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("no trace and live lines in\n%s", out)
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
