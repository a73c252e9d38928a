package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"vramscope/internal/testkit"
	"vramscope/internal/testkit/need"
)

// The README's two minutes, as a newcomer runs them: in a fresh clone of
// this repository, its install command (go install ./cmd/vramscope, into
// a GOBIN of the test's own), then, in clean folders with a HOME of their
// own, `vramscope` serves the page with its demo traces, `vramscope import
// FILE` stores a snapshot the server lists at once (both use the one
// per-user database) and `vramscope list` lists it. The commands are read
// from the README, so that it cannot drift from what is run. A clone holds
// what is committed: run locally, it checks the last commit.
func TestReadmeTwoMinutes(t *testing.T) {
	if testing.Short() {
		t.Skip("clones the repository and builds vramscope")
	}
	gitPath := need.Program(t, "git")
	snap, err := filepath.Abs(testkit.Snapshot(t, "settings_no_annotations.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	top, err := exec.Command(gitPath, "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatal(err)
	}
	root := strings.TrimSpace(string(top))

	// The README's commands.
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, block, _ := strings.Cut(string(readme), "```sh\n")
	block, _, _ = strings.Cut(block, "```")
	var cmds []string
	for _, line := range strings.Split(block, "\n") {
		if c, _, _ := strings.Cut(line, "#"); strings.TrimSpace(c) != "" {
			cmds = append(cmds, strings.TrimSpace(c))
		}
	}
	if strings.Join(cmds, "|") != "go install ./cmd/vramscope|vramscope" {
		t.Fatalf("the README's first commands are %q: this test runs go install ./cmd/vramscope, then vramscope", cmds)
	}
	for _, s := range []string{"vramscope import snapshot.pickle", "vramscope list", "--addr"} {
		if !strings.Contains(string(readme), s) {
			t.Fatalf("the README does not say %q", s)
		}
	}

	// A fresh clone, installed.
	clone, bin := filepath.Join(t.TempDir(), "vramscope"), t.TempDir()
	run := func(dir string, env []string, name string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s in %s: %v\n%s", name, strings.Join(args, " "), dir, err, out)
		}
		return string(out)
	}
	run(root, os.Environ(), gitPath, "clone", "--quiet", root, clone)
	run(clone, append(os.Environ(), "GOBIN="+bin), "go", "install", "./cmd/vramscope")

	// A newcomer's shell: its own HOME, no database named.
	home := t.TempDir()
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "HOME" && k != "XDG_DATA_HOME" && k != "VRAMSCOPE_DB" && k != "PATH" {
			env = append(env, kv)
		}
	}
	env = append(env, "HOME="+home, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	vramscope := filepath.Join(bin, "vramscope")
	server := exec.Command(vramscope, "--addr", addr)
	server.Dir, server.Env = t.TempDir(), env
	logs, err := os.Create(filepath.Join(t.TempDir(), "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	server.Stdout, server.Stderr = logs, logs
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Process.Kill(); server.Wait() })
	get := func(path string) (int, string) {
		res, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if code, _ := get("/healthz"); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logs.Name())
			t.Fatalf("vramscope never answered on %s:\n%s", addr, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if code, page := get("/"); code != http.StatusOK || !strings.Contains(page, "vramscope") {
		t.Fatalf("the page: %d %.300s", code, page)
	}
	out := run(t.TempDir(), env, vramscope, "import", snap)
	if !strings.Contains(out, "trace ") {
		t.Fatalf("vramscope import: %s", out)
	}
	if out := run(t.TempDir(), env, vramscope, "list"); !strings.Contains(out, "settings_no_annotations.pickle") {
		t.Fatalf("vramscope list:\n%s", out)
	}
	if code, list := get("/api/traces"); code != http.StatusOK || !strings.Contains(list, "settings_no_annotations.pickle") {
		t.Fatalf("the server does not list the trace imported beside it: %d %.500s", code, list)
	}
}
