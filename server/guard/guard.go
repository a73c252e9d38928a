// Package guard is the defensive HTTP plumbing of vramscope's server; it
// knows nothing of traces: JSON errors, security headers, request logs and
// panics, writes only from this origin and with the token, the host
// allow-list of a loopback server, minimum body rates and write deadlines,
// and reading a body ahead of its consumer.
package guard

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"strings"
	"time"

	"github.com/go-chi/chi/v5/middleware"
)

// WriteError sends {"error": "..."}.
func WriteError(w http.ResponseWriter, status int, format string, args ...any) {
	b, _ := json.Marshal(map[string]string{"error": fmt.Sprintf(format, args...)})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Del("Content-Encoding")
	w.WriteHeader(status)
	w.Write(b)
}

// csp allows only what the pages use, from this origin: scripts and
// styles (no inline script, style attribute or eval), images (and the
// empty data: icon), fetches and websockets, forms; nothing else loads and
// nothing frames a page. Trusted Types are required and none is defined,
// so a string can never reach an HTML or script sink (innerHTML,
// insertAdjacentHTML, document.write, a script's src): the modules build
// the DOM from text nodes, and a change that did not would throw rather
// than render markup from a file.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'; " +
	"require-trusted-types-for 'script'; trusted-types 'none'"

// SecurityHeaders sets the CSP and the other headers every answer carries.
func SecurityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "same-origin")
		// no other site's page may hold a window of ours, nor load our
		// answers (a trace's JSON) as a script or an image
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		next.ServeHTTP(w, r)
	})
}

// Log writes one structured line per request.
func Log(log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
			start := time.Now()
			next.ServeHTTP(ww, r)
			status := ww.Status()
			if status == 0 {
				status = http.StatusOK
			}
			level := slog.LevelInfo
			if status >= 500 {
				level = slog.LevelError
			}
			log.LogAttrs(r.Context(), level, "http",
				slog.String("id", middleware.GetReqID(r.Context())),
				slog.String("method", r.Method), slog.String("path", r.URL.Path),
				slog.Int("status", status), slog.Int("bytes", ww.BytesWritten()),
				slog.Duration("took", time.Since(start)))
		})
	}
}

// Recover turns a panic into a logged 500 with a JSON error.
func Recover(log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				if v := recover(); v != nil {
					if v == http.ErrAbortHandler {
						panic(v)
					}
					log.Error("panic", "id", middleware.GetReqID(r.Context()), "path", r.URL.Path,
						"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
					WriteError(w, http.StatusInternalServerError, "internal error (request %s)", middleware.GetReqID(r.Context()))
				}
			}()
			next.ServeHTTP(w, r)
		})
	}
}

// RequireToken lets through only requests that carry token as
// "Authorization: Bearer TOKEN"; an empty token lets every request through.
func RequireToken(token string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if token != "" {
				got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
				if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
					WriteError(w, http.StatusUnauthorized, "this server needs its token: send Authorization: Bearer TOKEN")
					return
				}
			}
			next.ServeHTTP(w, r)
		})
	}
}

// SameOrigin refuses writes (POST, PUT, PATCH, DELETE) that a browser sends
// on behalf of another site: a cross-site form can POST a multipart upload
// without asking first, token or not. Clients that are not browsers (curl,
// the Python helper, vramscope itself) send no Origin and pass.
func SameOrigin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
		default:
			if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
				WriteError(w, http.StatusForbidden, "writes from another site's page are refused")
				return
			}
			if o := r.Header.Get("Origin"); o != "" {
				u, err := url.Parse(o)
				if err != nil || u.Host != r.Host {
					WriteError(w, http.StatusForbidden, "writes from another origin (%s) are refused", o)
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}
