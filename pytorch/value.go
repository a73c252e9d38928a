package pytorch

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"unsafe"

	"vramscope/gpu"
)

// kind says what a Value holds.
type kind uint8

const (
	kEmpty    kind = iota // an unset memo slot
	kNone                 // None
	kBool                 // bits: 0 or 1
	kInt                  // bits: int64, two's complement
	kUint                 // bits: a uint64 above MaxInt64
	kBig                  // obj.big: beyond 64 bits
	kFloat                // bits: math.Float64bits
	kStr                  // bits: index into the string table
	kBytes                // bits: index into the string table
	kList                 // obj.items
	kTuple                // obj.items
	kDict                 // obj.items: key, value, key, value...
	kStack                // bits: a StackID (an interned frames list)
	kFrame                // bits: index into the frame table (an interned frame dict)
	kConsumed             // a trace entry already turned into an event
)

var kindNames = [...]string{"unset", "None", "bool", "int", "int", "int", "float", "str", "bytes",
	"list", "tuple", "dict", "list of frames", "frame", "trace entry"}

func (k kind) String() string { return kindNames[k] }

// Value is one decoded pickle value, kept to 24 bytes: scalars live in
// bits, strings are indices into the decoder's intern table, containers
// point to an object. The memo and the stack hold millions of these.
type Value struct {
	obj  *object
	bits uint64
	kind kind
}

// object is a mutable container. Pickle memoizes a container before it
// fills it, so the memo and the stack share the same object.
type object struct {
	items  []Value
	events *eventList // a list of trace entries, turned into events as they arrive
	big    *big.Int
	conv   Value // what the object became once interned or consumed
	memo   int   // the memo slot last given to it, -1 if none, memoFar if in the map
}

// memoFar is object.memo for an object whose slot is in the memo's map.
const memoFar = -2

// int64 returns an integer value that fits in int64.
func (v Value) int64() (int64, bool) {
	switch v.kind {
	case kInt:
		return int64(v.bits), true
	case kBool:
		return int64(v.bits), true
	}
	return 0, false
}

// uint64 returns a non-negative integer; values beyond 64 bits are clamped
// to MaxUint64 and reported as not exact.
func (v Value) uint64() (u uint64, exact, ok bool) {
	switch v.kind {
	case kInt, kBool:
		if int64(v.bits) < 0 {
			return 0, false, false
		}
		return v.bits, true, true
	case kUint:
		return v.bits, true, true
	case kBig:
		if v.obj.big.Sign() < 0 {
			return 0, false, false
		}
		return math.MaxUint64, false, true
	}
	return 0, false, false
}

// Tuple is a decoded Python tuple.
type Tuple []any

// Dict is a decoded Python dict: its items in the order they were set. A
// key set twice keeps its first place and its last value, as in Python.
type Dict []KV

// KV is one item of a Dict.
type KV struct {
	Key   any
	Value any
}

// Get returns the value of a string key.
func (d Dict) Get(key string) (any, bool) {
	for _, kv := range d {
		if k, ok := kv.Key.(string); ok && k == key {
			return kv.Value, true
		}
	}
	return nil, false
}

// MarshalJSON writes the dict as a JSON object in its own key order.
func (d Dict) MarshalJSON() ([]byte, error) {
	b := []byte{'{'}
	for i, kv := range d {
		if i > 0 {
			b = append(b, ',')
		}
		k, ok := kv.Key.(string)
		if !ok {
			k = fmt.Sprint(kv.Key)
		}
		kb, err := json.Marshal(k)
		if err != nil {
			return nil, err
		}
		vb, err := json.Marshal(kv.Value)
		if err != nil {
			return nil, err
		}
		b = append(append(append(b, kb...), ':'), vb...)
	}
	return append(b, '}'), nil
}

// errTooLarge is returned when a value expands beyond the memory budget:
// shared memo references can make a small file describe a huge tree.
var errTooLarge = fmt.Errorf("the data expands to more values than the file can hold (shared references)")

// anySize is what one converted value costs, about: a boxed scalar or a
// string header; containers add their backing arrays.
const anySize = 16

// toAny turns a Value into plain Go values: nil, bool, int64, uint64,
// *big.Int, float64, string, []byte, []any, Tuple, Dict. The nodes made
// are charged to the memory budget.
func (d *decoder) toAny(v Value, depth int) (any, error) {
	if d.charge(anySize); d.over != nil {
		return nil, errTooLarge
	}
	if depth > maxDepth {
		return nil, fmt.Errorf("values nested deeper than %d", maxDepth)
	}
	switch v.kind {
	case kNone, kEmpty:
		return nil, nil
	case kBool:
		return v.bits != 0, nil
	case kInt:
		return int64(v.bits), nil
	case kUint:
		return v.bits, nil
	case kBig:
		// A copy, like bytes below: charged by its size.
		if d.charge(8 * len(v.obj.big.Bits())); d.over != nil {
			return nil, errTooLarge
		}
		return new(big.Int).Set(v.obj.big), nil
	case kFloat:
		return math.Float64frombits(v.bits), nil
	case kStr:
		return d.strs[v.bits], nil
	case kBytes:
		// Each reference is a copy: charged by its size.
		if d.charge(len(d.strs[v.bits])); d.over != nil {
			return nil, errTooLarge
		}
		return []byte(d.strs[v.bits]), nil
	case kStack:
		if v.bits == 0 {
			return []any{}, nil
		}
		if d.charge(4 * mapEntry * len(d.stacks[v.bits-1])); d.over != nil {
			return nil, errTooLarge
		}
		return stackAny(d.stacks[v.bits-1]), nil
	case kFrame:
		return frameAny(d.frames[v.bits]), nil
	case kConsumed:
		return nil, fmt.Errorf("a trace entry is referenced twice")
	case kList, kTuple:
		if v.obj.events != nil {
			return d.eventsAny(v.obj.events)
		}
		if d.charge(anySize * len(v.obj.items)); d.over != nil {
			return nil, errTooLarge
		}
		out := make([]any, len(v.obj.items))
		for i, it := range v.obj.items {
			x, err := d.toAny(it, depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = x
		}
		if v.kind == kTuple {
			return Tuple(out), nil
		}
		return out, nil
	case kDict:
		items := v.obj.items
		pairs, err := dictPairs(items)
		if err != nil {
			return nil, err
		}
		if d.charge(int(unsafe.Sizeof(KV{})) * len(pairs)); d.over != nil {
			return nil, errTooLarge
		}
		m := make(Dict, len(pairs))
		for i, p := range pairs {
			k, err := d.toAny(items[p[0]], depth+1)
			if err != nil {
				return nil, err
			}
			x, err := d.toAny(items[p[1]], depth+1)
			if err != nil {
				return nil, err
			}
			m[i] = KV{k, x}
		}
		return m, nil
	}
	return nil, fmt.Errorf("unexpected value kind %d", v.kind)
}

// lineAny gives a frame line the type a generic decode would give it.
func lineAny(l uint64) any {
	if l > math.MaxInt64 {
		return l
	}
	return int64(l)
}

// stackAny is a stack as a frames list.
func stackAny(st gpu.Stack) []any {
	out := make([]any, len(st))
	for i, f := range st {
		out[i] = frameAny(f)
	}
	return out
}

// frameAny is a frame as its dict: name, filename, line, or as its form
// says.
func frameAny(f gpu.Frame) Dict {
	form := frameForm(f)
	keys := form.keysOr(frameKeys)
	m := make(Dict, len(keys))
	for i, k := range keys {
		m[i] = KV{k, frameValue(k, f, form)}
	}
	return m
}

// frameForm reads a frame's form; a form that does not read is dropped
// (the frame is then written as PyTorch does).
func frameForm(f gpu.Frame) *Form {
	if f.Extra == "" {
		return nil
	}
	form, err := ParseForm(f.Extra)
	if err != nil {
		return nil
	}
	return form
}

// frameValue is what a frame's dict holds under key.
func frameValue(key string, f gpu.Frame, form *Form) any {
	if v, ok := form.other(key); ok {
		return v
	}
	switch key {
	case "name":
		return f.Name
	case "filename":
		return f.Filename
	case "line":
		return lineAny(f.Line)
	}
	return nil
}

// dictPairs returns, for each distinct key of a dict's items in the order
// first set, the index of the key and of its last value, as Python keeps
// them. Keys must be scalars (str, int, float, bool, None).
func dictPairs(items []Value) ([][2]int, error) {
	pairs := make([][2]int, 0, len(items)/2)
	var pos map[Value]int
	if len(items) > 32 {
		pos = make(map[Value]int, len(items)/2)
	}
	for i := 0; i < len(items); i += 2 {
		k := items[i]
		switch k.kind {
		case kNone, kBool, kInt, kUint, kFloat, kStr:
		default:
			return nil, fmt.Errorf("dict key of type %s is not supported", k.kind)
		}
		j := -1
		if pos != nil {
			if at, ok := pos[k]; ok {
				j = at
			} else {
				pos[k] = len(pairs)
			}
		} else {
			for at, p := range pairs {
				if items[p[0]] == k {
					j = at
					break
				}
			}
		}
		if j >= 0 {
			pairs[j][1] = i + 1
		} else {
			pairs = append(pairs, [2]int{i, i + 1})
		}
	}
	return pairs, nil
}
