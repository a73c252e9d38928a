package gpu

import "testing"

func TestBytes(t *testing.T) {
	for in, want := range map[string]uint64{"80GiB": 80 << 30, "512 MiB": 512 << 20, "1.5GB": 1.5e9, "2048": 2048, "60MiB": 60 << 20, "1k": 1024} {
		got, err := ParseBytes(in)
		if err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "GiB", "12XB", "-1", "1e30GiB"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) accepted", bad)
		}
	}
	// Half up on the exact value, as static/common.js's fmtBytes rounds
	// (277.125 MiB and 7.125 MiB are ties); the largest units whole.
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1536: "1.50 KiB", 80 << 30: "80.00 GiB",
		277<<20 + 1<<17: "277.13 MiB", 7<<20 + 1<<17: "7.13 MiB", 7<<20 + 1<<17 - 1: "7.12 MiB", 1<<20 - 1: "1024.00 KiB",
		1<<64 - 1: "16.00 EiB", 1 << 60: "1.00 EiB", 6717177856: "6.26 GiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestFormatApart(t *testing.T) {
	a, b := FormatApart(FormatBytes, 6717177856, 6717177855)
	if a != "6,717,177,856 B" || b != "6,717,177,855 B" {
		t.Errorf("apart: %q, %q", a, b)
	}
	if a, b := FormatApart(FormatBytes, 5<<30, 6<<30); a != "5.00 GiB" || b != "6.00 GiB" {
		t.Errorf("apart: %q, %q", a, b)
	}
	if a, b := FormatApart(FormatMiB, 3270<<20, 3270<<20); a != "3270 MiB" || b != a {
		t.Errorf("the same size: %q, %q", a, b)
	}
	if a, b := FormatApart(FormatMiB, 6717177856, 6717177855); a != "6,717,177,856 B" || b != "6,717,177,855 B" {
		t.Errorf("apart in MiB: %q, %q", a, b)
	}
	if got := FormatMiB(6717177855); got != "6406.00 MiB" {
		t.Errorf("FormatMiB: %q", got)
	}
	if got := FormatExact(999); got != "999 B" {
		t.Errorf("FormatExact: %q", got)
	}
}
