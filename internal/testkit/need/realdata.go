package need

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
)

// TestdataEnv names a folder holding the real sets (pytorch/,
// pytorch-2.11/) in place of shared/testdata beside the checkout.
const TestdataEnv = "VRAMSCOPE_TESTDATA"

var (
	rootOnce sync.Once
	root     string // the module's root, "" where no go.mod is above the working directory
)

// testdataDirs are the folders that may hold the real sets:
// $VRAMSCOPE_TESTDATA alone when it is set; otherwise shared/testdata
// beside the checkout (the workspace's layout) or inside it.
func testdataDirs() []string {
	if d := os.Getenv(TestdataEnv); d != "" {
		return []string{d}
	}
	rootOnce.Do(func() {
		dir, err := os.Getwd()
		for err == nil {
			if _, e := os.Stat(filepath.Join(dir, "go.mod")); e == nil {
				root = dir
				return
			}
			if filepath.Dir(dir) == dir {
				return
			}
			dir = filepath.Dir(dir)
		}
	})
	if root == "" {
		return nil
	}
	return []string{filepath.Join(root, "..", "shared", "testdata"), filepath.Join(root, "shared", "testdata")}
}

// RealDir is the folder of a set of real snapshots: "pytorch" (PyTorch
// 2.0 to 2.11, written on their authors' GPUs) or "pytorch-2.11"
// (recordings of an H200, with the real allocator's figures in a .json
// beside each). Where it is missing the test fails under CI=true and is
// skipped elsewhere (Missing), naming it.
func RealDir(tb testing.TB, set string) string {
	tb.Helper()
	dir, elsewhere := findSet(set)
	if dir == "" {
		Missing(tb, "the real snapshots shared/testdata/%s %s", set, elsewhere)
	}
	return dir
}

// SnapshotOf is the path of the file name of a real set (RealDir); where
// it is missing the test fails under CI=true and is skipped elsewhere,
// naming the file.
func SnapshotOf(tb testing.TB, set, name string) string {
	tb.Helper()
	dir, elsewhere := findSet(set)
	if dir == "" {
		Missing(tb, "the real file shared/testdata/%s/%s %s", set, name, elsewhere)
		return ""
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		Missing(tb, "the real file shared/testdata/%s/%s (%v)", set, name, err)
	}
	return p
}

// findSet is the folder of set, or "" and where it was looked for.
func findSet(set string) (dir, looked string) {
	var dirs []string
	for _, d := range testdataDirs() {
		d = filepath.Join(d, set)
		if _, err := os.Stat(filepath.Join(d, "PROVENANCE.md")); err == nil {
			return d, ""
		}
		dirs = append(dirs, d)
	}
	return "", fmt.Sprintf("(not in %s; %s=DIR names another folder holding %s)", strings.Join(dirs, " nor "), TestdataEnv, set)
}

// RealFiles is every snapshot of a real set, sorted: every file in its
// folder but its notes (.md), the script that recorded it (.py) and the
// figures of the runs (JSON; oom_nonexpandable.json is a pickle), so that
// a file added there is covered by each test that reads them all.
func RealFiles(tb testing.TB, set string) []string {
	tb.Helper()
	dir := RealDir(tb, set)
	entries, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if !e.Type().IsRegular() || strings.HasSuffix(e.Name(), ".md") || strings.HasSuffix(e.Name(), ".py") || isJSON(p) {
			continue
		}
		files = append(files, p)
	}
	sort.Strings(files)
	if len(files) == 0 {
		Missing(tb, "the real snapshots of shared/testdata/%s: %s holds none", set, dir)
	}
	return files
}

// isJSON says whether the file starts as a JSON object does.
func isJSON(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	head := make([]byte, 64)
	n, _ := f.Read(head)
	return bytes.HasPrefix(bytes.TrimSpace(head[:n]), []byte("{"))
}
