package attrib_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"vramscope/attrib"
	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/store"
)

// pprofTop runs go tool pprof -top on a profile and returns its rows:
// the flat bytes and the name of each.
func pprofTop(t *testing.T, file string, n int) (names []string, flat []int64) {
	t.Helper()
	cmd := exec.Command("go", "tool", "pprof", "-top", "-unit=B", "-nodefraction=0", "-nodecount="+strconv.Itoa(n), file)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go tool pprof: %v\n%s", err, stderr.String())
	}
	row := regexp.MustCompile(`^\s*(\d+)B\s+([\d.e+-]+%\s+){2}\d+B\s+[\d.e+-]+%\s+(.+)$`)
	for _, line := range strings.Split(string(out), "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			v, _ := strconv.ParseInt(m[1], 10, 64)
			names, flat = append(names, strings.TrimSpace(m[3])), append(flat, v)
		}
	}
	if len(names) == 0 {
		t.Fatalf("no rows in go tool pprof's output:\n%s", out)
	}
	return names, flat
}

// checkProfile writes the live set at an instant as a profile, reads it
// back, and checks that go tool pprof -top lists the page's top frames
// (the rows by first user frame) with the same bytes.
func checkProfile(t *testing.T, db *store.DB, tr gpu.Trace, seq int64) {
	t.Helper()
	l, err := attrib.At(db, tr.ID, attrib.Instant{BySeq: true, Seq: seq})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "live.pb.gz")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := attrib.WriteProfile(f, l, tr, false); err != nil {
		t.Fatal(err)
	}
	f.Close()
	f, _ = os.Open(file)
	p, err := profile.Parse(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.CheckValid(); err != nil {
		t.Fatal(err)
	}
	var objects, space int64
	for _, s := range p.Sample {
		objects += s.Value[0]
		space += s.Value[1]
	}
	if objects != int64(len(l.Blocks)) || space != int64(l.Bytes()) {
		t.Fatalf("profile: %d objects, %d bytes; live set %d, %d", objects, space, len(l.Blocks), l.Bytes())
	}
	page := attrib.Group(l.LiveSet, attrib.ByFrame, attrib.Options{Categories: l.Verdicts})
	n := min(8, len(page.Rows))
	names, flat := pprofTop(t, file, n)
	if len(names) != n {
		t.Fatalf("pprof lists %d rows, the page %d: %q %v; %+v", len(names), n, names, flat, page.Rows[:n])
	}
	for i := 0; i < n; i++ {
		r := page.Rows[i]
		// pprof shortens C++ names to their last class and method.
		if flat[i] != int64(r.Bytes) || !strings.HasSuffix(r.Label, names[i]) {
			t.Errorf("row %d: pprof %q %d B, the page %q %d B", i, names[i], flat[i], r.Label, r.Bytes)
		}
	}
	t.Logf("%s at event %d: pprof's top %q", tr.Title(), seq, names[:min(3, n)])
}

func TestPprofAgreesWithThePage(t *testing.T) {
	db := testkit.OpenDB(t)
	real := importSnapshot(t, db, "training_22k_user_metadata.pickle")[0]
	checkProfile(t, db, real, real.PeakSeq)
	checkProfile(t, db, real, real.LastSeq)
	tr, _ := recordWithTruth(t, db, smallTrain(), true)
	checkProfile(t, db, tr, tr.PeakSeq)
}

// The top frame at the peak of training_22k_user_metadata.pickle is the
// attention's softmax (cs336_basics/nn_utils.py line 6): 24 of its
// outputs, a quarter of what was live.
func TestTopFrameAtRealTrainingPeak(t *testing.T) {
	db := testkit.OpenDB(t)
	tr := importSnapshot(t, db, "training_22k_user_metadata.pickle")[0]
	l, err := attrib.At(db, tr.ID, attrib.Instant{BySeq: true, Seq: tr.PeakSeq})
	if err != nil {
		t.Fatal(err)
	}
	if l.Bytes() != tr.PeakAllocated {
		t.Fatalf("live at the peak: %d bytes, the trace's peak %d", l.Bytes(), tr.PeakAllocated)
	}
	top := attrib.Group(l.LiveSet, attrib.ByFrame, attrib.Options{}).Rows[0]
	if top.Label != "nn_utils.py:6 softmax" || top.Count != 24 || top.Bytes != 24*256<<20 {
		t.Errorf("top frame at the peak: %+v", top)
	}
}
