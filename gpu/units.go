package gpu

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// FormatBytes renders n in binary units: "512 B", "1.50 KiB", "80.00 GiB",
// to two decimals rounded half up on the exact value (277.125 MiB is
// "277.13 MiB"), as the pages' fmtBytes (static/common.js) rounds it, so
// that the CLI, the JSON's texts and the pages print one figure alike.
func FormatBytes(n uint64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	i, unit := 0, uint64(1024)
	for n/unit >= 1024 && i < len(units)-1 {
		unit <<= 10
		i++
	}
	return fmt.Sprintf("%s %ciB", hundredths(n, unit), units[i])
}

// FormatMiB renders n in MiB, whole when it is ("3270 MiB"), else to two
// decimals rounded as FormatBytes rounds ("3270.50 MiB"): for figures a
// step of 2 MiB apart, which FormatBytes would print alike in GiB.
func FormatMiB(n uint64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%s MiB", hundredths(n, 1<<20))
}

// FormatExact renders n in bytes with thousands separators:
// "6,717,177,856 B".
func FormatExact(n uint64) string {
	s := strconv.FormatUint(n, 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String() + " B"
}

// FormatApart renders two sizes a sentence compares with format
// (FormatBytes, FormatMiB), or exactly (FormatExact) when format would
// print one figure for two different sizes: the digits that differ show.
func FormatApart(format func(uint64) string, a, b uint64) (string, string) {
	fa, fb := format(a), format(b)
	if strings.Replace(fa, ".00 ", " ", 1) == strings.Replace(fb, ".00 ", " ", 1) && a != b {
		return FormatExact(a), FormatExact(b)
	}
	return fa, fb
}

// hundredths is n/unit to two decimals, rounded half up on the exact
// value, in 128-bit arithmetic.
func hundredths(n, unit uint64) string {
	hi, lo := bits.Mul64(n, 100)
	hi, lo = add128(hi, lo, unit/2)
	h, _ := bits.Div64(hi, lo, unit)
	return fmt.Sprintf("%d.%02d", h/100, h%100)
}

func add128(hi, lo, n uint64) (uint64, uint64) {
	lo, carry := bits.Add64(lo, n, 0)
	return hi + carry, lo
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
