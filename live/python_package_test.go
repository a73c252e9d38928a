package live_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"vramscope/internal/testkit/need"
)

// pip install of live/python (offline, without build isolation: the
// build backend is the machine's setuptools and wheel) installs the
// modules the server serves, and the command, which estimates too.
func TestPythonPackageInstalls(t *testing.T) {
	py := ""
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(p, "-c", "import venv, ensurepip, setuptools, wheel").Run() == nil {
			py = p
			break
		}
	}
	if py == "" {
		need.Missing(t, "a python3 with venv, pip, setuptools and wheel")
	}
	// A copy: pip builds in the folder it is given.
	src := filepath.Join(t.TempDir(), "python")
	os.Mkdir(src, 0o755)
	for _, f := range []string{"pyproject.toml", "vramscope_watch.py", "vramscope_estimate.py"} {
		b, err := os.ReadFile(filepath.Join("python", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(src, f), b, 0o644)
	}
	venv := filepath.Join(t.TempDir(), "venv")
	run := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run(py, "-m", "venv", "--system-site-packages", venv)
	run(filepath.Join(venv, "bin", "pip"), "install", "--no-build-isolation", "--no-index", src)
	where := run(filepath.Join(venv, "bin", "python"), "-c", "import vramscope_watch; print(vramscope_watch.__file__)")
	installed, _ := os.ReadFile(strings.TrimSpace(where))
	served, _ := os.ReadFile("python/vramscope_watch.py")
	if string(installed) != string(served) {
		t.Fatalf("installed %s is not the served module", where)
	}
	if out := run(filepath.Join(venv, "bin", "vramscope-watch"), "--help"); !strings.Contains(out, "--on-oom") || !strings.Contains(out, "--estimate") {
		t.Fatalf("vramscope-watch --help:\n%s", out)
	}
	if out := run(filepath.Join(venv, "bin", "vramscope-watch"), "--estimate", "--help"); !strings.Contains(out, "--device-memory") {
		t.Fatalf("vramscope-watch --estimate --help:\n%s", out)
	}
}
