package ingest_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"vramscope/gpu"
	"vramscope/ingest"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/store"
)

// copyAs copies a real snapshot under another name in dir.
func copyAs(t *testing.T, dir, real, name string) string {
	t.Helper()
	b, err := os.ReadFile(testkit.Snapshot(t, real))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// The two-GPU and the multi-GPU shared snapshots as one run: ranks by
// their place, each rank its devices, every trace stored as a lone import
// would store it.
func TestRunOfRealSnapshots(t *testing.T) {
	db := testkit.OpenDB(t)
	files := []string{testkit.Snapshot(t, "two_gpus_expandable_state_only.pickle"), testkit.Snapshot(t, "expandable_oom_multigpu.pickle")}
	run, ranks, err := ingest.Run(context.Background(), db, "job", ingest.Files(files), pytorch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ranks) != 2 || ranks[0].Rank != 0 || ranks[1].Rank != 1 || len(ranks[0].Traces) != 2 || len(ranks[1].Traces) != 3 {
		t.Fatalf("ranks %+v", ranks)
	}
	r, err := db.Run(run)
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "job" || len(r.Ranks) != 2 {
		t.Fatalf("run %+v", r)
	}
	for i, rk := range r.Ranks {
		if rk.Rank != i || len(rk.Traces) != len(ranks[i].Traces) {
			t.Fatalf("rank %d: %+v", i, rk)
		}
		for j, tr := range rk.Traces {
			if tr.ID != ranks[i].Traces[j] || tr.Status != gpu.StatusComplete || tr.DeviceOrdinal != ranks[i].Devices[j].Device {
				t.Errorf("rank %d device %d: %+v", i, j, tr)
			}
		}
	}
	// The multi-GPU file's OOM is on its device 1, as when imported alone.
	if oom := r.Ranks[1].Traces[1]; oom.OOMs != 1 || oom.PeakAllocated == 0 {
		t.Errorf("rank 1, device 1: %+v", oom)
	}
	f, err := os.Open(files[1])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	alone, err := ingest.Snapshot(db, f, "alone", pytorch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for j, id := range alone {
		a, _ := db.Trace(id)
		b := r.Ranks[1].Traces[j]
		if a.Events != b.Events || a.PeakAllocated != b.PeakAllocated || a.PeakReserved != b.PeakReserved || a.PeakSeq != b.PeakSeq {
			t.Errorf("device %d: in the run %+v, alone %+v", j, b, a)
		}
	}
}

// Ranks come from the names (files or folders), from user_metadata, or
// are given; two files of one rank are refused.
func TestRunRanks(t *testing.T) {
	dir := t.TempDir()
	db, path := openDB(t)
	ranksOf := func(src ingest.RunSource) []int {
		t.Helper()
		_, ranks, err := ingest.Run(context.Background(), db, "r", src, pytorch.Options{})
		if err != nil {
			t.Fatal(err)
		}
		var out []int
		for _, r := range ranks {
			out = append(out, r.Rank)
		}
		return out
	}
	a := copyAs(t, dir, "windows_paths_small.pickle", "snap_rank3.pickle")
	b := copyAs(t, dir, "settings_no_annotations.pickle", "job/rank1/snapshot.pickle")
	if got := ranksOf(ingest.Files([]string{a, b})); !equal(got, []int{1, 3}) {
		t.Errorf("ranks from names: %v", got)
	}
	if got := ranksOf(ingest.WithRanks(ingest.Files([]string{a, b}), []int{7, 5})); !equal(got, []int{5, 7}) {
		t.Errorf("ranks given: %v", got)
	}

	// user_metadata "rank=4" in every entry of a snapshot named by nothing
	traces, err := pytorch.DecodeFile(testkit.Snapshot(t, "windows_paths_small.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range traces[0].Extras {
		traces[0].Extras[i].UserMetadata = "rank=4"
	}
	var buf bytes.Buffer
	if err := pytorch.Export(&buf, traces...); err != nil {
		t.Fatal(err)
	}
	md := filepath.Join(dir, "snapshot.pickle")
	if err := os.WriteFile(md, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := ranksOf(ingest.Files([]string{md, a})); !equal(got, []int{3, 4}) {
		t.Errorf("rank from user_metadata: %v", got)
	}

	before := countRows(t, path)
	c := copyAs(t, dir, "settings_no_annotations.pickle", "other/rank3.pickle")
	_, _, err = ingest.Run(context.Background(), db, "twice", ingest.Files([]string{a, c}), pytorch.Options{})
	var ie *ingest.InputError
	if !errors.As(err, &ie) || !bytes.Contains([]byte(err.Error()), []byte("rank 3 twice")) {
		t.Fatalf("two files of rank 3: %v", err)
	}
	if n := countRows(t, path); n != before {
		t.Errorf("a refused run left %d rows", n-before)
	}

	// Names that say one rank twice are refused before decoding: the
	// second file is not a snapshot, and is never read.
	bad := filepath.Join(dir, "again", "rank3.pickle")
	if err := os.MkdirAll(filepath.Dir(bad), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("not a pickle"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = ingest.Run(context.Background(), db, "twice", ingest.Files([]string{a, bad}), pytorch.Options{})
	if !errors.As(err, &ie) || !bytes.Contains([]byte(err.Error()), []byte("rank 3 twice")) {
		t.Fatalf("a second file named rank 3: %v", err)
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// openDB opens a fresh database and says where it is.
func openDB(t *testing.T) (*store.DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "t.db")
	db, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, path
}

// countRows counts the rows an import writes.
func countRows(t *testing.T, path string) int {
	t.Helper()
	raw, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	total := 0
	for _, table := range []string{"runs", "traces", "uploads", "annotations", "event_extras", "snapshot_segments", "stacks", "chunks"} {
		var n int
		if err := raw.QueryRow("SELECT count(*) FROM " + table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		total += n
	}
	return total
}

// A file that does not decode fails the whole run, named; nothing of the
// good files is kept.
func TestRunIsAllOrNothing(t *testing.T) {
	dir := t.TempDir()
	db, path := openDB(t)
	good := []string{copyAs(t, dir, "windows_paths_small.pickle", "rank0.pickle"), copyAs(t, dir, "training_22k_user_metadata.pickle", "rank1.pickle")}
	bad := filepath.Join(dir, "rank2.pickle")
	if err := os.WriteFile(bad, []byte("\x80\x04not a snapshot"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := ingest.Run(context.Background(), db, "broken", ingest.Files(append(good, bad)), pytorch.Options{})
	var ie *ingest.InputError
	if !errors.As(err, &ie) || !bytes.Contains([]byte(err.Error()), []byte("rank2.pickle")) {
		t.Fatalf("got %v, want an input error naming rank2.pickle", err)
	}
	if n := countRows(t, path); n != 0 {
		t.Errorf("%d rows left", n)
	}
	if _, _, err := ingest.Run(context.Background(), db, "none", ingest.Files(nil), pytorch.Options{}); !errors.As(err, &ie) {
		t.Errorf("an empty run: %v", err)
	}
}

// A tar (gzipped), as an upload sends it: ranks from the folders, read
// one file after another.
func TestRunFromTar(t *testing.T) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	add := func(name string, body []byte, typ byte) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Size: int64(len(body)), Mode: 0o644, Typeflag: typ}); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(testkit.Snapshot(t, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	add("job/", nil, tar.TypeDir)
	add("job/rank1/snapshot.pickle", read("settings_no_annotations.pickle"), tar.TypeReg)
	add("job/._rank1", []byte("macOS metadata"), tar.TypeReg)
	add("job/rank0/snapshot.pickle", read("snapshot_action_entry.pickle"), tar.TypeReg)
	tw.Close()
	zw.Close()
	if ok, err := ingest.IsTar(bufioOf(buf.Bytes())); !ok || err != nil {
		t.Fatal("IsTar says no")
	}
	db := testkit.OpenDB(t)
	run, ranks, err := ingest.Run(context.Background(), db, "tarred", ingest.Tar(bytes.NewReader(buf.Bytes()), pytorch.Options{}), pytorch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ranks) != 2 || ranks[0].Name != "job/rank0/snapshot.pickle" || ranks[1].Rank != 1 {
		t.Fatalf("ranks %+v", ranks)
	}
	if r, _ := db.Run(run); len(r.Ranks) != 2 {
		t.Fatalf("run %+v", r)
	}
	// The archive's bytes count against the decompressed cap.
	_, _, err = ingest.Run(context.Background(), db, "capped", ingest.Tar(bytes.NewReader(buf.Bytes()), pytorch.Options{MaxBytes: 10_000}), pytorch.Options{})
	var le *pytorch.LimitError
	if !errors.As(err, &le) {
		t.Fatalf("a capped tar: %v", err)
	}
	// A pickle is no tar.
	if ok, _ := ingest.IsTar(bufioOf(read("settings_no_annotations.pickle"))); ok {
		t.Error("IsTar says a pickle is a tar")
	}
}

func bufioOf(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }

// TestMemoryLimit: the limit follows the largest files decoded at once,
// and is left unset for a gzipped file, whose decoded size is unknown.
func TestMemoryLimit(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	small := write("small.pickle", []byte{0x80, 4})
	var sizes []int64
	var big []string
	for i := range 5 {
		size := int64(40+i) << 20
		sizes = append(sizes, size)
		p := write(fmt.Sprintf("rank%d.pickle", i), nil)
		if err := os.Truncate(p, size); err != nil {
			t.Fatal(err)
		}
		big = append(big, p)
	}
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	zw.Write([]byte{0x80, 4})
	zw.Close()
	gz := write("rank9.pickle.gz", zipped.Bytes())

	if got := ingest.MemoryLimit([]string{small}); got != pytorch.MemoryLimit(2) || got != 64<<20 {
		t.Errorf("a small file: limit %d, want the floor, 64 MiB", got)
	}
	if got, want := ingest.MemoryLimit(big[:1]), sizes[0]/4*7; got != want {
		t.Errorf("one file of %d B: limit %d, want %d", sizes[0], got, want)
	}
	var atOnce int64 // the largest files, one per core
	for _, s := range sizes[max(0, len(sizes)-runtime.NumCPU()):] {
		atOnce += s
	}
	if got := ingest.MemoryLimit(big); got != pytorch.MemoryLimit(atOnce) {
		t.Errorf("a run of %d files on %d cores: limit %d, want %d", len(big), runtime.NumCPU(), got, pytorch.MemoryLimit(atOnce))
	}
	// A pipe (vramscope import <(zcat x.gz)) is not opened: its bytes are
	// the import's alone.
	fifo := filepath.Join(dir, "rank8.pickle")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	go func() {
		if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			w.Write([]byte{0x80, 4})
			w.Close()
		}
	}()
	if got := ingest.MemoryLimit([]string{fifo}); got != 0 {
		t.Errorf("a pipe: limit %d, want none (0)", got)
	}
	read := make(chan []byte, 1)
	go func() { b, _ := os.ReadFile(fifo); read <- b }()
	select {
	case b := <-read:
		if !bytes.Equal(b, []byte{0x80, 4}) {
			t.Errorf("the pipe then reads % x, want 80 04", b)
		}
	case <-time.After(10 * time.Second): // a hang, not a measure of speed
		t.Error("the pipe was emptied before the import could read it")
	}
	for _, paths := range [][]string{{gz}, append(big[:2:2], gz), {filepath.Join(dir, "missing.pickle")}} {
		if got := ingest.MemoryLimit(paths); got != 0 {
			t.Errorf("%v: limit %d, want none (0)", paths, got)
		}
	}
}

// TestSnapshotFiles: a folder stands for its files, those of its
// subfolders and its links to files, sorted, hidden ones left out; links
// to folders are not followed.
func TestSnapshotFiles(t *testing.T) {
	dir := t.TempDir()
	elsewhere := t.TempDir()
	mk := func(p string) string {
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte{0x80}, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	job := filepath.Join(dir, "job")
	mk(filepath.Join(job, "rank1", "snapshot.pickle"))
	mk(filepath.Join(job, "rank0", "snapshot.pickle"))
	mk(filepath.Join(job, ".hidden.pickle"))
	mk(filepath.Join(job, ".cache", "x.pickle"))
	if err := os.Symlink(mk(filepath.Join(elsewhere, "r2.pickle")), filepath.Join(job, "rank2.pickle")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(job, filepath.Join(job, "loop")); err != nil {
		t.Fatal(err)
	}
	got, err := ingest.SnapshotFiles([]string{job})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(job, "rank0", "snapshot.pickle"), filepath.Join(job, "rank1", "snapshot.pickle"), filepath.Join(job, "rank2.pickle")}
	if !slices.Equal(got, want) {
		t.Errorf("files %q, want %q", got, want)
	}
	empty := filepath.Join(dir, "empty")
	os.Mkdir(empty, 0o755)
	if _, err := ingest.SnapshotFiles([]string{empty}); err == nil || !strings.Contains(err.Error(), "no files") {
		t.Errorf("an empty folder: %v", err)
	}
}
