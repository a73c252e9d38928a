// What the unpickler does with a snapshot's pieces as it builds them, so a
// big snapshot never exists as a whole object graph: trace entries become
// events as they are appended, "frames" lists become interned stacks, and
// values this package does not interpret are canonicalized once and shared.

package pytorch

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"unsafe"

	"vramscope/gpu"
)

// knownStrings are interned first, so their indices are the constants below
// and key matching is an integer comparison.
var knownStrings = []string{
	"action", "addr", "size", "stream", "time_us", "frames", "device_free",
	"compile_context", "user_metadata", "name", "filename", "line",
	"segments", "device_traces", "allocator_settings", "external_annotations",
	"device", "address", "total_size", "blocks", "state", "requested_size",
	"segment_type", "segment_pool_id", "is_expandable", "history", "real_size",
}

const (
	sAction = iota
	sAddr
	sSize
	sStream
	sTimeUS
	sFrames
	sDeviceFree
	sCompileContext
	sUserMetadata
	sName
	sFilename
	sLine
	sSegments
	sDeviceTraces
	sAllocatorSettings
	sExternalAnnotations
	sDevice
	sAddress
	sTotalSize
	sBlocks
	sState
	sRequestedSize
	sSegmentType
	sSegmentPoolID
	sIsExpandable
	sHistory
	sRealSize
)

// eventList is a list of trace entries, kept as events from the start.
type eventList struct {
	// the events in chunks of eventChunk, gathered into one slice by all:
	// a slice grown event by event would be copied over and over
	chunks [][]gpu.Event
	n      int
	extra  []uint32 // 1+index into the decoder's extras; nil until an entry has extras
	timed  int      // entries with time_us
	bad    string   // the first malformed entry's problem
	badAt  int
}

// eventChunk bounds a chunk of events: the first are small, so a short
// trace costs little, each twice the one before.
const eventChunk = 1 << 15

// add appends e and returns how many events' room it allocated.
func (el *eventList) add(e gpu.Event) (grew int) {
	if k := len(el.chunks); k == 0 || len(el.chunks[k-1]) == cap(el.chunks[k-1]) {
		n := eventChunk
		if k < 10 {
			n = min(64<<k, eventChunk)
		}
		el.chunks = append(el.chunks, make([]gpu.Event, 0, n))
		grew = n
	}
	c := &el.chunks[len(el.chunks)-1]
	*c = append(*c, e)
	el.n++
	return grew
}

// all gathers the events into one slice (once; the chunks go).
func (el *eventList) all() []gpu.Event {
	if len(el.chunks) == 1 {
		return el.chunks[0]
	}
	out := make([]gpu.Event, 0, el.n)
	for _, c := range el.chunks {
		out = append(out, c...)
	}
	el.chunks = [][]gpu.Event{out}
	return out
}

// EventExtra holds what a trace entry says beyond gpu.Event. Events share
// one EventExtra when these are equal.
type EventExtra struct {
	CompileContext string // when Keys has compile_context
	UserMetadata   string // when Keys has user_metadata
	Action         string // an action gpu.Action does not name (e.g. "annotate")
	// Form: the entry's keys in order, and the values of keys this
	// package does not know or that gpu.Event cannot hold. Keys are nil
	// for action, addr (device_free for oom), size, stream, time_us,
	// frames.
	Form
}

type extraKey struct {
	cc, um, action uint32 // 1+string index; 0 when absent
	keys           uint32 // 1+index of the key order in keyOrders; 0: the usual order
	other          string // canonical text of Other
}

// setItems adds key/value pairs to a dict. In snapshot mode a "frames"
// list becomes an interned stack right here: its dict is complete, and
// other entries reach the same list through the memo.
func (d *decoder) setItems(dict Value, kv []Value) error {
	if dict.kind != kDict {
		return fmt.Errorf("setting items on a %s", dict.kind)
	}
	o := dict.obj
	if o.conv.kind != kEmpty {
		return fmt.Errorf("setting items on a dict already read as a %s", o.conv.kind)
	}
	old := cap(o.items)
	if old == 0 {
		o.items = d.pool.get(len(kv))
	} else {
		o.items = slices.Grow(o.items, len(kv)) // one allocation, not one per doubling
	}
	for i := 0; i < len(kv); i += 2 {
		k, v := kv[i], kv[i+1]
		if d.snap && k.kind == kStr && k.bits == sFrames && v.kind == kList {
			v = d.internStack(v)
		}
		o.items = append(o.items, k, v)
	}
	d.grew(old, cap(o.items), valueSize)
	return nil
}

// appendItems adds items to a list. In snapshot mode, trace entries
// appended to an empty list make it an event list.
func (d *decoder) appendItems(list Value, items []Value) error {
	if list.kind != kList {
		return fmt.Errorf("appending to a %s", list.kind)
	}
	o := list.obj
	if o.conv.kind != kEmpty {
		return fmt.Errorf("appending to a list already read as a %s", o.conv.kind)
	}
	if d.snap && len(items) > 0 && o.events == nil && len(o.items) == 0 && isEntry(items[0]) {
		o.events = &eventList{}
	}
	if o.events == nil {
		old := cap(o.items)
		if old == 0 {
			o.items = d.pool.get(len(items))
		}
		o.items = append(o.items, items...)
		d.grew(old, cap(o.items), valueSize)
		return nil
	}
	for _, it := range items {
		if !isEntry(it) {
			return fmt.Errorf("a list of trace entries holds a %s (entry %d)", it.kind, o.events.n)
		}
		d.addEvent(o.events, it.obj)
	}
	return nil
}

// isEntry says whether v is a trace entry: a dict with a string "action".
func isEntry(v Value) bool {
	if v.kind != kDict {
		return false
	}
	items := v.obj.items
	for i := 0; i < len(items); i += 2 {
		if items[i].kind == kStr && items[i].bits == sAction {
			return items[i+1].kind == kStr
		}
	}
	return false
}

// addEvent turns a trace entry dict into an event and drops the dict.
func (d *decoder) addEvent(el *eventList, o *object) {
	e := gpu.Event{Seq: int64(el.n), TimeUS: -1}
	var ex extraKey
	var other Dict
	var toks []otherTok
	var hasAddr, hasSize, hasFree bool
	bad := ""
	u64 := func(key string, v Value) uint64 {
		u, exact, ok := v.uint64()
		if (!ok || !exact) && bad == "" {
			bad = fmt.Sprintf("%q is not an integer from 0 to 2^64-1", key)
		}
		return u
	}
	// keep holds a value gpu.Event has no room for, under its key.
	keep := func(k, v Value) {
		x, tok, err := d.otherValue(v)
		if err != nil && bad == "" {
			bad = fmt.Sprintf("%q: %v", d.strs[k.bits], err)
		}
		name := d.strs[k.bits]
		for i := range other {
			if other[i].Key == name { // set twice: Python keeps the last value
				other[i].Value = x
				toks = append(toks, otherTok{uint32(k.bits), tok})
				return
			}
		}
		other = append(other, KV{name, x})
		toks = append(toks, otherTok{uint32(k.bits), tok})
	}
	order := d.orderBuf[:0] // the keys as written, once each
	var known uint64        // keys with string ids below 64 already in order
	items := o.items
	for i := 0; i < len(items); i += 2 {
		k, v := items[i], items[i+1]
		if k.kind != kStr {
			bad = "a key is not a string"
			continue
		}
		seen := k.bits < 64 && known&(1<<k.bits) != 0
		for j := 0; j < len(order) && k.bits >= 64 && !seen; j += 4 {
			seen = binary.LittleEndian.Uint32(order[j:]) == uint32(k.bits)
		}
		if !seen {
			order = binary.LittleEndian.AppendUint32(order, uint32(k.bits))
			if k.bits < 64 {
				known |= 1 << k.bits
			}
		}
		switch {
		case k.bits == sAction:
			if a, ok := d.actionOf[uint32(v.bits)]; ok {
				e.Action = a
			} else {
				ex.action = uint32(v.bits) + 1
			}
		case k.bits == sAddr:
			e.Addr, hasAddr = u64("addr", v), true
		case k.bits == sSize:
			e.Size, hasSize = u64("size", v), true
		case k.bits == sDeviceFree:
			e.DeviceFree, hasFree = u64("device_free", v), true
		case k.bits == sStream:
			switch v.kind {
			case kInt:
				e.Stream = int64(v.bits)
			case kUint: // a cudaStream_t beyond int64: kept as written
				e.Stream = int64(v.bits)
				keep(k, v)
			default:
				if bad == "" {
					bad = `"stream" is not a 64-bit integer`
				}
			}
		case k.bits == sTimeUS:
			if t, ok := v.int64(); ok {
				e.TimeUS = t
				el.timed++
				if v.kind == kBool {
					keep(k, v)
				}
			} else if bad == "" {
				bad = `"time_us" is not a 64-bit integer`
			}
		case k.bits == sFrames:
			if v.kind == kStack {
				e.Stack = gpu.StackID(v.bits)
			} else if bad == "" {
				bad = `"frames" is not a list of frames {name, filename, line}`
			}
		case k.bits == sCompileContext && v.kind == kStr:
			ex.cc = uint32(v.bits) + 1
		case k.bits == sUserMetadata && v.kind == kStr:
			ex.um = uint32(v.bits) + 1
		default:
			keep(k, v)
		}
	}
	d.orderBuf = order
	switch {
	case !hasSize:
		bad = `missing key "size"`
	case e.Action == gpu.ActionOOM && !hasFree:
		bad = `missing key "device_free"`
	case e.Action != gpu.ActionOOM && !hasAddr:
		bad = `missing key "addr"`
	}
	if bad != "" && el.bad == "" {
		el.bad, el.badAt = bad, el.n
	}
	if other != nil {
		ex.other = otherKey(toks)
	}
	if !usualOrder(order, e.Action == gpu.ActionOOM) {
		if d.lastOrder == 0 || d.keyOrders[d.lastOrder-1] != string(order) { // entries mostly repeat the one before
			id, ok := d.orderIdx[string(order)]
			if !ok {
				d.keyOrders = append(d.keyOrders, string(order))
				id = uint32(len(d.keyOrders))
				d.orderIdx[string(order)] = id
			}
			d.lastOrder = id
		}
		ex.keys = d.lastOrder
	}
	if ex != (extraKey{}) {
		idx, ok := d.extraIdx[ex]
		if !ok {
			x := EventExtra{Form: Form{Other: other}}
			if ex.cc > 0 {
				x.CompileContext = d.strs[ex.cc-1]
			}
			if ex.um > 0 {
				x.UserMetadata = d.strs[ex.um-1]
			}
			if ex.action > 0 {
				x.Action = d.strs[ex.action-1]
			}
			if ex.keys > 0 {
				ord := d.keyOrders[ex.keys-1]
				for j := 0; j < len(ord); j += 4 {
					x.Keys = append(x.Keys, d.strs[binary.LittleEndian.Uint32([]byte(ord[j:]))])
				}
			}
			d.extras = append(d.extras, x)
			idx = uint32(len(d.extras))
			d.extraIdx[ex] = idx
			d.charge(int(unsafe.Sizeof(x)) + 2*mapEntry + len(ex.other))
		}
		if el.extra == nil {
			el.extra = make([]uint32, el.n, el.n+64)
			d.charge(4 * cap(el.extra))
		}
		old := cap(el.extra)
		el.extra = append(roomForOne(el.extra), idx)
		d.grew(old, cap(el.extra), 4)
	} else if el.extra != nil {
		old := cap(el.extra)
		el.extra = append(roomForOne(el.extra), 0)
		d.grew(old, cap(el.extra), 4)
	}
	d.charge(el.add(e) * eventSize)
	d.replaceMemo(o, Value{kind: kConsumed})
}

// roomForOne returns s with room for one more element, doubling its
// capacity when it is full: append grows a big slice by a quarter at a
// time, and copying millions of events over and over costs more than
// decoding them.
func roomForOne[T any](s []T) []T {
	if len(s) < cap(s) {
		return s
	}
	return slices.Grow(s, max(len(s), 64))
}

// usualOrder says whether an entry's keys (string ids, 4 bytes each) are
// action, addr (device_free for oom), size, stream, time_us, frames.
func usualOrder(order []byte, oom bool) bool {
	addr := uint32(sAddr)
	if oom {
		addr = sDeviceFree
	}
	want := [...]uint32{sAction, addr, sSize, sStream, sTimeUS, sFrames}
	if len(order) != 4*len(want) {
		return false
	}
	for i, k := range want {
		if binary.LittleEndian.Uint32(order[4*i:]) != k {
			return false
		}
	}
	return true
}

// otherTok is a key this package does not know and its value's token.
type otherTok struct {
	key uint32
	tok string
}

// otherKey is the canonical text of an entry's unknown keys: sorted, the
// last of equal keys winning, as in the Other map.
func otherKey(toks []otherTok) string {
	sort.SliceStable(toks, func(i, j int) bool { return toks[i].key < toks[j].key })
	var b []byte
	for i, t := range toks {
		if i+1 < len(toks) && toks[i+1].key == t.key {
			continue
		}
		b = binary.AppendUvarint(b, uint64(t.key))
		b = binary.AppendUvarint(b, uint64(len(t.tok)))
		b = append(b, t.tok...)
	}
	return string(b)
}

// otherConv is an unknown key's value, converted once.
type otherConv struct {
	x   any
	tok string
	err error
}

// otherCached is the cost, in values, above which a converted unknown
// value is kept for the other entries that refer to it.
const otherCached = 16

// otherValue converts the value of a trace-entry key this package does
// not know, and returns a token for it: entries whose tokens are equal
// have equal values, and share one EventExtra. All such values of a
// decode draw on the memory budget, which grows with the input read, and a large
// value is converted once however many entries refer to it through the
// memo, so the work stays in proportion to the input. A container is
// taken as it is when an entry first refers to it.
func (d *decoder) otherValue(v Value) (any, string, error) {
	if c, ok := d.otherCache[v]; ok {
		return c.x, c.tok, c.err
	}
	before := d.mem
	x, err := d.toAny(v, 1)
	var tok []byte
	if err == nil {
		tok, err = d.canon(nil, v)
	}
	if err != nil {
		x, tok = nil, nil
	}
	if d.mem-before <= otherCached*anySize && err == nil {
		return x, string(tok), nil
	}
	c := otherConv{x: x, err: err}
	if err == nil {
		id, ok := d.otherIDs[string(tok)]
		if ok {
			c.x = d.otherXs[id] // equal values share one conversion
		} else {
			if d.otherIDs == nil {
				d.otherIDs = map[string]uint32{}
			}
			id = uint32(len(d.otherXs))
			d.otherIDs[string(tok)] = id
			d.otherXs = append(d.otherXs, x)
		}
		c.tok = string(binary.AppendUvarint([]byte{'#'}, uint64(id)))
	}
	// Only what the memo can hand out again is worth keeping.
	if v.obj == nil || v.obj.memo != -1 {
		if d.otherCache == nil {
			d.otherCache = map[Value]otherConv{}
		}
		d.otherCache[v] = c
	}
	return c.x, c.tok, c.err
}

// canon appends a canonical encoding of v, in step with toAny: equal
// encodings convert to equal values. Strings, stacks and frames are
// their interned indices, so the encoding is a few bytes per value
// however long the strings are.
func (d *decoder) canon(b []byte, v Value) ([]byte, error) {
	if d.charge(8); d.over != nil {
		return nil, errTooLarge
	}
	switch v.kind {
	case kNone, kEmpty:
		return append(b, 'N'), nil
	case kBool, kInt, kUint, kFloat, kStr, kBytes, kStack, kFrame:
		return binary.AppendUvarint(append(b, 'a'+byte(v.kind)), v.bits), nil
	case kBig:
		words := v.obj.big.Bits()
		if d.charge(8 * len(words)); d.over != nil {
			return nil, errTooLarge
		}
		b = append(b, 'B', byte('0'+v.obj.big.Sign()+1))
		b = binary.AppendUvarint(b, uint64(len(words)))
		for _, w := range words {
			b = binary.LittleEndian.AppendUint64(b, uint64(w))
		}
		return b, nil
	case kList, kTuple:
		if v.obj.events != nil {
			return fmt.Appendf(append(b, 'E'), "%p;", v.obj), nil
		}
		b = binary.AppendUvarint(append(b, 'a'+byte(v.kind)), uint64(len(v.obj.items)))
		var err error
		for _, it := range v.obj.items {
			if b, err = d.canon(b, it); err != nil {
				return nil, err
			}
		}
		return b, nil
	case kDict:
		// In step with toAny: the keys in the order first set, each
		// with its last value.
		items := v.obj.items
		pairs, err := dictPairs(items)
		if err != nil {
			return nil, err
		}
		b = binary.AppendUvarint(append(b, 'D'), uint64(len(pairs)))
		for _, p := range pairs {
			if b, err = d.canon(b, items[p[0]]); err != nil {
				return nil, err
			}
			if b, err = d.canon(b, items[p[1]]); err != nil {
				return nil, err
			}
		}
		return b, nil
	}
	return nil, fmt.Errorf("unexpected value kind %d", v.kind)
}

// internStack turns a list of frame dicts into an interned stack. A list
// that is not one stays as it is, for the converter to report.
func (d *decoder) internStack(v Value) Value {
	o := v.obj
	if o.conv.kind != kEmpty {
		return o.conv // interned already, through another reference
	}
	if o.events != nil {
		return v
	}
	key := d.scratch[:0]
	for i, it := range o.items {
		it = resolve(it)
		if it.kind == kDict {
			f, ok := d.internFrame(it.obj)
			if !ok {
				return v
			}
			it = f
			o.items[i] = f
		}
		if it.kind != kFrame {
			return v
		}
		key = binary.LittleEndian.AppendUint32(key, uint32(it.bits))
	}
	d.scratch = key
	id, ok := d.stackIdx[string(key)]
	if !ok {
		st := make(gpu.Stack, len(o.items))
		for i := range st {
			st[i] = d.frames[binary.LittleEndian.Uint32(key[4*i:])]
		}
		d.charge(len(st)*frameSize + len(key) + 2*mapEntry)
		d.stacks = append(d.stacks, st)
		id = gpu.StackID(len(d.stacks))
		d.stackIdx[string(key)] = id
	}
	s := Value{kind: kStack, bits: uint64(id)}
	d.replaceMemo(o, s)
	return s
}

// internFrame turns a {name, filename, line} dict into a frame index.
// Other keys (the FX fields of newer versions) and a key order other than
// name, filename, line are kept in the frame's form, Frame.Extra.
func (d *decoder) internFrame(o *object) (Value, bool) {
	var k frameKey
	var has int
	var keys []string
	var other Dict
	var toks []otherTok
	usual := len(o.items) == 6
	for i := 0; i < len(o.items); i += 2 {
		key, v := o.items[i], o.items[i+1]
		if key.kind != kStr {
			return Value{}, false
		}
		usual = usual && key.bits == [...]uint64{sName, sFilename, sLine}[min(i/2, 2)]
		if !slices.Contains(keys, d.strs[key.bits]) {
			keys = append(keys, d.strs[key.bits])
		}
		switch key.bits {
		case sName, sFilename:
			if v.kind != kStr {
				return Value{}, false
			}
			if key.bits == sName {
				k.name = uint32(v.bits)
			} else {
				k.file = uint32(v.bits)
			}
			has |= 1 << key.bits
		case sLine:
			switch v.kind {
			case kInt:
				if int64(v.bits) < 0 {
					d.wideLines++ // negative: clamped to 0
				} else {
					k.line = v.bits
				}
			case kUint:
				k.line = v.bits
			case kBig:
				d.wideLines++ // beyond 64 bits: clamped
				if v.obj.big.Sign() > 0 {
					k.line = math.MaxUint64
				}
			default:
				return Value{}, false
			}
			has |= 1 << sLine
		default:
			x, tok, err := d.otherValue(v)
			if err != nil {
				return Value{}, false
			}
			other = append(other, KV{d.strs[key.bits], x})
			toks = append(toks, otherTok{uint32(key.bits), tok})
		}
	}
	if has != 1<<sName|1<<sFilename|1<<sLine {
		return Value{}, false
	}
	if !usual {
		k.extra = strings.Join(keys, "\x00") + "\x00" + otherKey(toks)
	}
	idx, ok := d.frameIdx[k]
	if !ok {
		f := gpu.Frame{Name: d.strs[k.name], Filename: d.strs[k.file], Line: k.line}
		if !usual {
			extra, err := (&Form{Keys: keys, Other: other}).JSON()
			if err != nil {
				return Value{}, false
			}
			if d.charge(len(extra)); d.over != nil {
				return Value{}, false
			}
			f.Extra = extra
		}
		idx = uint32(len(d.frames))
		d.charge(frameSize + mapEntry)
		d.frames = append(d.frames, f)
		d.frameIdx[k] = idx
	}
	f := Value{kind: kFrame, bits: uint64(idx)}
	d.replaceMemo(o, f)
	return f, true
}

// internForm returns a Form for keys and other; forms without values are
// shared by every dict with the same keys.
func (d *decoder) internForm(keys []string, other Dict) *Form {
	if other != nil {
		return &Form{Keys: keys, Other: other}
	}
	sig := strings.Join(keys, "\x00")
	f, ok := d.forms[sig]
	if !ok {
		f = &Form{Keys: keys}
		d.forms[sig] = f
	}
	return f
}

// eventsAny turns an event list back into trace entry dicts.
func (d *decoder) eventsAny(el *eventList) (any, error) {
	events := el.all()
	out := make([]any, len(events))
	stack := func(id gpu.StackID) gpu.Stack {
		if id == 0 {
			return nil
		}
		return d.stacks[id-1]
	}
	for i := range events {
		if d.charge(8 * mapEntry); d.over != nil {
			return nil, errTooLarge
		}
		var x *EventExtra
		if el.extra != nil && el.extra[i] > 0 {
			x = &d.extras[el.extra[i]-1]
		}
		e := &events[i]
		keys := entryKeysOf(e, x)
		m := make(Dict, len(keys))
		for j, k := range keys {
			v := entryValue(k, e, x)
			if k == "frames" && v == nil {
				v = stackAny(stack(e.Stack))
			}
			m[j] = KV{k, v}
		}
		out[i] = m
	}
	return out, nil
}

// dictGet returns the value of a string key in a dict; the last one wins,
// as in Python.
func dictGet(v Value, key uint32) (Value, bool) {
	items := v.obj.items
	for i := len(items) - 2; i >= 0; i -= 2 {
		if items[i].kind == kStr && uint32(items[i].bits) == key {
			return items[i+1], true
		}
	}
	return Value{}, false
}

// describeKeys lists a dict's keys, for error messages.
func (d *decoder) describeKeys(v Value) string {
	var ks []string
	for i := 0; i < len(v.obj.items); i += 2 {
		if k := v.obj.items[i]; k.kind == kStr {
			ks = append(ks, d.strs[k.bits])
		}
	}
	sort.Strings(ks)
	return strings.Join(ks, ", ")
}
