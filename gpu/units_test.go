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
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1536: "1.50 KiB", 80 << 30: "80.00 GiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
