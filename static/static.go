// Package static holds the browser's ES modules and CSS, embedded in the
// binary. They are served under a path that carries a hash of all of them,
// so relative imports between modules keep working and any change to any
// file gives every URL a new name (browsers may cache them forever).
package static

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"sort"
	"strings"
)

//go:embed *.js *.css
var files embed.FS

// Version is a content hash of every file: the cache-busting path element.
var Version string

// etags holds a strong ETag per file name.
var etags = map[string]string{}

func init() {
	names, _ := fs.Glob(files, "*")
	sort.Strings(names)
	all := sha256.New()
	for _, n := range names {
		b, _ := fs.ReadFile(files, n)
		h := sha256.Sum256(b)
		etags[n] = `"` + hex.EncodeToString(h[:8]) + `"`
		all.Write([]byte(n))
		all.Write(h[:])
	}
	Version = hex.EncodeToString(all.Sum(nil)[:6])
}

// Prefix is the URL path under which the files are served.
func Prefix() string { return "/static/" + Version + "/" }

// Serve answers a request for file name under version's prefix and
// reports whether there is such a file (if not, it has written nothing).
// The current version's URLs are immutable; an old version's still get the
// current file, with a short cache life, so a page loaded before an upgrade
// keeps working.
func Serve(w http.ResponseWriter, r *http.Request, version, name string) bool {
	tag, ok := etags[name]
	if !ok || strings.Contains(name, "/") {
		return false
	}
	b, err := fs.ReadFile(files, name)
	if err != nil {
		return false
	}
	h := w.Header()
	h.Set("ETag", tag)
	if version == Version {
		h.Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		h.Set("Cache-Control", "no-cache")
	}
	ct := mime.TypeByExtension(path.Ext(name))
	if path.Ext(name) == ".js" {
		ct = "text/javascript; charset=utf-8"
	}
	h.Set("Content-Type", ct)
	if match := r.Header.Get("If-None-Match"); match != "" && strings.Contains(match, tag) {
		w.WriteHeader(http.StatusNotModified)
		return true
	}
	w.Write(b)
	return true
}
