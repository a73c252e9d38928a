package ingest

import (
	"os"
	"testing"

	"vramscope/internal/pgtest"
)

// TestMain stops the PostgreSQL server the tests on that backend started.
func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop()
	os.Exit(code)
}
