package caching

import (
	"flag"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("%s differs:\n%s\nwant:\n%s", name, got, want)
	}
}

func TestSummaryLayout(t *testing.T) {
	h := newHarness(t, 1<<30, "")
	h.malloc(100)
	s := h.a.stats.Summary(0, false)
	golden(t, "summary_a1.txt", s)
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	for i, l := range lines {
		if len(l) != 77 || l[0] != '|' || l[76] != '|' {
			t.Errorf("line %d is not |75 chars|: %q", i, l)
		}
	}
	if !strings.Contains(s, "| Allocated memory      |    512 B   |    512 B   |    512 B   |      0 B   |\n") {
		t.Error("allocated row")
	}
	d, _ := scenarioD(t, "")
	golden(t, "summary_d_abbreviated.txt", d.a.stats.Summary(0, true))
}

func TestSummaryUnits(t *testing.T) {
	cases := []struct {
		v, ref int64
		want   string
	}{
		{512, 512, "   512 B  "},
		{2 << 20, 2 << 20, "  2048 KiB"},
		{20 << 20, 20 << 20, " 20480 KiB"},
		{768 << 20, 768 << 20, "   768 MiB"},
		{0, 2 << 20, "     0 KiB"},
		{5 << 30, 5 << 30, "  5120 MiB"},
	}
	for _, c := range cases {
		if got := formatSizeCell(c.v, c.ref); got != c.want {
			t.Errorf("formatSizeCell(%d, %d) = %q, want %q", c.v, c.ref, got, c.want)
		}
	}
	if got := formatCountCell(1_500_000, 1_500_000); got != "   1500 K " {
		t.Errorf("count %q", got)
	}
	for n, want := range map[uint64]string{0: "0 bytes", 1024: "1024 bytes", 1025: "1.00 KiB", 1 << 20: "1024.00 KiB",
		1<<20 + 1: "1.00 MiB", 1 << 30: "1024.00 MiB", 60 << 20: "60.00 MiB", 3 << 30: "3.00 GiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestMemoryStatsKeys(t *testing.T) {
	h := newHarness(t, 1<<30, "")
	m := h.a.stats.Flat()
	if len(m) != 122 {
		t.Errorf("%d keys, want 122 (spec §11.1)", len(m))
	}
	for _, k := range []string{"allocation.all.current", "inactive_split_bytes.small_pool.freed", "requested_bytes.large_pool.peak",
		"oversize_segments.allocated", "num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams",
		"num_device_alloc", "num_device_free"} {
		if _, ok := m[k]; !ok {
			t.Errorf("missing %s", k)
		}
	}
	if m["max_split_size"] != -1 {
		t.Errorf("max_split_size %d, want -1 when unlimited", m["max_split_size"])
	}
	keys := slices.Sorted(maps.Keys(m))
	if keys[0] != "active.all.allocated" {
		t.Errorf("first key %s", keys[0])
	}
}
