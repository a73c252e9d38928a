package pytorch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"sort"

	"vramscope/gpu"
)

// Export writes traces as one snapshot pickle (protocol 4, as
// torch.cuda.memory._dump_snapshot writes it), which pytorch.org/memory_viz
// opens: segments with every key the viewer reads, device_traces indexed
// by device, allocator_settings and external_annotations. The settings and
// unknown top-level keys are taken from the first trace.
func Export(w io.Writer, traces ...*Trace) error {
	if len(traces) == 0 {
		return errors.New("export: no traces")
	}
	seen := map[int]bool{}
	maxDev := -1
	for _, t := range traces {
		if seen[t.Device] {
			return fmt.Errorf("export: two traces for device %d", t.Device)
		}
		seen[t.Device] = true
		maxDev = max(maxDev, t.Device)
	}
	p := &pickler{w: w, strs: map[string]uint32{}, stacks: map[stackKey]uint32{}}
	p.raw(opProto, 4)

	p.dictStart()
	p.str("segments")
	p.listStart()
	for _, t := range traces {
		for i := range t.Final.Segments {
			p.segment(t, i)
			p.item()
		}
	}
	p.listEnd()
	p.item()

	p.str("device_traces")
	p.listStart()
	for dev := 0; dev <= maxDev; dev++ {
		var t *Trace
		for _, x := range traces {
			if x.Device == dev {
				t = x
			}
		}
		p.listStart()
		if t != nil {
			for i, e := range t.Events {
				p.event(t, e, t.Extra(i))
				p.item()
			}
		}
		p.listEnd()
		p.item()
	}
	p.listEnd()
	p.item()

	first := traces[0]
	if first.Settings.Raw != nil {
		p.str("allocator_settings")
		p.any(first.Settings.Raw)
		p.item()
	}
	p.str("external_annotations")
	p.listStart()
	for _, t := range traces {
		for _, a := range t.Annotations {
			m := map[string]any{"stage": a.Stage, "name": a.Name, "device": int64(a.Device), "time_us": a.TimeUS}
			for k, v := range a.Other {
				m[k] = v
			}
			p.any(m)
			p.item()
		}
	}
	p.listEnd()
	p.item()
	for _, k := range sortedKeys(first.Other) {
		p.str(k)
		p.any(first.Other[k])
		p.item()
	}
	p.dictEnd()
	p.op(opStop)
	p.commit(true)
	return p.err
}

func (p *pickler) segment(t *Trace, i int) {
	s := &t.Final.Segments[i]
	var info SegmentInfo
	if i < len(t.Segments) {
		info = t.Segments[i]
	}
	var alloc, active, req uint64
	for _, b := range s.Blocks {
		if b.State == gpu.BlockAllocated {
			alloc += b.Size
			req += b.Requested
		}
		if b.State != gpu.BlockFree {
			active += b.Size
		}
	}
	p.dictStart()
	p.kv("device", int64(t.Device))
	p.kv("address", s.Addr)
	p.kv("total_size", s.Size)
	p.kv("allocated_size", alloc)
	p.kv("active_size", active)
	p.kv("requested_size", req)
	p.kv("stream", s.Stream)
	p.kv("segment_type", s.Pool.String())
	p.str("segment_pool_id")
	p.int(info.PoolID[0])
	p.int(info.PoolID[1])
	p.op(opTuple2)
	p.item()
	p.kv("is_expandable", s.Expandable)
	p.str("frames")
	p.stack(t, info.Stack)
	p.item()
	p.str("blocks")
	p.listStart()
	for _, b := range s.Blocks {
		p.dictStart()
		p.kv("address", b.Addr)
		p.kv("size", b.Size)
		p.kv("requested_size", b.Requested)
		p.kv("state", b.State.String())
		p.str("frames")
		p.stack(t, b.Stack)
		p.item()
		p.dictEnd()
		p.item()
	}
	p.listEnd()
	p.item()
	p.dictEnd()
}

func (p *pickler) event(t *Trace, e gpu.Event, x *EventExtra) {
	p.dictStart()
	action := e.Action.String()
	if x != nil && x.Action != "" {
		action = x.Action
	}
	p.kv("action", action)
	if e.Action == gpu.ActionOOM {
		p.kv("device_free", e.DeviceFree)
	} else {
		p.kv("addr", e.Addr)
	}
	p.kv("size", e.Size)
	p.kv("stream", e.Stream)
	if t.HasTime {
		p.kv("time_us", e.TimeUS)
	}
	if x != nil {
		if x.CompileContext != "" {
			p.kv("compile_context", x.CompileContext)
		}
		if x.UserMetadata != "" {
			p.kv("user_metadata", x.UserMetadata)
		}
		for _, k := range sortedKeys(x.Other) {
			p.kv(k, x.Other[k])
		}
	}
	p.str("frames")
	p.stack(t, e.Stack)
	p.item()
	p.dictEnd()
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
	batches []batch // open containers
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

func (p *pickler) kv(k string, v any) {
	p.str(k)
	p.any(v)
	p.item()
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
		if len(x) < 256 {
			p.op(opShortBinBytes, byte(len(x)))
		} else {
			p.op(opBinBytes)
			p.buf = binary.LittleEndian.AppendUint32(p.buf, uint32(len(x)))
		}
		p.buf = append(p.buf, x...)
	case []any:
		p.listStart()
		for _, it := range x {
			p.any(it)
			p.item()
		}
		p.listEnd()
	case Tuple:
		p.op(opMark)
		for _, it := range x {
			p.any(it)
		}
		p.op(opTuple)
	case map[string]any:
		p.dictStart()
		for _, k := range sortedKeys(x) {
			p.kv(k, x[k])
		}
		p.dictEnd()
	case map[any]any:
		keys := make([]any, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j]) })
		p.dictStart()
		for _, k := range keys {
			p.any(k)
			p.any(x[k])
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
