package pytorch

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"

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
	// HasTime: the entries carry time_us; otherwise TimeUS is the index
	// (and the entries' forms leave time_us out).
	HasTime bool
	// ExtraOf[i] is 1 + the index in Extras of event i's other fields, 0
	// when it has none; nil when no event has any.
	ExtraOf []uint32
	Extras  []EventExtra

	// Stacks are the distinct stacks this trace refers to: StackID i is
	// Stacks[i-1].
	Stacks []gpu.Stack

	// Snapshot is the file's top level, shared by the traces decoded from
	// it; nil for a trace made otherwise (PyTorch's own top level then).
	Snapshot *Snapshot

	// Mismatches are the events that did not fit the layout when undone
	// or replayed, and where the replay ended apart from the snapshot.
	Mismatches []gpu.MismatchError
	// Dropped are the events left out of Events (they did not fit), in
	// order, with why.
	Dropped []gpu.DroppedEvent
	// Warnings are file-level oddities that were clamped, not refused.
	Warnings []string
}

// Estimate returns what the snapshot says of itself when it is an
// estimate made on a CPU (see EstimateKey), nil otherwise.
func (t *Trace) Estimate() *Estimate { return t.Snapshot.Estimate() }

// Annotations returns the external_annotations of the trace's device.
func (t *Trace) Annotations() []Annotation {
	if t.Snapshot == nil {
		return nil
	}
	var out []Annotation
	for _, a := range t.Snapshot.Annotations {
		if a.Device == t.Device {
			out = append(out, a)
		}
	}
	return out
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

// Devices picks from a snapshot's traces the devices to keep: every
// device that holds segments or trace events, or of those the one of
// ordinal device when device >= 0 (an error, naming the others, when it
// is not one of them).
func Devices(traces []*Trace, device int) ([]*Trace, error) {
	var out []*Trace
	var held []string
	listed := false
	for _, t := range traces {
		listed = listed || t.Device == device
		if len(t.Events) == 0 && len(t.Final.Segments) == 0 {
			continue
		}
		held = append(held, strconv.Itoa(t.Device))
		if device < 0 || t.Device == device {
			out = append(out, t)
		}
	}
	switch {
	case len(held) == 0:
		return nil, errors.New("the snapshot holds no segments and no trace events on any device")
	case len(out) == 0 && listed:
		return nil, fmt.Errorf("the snapshot's device %d holds no segments and no trace events (devices that do: %s)", device, strings.Join(held, ", "))
	case len(out) == 0:
		return nil, fmt.Errorf("the snapshot has no device %d (devices with segments or trace events: %s)", device, strings.Join(held, ", "))
	}
	return out, nil
}

// Recording is the device's trace as an event stream to replay, under the
// settings the allocator had (see Settings.Replay). A snapshot does not
// record its device's capacity.
func (t *Trace) Recording() gpu.Recording {
	rec := gpu.Recording{Initial: t.Initial, Events: t.Events, Settings: t.Settings.Replay(), Device: t.Device, Stacks: t.Stacks}
	if e := t.Estimate(); e != nil {
		rec.Capacity, rec.Estimated = e.Capacity(), true
	}
	for i, info := range t.Segments {
		if info.PoolID != ([2]int64{}) && i < len(t.Final.Segments) {
			if rec.Pools == nil {
				rec.Pools = map[uint64][2]int64{}
			}
			rec.Pools[t.Final.Segments[i].Addr] = info.PoolID
		}
	}
	for _, a := range t.Annotations() {
		rec.Annotations = append(rec.Annotations, gpu.Annotation{Device: a.Device, TimeUS: a.TimeUS, Stage: a.Stage, Name: a.Name})
	}
	return rec
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
	PoolID [2]int64    // segment_pool_id; (0, 0) is the default pool
	Stack  gpu.StackID // where the segment was allocated
	// Index is the segment's place in the file's segments list, which
	// holds every device's; export writes segments in this order, then by
	// device and address.
	Index int
	// Form is how the segment's dict was written; nil as PyTorch does.
	Form *Form
	// Blocks are the forms of the segment's blocks, in order; nil when
	// every block is written as PyTorch does.
	Blocks []*Form
}

// blockForm returns the form of block j.
func (s *SegmentInfo) blockForm(j int) *Form {
	if j < len(s.Blocks) {
		return s.Blocks[j]
	}
	return nil
}

// Annotation is an external_annotations entry (a record_function or
// dynamo region boundary, or a workload's step).
type Annotation struct {
	Stage  string // "START" or "END"
	Name   string
	Device int
	TimeUS int64
	// Form is how the entry was written; nil as PyTorch does (stage,
	// name, device, time_us).
	Form *Form
}

// Settings are the allocator settings a snapshot records.
type Settings struct {
	// Conf is PYTORCH_CUDA_ALLOC_CONF as the allocator last parsed it.
	Conf  string
	Rules gpu.Rules
	// Raw is allocator_settings as written, nil when the file has none.
	Raw Dict
}

// Replay is the settings to replay under, PYTORCH_CUDA_ALLOC_CONF syntax:
// Conf, unless allocator_settings say otherwise (settings changed at run
// time with _set_allocator_settings), then what they say.
func (s Settings) Replay() string {
	c, err := caching.ParseConfig(s.Conf)
	gcv, _ := s.Raw.Get("garbage_collection_threshold")
	gc, _ := gcv.(float64)
	if err == nil && c.Rules == s.Rules && (gcv == nil || c.GarbageCollectionThreshold == gc) {
		return s.Conf
	}
	return caching.Config{Rules: s.Rules, GarbageCollectionThreshold: gc}.String()
}

// SettingsFromRules describes an allocator's settings as PyTorch writes
// allocator_settings: every key, in PyTorch's order. conf is its
// PYTORCH_CUDA_ALLOC_CONF, which gives what rules do not hold.
func SettingsFromRules(conf string, r gpu.Rules) Settings {
	split := int64(-1)
	if r.MaxSplitSize != gpu.Unlimited && r.MaxSplitSize != 0 {
		split = int64(min(r.MaxSplitSize, math.MaxInt64))
	}
	cfg, err := caching.ParseConfig(conf)
	if err != nil {
		cfg = caching.DefaultConfig()
	}
	div := make(Dict, len(r.RoundupDivisions))
	for i, v := range r.RoundupDivisions {
		div[i] = KV{strconv.Itoa(1 << i), int64(v)}
	}
	return Settings{Conf: conf, Rules: r, Raw: Dict{
		{"PYTORCH_CUDA_ALLOC_CONF", conf},
		{"max_split_size", split},
		{"garbage_collection_threshold", cfg.GarbageCollectionThreshold},
		{"expandable_segments", r.Expandable},
		{"pinned_num_register_threads", int64(1)},
		{"release_lock_on_cudamalloc", cfg.ReleaseLockOnCudaMalloc},
		{"pinned_use_cuda_host_register", false},
		{"roundup_power2_divisions", div},
	}}
}

// rulesFrom reads gpu.Rules out of allocator_settings.
func rulesFrom(raw Dict) gpu.Rules {
	r := gpu.DefaultRules()
	get := func(k string) any { v, _ := raw.Get(k); return v }
	if v, ok := get("max_split_size").(int64); ok && v >= 0 {
		r.MaxSplitSize = uint64(v)
	}
	if v, ok := get("expandable_segments").(bool); ok {
		r.Expandable = v
	}
	if div, ok := get("roundup_power2_divisions").(Dict); ok {
		for _, kv := range div {
			k, _ := kv.Key.(string)
			v := kv.Value
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
