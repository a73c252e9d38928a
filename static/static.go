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
	"sort"
)

//go:embed *.js *.css
var files embed.FS

// FS is the embedded files.
var FS fs.FS = files

// Version is a content hash of every file: the cache-busting path element.
var Version string

// ETags holds a strong ETag per file name.
var ETags = map[string]string{}

func init() {
	names, _ := fs.Glob(files, "*")
	sort.Strings(names)
	all := sha256.New()
	for _, n := range names {
		b, _ := fs.ReadFile(files, n)
		h := sha256.Sum256(b)
		ETags[n] = `"` + hex.EncodeToString(h[:8]) + `"`
		all.Write([]byte(n))
		all.Write(h[:])
	}
	Version = hex.EncodeToString(all.Sum(nil)[:6])
}

// Prefix is the URL path under which the files are served.
func Prefix() string { return "/static/" + Version + "/" }
