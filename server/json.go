package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"vramscope/server/guard"
	"vramscope/store"
)

// writeJSON sends v as compact JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "encoding the answer: %v", err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if w.Header().Get("Cache-Control") == "" {
		w.Header().Set("Cache-Control", "no-store")
	}
	w.WriteHeader(status)
	w.Write(b)
}

// writeError sends {"error": "..."}.
var writeError = guard.WriteError

// storeError maps a store error to its status: 404 for unknown things,
// 500 for the rest (logged, since it is our fault).
func (s *Server) storeError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, http.StatusNotFound, "%v", err)
		return
	}
	if store.Unavailable(err) {
		unavailable(w, err)
		return
	}
	s.log.Error("store", "path", r.URL.Path, "err", err)
	writeError(w, http.StatusInternalServerError, "%v", err)
}

// paramError is a bad query parameter; it names the parameter.
type paramError struct{ name, msg string }

func (e *paramError) Error() string { return fmt.Sprintf("parameter %s: %s", e.name, e.msg) }

// params reads query parameters, remembering the first error.
type params struct {
	r   *http.Request
	err error
}

func (p *params) fail(name, format string, args ...any) {
	if p.err == nil {
		p.err = &paramError{name, fmt.Sprintf(format, args...)}
	}
}

// int64 reads an integer parameter; def when absent.
func (p *params) int64(name string, def int64) int64 {
	v := p.r.URL.Query().Get(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		// Accept a float (JS may send 1.5e6) and truncate.
		f, ferr := strconv.ParseFloat(v, 64)
		if ferr != nil || f != f || f > 9e18 || f < -9e18 {
			p.fail(name, "%q is not an integer", v)
			return def
		}
		n = int64(f)
	}
	return n
}

// intIn reads an integer in [lo, hi].
func (p *params) intIn(name string, def, lo, hi int64) int64 {
	n := p.int64(name, def)
	if p.err == nil && (n < lo || n > hi) {
		p.fail(name, "%d is out of range [%d, %d]", n, lo, hi)
	}
	return n
}

// required reads an integer that must be present.
func (p *params) required(name string) int64 {
	if p.r.URL.Query().Get(name) == "" {
		p.fail(name, "missing")
		return 0
	}
	return p.int64(name, 0)
}

func (p *params) check(w http.ResponseWriter) bool {
	if p.err != nil {
		writeError(w, http.StatusBadRequest, "%v", p.err)
		return false
	}
	return true
}

// unavailable answers a request the database could not serve because it
// is away (a PostgreSQL restart): 503, to be asked again.
func unavailable(w http.ResponseWriter, err error) {
	w.Header().Set("Retry-After", "5")
	writeError(w, http.StatusServiceUnavailable, "the database is not reachable just now (%v): try again in a moment", err)
}
