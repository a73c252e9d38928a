package need_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"vramscope/internal/testkit/need"
)

// RealFiles lists exactly the files of a set that are pickles (PROTO) or
// gzip: a second way of telling snapshots from the notes, the recording
// script and the runs' JSON figures than RealFiles' own.
func TestRealFilesAreTheSnapshots(t *testing.T) {
	for _, set := range []string{"pytorch", "pytorch-2.11"} {
		files := need.RealFiles(t, set)
		entries, err := os.ReadDir(need.RealDir(t, set))
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, e := range entries {
			p := filepath.Join(need.RealDir(t, set), e.Name())
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.HasPrefix(b, []byte{0x80}) || bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
				want = append(want, p)
			}
		}
		if !slices.Equal(files, want) {
			t.Errorf("%s: RealFiles %q, want the pickles %q", set, files, want)
		}
		if len(files) < 7 {
			t.Errorf("%s: only %d snapshots", set, len(files))
		}
	}
}
