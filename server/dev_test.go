package server

import (
	"net/http/httptest"
	"os"
	"testing"
)

func TestDevServe(t *testing.T) {
	if os.Getenv("VS_DEV") == "" {
		t.Skip()
	}
	db := openDB(t)
	makeTrace(t, db, "small", workload{Steps: 5, Layers: 6, Seed: 1})
	srv := httptest.NewServer(New(Options{DB: db}).Handler())
	os.WriteFile("/tmp/vs_url", []byte(srv.URL), 0o644)
	select {}
}
