package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"

	"vramscope/gpu"
)

// Events are stored in chunks of up to chunkSize consecutive events, one row
// per chunk. A row per event would cap ingest at about 285k events/s and cost
// far more than 40 bytes each; a chunk is a few varints per event, and a
// reader of one instant decodes at most a chunk or two.
const chunkSize = 4096

// Event encoding, per event:
//
//	tag     byte: action (low 4 bits), pool (2 bits), tagExt, tagStream
//	[ext]   byte of ext* bits, when tagExt
//	[seq]   varint seq-prev-1, when extSeq
//	dt      uvarint time - previous time (times never decrease)
//	[stream] varint, when tagStream (stream differs from the previous event's)
//	daddr   varint addr - previous addr
//	size    uvarint
//	[bs]    uvarint BlockSize-Size, for alloc and free_* events
//	[bs]    uvarint BlockSize, when extBlockSize (other actions)
//	[free]  uvarint DeviceFree, when extDeviceFree
//	stack   uvarint
const (
	tagPoolShift  = 4
	tagExt        = 1 << 6
	tagStream     = 1 << 7
	extSeq        = 1 << 0
	extDeviceFree = 1 << 1
	extBlockSize  = 1 << 2
	// extEnds: a free_completed that also ends the allocation, because no
	// free_requested came before it.
	extEnds = 1 << 3
)

func hasBlock(a gpu.Action) bool {
	return a == gpu.ActionAlloc || a == gpu.ActionFreeRequested || a == gpu.ActionFreeCompleted
}

// encodable says whether e fits the encoding: an action of at most 4 bits
// and a pool of at most 2 that the readers know, and a seq that is not
// negative (readers take a negative seq for "no event").
func encodable(e *gpu.Event) error {
	switch {
	case e.Seq < 0:
		return fmt.Errorf("event %d: negative seq", e.Seq)
	case e.Action > gpu.ActionOOM:
		return fmt.Errorf("event %d: unknown action %d", e.Seq, e.Action)
	case e.Pool > gpu.PoolLarge:
		return fmt.Errorf("event %d (%s): unknown pool %d", e.Seq, e.Action, e.Pool)
	}
	return nil
}

// encState is what the next event is encoded relative to.
type encState struct {
	seq    int64
	us     int64
	addr   uint64
	stream int64
}

// appendEvent encodes e after st. ends marks a free_completed that ends an
// allocation (see extEnds).
func appendEvent(buf []byte, st *encState, e *gpu.Event, ends bool) []byte {
	tag := byte(e.Action) | byte(e.Pool)<<tagPoolShift
	var ext byte
	if e.Seq != st.seq+1 {
		ext |= extSeq
	}
	if e.DeviceFree != 0 {
		ext |= extDeviceFree
	}
	if !hasBlock(e.Action) && e.BlockSize != 0 {
		ext |= extBlockSize
	}
	if ends {
		ext |= extEnds
	}
	if ext != 0 {
		tag |= tagExt
	}
	if e.Stream != st.stream {
		tag |= tagStream
	}
	buf = append(buf, tag)
	if ext != 0 {
		buf = append(buf, ext)
	}
	if ext&extSeq != 0 {
		buf = binary.AppendVarint(buf, e.Seq-st.seq-1)
	}
	buf = binary.AppendUvarint(buf, uint64(e.TimeUS-st.us))
	if tag&tagStream != 0 {
		buf = binary.AppendVarint(buf, e.Stream)
	}
	buf = binary.AppendVarint(buf, int64(e.Addr-st.addr))
	buf = binary.AppendUvarint(buf, e.Size)
	if hasBlock(e.Action) {
		buf = binary.AppendUvarint(buf, e.BlockSize-e.Size)
	} else if ext&extBlockSize != 0 {
		buf = binary.AppendUvarint(buf, e.BlockSize)
	}
	if ext&extDeviceFree != 0 {
		buf = binary.AppendUvarint(buf, e.DeviceFree)
	}
	buf = binary.AppendUvarint(buf, uint64(e.Stack))
	*st = encState{seq: e.Seq, us: e.TimeUS, addr: e.Addr, stream: e.Stream}
	return buf
}

var errCorrupt = errors.New("corrupt event chunk")

// decoder reads a chunk's events one at a time. It moves an index over
// buf rather than reslicing it: a slice field rewritten per varint costs a
// GC write barrier each time, which doubled the cost of a scan.
type decoder struct {
	buf []byte
	pos int
	st  encState
	err error
}

// more reports whether bytes are left.
func (d *decoder) more() bool { return d.pos < len(d.buf) }

// left is the number of bytes not read yet.
func (d *decoder) left() int { return len(d.buf) - d.pos }

// byte1 reads one byte; false (and d.err set) at the end.
func (d *decoder) byte1() (byte, bool) {
	if d.pos >= len(d.buf) {
		d.err = errCorrupt
		return 0, false
	}
	b := d.buf[d.pos]
	d.pos++
	return b, true
}

func newDecoder(data []byte, firstSeq, firstUS int64) *decoder {
	return &decoder{buf: data, st: encState{seq: firstSeq - 1, us: firstUS}}
}

func (d *decoder) uvarint() uint64 {
	v, pos := uvarintAt(d.buf, d.pos)
	if pos > len(d.buf) {
		d.err = errCorrupt
		d.pos = len(d.buf)
		return 0
	}
	d.pos = pos
	return v
}

// uvarintAt reads the uvarint at buf[pos:], returning it and the position
// after it, or a position past len(buf) where there is none (and at any
// position past it).
func uvarintAt(buf []byte, pos int) (uint64, int) {
	if pos < len(buf) && buf[pos] < 0x80 {
		return uint64(buf[pos]), pos + 1
	}
	return uvarintLong(buf, pos)
}

// uvarintLong is uvarintAt past its one-byte case (which callers that
// run hot write inline: a call costs more than the byte).
func uvarintLong(buf []byte, pos int) (uint64, int) {
	if pos >= 0 && pos+3 < len(buf) { // up to four bytes, unrolled
		v := uint64(buf[pos]&0x7f) | uint64(buf[pos+1]&0x7f)<<7
		if buf[pos+1] < 0x80 {
			return v, pos + 2
		}
		v |= uint64(buf[pos+2]&0x7f) << 14
		if buf[pos+2] < 0x80 {
			return v, pos + 3
		}
		v |= uint64(buf[pos+3]&0x7f) << 21
		if buf[pos+3] < 0x80 {
			return v, pos + 4
		}
	}
	if pos >= len(buf) {
		return 0, len(buf) + 1
	}
	v, n := binary.Uvarint(buf[pos:])
	if n <= 0 {
		return 0, len(buf) + 1
	}
	return v, pos + n
}

// unzigzag undoes binary.AppendVarint's zig-zag encoding.
func unzigzag(u uint64) int64 { return int64(u>>1) ^ -int64(u&1) }

// varint undoes binary.AppendVarint's zig-zag encoding.
func (d *decoder) varint() int64 { return unzigzag(d.uvarint()) }

// next decodes the next event into e; false at the end or on corruption
// (then d.err is set). ends reports extEnds. It reads with the buffer and
// position in locals: through d, every varint cost two loads and a store.
func (d *decoder) next(e *gpu.Event) (ends, ok bool) {
	buf, pos := d.buf, d.pos
	if pos >= len(buf) || d.err != nil {
		return false, false
	}
	tag := buf[pos]
	pos++
	var ext byte
	if tag&tagExt != 0 {
		if pos >= len(buf) {
			d.err = errCorrupt
			return false, false
		}
		ext = buf[pos]
		pos++
	}
	var v uint64
	e.Action, e.Pool = gpu.Action(tag&15), gpu.Pool(tag>>tagPoolShift&3)
	e.Seq = d.st.seq + 1
	if ext&extSeq != 0 {
		v, pos = uvarintAt(buf, pos)
		e.Seq += unzigzag(v)
	}
	if pos < len(buf) && buf[pos] < 0x80 {
		v, pos = uint64(buf[pos]), pos+1
	} else {
		v, pos = uvarintLong(buf, pos)
	}
	e.TimeUS = d.st.us + int64(v)
	e.Stream = d.st.stream
	if tag&tagStream != 0 {
		v, pos = uvarintAt(buf, pos)
		e.Stream = unzigzag(v)
	}
	if pos < len(buf) && buf[pos] < 0x80 {
		v, pos = uint64(buf[pos]), pos+1
	} else {
		v, pos = uvarintLong(buf, pos)
	}
	e.Addr = d.st.addr + uint64(unzigzag(v))
	if pos < len(buf) && buf[pos] < 0x80 {
		e.Size, pos = uint64(buf[pos]), pos+1
	} else {
		e.Size, pos = uvarintLong(buf, pos)
	}
	e.BlockSize, e.DeviceFree = 0, 0
	if hasBlock(e.Action) {
		if pos < len(buf) && buf[pos] < 0x80 {
			v, pos = uint64(buf[pos]), pos+1
		} else {
			v, pos = uvarintLong(buf, pos)
		}
		e.BlockSize = e.Size + v
	} else if ext&extBlockSize != 0 {
		e.BlockSize, pos = uvarintAt(buf, pos)
	}
	if ext&extDeviceFree != 0 {
		e.DeviceFree, pos = uvarintAt(buf, pos)
	}
	if pos < len(buf) && buf[pos] < 0x80 {
		v, pos = uint64(buf[pos]), pos+1
	} else {
		v, pos = uvarintLong(buf, pos)
	}
	e.Stack = gpu.StackID(v)
	if pos > len(buf) {
		d.err, d.pos = errCorrupt, len(buf)
		return false, false
	}
	d.pos = pos
	d.st = encState{seq: e.Seq, us: e.TimeUS, addr: e.Addr, stream: e.Stream}
	return ext&extEnds != 0, true
}

// endsAllocation reports whether e ends an allocation's interval.
func endsAllocation(e *gpu.Event, ends bool) bool {
	return e.Action == gpu.ActionFreeRequested || e.Action == gpu.ActionFreeCompleted && ends
}

// Layout encoding (checkpoints): segments in address order, each followed by
// its blocks; block addresses are implied because blocks tile their segment.
func appendLayout(buf []byte, l *gpu.Layout) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(l.Segments)))
	var prevEnd uint64
	for i := range l.Segments {
		s := &l.Segments[i]
		buf = binary.AppendUvarint(buf, s.Addr-prevEnd)
		buf = binary.AppendUvarint(buf, s.Size)
		buf = binary.AppendVarint(buf, s.Stream)
		flags := byte(s.Pool)
		if s.Expandable {
			flags |= 4
		}
		buf = append(buf, flags)
		buf = binary.AppendUvarint(buf, uint64(len(s.Blocks)))
		for j := range s.Blocks {
			b := &s.Blocks[j]
			buf = binary.AppendUvarint(buf, b.Size)
			buf = append(buf, byte(b.State))
			buf = binary.AppendVarint(buf, int64(b.Size-b.Requested))
			buf = binary.AppendUvarint(buf, uint64(b.Stack))
			buf = binary.AppendVarint(buf, b.Seq)
		}
		prevEnd = s.End()
	}
	return buf
}

func decodeLayout(data []byte, rules gpu.Rules) (*gpu.Layout, error) {
	d := &decoder{buf: data}
	l := gpu.NewLayout(rules)
	n := d.uvarint()
	if n > uint64(len(data)) {
		return nil, errors.New("corrupt layout checkpoint")
	}
	l.Segments = make([]gpu.Segment, 0, n)
	var prevEnd uint64
	for range n {
		var s gpu.Segment
		s.Addr = prevEnd + d.uvarint()
		s.Size = d.uvarint()
		s.Stream = d.varint()
		flags, ok := d.byte1()
		if !ok {
			return nil, errors.New("corrupt layout checkpoint")
		}
		s.Pool = gpu.Pool(flags & 3)
		s.Expandable = flags&4 != 0
		nb := d.uvarint()
		if nb > uint64(d.left()) {
			return nil, errors.New("corrupt layout checkpoint")
		}
		s.Blocks = make([]gpu.Block, nb)
		at := s.Addr
		for j := range s.Blocks {
			b := &s.Blocks[j]
			b.Addr = at
			b.Size = d.uvarint()
			st, ok := d.byte1()
			if !ok {
				return nil, errors.New("corrupt layout checkpoint")
			}
			b.State = gpu.BlockState(st)
			b.Requested = b.Size - uint64(d.varint())
			b.Stack = gpu.StackID(d.uvarint())
			b.Seq = d.varint()
			at += b.Size
		}
		if d.err != nil {
			return nil, fmt.Errorf("corrupt layout checkpoint: %w", d.err)
		}
		l.Segments = append(l.Segments, s)
		prevEnd = s.End()
	}
	return l, d.err
}

// Allocation records, as stored in alloc_bins and alloc_open blobs; each is
// encoded relative to the one before it in the same blob.
type allocRec struct {
	addr      uint64
	size      uint64
	requested uint64
	stream    int64
	allocUS   int64
	freeUS    int64
	allocSeq  int64
	freeSeq   int64
	stack     gpu.StackID
}

func appendAllocRec(buf []byte, prev *allocRec, r *allocRec) []byte {
	buf = binary.AppendVarint(buf, r.freeUS-prev.freeUS)
	buf = binary.AppendUvarint(buf, uint64(r.freeUS-r.allocUS))
	buf = binary.AppendVarint(buf, int64(r.addr-prev.addr))
	buf = binary.AppendUvarint(buf, r.size)
	buf = binary.AppendVarint(buf, int64(r.size-r.requested))
	buf = binary.AppendVarint(buf, r.stream)
	buf = binary.AppendVarint(buf, r.allocSeq-prev.allocSeq)
	buf = binary.AppendVarint(buf, r.freeSeq-r.allocSeq)
	buf = binary.AppendUvarint(buf, uint64(r.stack))
	*prev = *r
	return buf
}

func (d *decoder) allocRec(prev *allocRec) (allocRec, bool) {
	if !d.more() || d.err != nil {
		return allocRec{}, false
	}
	var r allocRec
	r.freeUS = prev.freeUS + d.varint()
	r.allocUS = r.freeUS - int64(d.uvarint())
	r.addr = prev.addr + uint64(d.varint())
	r.size = d.uvarint()
	r.requested = r.size - uint64(d.varint())
	r.stream = d.varint()
	r.allocSeq = prev.allocSeq + d.varint()
	r.freeSeq = r.allocSeq + d.varint()
	r.stack = gpu.StackID(d.uvarint())
	if d.err != nil {
		return allocRec{}, false
	}
	*prev = r
	return r, true
}

// sizeClass orders sizes in classes four to an octave, so the largest
// allocations of a window are found by visiting the top classes only.
func sizeClass(size uint64) int {
	if size < 4 {
		return int(size)
	}
	e := bits.Len64(size) - 1
	return e*4 + int(size>>(e-2)&3)
}

// durClass is the bit length of an allocation's lifetime: an allocation of
// class d alive at t was made after t - 2^d.
func durClass(d int64) int {
	if d < 0 {
		d = 0
	}
	return bits.Len64(uint64(d))
}
