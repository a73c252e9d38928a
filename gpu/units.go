package gpu

import (
	"fmt"
	"strconv"
	"strings"
)

// FormatBytes renders n in binary units: "512 B", "1.50 KiB", "80.00 GiB".
func FormatBytes(n uint64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n)
	i := -1
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.2f %ciB", v, units[i])
}

// ParseBytes reads a size such as "80GiB", "512 MiB", "1.5GB", "2048" (bytes).
// Decimal suffixes (KB, MB, GB, TB) are powers of 1000, binary ones (KiB...)
// powers of 1024.
func ParseBytes(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, unit := strings.TrimSpace(t[:i]), strings.ToLower(strings.TrimSpace(t[i:]))
	mult := map[string]float64{"": 1, "b": 1, "k": 1 << 10, "kb": 1e3, "kib": 1 << 10, "m": 1 << 20, "mb": 1e6, "mib": 1 << 20,
		"g": 1 << 30, "gb": 1e9, "gib": 1 << 30, "t": 1 << 40, "tb": 1e12, "tib": 1 << 40}[unit]
	if mult == 0 {
		return 0, fmt.Errorf("size %q: unknown unit %q (use B, KiB, MiB, GiB, TiB or KB, MB, GB, TB)", s, t[i:])
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("size %q: %q is not a number", s, num)
	}
	if v*mult >= 1<<63 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return uint64(v * mult), nil
}

// FormatDuration renders microseconds in the largest fitting unit: 812
// µs, 21.5 ms, 6.38 s, 15.9 min.
func FormatDuration(us int64) string {
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
