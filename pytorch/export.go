package pytorch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"reflect"
	"sort"

	"vramscope/gpu"
)

// Export writes traces as one snapshot pickle (protocol 4, as
// torch.cuda.memory._dump_snapshot writes it), which pytorch.org/memory_viz
// opens. The top level is the traces' Snapshot (the first trace that has
// one) and their settings are the first trace's: a decoded file is written
// back as it was, key order, absent keys and values vramscope does not
// interpret included. Without a Snapshot the top level is PyTorch's own.
func Export(w io.Writer, traces ...*Trace) error {
	if len(traces) == 0 {
		return errors.New("export: no traces")
	}
	seen := map[int]bool{}
	maxDev := -1
	snap := &Snapshot{}
	for i := len(traces) - 1; i >= 0; i-- {
		t := traces[i]
		if seen[t.Device] {
			return fmt.Errorf("export: two traces for device %d", t.Device)
		}
		seen[t.Device] = true
		maxDev = max(maxDev, t.Device)
		if t.Snapshot != nil {
			snap = t.Snapshot
		}
	}
	settings := traces[0].Settings.Raw
	p := &pickler{w: w, strs: map[string]uint32{}, stacks: map[stackKey]uint32{}, shared: map[sharedKey]shared{}}
	p.raw(opProto, 4)

	if snap.List {
		p.segments(traces)
		return p.finish()
	}
	keys := snap.Keys
	if keys == nil {
		keys = topKeys
		if settings == nil {
			keys = []string{"segments", "device_traces", "external_annotations"}
		}
	}
	p.dictStart()
	for _, k := range keys {
		p.str(k)
		switch k {
		case "segments":
			p.segments(traces)
		case "device_traces":
			p.listStart()
			for dev := 0; dev < max(snap.DeviceTraces, maxDev+1); dev++ {
				p.listStart()
				for _, t := range traces {
					if t.Device == dev {
						for i := range t.Events {
							p.event(t, &t.Events[i], t.Extra(i))
							p.item()
						}
					}
				}
				p.listEnd()
				p.item()
			}
			p.listEnd()
		case "allocator_settings":
			p.any(settings)
		case "external_annotations":
			p.listStart()
			for i := range snap.Annotations {
				p.annotation(&snap.Annotations[i])
				p.item()
			}
			p.listEnd()
		default:
			v, _ := snap.Other.Get(k)
			p.any(v)
		}
		p.item()
	}
	p.dictEnd()
	return p.finish()
}

func (p *pickler) finish() error {
	p.op(opStop)
	p.commit(true)
	return p.err
}

// segments writes every trace's segments as one list, in file order.
func (p *pickler) segments(traces []*Trace) {
	type ref struct {
		t        *Trace
		i, index int
	}
	var all []ref
	for _, t := range traces {
		for i := range t.Final.Segments {
			all = append(all, ref{t, i, t.info(i).Index})
		}
	}
	sort.SliceStable(all, func(a, b int) bool { return all[a].index < all[b].index })
	p.listStart()
	for _, r := range all {
		p.segment(r.t, r.i)
		p.item()
	}
	p.listEnd()
}

// info returns what the snapshot said about segment i beyond gpu.Segment.
func (t *Trace) info(i int) *SegmentInfo {
	if i < len(t.Segments) {
		return &t.Segments[i]
	}
	return &SegmentInfo{}
}

func (p *pickler) segment(t *Trace, i int) {
	s := &t.Final.Segments[i]
	info := t.info(i)
	p.dictStart()
	for _, k := range info.Form.keysOr(defaultSegmentKeys(info.Stack)) {
		p.str(k)
		if v, ok := info.Form.other(k); ok {
			p.any(v)
			p.item()
			continue
		}
		switch k {
		case "frames":
			p.stack(t, info.Stack)
		case "blocks":
			p.listStart()
			for j := range s.Blocks {
				p.block(t, &s.Blocks[j], info.blockForm(j))
				p.item()
			}
			p.listEnd()
		default:
			v, _ := segmentValue(k, t.Device, s, info)
			p.any(v)
		}
		p.item()
	}
	p.dictEnd()
}

func (p *pickler) block(t *Trace, b *gpu.Block, f *Form) {
	p.dictStart()
	for _, k := range f.keysOr(blockKeys) {
		p.str(k)
		if v, ok := f.other(k); ok {
			p.any(v)
		} else if k == "frames" {
			p.stack(t, b.Stack)
		} else {
			v, _ := blockValue(k, b)
			p.any(v)
		}
		p.item()
	}
	p.dictEnd()
}

func (p *pickler) event(t *Trace, e *gpu.Event, x *EventExtra) {
	p.dictStart()
	for _, k := range entryKeysOf(e, x) {
		p.str(k)
		if v := entryValue(k, e, x); v != nil || k != "frames" {
			p.any(v)
		} else {
			p.stack(t, e.Stack)
		}
		p.item()
	}
	p.dictEnd()
}

func (p *pickler) annotation(a *Annotation) {
	p.dictStart()
	for _, k := range a.Form.keysOr(annotationKeys) {
		p.str(k)
		if v, ok := a.Form.other(k); ok {
			p.any(v)
		} else {
			switch k {
			case "stage":
				p.str(a.Stage)
			case "name":
				p.str(a.Name)
			case "device":
				p.int(int64(a.Device))
			case "time_us":
				p.int(a.TimeUS)
			default:
				p.any(nil)
			}
		}
		p.item()
	}
	p.dictEnd()
}

// segmentValue is what a segment's key holds, derived from the segment;
// ok is false for keys it does not know. frames and blocks are known but
// written from elsewhere: their value is nil.
func segmentValue(key string, device int, s *gpu.Segment, info *SegmentInfo) (v any, ok bool) {
	switch key {
	case "device":
		return int64(device), true
	case "address":
		return s.Addr, true
	case "total_size":
		return s.Size, true
	case "allocated_size", "active_size", "requested_size":
		var n uint64
		for _, b := range s.Blocks {
			switch {
			case key == "active_size" && b.State != gpu.BlockFree:
				n += b.Size
			case b.State != gpu.BlockAllocated:
			case key == "allocated_size":
				n += b.Size
			case key == "requested_size":
				n += b.Requested
			}
		}
		return n, true
	case "stream":
		return s.Stream, true
	case "segment_type":
		return s.Pool.String(), true
	case "segment_pool_id":
		return Tuple{info.PoolID[0], info.PoolID[1]}, true
	case "is_expandable":
		return s.Expandable, true
	case "frames", "blocks":
		return nil, true
	}
	return nil, false
}

// blockValue is what a block's key holds, as segmentValue.
func blockValue(key string, b *gpu.Block) (any, bool) {
	switch key {
	case "address":
		return b.Addr, true
	case "size":
		return b.Size, true
	case "requested_size":
		return b.Requested, true
	case "state":
		return b.State.String(), true
	case "frames":
		return nil, true
	}
	return nil, false
}

// entryKeysOf returns the keys of an event's trace entry, in order.
func entryKeysOf(e *gpu.Event, x *EventExtra) []string {
	switch {
	case x != nil && x.Keys != nil:
		return x.Keys
	case e.Action == gpu.ActionOOM:
		return oomEntryKeys
	}
	return entryKeys
}

// entryValue is what an event's trace entry holds under key; nil for
// frames, which is the event's stack.
func entryValue(key string, e *gpu.Event, x *EventExtra) any {
	if x != nil {
		if v, ok := x.other(key); ok {
			return v
		}
	}
	switch key {
	case "action":
		if x != nil && x.Action != "" {
			return x.Action
		}
		return e.Action.String()
	case "addr":
		return e.Addr
	case "device_free":
		return e.DeviceFree
	case "size":
		return e.Size
	case "stream":
		return e.Stream
	case "time_us":
		return e.TimeUS
	case "compile_context":
		if x != nil {
			return x.CompileContext
		}
	case "user_metadata":
		if x != nil {
			return x.UserMetadata
		}
	}
	return nil
}

// pickler writes protocol 4: strings and frames are memoized and referred
// to again with BINGET, stacks within one segment or trace likewise, as
// PyTorch's own files do. Output goes out in FRAMEs of about 64 KiB.
type pickler struct {
	w       io.Writer
	buf     []byte
	err     error
	memo    uint32
	strs    map[string]uint32
	frames  map[gpu.Frame]uint32
	stacks  map[stackKey]uint32
	shared  map[sharedKey]shared // containers written, by identity
	batches []batch              // open containers
}

// sharedKey names a container by identity: values that many entries
// share (one decoded value behind many trace entries) are written once
// and referred to again with BINGET.
type sharedKey struct {
	data uintptr
	n    int
	kind reflect.Kind
	tag  byte
}

type shared struct {
	memo uint32
	keep any // holds the value, so its address is not reused while writing
}

// again writes a BINGET when v, a non-empty container, was written before;
// otherwise it returns the key to remember it under.
func (p *pickler) again(v any, tag byte) (sharedKey, bool) {
	rv := reflect.ValueOf(v)
	if rv.Len() == 0 {
		return sharedKey{}, false
	}
	k := sharedKey{rv.Pointer(), rv.Len(), rv.Kind(), tag}
	if s, ok := p.shared[k]; ok {
		p.get(s.memo)
		return k, true
	}
	return k, false
}

func (p *pickler) remember(k sharedKey, memo uint32, v any) {
	if k.n > 0 {
		p.shared[k] = shared{memo, v}
	}
}

// batch is an open MARK: items since it, and the opcode that closes it.
type batch struct {
	n  int
	op byte
}

type stackKey struct {
	t  *Trace
	id gpu.StackID
}

const frameTarget = 64 << 10

func (p *pickler) op(b ...byte) { p.buf = append(p.buf, b...) }

func (p *pickler) raw(op byte, arg byte) { p.buf = append(p.buf, op, arg) }

// commit writes the buffer as a FRAME once it is big enough.
func (p *pickler) commit(final bool) {
	if p.err != nil || len(p.buf) == 0 || (!final && len(p.buf) < frameTarget) {
		return
	}
	start := 0
	if p.buf[0] == opProto { // PROTO goes before the first frame
		start = 2
		if _, p.err = p.w.Write(p.buf[:2]); p.err != nil {
			return
		}
	}
	var hdr [9]byte
	hdr[0] = opFrame
	binary.LittleEndian.PutUint64(hdr[1:], uint64(len(p.buf)-start))
	if _, p.err = p.w.Write(hdr[:]); p.err == nil {
		_, p.err = p.w.Write(p.buf[start:])
	}
	p.buf = p.buf[:0]
}

func (p *pickler) memoize() uint32 {
	p.op(opMemoize)
	p.memo++
	return p.memo - 1
}

func (p *pickler) get(idx uint32) {
	if idx < 256 {
		p.op(opBinGet, byte(idx))
		return
	}
	p.op(opLongBinGet)
	p.buf = binary.LittleEndian.AppendUint32(p.buf, idx)
}

func (p *pickler) str(s string) {
	if idx, ok := p.strs[s]; ok {
		p.get(idx)
		return
	}
	if len(s) < 256 {
		p.op(opShortBinUni, byte(len(s)))
	} else {
		p.op(opBinUnicode)
		p.buf = binary.LittleEndian.AppendUint32(p.buf, uint32(len(s)))
	}
	p.buf = append(p.buf, s...)
	p.strs[s] = p.memoize()
}

func (p *pickler) int(n int64) {
	switch {
	case n >= 0 && n < 256:
		p.op(opBinInt1, byte(n))
	case n >= 0 && n < 65536:
		p.op(opBinInt2, byte(n), byte(n>>8))
	case n >= math.MinInt32 && n <= math.MaxInt32:
		p.op(opBinInt)
		p.buf = binary.LittleEndian.AppendUint32(p.buf, uint32(n))
	default:
		p.long(big.NewInt(n))
	}
}

func (p *pickler) uint(u uint64) {
	if u <= math.MaxInt64 {
		p.int(int64(u))
		return
	}
	p.long(new(big.Int).SetUint64(u))
}

func (p *pickler) long(x *big.Int) {
	b := bigToLE(x)
	// bigToLE may leave a redundant sign byte; drop it as Python does.
	for len(b) > 1 && (b[len(b)-1] == 0 && b[len(b)-2]&0x80 == 0 || b[len(b)-1] == 0xff && b[len(b)-2]&0x80 != 0) {
		b = b[:len(b)-1]
	}
	if len(b) < 256 {
		p.op(opLong1, byte(len(b)))
	} else {
		p.op(opLong4)
		p.buf = binary.LittleEndian.AppendUint32(p.buf, uint32(len(b)))
	}
	p.buf = append(p.buf, b...)
}

func (p *pickler) dictStart() uint32 { return p.open(opEmptyDict, opSetItems) }
func (p *pickler) listStart() uint32 { return p.open(opEmptyList, opAppends) }

// open starts a container and a batch; it returns the container's memo index.
func (p *pickler) open(empty, closing byte) uint32 {
	p.op(empty)
	idx := p.memoize()
	p.op(opMark)
	p.batches = append(p.batches, batch{op: closing})
	return idx
}

// item counts one finished list item or dict pair; pickle's own writer
// closes a batch every 1000.
func (p *pickler) item() {
	b := &p.batches[len(p.batches)-1]
	if b.n++; b.n == 1000 {
		p.op(b.op, opMark)
		b.n = 0
	}
	p.commit(false)
}

func (p *pickler) listEnd() { p.end() }
func (p *pickler) dictEnd() { p.end() }

func (p *pickler) end() {
	b := p.batches[len(p.batches)-1]
	p.batches = p.batches[:len(p.batches)-1]
	if b.n == 0 && len(p.buf) > 0 {
		p.buf = p.buf[:len(p.buf)-1] // nothing since the MARK (the last byte): drop it
		return
	}
	p.op(b.op) // an empty batch whose MARK already went out in a frame is still valid
}

func (p *pickler) any(v any) {
	switch x := v.(type) {
	case nil:
		p.op(opNone)
	case bool:
		if x {
			p.op(opNewTrue)
		} else {
			p.op(opNewFalse)
		}
	case int:
		p.int(int64(x))
	case int64:
		p.int(x)
	case uint64:
		p.uint(x)
	case *big.Int:
		p.long(x)
	case float64:
		p.op(opBinFloat)
		p.buf = binary.BigEndian.AppendUint64(p.buf, math.Float64bits(x))
	case string:
		p.str(x)
	case []byte:
		k, done := p.again(x, 'b')
		if done {
			return
		}
		if len(x) < 256 {
			p.op(opShortBinBytes, byte(len(x)))
		} else {
			p.op(opBinBytes)
			p.buf = binary.LittleEndian.AppendUint32(p.buf, uint32(len(x)))
		}
		p.buf = append(p.buf, x...)
		p.remember(k, p.memoize(), x)
	case []any:
		k, done := p.again(x, 'l')
		if done {
			return
		}
		p.remember(k, p.listStart(), x)
		for _, it := range x {
			p.any(it)
			p.item()
		}
		p.listEnd()
	case Tuple:
		k, done := p.again(x, 't')
		if done {
			return
		}
		if len(x) == 0 {
			p.op(opEmptyTuple)
			return
		}
		if len(x) > 3 {
			p.op(opMark)
		}
		for _, it := range x {
			p.any(it)
		}
		if len(x) > 3 {
			p.op(opTuple)
		} else {
			p.op(opTuple1 + byte(len(x)-1))
		}
		p.remember(k, p.memoize(), x)
	case Dict:
		k, done := p.again(x, 'd')
		if done {
			return
		}
		p.remember(k, p.dictStart(), x)
		for _, kv := range x {
			p.any(kv.Key)
			p.any(kv.Value)
			p.item()
		}
		p.dictEnd()
	default:
		if p.err == nil {
			p.err = fmt.Errorf("export: cannot write a %T", v)
		}
		p.op(opNone)
	}
}

// stack writes a frames list, memoized so a repeated stack costs a BINGET.
func (p *pickler) stack(t *Trace, id gpu.StackID) {
	key := stackKey{t, id}
	if idx, ok := p.stacks[key]; ok && id != 0 {
		p.get(idx)
		return
	}
	idx := p.listStart()
	for _, f := range t.Stack(id) {
		p.frame(f)
		p.item()
	}
	p.listEnd()
	if id != 0 {
		p.stacks[key] = idx
	}
}

func (p *pickler) frame(f gpu.Frame) {
	if p.frames == nil {
		p.frames = map[gpu.Frame]uint32{}
	}
	if idx, ok := p.frames[f]; ok {
		p.get(idx)
		return
	}
	if f.Extra != "" {
		p.frames[f] = p.dictStart()
		for _, kv := range frameAny(f) {
			p.any(kv.Key)
			p.any(kv.Value)
			p.item()
		}
		p.dictEnd()
		return
	}
	p.op(opEmptyDict)
	idx := p.memoize()
	p.op(opMark)
	p.str("name")
	p.str(f.Name)
	p.str("filename")
	p.str(f.Filename)
	p.str("line")
	p.uint(f.Line)
	p.op(opSetItems)
	p.frames[f] = idx
}
