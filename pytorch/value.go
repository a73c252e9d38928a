package pytorch

import (
	"fmt"
	"math"
	"math/big"
	"sort"
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

func (v Value) isContainer() bool { return v.kind == kList || v.kind == kTuple || v.kind == kDict }

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

// errTooLarge is returned when a value expands beyond the budget: shared
// memo references can make a small file describe a huge tree.
var errTooLarge = fmt.Errorf("the data expands to more values than the file can hold (shared references)")

// toAny turns a Value into plain Go values: nil, bool, int64, uint64,
// *big.Int, float64, string, []byte, []any, Tuple, map[string]any (or
// map[any]any when a key is not a string). budget bounds the nodes made.
func (d *decoder) toAny(v Value, depth int, budget *int) (any, error) {
	if *budget--; *budget < 0 {
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
		if *budget -= len(v.obj.big.Bits()) / 2; *budget < 0 {
			return nil, errTooLarge
		}
		return new(big.Int).Set(v.obj.big), nil
	case kFloat:
		return math.Float64frombits(v.bits), nil
	case kStr:
		return d.strs[v.bits], nil
	case kBytes:
		// Each reference is a copy: charged as one value per 16 bytes.
		if *budget -= len(d.strs[v.bits]) / 16; *budget < 0 {
			return nil, errTooLarge
		}
		return []byte(d.strs[v.bits]), nil
	case kStack:
		out := []any{}
		if v.bits == 0 {
			return out, nil
		}
		for _, f := range d.stacks[v.bits-1] {
			out = append(out, map[string]any{"name": f.Name, "filename": f.Filename, "line": lineAny(f.Line)})
		}
		return out, nil
	case kFrame:
		f := d.frames[v.bits]
		return map[string]any{"name": f.Name, "filename": f.Filename, "line": lineAny(f.Line)}, nil
	case kConsumed:
		return nil, fmt.Errorf("a trace entry is referenced twice")
	case kList, kTuple:
		if v.obj.events != nil {
			return d.eventsAny(v.obj.events, budget)
		}
		out := make([]any, len(v.obj.items))
		for i, it := range v.obj.items {
			x, err := d.toAny(it, depth+1, budget)
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
		allStr := true
		for i := 0; i < len(items); i += 2 {
			allStr = allStr && items[i].kind == kStr
		}
		if allStr {
			m := make(map[string]any, len(items)/2)
			for i := 0; i < len(items); i += 2 {
				x, err := d.toAny(items[i+1], depth+1, budget)
				if err != nil {
					return nil, err
				}
				m[d.strs[items[i].bits]] = x
			}
			return m, nil
		}
		m := make(map[any]any, len(items)/2)
		for i := 0; i < len(items); i += 2 {
			if items[i].isContainer() || items[i].kind == kBytes || items[i].kind == kBig {
				return nil, fmt.Errorf("dict key of type %s is not supported", items[i].kind)
			}
			k, err := d.toAny(items[i], depth+1, budget)
			if err != nil {
				return nil, err
			}
			x, err := d.toAny(items[i+1], depth+1, budget)
			if err != nil {
				return nil, err
			}
			m[k] = x
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

// sortedKeys returns a map's keys in order, for deterministic output.
func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
