package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"vramscope/ingest"
	"vramscope/internal/hostile"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/store"
)

func TestTermWriter(t *testing.T) {
	for in, want := range map[string]string{
		"plain ASCII\tand\r\n":                     "plain ASCII\tand\r\n",
		"训练 · 2.00 GiB − 1 ×":                      "训练 · 2.00 GiB − 1 ×",
		"\x1b]0;pwned\x07\x1b[31mred\x1b[0m":       `\x1b]0;pwned\x07\x1b[31mred\x1b[0m`,
		"8-bit CSI \xc2\x9b2J, a lone \x9b2J":      `8-bit CSI \u009b2J, a lone \x9b2J`,
		"rank0\u202Elekcip.exe \u2066x\u2069 \x7f": `rank0\u202elekcip.exe \u2066x\u2069 \x7f`,
		"\x00\x08": `\x00\x08`,
		"line\u2028and paragraph\u2029separators": `line\u2028and paragraph\u2029separators`,
	} {
		var b bytes.Buffer
		n, err := termWriter{&b}.Write([]byte(in))
		if err != nil || n != len(in) || b.String() != want {
			t.Errorf("%q: wrote %q (%d, %v), want %q", in, b.String(), n, err, want)
		}
	}
}

// Stored names, frame names and settings that came from a file reach the
// terminal escaped: a trace named with an escape sequence (stored before
// names were checked, or by another version) and a snapshot whose frames
// and allocator_settings hold escape sequences and right-to-left
// overrides, through list, compare and whatif.
func TestOutputEscapesUploadedText(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "v.db")
	db, err := store.Open(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	snap := hostile.MarkupSnapshot(t, testkit.Snapshot(t, "windows_paths_small.pickle"))
	traces, err := pytorch.Decode(bytes.NewReader(snap))
	if err != nil {
		t.Fatal(err)
	}
	a, err := ingest.Store(context.Background(), db, traces, "evil\x1b]0;pwned\x07\x1b[2J\u202Eeman")
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	if code, _, errs := runCmd("import", testkit.Snapshot(t, "windows_paths_small.pickle"), "--db", dbPath); code != 0 {
		t.Fatal(errs)
	}
	code, list, errs := runCmd("list", "--db", dbPath)
	if code != 0 {
		t.Fatal(errs)
	}
	if !strings.Contains(list, `evil\x1b]0;pwned\x07\x1b[2J\u202eeman`) {
		t.Errorf("list does not show the name escaped:\n%s", list)
	}
	for _, args := range [][]string{{"list"}, {"compare", a[0], strings.Fields(strings.Split(list, "\n")[1])[0]}, {"whatif", "--trace", a[0]}} {
		code, out, errs := runCmd(append(args, "--db", dbPath)...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", args[0], code, errs)
		}
		for _, bad := range []string{"\x1b", "\x07", "\u202E", "\u2066"} {
			if strings.Contains(out+errs, bad) {
				t.Errorf("%s writes %q raw:\n%s", args[0], bad, out)
			}
		}
		if args[0] == "compare" && !strings.Contains(out, `\x1b]0;pwned\x07\x1b[31mred\x1b[0m \u202eevil\u202c`) {
			t.Errorf("compare does not show the frames and settings escaped:\n%s", out)
		}
	}
}

// A name that would not show as one line of plain text, or that is too
// long, is refused before anything is read: exit 2, saying which rule.
func TestCLINamesRefused(t *testing.T) {
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "v.db")
	snap := testkit.Snapshot(t, "settings_no_annotations.pickle")
	b, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	evil := filepath.Join(dir, "evil\x1b[31m.pickle")
	if err := os.WriteFile(evil, b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"import", snap, "--name", strings.Repeat("n", 1<<20)}, "vramscope import: the trace's name (--name, else the file's): a name is at most 255 bytes, this one is 1048576"},
		{[]string{"import", snap, "--name", "a\nb"}, "control character U+000A"},
		{[]string{"import", snap, "--name", " \t "}, "it is blank"},
		{[]string{"import", evil}, `the trace's name (--name, else the file's): a name is one line of plain text; byte 4 of this one is the control character U+001B`},
		{[]string{"import", "--run", "job\u202E", snap}, "the run's name: a name is plain text; byte 3 of this one is the bidirectional formatting character U+202E"},
		{[]string{"import", "--run", "job", evil}, `evil\x1b[31m.pickle": a name is one line of plain text`},
		{[]string{"trace", "--name", strings.Repeat("n", 256)}, "vramscope trace: --name: a name is at most 255 bytes, this one is 256"},
	} {
		code, _, errs := runCmd(append(c.args, "--db", dbPath)...)
		if code != 2 || !strings.Contains(errs, c.want) || len(errs) > 400 {
			t.Errorf("%.80q: exit %d, %.400q; want 2 and %q", c.args, code, errs, c.want)
		}
	}
	if _, err := os.Stat(dbPath); err == nil {
		db, err := store.Open(dbPath)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if trs, _ := db.Traces(); len(trs) != 0 {
			t.Errorf("refused names stored %d traces", len(trs))
		}
	}
}

// Text from uploaded files stays on its line: frame names, allocator
// settings, trace and run names and a run's file names that hold carriage
// returns, newlines, vertical tabs, form feeds (which tabwriter reads as
// cell and line ends) and line separators reach the terminal escaped,
// through list, compare (by frame and by stack) and import --run, and
// forge no line.
func TestOutputKeepsUploadedTextOnItsLine(t *testing.T) {
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "v.db")
	db, err := store.Open(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	breaks := []string{"a\r\nFORGED", "b\rFORGED", "c\nFORGED", "d\vFORGED\fFORGED\u2028FORGED\u2029FORGED"}
	snap := hostile.SnapshotWith(t, testkit.Snapshot(t, "windows_paths_small.pickle"), breaks)
	traces, err := pytorch.Decode(bytes.NewReader(snap))
	if err != nil {
		t.Fatal(err)
	}
	a, err := ingest.Store(context.Background(), db, traces, "name\r\nFORGED")
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	if code, _, errs := runCmd("import", testkit.Snapshot(t, "windows_paths_small.pickle"), "--db", dbPath); code != 0 {
		t.Fatal(errs)
	}
	_, list, _ := runCmd("list", "--db", dbPath)
	b := strings.Fields(strings.Split(list, "\n")[1])[0]
	// A run's file names are checked, their folders' names are not.
	data, err := os.ReadFile(testkit.Snapshot(t, "two_gpus_expandable_state_only.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	job := tarOf(t, "job\rFORGED/rank0.pickle", data)
	for _, args := range [][]string{{"list"}, {"compare", a[0], b}, {"compare", "--group", "stack", a[0], b}, {"import", "--run", "job", job}} {
		code, out, errs := runCmd(append(args, "--db", dbPath)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
		for _, bad := range []string{"\nFORGED", "\rFORGED", "\v", "\f", "\u2028", "\u2029"} {
			if strings.Contains(out+errs, bad) {
				t.Errorf("%v writes %q raw:\n%s%s", args, bad, out, errs)
			}
		}
		want := map[string]string{"list": `name\x0d\x0aFORGED`, "compare": `forward b\x0dFORGED`, "import": `read job\x0dFORGED/rank0.pickle`}[args[0]]
		if !strings.Contains(out+errs, want) {
			t.Errorf("%v does not show %s:\n%s%s", args, want, out, errs)
		}
	}
}
