package caching

import (
	"errors"
	"testing"

	"vramscope/gpu"
)

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig(" expandable_segments:True, max_split_size_mb:128,garbage_collection_threshold:0.6,roundup_power2_divisions:4")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Expandable || c.MaxSplitSize != 128<<20 || c.GarbageCollectionThreshold != 0.6 || c.RoundupDivisions[15] != 4 {
		t.Errorf("parsed %+v", c)
	}
	if c, _ := ParseConfig(""); c.MaxSplitSize != gpu.Unlimited || c.Expandable {
		t.Errorf("defaults %+v", c)
	}
}

func TestParseConfigRoundupList(t *testing.T) {
	// Keys are MB, interval [K, 2K) gets K's value; the first key fills below,
	// ">" fills after the last listed interval, gaps stay 0 (newest PyTorch).
	c, err := ParseConfig("roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]")
	if err != nil {
		t.Fatal(err)
	}
	want := [16]uint64{8, 8, 8, 8, 8, 8, 8, 2, 4, 2, 4, 1, 1, 1, 1, 1}
	if c.RoundupDivisions != want {
		t.Errorf("got %v want %v", c.RoundupDivisions, want)
	}
	c, err = ParseConfig("roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.RoundupDivisions; got[10] != 0 || got[11] != 8 || got[12] != 2 || got[7] != 8 || got[0] != 8 {
		t.Errorf("got %v", got)
	}
	for size, want := range map[uint64]uint64{1200: 1536, 3000: 3072, 5<<20 + 1: 6 << 20, 1395864371: 1476395008} {
		d, _ := ParseConfig("roundup_power2_divisions:4")
		if size == 1395864371 {
			d, _ = ParseConfig("roundup_power2_divisions:8")
		}
		if got := d.RoundSize(size); got != want {
			t.Errorf("RoundSize(%d) = %d, want %d", size, got, want)
		}
	}
}

func TestParseConfigErrors(t *testing.T) {
	cases := map[string]string{
		"foo:1":                              "Unrecognized CachingAllocator option: foo",
		"max_split_size_mb:20":               "CachingAllocator option max_split_size_mb too small, must be > 20",
		"max_split_size_mb":                  "Error parsing CachingAllocator settings, expected :",
		"max_split_size_mb:":                 "Error, expecting max_split_size_mb value",
		"expandable_segments:true":           "Expected a single True/False argument for expandable_segments",
		"garbage_collection_threshold:0":     "garbage_collect_threshold too small, set it 0.0~1.0",
		"garbage_collection_threshold:1.0":   "garbage_collect_threshold too big, set it 0.0~1.0",
		"roundup_power2_divisions:3":         "For roundups, the divisons has to be power of 2 ",
		"roundup_power2_divisions:[100:4]":   "For roundups, the intervals have to be power of 2 ",
		"roundup_power2_divisions:[64:3]":    "For roundups, the divisons has to be power of 2 or 0 to disable roundup ",
		"expandable_segments:True;max_split": "Expected a single True/False argument for expandable_segments",
		"expandable_segments:True max_split": "Expected a single True/False argument for expandable_segments",
		"max_split_size_mb:100:":             "Error parsing CachingAllocator settings, expected ,",
		"backend:cudaMallocAsync":            "backend:cudaMallocAsync is the driver's own allocator; vramscope models only the native caching allocator",
		"roundup_power2_divisions:[64:4":     "Error parsing CachingAllocator settings, expected ]",
	}
	for in, want := range cases {
		_, err := ParseConfig(in)
		var ce *ConfigError
		if !errors.As(err, &ce) || err.Error() != want {
			t.Errorf("ParseConfig(%q) = %v, want %q", in, err, want)
		}
	}
}

func TestConfigStringRoundTrip(t *testing.T) {
	for _, in := range []string{"", "expandable_segments:True", "max_split_size_mb:128,garbage_collection_threshold:0.6",
		"roundup_power2_divisions:4", "roundup_power2_divisions:[64:8,>:2]"} {
		c, err := ParseConfig(in)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := ParseConfig(c.String())
		if err != nil {
			t.Fatalf("%q -> %q: %v", in, c.String(), err)
		}
		c.Raw, c2.Raw = "", ""
		if c != c2 {
			t.Errorf("%q -> %q changed the settings", in, c.String())
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{"", "expandable_segments:True", "max_split_size_mb:128,garbage_collection_threshold:0.6",
		"roundup_power2_divisions:[64:8,128:2,>:1]", "roundup_power2_divisions:4", "backend:native,release_lock_on_cudamalloc:True",
		"max_split_size_mb:", "[[::]],", "roundup_power2_divisions:[>:2]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseConfig(s)
		if err != nil {
			return
		}
		// A valid config renders to a string that parses to the same settings.
		c2, err := ParseConfig(c.String())
		if err != nil {
			t.Fatalf("%q rendered as %q: %v", s, c.String(), err)
		}
		c.Raw, c2.Raw = "", ""
		if c != c2 {
			t.Fatalf("%q rendered as %q changed the settings", s, c.String())
		}
		for _, d := range c.RoundupDivisions {
			if d != 0 && d&(d-1) != 0 {
				t.Fatalf("divisions %d not a power of two", d)
			}
		}
	})
}
