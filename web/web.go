// Package web renders vramscope's pages as templ components. The pages are
// frames: the data comes from the JSON API, fetched per viewport by the
// modules in static/.
package web

//go:generate go tool templ generate

import (
	"fmt"
	"strconv"

	"vramscope/gpu"
)

// Bytes renders a size in binary units.
func Bytes(n uint64) string { return gpu.FormatBytes(n) }

// Duration renders microseconds as the largest fitting unit.
func Duration(us int64) string {
	switch {
	case us < 0:
		return "–"
	case us < 1000:
		return fmt.Sprintf("%d µs", us)
	case us < 1_000_000:
		return fmt.Sprintf("%.1f ms", float64(us)/1e3)
	case us < 600_000_000:
		return fmt.Sprintf("%.2f s", float64(us)/1e6)
	}
	return fmt.Sprintf("%.1f min", float64(us)/6e7)
}

func itoa(n int) string { return strconv.Itoa(n) }

// plural picks one or many by n.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
func i64(n int64) string  { return strconv.FormatInt(n, 10) }
func u64(n uint64) string { return strconv.FormatUint(n, 10) }

func boolAttr(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
