package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A port in use is said at once, with the way out, before the database is
// made and filled with the demo traces.
func TestServePortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	db := filepath.Join(t.TempDir(), "v.db")
	code, _, errs := runCmd("serve", "--addr", ln.Addr().String(), "--db", db)
	if code != 1 || !strings.Contains(errs, ln.Addr().String()+" is already in use") || !strings.Contains(errs, "--addr") {
		t.Errorf("exit %d: %s", code, errs)
	}
	if _, err := os.Stat(db); !os.IsNotExist(err) {
		t.Errorf("the database was made before the address was claimed: %v", err)
	}
}
