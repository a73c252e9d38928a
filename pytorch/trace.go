package pytorch

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"

	"vramscope/gpu"
	"vramscope/gpu/caching"
)

// Trace is one device's part of a PyTorch memory snapshot.
type Trace struct {
	Device   int
	Settings Settings

	// Final is the segments and blocks at snapshot time; Segments holds
	// what gpu.Segment has no room for, in the same order.
	Final    *gpu.Layout
	Segments []SegmentInfo
	// Initial is the state before the first event, found by undoing the
	// events from Final backwards.
	Initial *gpu.Layout

	// Events are the device's trace entries, oldest first, Seq 0..n-1.
	// BlockSize is filled by replaying them forward from Initial.
	Events []gpu.Event
	// HasTime: the entries carry time_us; otherwise TimeUS is the index.
	HasTime bool
	// ExtraOf[i] is 1 + the index in Extras of event i's other fields, 0
	// when it has none; nil when no event has any.
	ExtraOf []uint32
	Extras  []EventExtra

	// Stacks are the distinct stacks this trace refers to: StackID i is
	// Stacks[i-1].
	Stacks []gpu.Stack

	Annotations []Annotation
	// Mismatches are the events that did not fit the layout when undone
	// or replayed, and where the replay ended apart from the snapshot.
	Mismatches []gpu.MismatchError
	// Warnings are file-level oddities that were clamped, not refused.
	Warnings []string
	// Other holds top-level keys this package does not know (for example
	// host_segments), kept for export.
	Other map[string]any
}

// Stack returns the stack of id, nil for 0 or an unknown id.
func (t *Trace) Stack(id gpu.StackID) gpu.Stack {
	if id == 0 || int(id) > len(t.Stacks) {
		return nil
	}
	return t.Stacks[id-1]
}

// Extra returns the extra fields of event i, or nil.
func (t *Trace) Extra(i int) *EventExtra {
	if t.ExtraOf == nil || t.ExtraOf[i] == 0 {
		return nil
	}
	return &t.Extras[t.ExtraOf[i]-1]
}

// Devices picks from a snapshot's traces the devices to keep: the one of
// ordinal device when device >= 0 (an error when the snapshot lacks it),
// else every device that holds segments or trace events.
func Devices(traces []*Trace, device int) ([]*Trace, error) {
	var out []*Trace
	for _, t := range traces {
		if device >= 0 && t.Device == device || device < 0 && (len(t.Events) > 0 || len(t.Final.Segments) > 0) {
			out = append(out, t)
		}
	}
	if device >= 0 && len(out) == 0 {
		return nil, fmt.Errorf("the snapshot has no device %d", device)
	}
	if len(out) == 0 {
		return nil, errors.New("the snapshot holds no segments and no trace events on any device")
	}
	return out, nil
}

// Recording is the device's trace as an event stream to replay, under the
// settings the allocator had (see Settings.Replay). A snapshot does not
// record its device's capacity.
func (t *Trace) Recording() gpu.Recording {
	return gpu.Recording{Initial: t.Initial, Events: t.Events, Settings: t.Settings.Replay()}
}

// OOMs counts the oom events.
func (t *Trace) OOMs() int {
	n := 0
	for _, e := range t.Events {
		if e.Action == gpu.ActionOOM {
			n++
		}
	}
	return n
}

// SegmentInfo is what a snapshot says about a segment beyond gpu.Segment.
type SegmentInfo struct {
	PoolID [2]int64    `json:"segment_pool_id"` // (0, 0) is the default pool
	Stack  gpu.StackID `json:"stack,omitempty"` // where the segment was allocated
}

// Annotation is an external_annotations entry (a record_function or
// dynamo region boundary).
type Annotation struct {
	Stage  string         `json:"stage"` // "START" or "END"
	Name   string         `json:"name"`
	Device int            `json:"device"`
	TimeUS int64          `json:"time_us"`
	Other  map[string]any `json:"other,omitempty"`
}

// Settings are the allocator settings a snapshot records.
type Settings struct {
	// Conf is PYTORCH_CUDA_ALLOC_CONF as the allocator last parsed it.
	Conf  string
	Rules gpu.Rules
	// Raw is allocator_settings as written, nil when the file has none.
	Raw map[string]any
}

// Replay is the settings to replay under, PYTORCH_CUDA_ALLOC_CONF syntax:
// Conf, unless allocator_settings say otherwise (settings changed at run
// time with _set_allocator_settings), then what they say.
func (s Settings) Replay() string {
	c, err := caching.ParseConfig(s.Conf)
	gc, _ := s.Raw["garbage_collection_threshold"].(float64)
	if err == nil && c.Rules == s.Rules && (s.Raw["garbage_collection_threshold"] == nil || c.GarbageCollectionThreshold == gc) {
		return s.Conf
	}
	return caching.Config{Rules: s.Rules, GarbageCollectionThreshold: gc}.String()
}

// SettingsFromRules describes rules as allocator_settings, for export.
func SettingsFromRules(conf string, r gpu.Rules) Settings {
	split := int64(-1)
	if r.MaxSplitSize != gpu.Unlimited && r.MaxSplitSize != 0 {
		split = int64(min(r.MaxSplitSize, math.MaxInt64))
	}
	div := map[string]any{}
	for i, v := range r.RoundupDivisions {
		div[strconv.Itoa(1<<i)] = int64(v)
	}
	return Settings{Conf: conf, Rules: r, Raw: map[string]any{
		"PYTORCH_CUDA_ALLOC_CONF": conf, "max_split_size": split,
		"expandable_segments": r.Expandable, "roundup_power2_divisions": div,
	}}
}

// rulesFrom reads gpu.Rules out of allocator_settings.
func rulesFrom(raw map[string]any) gpu.Rules {
	r := gpu.DefaultRules()
	if v, ok := raw["max_split_size"].(int64); ok && v >= 0 {
		r.MaxSplitSize = uint64(v)
	}
	if v, ok := raw["expandable_segments"].(bool); ok {
		r.Expandable = v
	}
	if div, ok := raw["roundup_power2_divisions"].(map[string]any); ok {
		for k, v := range div {
			mb, err := strconv.ParseUint(k, 10, 64)
			n, ok := v.(int64)
			if err != nil || !ok || n < 0 || mb == 0 || mb&(mb-1) != 0 {
				continue
			}
			if i := bits.TrailingZeros64(mb); i < gpu.RoundupIntervals {
				r.RoundupDivisions[i] = uint64(n)
			}
		}
	}
	return r
}
