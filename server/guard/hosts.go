package guard

import (
	"net"
	"net/http"
	"strings"
)

// AllowHosts answers, on a server listening on loopback, only requests
// whose Host is a loopback name or address or an --allowed-host: a page of
// another site whose name an attacker points at 127.0.0.1 (DNS rebinding)
// sends its own name as Host, and would otherwise read and write as this
// origin. Beyond loopback the token guards writes instead.
func AllowHosts(addr string, allowed []string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		if !Loopback(addr) {
			return next
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !hostAllowed(r.Host, allowed) {
				WriteError(w, http.StatusMisdirectedRequest, "this server listens on loopback and answers only to localhost or a loopback address, not to host %q (start it with --allowed-host %s to allow that name)", r.Host, hostOnly(r.Host))
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

func hostOnly(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
}

// hostAllowed says whether host (a Host header) names loopback or one of
// allowed. Names under .localhost always resolve to loopback (RFC 6761),
// so no one else can hold them.
func hostAllowed(host string, allowed []string) bool {
	h := hostOnly(host)
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	if ip := net.ParseIP(h); ip != nil && ip.IsLoopback() {
		return true
	}
	for _, a := range allowed {
		if hostOnly(a) == h {
			return true
		}
	}
	return false
}

// Loopback reports whether addr (host:port) listens on loopback only.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
