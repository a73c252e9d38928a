package replay

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
	"vramscope/pytorch"
)

// decodeReal returns a real snapshot's device trace.
func decodeReal(t *testing.T, file string, device int) *pytorch.Trace {
	t.Helper()
	name := fmt.Sprintf("%s/device%d", file, device)
	for _, tr := range realTraces(t) {
		if tr.name == name {
			return tr.Trace
		}
	}
	t.Fatalf("no %s", name)
	return nil
}

// What the real snapshots say of their devices, and how it is said.
func TestCapacityFromTheRecording(t *testing.T) {
	// What an OOM implies is what the allocator could have had, not the
	// card: it says so.
	const notTheCard = ", what this allocator had then: reserved plus free on the device; the recording does not say the device's size"
	for _, c := range []struct {
		file   string
		device int
		source CapacitySource
		bytes  uint64
		says   string
	}{
		// 39 free-and-retry paths: released cached segments right before a
		// segment_alloc the device then granted.
		{"no_time_us_segment_churn.pickle", 0, CapacityRetries, 22556966911,
			"capacity 21.01 GiB, inferred from 39 retries (between 20.97 GiB and 21.01 GiB)"},
		{"oom_nonexpandable.json", 0, CapacityOOM, 23561895936, "capacity 21.94 GiB, inferred from the OOM at event 1117" + notTheCard},
		{"expandable_oom_multigpu.pickle", 1, CapacityOOM, 84298432512, "capacity 78.51 GiB, inferred from the OOM at event 421" + notTheCard},
		// Two expandable segments held at once, 89 GiB apart.
		{"expandable_oom_multigpu.pickle", 0, CapacityReservations, 85004561064,
			"capacity 79.17 GiB, the most the address space reserved for expandable segments leaves room for"},
		{"training_22k_user_metadata.pickle", 0, CapacityUnknown, 0, "capacity unknown"},
	} {
		s := FromRecording(decodeReal(t, c.file, c.device).Recording())
		if s.Capacity.Source != c.source || s.Capacity.Bytes != c.bytes || s.Capacity.String() != c.says {
			t.Errorf("%s: %d bytes from %q: %q", c.file, s.Capacity.Bytes, s.Capacity.Source, s.Capacity)
		}
	}
	s := FromRecording(decodeReal(t, "no_time_us_segment_churn.pickle", 0).Recording())
	if s.Capacity.Low != 22519218176 || s.Capacity.High != 22556966911 || s.Capacity.Retries != 39 {
		t.Errorf("bounds %+v, want [22519218176, 22556966911] from 39 retries", s.Capacity)
	}
	given := s
	given.Use(80<<30, DefaultCapacity)
	if given.Capacity.String() != "capacity 80.00 GiB, as given (the recording implies 21.01 GiB)" {
		t.Errorf("given: %q", given.Capacity)
	}
	unknown := FromRecording(decodeReal(t, "training_22k_user_metadata.pickle", 0).Recording())
	unknown.Use(0, DefaultCapacity)
	if unknown.Capacity.String() != "capacity 80.00 GiB, a default: the recording does not say" {
		t.Errorf("default: %q", unknown.Capacity)
	}
	small := FromRecording(decodeReal(t, "training_22k_user_metadata.pickle", 0).Recording())
	small.Use(0, 1<<30)
	if !strings.HasSuffix(small.Capacity.String(), "(less than the 23.45 GiB the recording reserved)") {
		t.Errorf("too small a default: %q", small.Capacity)
	}
}

// oom_nonexpandable.json frees five cached segments at its end with no
// request around them: an empty_cache() call. Its free-and-retry path
// before the OOM is malloc's own, and so are the 39 of the churn file.
func TestEmptyCacheInferred(t *testing.T) {
	count := func(s Stream) (n int) {
		for _, r := range s.Requests {
			if r.Op == OpEmptyCache {
				n++
			}
		}
		return n
	}
	s := FromRecording(decodeReal(t, "oom_nonexpandable.json", 0).Recording())
	if last := s.Requests[len(s.Requests)-1]; last.Op != OpEmptyCache || count(s) != 1 {
		t.Errorf("%d empty_cache() calls, last request %+v", count(s), last)
	}
	if n := count(FromRecording(decodeReal(t, "no_time_us_segment_churn.pickle", 0).Recording())); n != 0 {
		t.Errorf("%d empty_cache() calls in the churn file", n)
	}
}

func TestOverlay(t *testing.T) {
	base, _ := caching.ParseConfig("expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:[256:4,>:8]")
	for conf, want := range map[string]string{
		"":                           "expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:[1:4,2:4,4:4,8:4,16:4,32:4,64:4,128:4,256:4,512:8,1024:8,2048:8,4096:8,8192:8,16384:8,32768:8]",
		"expandable_segments:False":  "max_split_size_mb:128,roundup_power2_divisions:[1:4,2:4,4:4,8:4,16:4,32:4,64:4,128:4,256:4,512:8,1024:8,2048:8,4096:8,8192:8,16384:8,32768:8]",
		"roundup_power2_divisions:2": "expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:2",
		"max_split_size_mb:32,garbage_collection_threshold:0.5": "expandable_segments:True,max_split_size_mb:32,garbage_collection_threshold:0.5,roundup_power2_divisions:[1:4,2:4,4:4,8:4,16:4,32:4,64:4,128:4,256:4,512:8,1024:8,2048:8,4096:8,8192:8,16384:8,32768:8]",
	} {
		got, err := Overlay(base, conf)
		if err != nil || got.String() != want {
			t.Errorf("Overlay(%q) = %q, %v\nwant %q", conf, got.String(), err, want)
		}
	}
	var ce *caching.ConfigError
	if _, err := Overlay(base, "expandable_segments:maybe"); !errors.As(err, &ce) {
		t.Errorf("a bad key: %v", err)
	}
}

// A starting layout larger than the device is an out-of-memory error, and
// the device gets its capacity back.
func TestStartingLayoutTooLarge(t *testing.T) {
	tr := decodeReal(t, "training_22k_user_metadata.pickle", 0)
	s := FromRecording(tr.Recording())
	dev := s.Device(8 << 30)
	a, err := caching.New(dev, caching.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Start(a)
	if !errors.Is(err, gpu.ErrOutOfMemory) || !strings.Contains(err.Error(), "does not fit on a 8.00 GiB device") || dev.Capacity() != 8<<30 {
		t.Fatalf("%v (capacity %d)", err, dev.Capacity())
	}
	var _ *sim.Device = dev
}
