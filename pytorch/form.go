package pytorch

// How a snapshot's dicts were written beyond the fields vramscope reads
// from them, so that export gives back the same Python value: key order,
// absent keys, keys vramscope does not know, and known keys whose written
// value its structures cannot hold. Dicts written as PyTorch writes them
// today carry no form at all.

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"vramscope/gpu"
)

// Form is how one dict was written: its keys in order, and the values of
// those export does not derive from the decoded structure (keys this
// package does not know, and known keys written otherwise than export
// would write them). Dicts written alike share one Form.
type Form struct {
	Keys  []string
	Other Dict // in Keys order
}

// formJSON is a Form as the store keeps it.
type formJSON struct {
	Keys  []string        `json:"keys"`
	Other json.RawMessage `json:"other,omitempty"`
}

// JSON writes f for the store; "" for nil.
func (f *Form) JSON() (string, error) {
	if f == nil {
		return "", nil
	}
	fj := formJSON{Keys: f.Keys}
	if len(f.Other) > 0 {
		o, err := MarshalValue(f.Other)
		if err != nil {
			return "", err
		}
		fj.Other = json.RawMessage(o)
	}
	b, err := json.Marshal(fj)
	return string(b), err
}

// ParseForm reads what Form.JSON wrote; "" is nil.
func ParseForm(s string) (*Form, error) {
	if s == "" {
		return nil, nil
	}
	var fj formJSON
	if err := json.Unmarshal([]byte(s), &fj); err != nil {
		return nil, fmt.Errorf("stored form: %w", err)
	}
	f := &Form{Keys: fj.Keys}
	if len(fj.Other) > 0 {
		o, err := UnmarshalValue(string(fj.Other))
		if err != nil {
			return nil, err
		}
		d, ok := o.(Dict)
		if !ok {
			return nil, fmt.Errorf("stored form: other is a %T", o)
		}
		f.Other = d
	}
	return f, nil
}

// keysOr returns the form's keys, or std for a nil form.
func (f *Form) keysOr(std []string) []string {
	if f == nil {
		return std
	}
	return f.Keys
}

// other returns the written value of key, when the form keeps one.
func (f *Form) other(key string) (any, bool) {
	if f == nil || len(f.Other) == 0 {
		return nil, false
	}
	return f.Other.Get(key)
}

// The keys PyTorch writes today, in its order.
var (
	segmentKeys = []string{"device", "address", "total_size", "allocated_size", "active_size", "requested_size",
		"stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
	// A segment with a stack has its frames written after its blocks.
	segmentKeysWithStack = append(slices.Clone(segmentKeys[:10]), "blocks", "frames")
	blockKeys            = []string{"address", "size", "requested_size", "state", "frames"}
	entryKeys            = []string{"action", "addr", "size", "stream", "time_us", "frames"}
	oomEntryKeys         = []string{"action", "device_free", "size", "stream", "time_us", "frames"}
	annotationKeys       = []string{"stage", "name", "device", "time_us"}
	frameKeys            = []string{"name", "filename", "line"}
	topKeys              = []string{"segments", "device_traces", "allocator_settings", "external_annotations"}
)

func defaultSegmentKeys(stack gpu.StackID) []string {
	if stack != 0 {
		return segmentKeysWithStack
	}
	return segmentKeys
}

// Snapshot is what a snapshot file says beyond its devices' traces: its
// top level as written. The traces decoded from one file share it.
type Snapshot struct {
	// List: the file is a bare list of segments, as
	// torch.cuda.memory_snapshot() returns them.
	List bool
	// Keys are the top-level keys in the order written; nil is
	// segments, device_traces, allocator_settings (when there are
	// settings), external_annotations.
	Keys []string
	// DeviceTraces is the length of device_traces as written (devices
	// without segments or events have no Trace but keep their place).
	DeviceTraces int
	// Annotations are the external_annotations of every device, in file
	// order.
	Annotations []Annotation
	// Other holds the top-level keys this package does not know (for
	// example host_segments), in file order.
	Other Dict
}

// topJSON is a Snapshot's top level as the store keeps it (the
// annotations and settings have their own places).
type topJSON struct {
	List         bool            `json:"list,omitempty"`
	Keys         []string        `json:"keys,omitempty"`
	DeviceTraces int             `json:"device_traces,omitempty"`
	Other        json.RawMessage `json:"other,omitempty"`
}

// TopJSON writes the top level, without annotations, for the store.
func (s *Snapshot) TopJSON() (string, error) {
	tj := topJSON{List: s.List, Keys: s.Keys, DeviceTraces: s.DeviceTraces}
	if len(s.Other) > 0 {
		o, err := MarshalValue(s.Other)
		if err != nil {
			return "", err
		}
		tj.Other = json.RawMessage(o)
	}
	b, err := json.Marshal(tj)
	return string(b), err
}

// ParseTop reads what TopJSON wrote.
func ParseTop(text string) (*Snapshot, error) {
	var tj topJSON
	if err := json.NewDecoder(strings.NewReader(text)).Decode(&tj); err != nil {
		return nil, fmt.Errorf("stored snapshot top level: %w", err)
	}
	s := &Snapshot{List: tj.List, Keys: tj.Keys, DeviceTraces: tj.DeviceTraces}
	if len(tj.Other) > 0 {
		o, err := UnmarshalValue(string(tj.Other))
		if err != nil {
			return nil, err
		}
		d, ok := o.(Dict)
		if !ok {
			return nil, fmt.Errorf("stored snapshot top level: other is a %T", o)
		}
		s.Other = d
	}
	return s, nil
}

// sameValue says whether a decoded value is what export writes as x
// (int64, uint64, bool, string or a Tuple of those), type and all.
func (d *decoder) sameValue(v Value, x any) bool {
	v = resolve(v)
	switch want := x.(type) {
	case int64:
		return v.kind == kInt && int64(v.bits) == want
	case uint64:
		return (v.kind == kInt && int64(v.bits) >= 0 || v.kind == kUint) && v.bits == want
	case bool:
		return v.kind == kBool && (v.bits != 0) == want
	case string:
		return v.kind == kStr && d.strs[v.bits] == want
	case Tuple:
		if v.kind != kTuple || len(v.obj.items) != len(want) {
			return false
		}
		for i, it := range v.obj.items {
			if !d.sameValue(it, want[i]) {
				return false
			}
		}
		return true
	}
	return false
}
