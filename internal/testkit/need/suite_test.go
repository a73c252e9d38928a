package need_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"vramscope/internal/testkit/need"
)

// allowedSkips are the skips that are not for want of data or a program:
// in file, a message that starts so, and why. Any other skip is a test
// deciding on its own what need.Missing decides.
var allowedSkips = []struct{ file, msg, why string }{
	{"server/team_test.go", "runs as the child of TestTeamServers", "a child process's guard"},
	{"store/crash_test.go", "runs as the child of TestSIGKILL", "a child process's guard"},
	{"pytorch/bench_test.go", "only run by BenchmarkDecode100MB", "a child process's guard"},
	{"gpu/cuda/cuda_test.go", "already running against a named driver", "a child process's guard"},
	{"gpu/cuda/cuda_test.go", "%s is set", "a test of a machine without a driver, on one told to use a driver"},
	{"gpu/cuda/cuda_test.go", "a CUDA driver is installed", "a test of a machine without a driver"},
	{"cmd/vramscope/devices_test.go", "a CUDA driver is installed", "a test of a machine without a driver"},
	{"gpu/cuda/cuda_test.go", "needs a CUDA GPU", "GPU tests: CI has none (TestFakeDriver runs them on a fake driver)"},
	{"gpu/cuda/cuda_test.go", "maps the whole GPU page by page", "-short"},
	{"store/bands_test.go", "writes 300k events", "-short"},
	{"store/dense_test.go", "writes 300k events", "-short"},
	{"cmd/vramscope/readme_test.go", "clones the repository and builds vramscope", "-short"},
	{"server/perf_test.go", "set VRAMSCOPE_PERF=1", "a measurement, run when asked for"},
	{"store/open_test.go", "cannot remount read-only", "a privilege (mount), not a tool"},
	{"internal/hostile/hostile.go", "cannot mount a small file system here", "a privilege (mount), not a tool"},
}

// sharedPath is a string literal that names the shared folder as a path.
var sharedPath = regexp.MustCompile(`^shared$|(^|/)shared/testdata|^/work/shared`)

// moduleRoot is the checkout's root, where go.mod is.
func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(need.Program(t, "go"), "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// sourceFile is one parsed Go file of the module.
type sourceFile struct {
	rel string // from the module's root, slash-separated
	pkg string // its folder, slash-separated ("." at the root)
	f   *ast.File
}

func parseModule(t *testing.T, root string) (*token.FileSet, []sourceFile) {
	t.Helper()
	fset := token.NewFileSet()
	var files []sourceFile
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		files = append(files, sourceFile{filepath.ToSlash(rel), filepath.ToSlash(filepath.Dir(rel)), f})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fset, files
}

// No code but this package finds the real snapshots, reads CI, or skips a
// test for a reason of its own: so that under CI=true nothing is skipped
// for want of data or a program, and moving shared/testdata away (as
// TestSuiteWithoutTestdata does with VRAMSCOPE_TESTDATA) is seen by every
// test that reads it.
func TestOnlyNeedDecides(t *testing.T) {
	root := moduleRoot(t)
	fset, files := parseModule(t, root)
	for _, sf := range files {
		if sf.pkg == "internal/testkit/need" {
			continue
		}
		ast.Inspect(sf.f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BasicLit:
				if n.Kind == token.STRING {
					if s, err := strconv.Unquote(n.Value); err == nil && sharedPath.MatchString(s) {
						t.Errorf("%s: %q finds the shared folder itself; ask testkit.Snapshot, SnapshotOf or RealFiles", fset.Position(n.Pos()), s)
					}
				}
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				switch sel.Sel.Name {
				case "Getenv":
					if len(n.Args) == 1 && isString(n.Args[0], "CI") {
						t.Errorf("%s: reads CI itself; need.Missing decides what CI changes", fset.Position(n.Pos()))
					}
				case "Skip", "Skipf", "SkipNow":
					if !allowedSkip(sf.rel, n) {
						t.Errorf("%s: a skip of its own; for something missing call need.Missing (fails under CI=true), or add it to allowedSkips with why", fset.Position(n.Pos()))
					}
				}
			}
			return true
		})
	}
}

func isString(e ast.Expr, want string) bool {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return false
	}
	s, err := strconv.Unquote(lit.Value)
	return err == nil && s == want
}

func allowedSkip(file string, call *ast.CallExpr) bool {
	if len(call.Args) == 0 {
		return false
	}
	lit, ok := call.Args[0].(*ast.BasicLit)
	if !ok {
		return false
	}
	msg, _ := strconv.Unquote(lit.Value)
	for _, a := range allowedSkips {
		if a.file == file && strings.HasPrefix(msg, a.msg) {
			return true
		}
	}
	return false
}

// dataHelpers are the calls that find a real snapshot.
var dataHelpers = map[string]bool{
	"testkit.Snapshot": true, "testkit.SnapshotOf": true, "testkit.RealFiles": true,
	"need.RealDir": true, "need.SnapshotOf": true, "need.RealFiles": true,
}

// realDataTests are, by package folder, the top-level tests whose code
// reaches a data helper: directly or through the package's own functions
// and methods (matched by name, closures included).
func realDataTests(files []sourceFile) map[string][]string {
	type fn struct {
		pkg, name string
	}
	uses := map[fn][]string{} // a function's references to names
	direct := map[fn]bool{}
	for _, sf := range files {
		if !strings.HasSuffix(sf.rel, "_test.go") {
			continue
		}
		for _, d := range sf.f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			k := fn{sf.pkg, fd.Name.Name}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.SelectorExpr:
					if x, ok := n.X.(*ast.Ident); ok && dataHelpers[x.Name+"."+n.Sel.Name] {
						direct[k] = true
					}
					uses[k] = append(uses[k], n.Sel.Name)
				case *ast.Ident:
					uses[k] = append(uses[k], n.Name)
				}
				return true
			})
		}
	}
	// Propagate until nothing changes: a function reaches data if a name
	// it uses is a function of its package that does.
	for changed := true; changed; {
		changed = false
		for k, names := range uses {
			if direct[k] {
				continue
			}
			for _, name := range names {
				if direct[fn{k.pkg, name}] {
					direct[k], changed = true, true
					break
				}
			}
		}
	}
	tests := map[string][]string{}
	for k := range direct {
		if strings.HasPrefix(k.name, "Test") && k.name != "TestMain" {
			tests[k.pkg] = append(tests[k.pkg], k.name)
		}
	}
	for _, ts := range tests {
		sort.Strings(ts)
	}
	return tests
}

// missingLine is what need.Missing writes under CI=true for a real set
// or file.
var missingLine = regexp.MustCompile(`missing, and CI=true needs it: the real (file|snapshots) shared/testdata/\S+`)

// With shared/testdata moved away (VRAMSCOPE_TESTDATA naming an empty
// folder, the only way a test finds it: TestOnlyNeedDecides), every test
// that reads a real snapshot fails under CI=true, naming the file or set
// that is missing; none passes and none skips for it. It runs those tests
// alone, in a child `go test` of their packages, to stay short.
func TestSuiteWithoutTestdata(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the real-data tests of every package")
	}
	goCmd := need.Program(t, "go")
	root := moduleRoot(t)
	_, files := parseModule(t, root)
	tests := realDataTests(files)
	var pkgs []string
	total := 0
	for pkg, ts := range tests {
		if pkg == "internal/testkit/need" {
			continue // this test's own package
		}
		pkgs = append(pkgs, "./"+pkg)
		total += len(ts)
	}
	sort.Strings(pkgs)
	// A floor, so that a broken search for the tests cannot pass unseen:
	// there are over a hundred today.
	if total < 100 {
		t.Fatalf("found only %d tests that read real snapshots, in %v", total, pkgs)
	}
	var names []string
	for _, ts := range tests {
		names = append(names, ts...)
	}
	sort.Strings(names)
	names = slices.Compact(names)
	cmd := exec.Command(goCmd, append([]string{"test", "-count=1", "-json", "-timeout", "10m",
		"-run", "^(" + strings.Join(names, "|") + ")$"}, pkgs...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CI=true", need.TestdataEnv+"="+t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, _ := cmd.Output() // it fails: that is the point
	type event struct {
		Action, Package, Test, Output string
	}
	outputs := map[string]*strings.Builder{} // package/test: its output, subtests included
	results := map[string]string{}           // package/test: pass, fail or skip
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" {
			continue
		}
		pkg := strings.TrimPrefix(e.Package, "vramscope/")
		top, _, _ := strings.Cut(e.Test, "/")
		key := pkg + "/" + top
		if outputs[key] == nil {
			outputs[key] = &strings.Builder{}
		}
		outputs[key].WriteString(e.Output)
		if e.Test == top && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip") {
			results[key] = e.Action
		}
	}
	ran := 0
	for pkg, ts := range tests {
		if pkg == "internal/testkit/need" {
			continue
		}
		for _, name := range ts {
			key := pkg + "/" + name
			switch got := results[key]; {
			case got == "":
				t.Errorf("%s did not run (%s)", key, strings.TrimSpace(stderr.String()))
			case got == "fail" && missingLine.MatchString(outputs[key].String()):
				ran++
			case got == "skip" && skippedAllowed(outputs[key].String()):
				// Skipped before it read anything, for a reason of
				// allowedSkips (a child process's guard, an opt-in).
				t.Logf("%s skipped: %s", key, lastLine(outputs[key].String()))
			default:
				t.Errorf("%s: %s without the real snapshots; want a failure naming what is missing:\n%s", key, got, lastLines(outputs[key].String(), 12))
			}
		}
	}
	t.Logf("%d tests of %d packages fail without shared/testdata, naming what is missing", ran, len(pkgs))
}

// skippedAllowed says whether a test's output shows a skip of allowedSkips.
func skippedAllowed(output string) bool {
	for _, a := range allowedSkips {
		if m, _, _ := strings.Cut(a.msg, "%"); m != "" && strings.Contains(output, m) {
			return true
		}
	}
	return false
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
