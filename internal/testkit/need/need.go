// Package need decides what a test does when something it needs is not
// on this machine (a real snapshot, a program, a server): it skips, unless
// CI=true, where nothing may be missing and the test fails, naming what.
// Every such decision goes through Missing; it is a package of its own so
// that pgtest, which testkit imports, can use it too.
package need

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// ci says whether this is a CI run (CI=true), where every test must run.
func ci() bool { return os.Getenv("CI") == "true" }

// Missing ends tb for want of what format names: it fails under CI=true
// and skips elsewhere.
func Missing(tb testing.TB, format string, args ...any) {
	tb.Helper()
	what := fmt.Sprintf(format, args...)
	if ci() {
		tb.Fatalf("missing, and CI=true needs it: %s", what)
	}
	tb.Skipf("missing: %s", what)
}

// Program is the path of the program name on $PATH, or Missing.
func Program(tb testing.TB, name string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(tb, "the program %s (%v)", name, err)
	}
	return p
}
