package pytorch

// A restricted, streaming unpickler for PyTorch memory snapshots.
//
// The Go pickle libraries (og-rek, gopickle) build the whole object graph
// as interface values, about 18x the file size in memory, so a 1 GB
// snapshot would need some 20 GB. This decoder reads the stream once,
// keeps values in 24-byte tagged structs, interns every string, turns each
// frames list into an interned stack the moment it is set in its dict, and
// turns trace entries into gpu.Events as they are appended to their list,
// dropping the dicts. It understands the data opcodes of protocols 0 to 5
// only; every opcode that imports or calls Python code is refused, so
// nothing from the file is ever executed.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"vramscope/gpu"
)

// Limits on what a file may declare. Lengths are checked before anything
// is allocated, and buffers grow only as data actually arrives.
const (
	maxDepth     = 1000    // open MARKs, and nesting of values converted to Go
	maxStack     = 1 << 24 // values on the pickle stack
	maxLongBytes = 1 << 16 // one LONG1/LONG4 integer
	maxMemoGap   = 1 << 16 // BINPUT beyond the memo's end by more than this goes to a map
	memoSlack    = 1 << 10 // memo slots allowed beyond the input bytes read so far
)

// Opcodes (CPython Lib/pickle.py).
const (
	opMark           = '('
	opStop           = '.'
	opPop            = '0'
	opPopMark        = '1'
	opDup            = '2'
	opFloat          = 'F'
	opInt            = 'I'
	opBinInt         = 'J'
	opBinInt1        = 'K'
	opLong           = 'L'
	opBinInt2        = 'M'
	opNone           = 'N'
	opString         = 'S'
	opBinString      = 'T'
	opShortBinString = 'U'
	opUnicode        = 'V'
	opBinUnicode     = 'X'
	opAppend         = 'a'
	opDict           = 'd'
	opEmptyDict      = '}'
	opAppends        = 'e'
	opGet            = 'g'
	opBinGet         = 'h'
	opLongBinGet     = 'j'
	opList           = 'l'
	opEmptyList      = ']'
	opPut            = 'p'
	opBinPut         = 'q'
	opLongBinPut     = 'r'
	opSetItem        = 's'
	opTuple          = 't'
	opEmptyTuple     = ')'
	opSetItems       = 'u'
	opBinFloat       = 'G'
	opProto          = 0x80
	opTuple1         = 0x85
	opTuple2         = 0x86
	opTuple3         = 0x87
	opNewTrue        = 0x88
	opNewFalse       = 0x89
	opLong1          = 0x8a
	opLong4          = 0x8b
	opBinBytes       = 'B'
	opShortBinBytes  = 'C'
	opShortBinUni    = 0x8c
	opBinUnicode8    = 0x8d
	opBinBytes8      = 0x8e
	opMemoize        = 0x94
	opFrame          = 0x95
	opByteArray8     = 0x96
)

// refused names the opcodes that import, call or reach outside the data.
var refused = map[byte]string{
	'c': "GLOBAL", 0x93: "STACK_GLOBAL", 'R': "REDUCE", 'b': "BUILD", 'i': "INST", 'o': "OBJ",
	0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", 'P': "PERSID", 'Q': "BINPERSID",
	0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4", 0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER",
}

// Error is a decoding failure at a byte offset of the (decompressed) input.
type Error struct {
	Offset int64
	Msg    string
	Err    error // ErrRefused for opcodes that would run code
}

func (e *Error) Error() string { return fmt.Sprintf("pickle: byte offset %d: %s", e.Offset, e.Msg) }
func (e *Error) Unwrap() error { return e.Err }

// ErrRefused is wrapped by errors for opcodes that would import or call code.
var ErrRefused = errors.New("refused: the opcode imports or calls Python code, and snapshots are plain data")

// Sizes of what the memory budget counts.
const (
	valueSize  = int(unsafe.Sizeof(Value{}))
	objectSize = int(unsafe.Sizeof(object{}))
	eventSize  = int(unsafe.Sizeof(gpu.Event{}))
	frameSize  = int(unsafe.Sizeof(gpu.Frame{}))
	mapEntry   = 48 // a map entry's share of its table, about
)

// decoder holds the pickle machine and the tables built while decoding.
type decoder struct {
	in       input
	jsonRead int64 // bytes the JSON decoder has read, when the input is JSON
	ctx      context.Context
	mem      int64       // bytes of decoded data held (charge, credit)
	peak     int64       // the most mem has been
	over     *LimitError // set once mem passed the budget
	stack    []Value
	marks    []int
	memo     []Value
	far      map[uint64]Value // memo slots set far beyond the slice

	strs   []string
	strIdx map[string]uint32
	pool   itemsPool

	// snapshot mode: intern frames lists, turn trace entries into events.
	snap      bool
	frames    []gpu.Frame
	frameIdx  map[frameKey]uint32
	stacks    []gpu.Stack
	stackIdx  map[string]gpu.StackID
	scratch   []byte
	extras    []EventExtra
	extraIdx  map[extraKey]uint32
	orderBuf  []byte
	keyOrders []string          // distinct key orders of trace entries, as string ids
	orderIdx  map[string]uint32 // index+1 in keyOrders
	lastOrder uint32            // the key order of the entry before
	forms     map[string]*Form  // forms without values, by their keys
	actionOf  map[uint32]gpu.Action
	wideLines int // frame lines beyond 64 bits, clamped

	// values of trace-entry keys this package does not know
	otherCache map[Value]otherConv // large ones, converted once
	otherIDs   map[string]uint32   // canonical encodings of the large ones
	otherXs    []any               // the large ones converted, by id
}

type frameKey struct {
	name, file uint32
	line       uint64
	extra      string // canonical text of the keys beyond name, filename, line
}

func newDecoder(r io.Reader, snap bool) *decoder {
	d := &decoder{
		in:     input{r: r, buf: make([]byte, 0, 64<<10)},
		strIdx: map[string]uint32{},
		snap:   snap,
	}
	for _, s := range knownStrings {
		d.intern([]byte(s))
	}
	if snap {
		d.frameIdx = map[frameKey]uint32{}
		d.stackIdx = map[string]gpu.StackID{"": 0}
		d.extraIdx = map[extraKey]uint32{}
		d.orderIdx = map[string]uint32{}
		d.forms = map[string]*Form{}
		d.actionOf = map[uint32]gpu.Action{}
		for a := gpu.ActionAlloc; a <= gpu.ActionOOM; a++ {
			d.actionOf[d.intern([]byte(a.String()))] = a
		}
	}
	return d
}

func (d *decoder) fail(at int64, format string, args ...any) error {
	return &Error{Offset: at, Msg: fmt.Sprintf(format, args...)}
}

// intern returns the index of s in the string table, adding it once.
func (d *decoder) intern(b []byte) uint32 {
	if i, ok := d.strIdx[string(b)]; ok {
		return i
	}
	s := string(b)
	i := uint32(len(d.strs))
	old := cap(d.strs)
	d.strs = append(d.strs, s)
	d.grew(old, cap(d.strs), 16)
	d.strIdx[s] = i
	d.charge(len(s) + mapEntry)
	return i
}

func (d *decoder) push(v Value) error {
	if len(d.stack) >= maxStack {
		return fmt.Errorf("more than %d values on the stack", maxStack)
	}
	old := cap(d.stack)
	d.stack = append(d.stack, v)
	d.grew(old, cap(d.stack), valueSize)
	return nil
}

// popMark returns the values above the last MARK and removes them and it.
func (d *decoder) popMark() ([]Value, bool) {
	if len(d.marks) == 0 {
		return nil, false
	}
	m := d.marks[len(d.marks)-1]
	d.marks = d.marks[:len(d.marks)-1]
	items := d.stack[m:]
	d.stack = d.stack[:m]
	return items, true
}

func (d *decoder) newObj(k kind, items []Value) Value {
	d.charge(objectSize + cap(items)*valueSize)
	return Value{kind: k, obj: &object{items: items, memo: -1}}
}

// resolve follows an object to what it became once interned or consumed.
func resolve(v Value) Value {
	if v.obj != nil && v.obj.conv.kind != kEmpty {
		return v.obj.conv
	}
	return v
}

// memoPut sets a memo slot. The memo is a slice while the slots are dense:
// a slot within maxMemoGap of its end, and no further than the bytes read
// so far (every PUT takes at least two), so gaps cost memory only in
// proportion to the input. Sparser slots go to a map.
func (d *decoder) memoPut(idx uint64, v Value) {
	if v.obj != nil {
		v.obj.memo = int(idx)
	}
	n := uint64(len(d.memo))
	switch {
	case idx < n:
		d.memo[idx] = v
	case idx < n+maxMemoGap && idx < uint64(d.read())+memoSlack:
		old := cap(d.memo)
		if uint64(old) <= idx { // double, as roomForOne does
			d.memo = slices.Grow(d.memo, max(int(idx+1-n), len(d.memo)))
		}
		d.grew(old, cap(d.memo), valueSize)
		d.memo = d.memo[:idx+1]
		clear(d.memo[n:idx])
		d.memo[idx] = v
	default:
		if d.far == nil {
			d.far = map[uint64]Value{}
		}
		d.far[idx] = v
		d.charge(valueSize + mapEntry)
		if v.obj != nil {
			v.obj.memo = memoFar
		}
	}
}

func (d *decoder) memoGet(idx uint64) (Value, bool) {
	var v Value
	if idx < uint64(len(d.memo)) {
		v = d.memo[idx]
	}
	if v.kind == kEmpty && d.far != nil {
		v = d.far[idx] // set while the slice did not reach it yet
	}
	if v.kind == kEmpty {
		return v, false
	}
	return resolve(v), true
}

// replaceMemo points the memo slot of o at what o became, so the memo
// stops holding the original container alive.
func (d *decoder) replaceMemo(o *object, with Value) {
	o.conv = with
	d.credit(cap(o.items) * valueSize)
	d.pool.put(o.items)
	o.items = nil
	if o.memo >= 0 && o.memo < len(d.memo) && d.memo[o.memo].obj == o {
		d.memo[o.memo] = with
	}
}

// itemsPool keeps the items of the dicts and lists the decoder consumed
// (trace entries, frames lists, frame dicts: millions in a big file, each
// dropped as soon as it is read) for the next ones, by capacity class, so
// they cost neither an allocation nor garbage to collect. An array is
// only ever held by its one object, so once that object is consumed it is
// free.
type itemsPool [maxPooled + 1][][]Value

// maxPooled is the largest class kept (2^maxPooled values); poolBytes
// bounds what each class keeps, room for a pickle batch (1000) of trace
// entries waiting for their APPENDS.
const maxPooled, poolBytes = 12, 2 << 20

// get returns an empty slice with room for n values.
func (p *itemsPool) get(n int) []Value {
	c := bits.Len(uint(max(n, 1) - 1)) // the smallest c with 1<<c >= n
	if c > maxPooled {
		return make([]Value, 0, n)
	}
	if l := p[c]; len(l) > 0 {
		p[c] = l[:len(l)-1]
		return l[len(l)-1]
	}
	return make([]Value, 0, 1<<c)
}

// put takes back the array of s, cleared, for a later get.
func (p *itemsPool) put(s []Value) {
	c := bits.Len(uint(cap(s))) - 1 // the largest c with 1<<c <= cap
	if c < 0 || c > maxPooled || len(p[c])<<c*valueSize >= poolBytes {
		return
	}
	clear(s)
	p[c] = append(p[c], s[:0])
}

// unpickle runs the machine to STOP and returns the top value.
func (d *decoder) unpickle() (Value, error) {
	in := &d.in
	for {
		if d.fast() {
			continue
		}
		at := in.offset()
		var op byte
		if in.pos < len(in.buf) {
			op = in.buf[in.pos]
			in.pos++
		} else {
			b, err := in.read(1)
			if err != nil {
				return Value{}, d.truncated(at, "an opcode", err)
			}
			op = b[0]
		}
		err := d.step(op, at)
		if err == nil && d.over != nil {
			err = d.over
		}
		if err != nil {
			if err == errStop {
				if len(d.stack) != 1 || len(d.marks) != 0 {
					return Value{}, d.fail(at, "STOP with %d values and %d marks on the stack, want 1 and 0", len(d.stack), len(d.marks))
				}
				return d.stack[0], nil
			}
			var de *Error
			var le *LimitError
			if errors.As(err, &de) || errors.As(err, &le) {
				return Value{}, err
			}
			return Value{}, d.fail(at, "%s: %v", opName(op), err)
		}
	}
}

var errStop = errors.New("stop")

// fast runs the next opcode when it is one of the few that make up most
// of a snapshot (memo references in frames lists, MEMOIZE, MARK), its
// argument is in the buffer and nothing can go wrong: no error, no growth
// to charge. Otherwise it leaves the opcode to step.
func (d *decoder) fast() bool {
	in := &d.in
	b := in.buf[in.pos:]
	if len(b) < 5 {
		return false
	}
	var idx uint64
	n := 2
	switch b[0] {
	case opBinGet:
		idx = uint64(b[1])
	case opLongBinGet:
		idx, n = uint64(binary.LittleEndian.Uint32(b[1:])), 5
	case opMemoize:
		if len(d.stack) == 0 || len(d.memo) == cap(d.memo) {
			return false
		}
		v := d.stack[len(d.stack)-1]
		if v.obj != nil {
			v.obj.memo = len(d.memo)
		}
		d.memo = append(d.memo, v)
		in.pos++
		return true
	case opMark:
		if len(d.marks) >= maxDepth || len(d.marks) == cap(d.marks) {
			return false
		}
		d.marks = append(d.marks, len(d.stack))
		in.pos++
		return true
	default:
		return false
	}
	if idx >= uint64(len(d.memo)) || len(d.stack) == cap(d.stack) {
		return false
	}
	v := resolve(d.memo[idx])
	if v.kind == kEmpty || v.kind == kConsumed {
		return false
	}
	d.stack = append(d.stack, v)
	in.pos += n
	return true
}

// truncated reports a read that failed: the input ended, or the reader
// failed (a size limit, a client gone, a time budget), which is wrapped.
func (d *decoder) truncated(at int64, what string, err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return d.fail(at, "input ends inside %s (truncated file)", what)
	}
	var le *LimitError
	if errors.As(err, &le) {
		return le
	}
	return &Error{Offset: at, Msg: fmt.Sprintf("reading %s: %v", what, err), Err: err}
}

// arg reads n argument bytes of the opcode at offset at.
func (d *decoder) arg(n int, op byte, at int64) ([]byte, error) {
	b, err := d.in.read(n)
	if err != nil {
		return nil, d.truncated(at, "the argument of "+opName(op), err)
	}
	return b, nil
}

// length reads a declared length of n bytes and checks it against limit.
func (d *decoder) length(n int, op byte, at int64, limit uint64) (int, error) {
	b, err := d.arg(n, op, at)
	if err != nil {
		return 0, err
	}
	var l uint64
	switch n {
	case 1:
		l = uint64(b[0])
	case 4:
		l = uint64(binary.LittleEndian.Uint32(b))
	case 8:
		l = binary.LittleEndian.Uint64(b)
	}
	if l > limit {
		return 0, d.fail(at, "%s declares %d bytes, more than the limit of %d", opName(op), l, limit)
	}
	return int(l), nil
}

func (d *decoder) step(op byte, at int64) error {
	switch op {
	case opProto:
		b, err := d.arg(1, op, at)
		if err != nil {
			return err
		}
		if b[0] > 5 {
			return d.fail(at, "pickle protocol %d is not supported (0 to 5 are)", b[0])
		}
	case opFrame:
		if _, err := d.arg(8, op, at); err != nil {
			return err
		}
	case opStop:
		return errStop
	case opMark:
		if len(d.marks) >= maxDepth {
			return d.fail(at, "nesting deeper than %d", maxDepth)
		}
		d.marks = append(d.marks, len(d.stack))
	case opPop:
		if n := len(d.marks); n > 0 && d.marks[n-1] == len(d.stack) {
			d.marks = d.marks[:n-1] // POP of a MARK
			return nil
		}
		if len(d.stack) == 0 {
			return errors.New("empty stack")
		}
		d.stack = d.stack[:len(d.stack)-1]
	case opPopMark:
		if _, ok := d.popMark(); !ok {
			return errors.New("no MARK")
		}
	case opDup:
		if len(d.stack) == 0 {
			return errors.New("empty stack")
		}
		return d.push(d.stack[len(d.stack)-1])
	case opNone:
		return d.push(Value{kind: kNone})
	case opNewTrue:
		return d.push(Value{kind: kBool, bits: 1})
	case opNewFalse:
		return d.push(Value{kind: kBool})
	case opBinInt1:
		b, err := d.arg(1, op, at)
		if err != nil {
			return err
		}
		return d.push(Value{kind: kInt, bits: uint64(b[0])})
	case opBinInt2:
		b, err := d.arg(2, op, at)
		if err != nil {
			return err
		}
		return d.push(Value{kind: kInt, bits: uint64(binary.LittleEndian.Uint16(b))})
	case opBinInt:
		b, err := d.arg(4, op, at)
		if err != nil {
			return err
		}
		return d.push(Value{kind: kInt, bits: uint64(int64(int32(binary.LittleEndian.Uint32(b))))})
	case opLong1, opLong4:
		w := 1
		if op == opLong4 {
			w = 4
		}
		n, err := d.length(w, op, at, maxLongBytes)
		if err != nil {
			return err
		}
		b, err := d.arg(n, op, at)
		if err != nil {
			return err
		}
		return d.push(d.long(b))
	case opBinFloat:
		b, err := d.arg(8, op, at)
		if err != nil {
			return err
		}
		return d.push(Value{kind: kFloat, bits: binary.BigEndian.Uint64(b)})
	case opShortBinUni, opShortBinString, opShortBinBytes:
		return d.str(op, at, 1)
	case opBinUnicode, opBinString, opBinBytes:
		return d.str(op, at, 4)
	case opBinUnicode8, opBinBytes8, opByteArray8:
		return d.str(op, at, 8)
	case opInt, opLong, opFloat, opString, opUnicode, opGet, opPut:
		return d.text(op, at)
	case opEmptyDict:
		return d.push(d.newObj(kDict, nil))
	case opEmptyList:
		return d.push(d.newObj(kList, nil))
	case opEmptyTuple:
		return d.push(d.newObj(kTuple, nil))
	case opTuple1, opTuple2, opTuple3:
		n := int(op-opTuple1) + 1
		if len(d.stack)-n < d.topMark() {
			return fmt.Errorf("needs %d values on the stack", n)
		}
		items := append([]Value(nil), d.stack[len(d.stack)-n:]...)
		d.stack = d.stack[:len(d.stack)-n]
		return d.push(d.newObj(kTuple, items))
	case opTuple, opList:
		items, ok := d.popMark()
		if !ok {
			return errors.New("no MARK")
		}
		k := kTuple
		if op == opList {
			k = kList
		}
		v := d.newObj(k, nil)
		if k == kList {
			if err := d.appendItems(v, items); err != nil {
				return err
			}
			return d.push(v)
		}
		v.obj.items = append([]Value(nil), items...)
		d.charge(cap(v.obj.items) * valueSize)
		return d.push(v)
	case opDict:
		items, ok := d.popMark()
		if !ok {
			return errors.New("no MARK")
		}
		if len(items)%2 != 0 {
			return errors.New("odd number of values: a key without a value")
		}
		v := d.newObj(kDict, nil)
		if err := d.setItems(v, items); err != nil {
			return err
		}
		return d.push(v)
	case opAppend:
		if len(d.stack)-2 < d.topMark() {
			return errors.New("needs a list and a value")
		}
		item := d.stack[len(d.stack)-1]
		d.stack = d.stack[:len(d.stack)-1]
		return d.appendItems(d.stack[len(d.stack)-1], []Value{item})
	case opAppends:
		items, ok := d.popMark()
		if !ok || len(d.stack) == 0 {
			return errors.New("needs a list below the MARK")
		}
		return d.appendItems(d.stack[len(d.stack)-1], items)
	case opSetItem:
		if len(d.stack)-3 < d.topMark() {
			return errors.New("needs a dict, a key and a value")
		}
		kv := d.stack[len(d.stack)-2:]
		dict := d.stack[len(d.stack)-3]
		err := d.setItems(dict, kv)
		d.stack = d.stack[:len(d.stack)-2]
		return err
	case opSetItems:
		items, ok := d.popMark()
		if !ok || len(d.stack) == 0 {
			return errors.New("needs a dict below the MARK")
		}
		if len(items)%2 != 0 {
			return errors.New("odd number of values: a key without a value")
		}
		return d.setItems(d.stack[len(d.stack)-1], items)
	case opMemoize:
		if len(d.stack) == 0 {
			return errors.New("empty stack")
		}
		d.memoPut(uint64(len(d.memo)), d.stack[len(d.stack)-1])
	case opBinPut, opLongBinPut:
		w := 1
		if op == opLongBinPut {
			w = 4
		}
		idx, err := d.length(w, op, at, math.MaxUint32)
		if err != nil {
			return err
		}
		if len(d.stack) == 0 {
			return errors.New("empty stack")
		}
		d.memoPut(uint64(idx), d.stack[len(d.stack)-1])
	case opBinGet, opLongBinGet:
		var idx uint64
		if op == opBinGet {
			b, err := d.arg(1, op, at)
			if err != nil {
				return err
			}
			idx = uint64(b[0])
		} else {
			b, err := d.arg(4, op, at)
			if err != nil {
				return err
			}
			idx = uint64(binary.LittleEndian.Uint32(b))
		}
		return d.get(idx)
	default:
		if name, ok := refused[op]; ok {
			return &Error{Offset: at, Msg: fmt.Sprintf("opcode %s (0x%02x) %v", name, op, ErrRefused), Err: ErrRefused}
		}
		return d.fail(at, "unknown or unsupported opcode 0x%02x", op)
	}
	return nil
}

func (d *decoder) get(idx uint64) error {
	v, ok := d.memoGet(idx)
	if !ok {
		return fmt.Errorf("memo slot %d was never set", idx)
	}
	if v.kind == kConsumed {
		return fmt.Errorf("memo slot %d refers to a trace entry that is already in a trace", idx)
	}
	return d.push(v)
}

func (d *decoder) topMark() int {
	if len(d.marks) == 0 {
		return 0
	}
	return d.marks[len(d.marks)-1]
}

// long decodes a little-endian two's-complement integer.
func (d *decoder) long(b []byte) Value {
	n := len(b)
	switch {
	case n == 0:
		return Value{kind: kInt}
	case n <= 8:
		var u uint64
		for i := n - 1; i >= 0; i-- {
			u = u<<8 | uint64(b[i])
		}
		shift := uint(64 - 8*n)
		return Value{kind: kInt, bits: uint64(int64(u<<shift) >> shift)}
	case n == 9 && b[8] == 0:
		u := binary.LittleEndian.Uint64(b)
		if u <= math.MaxInt64 {
			return Value{kind: kInt, bits: u}
		}
		return Value{kind: kUint, bits: u}
	}
	// Beyond 64 bits: keep the exact value for generic decoding; snapshot
	// fields clamp it.
	be := make([]byte, n)
	for i := range b {
		be[n-1-i] = b[i]
	}
	x := new(big.Int).SetBytes(be)
	if b[n-1]&0x80 != 0 {
		x.Sub(x, new(big.Int).Lsh(big.NewInt(1), uint(8*n)))
	}
	if x.IsInt64() {
		return Value{kind: kInt, bits: uint64(x.Int64())}
	}
	if x.IsUint64() {
		return Value{kind: kUint, bits: x.Uint64()}
	}
	d.charge(objectSize + n)
	return Value{kind: kBig, obj: &object{big: x, memo: -1}}
}

func (d *decoder) str(op byte, at int64, w int) error {
	n, err := d.length(w, op, at, math.MaxInt64)
	if err != nil {
		return err
	}
	if n > MaxString {
		return d.tooLong(op, at, n)
	}
	b, err := d.arg(n, op, at)
	if err != nil {
		return err
	}
	k := kStr
	if op == opShortBinBytes || op == opBinBytes || op == opBinBytes8 || op == opByteArray8 {
		k = kBytes
	}
	return d.push(Value{kind: k, bits: uint64(d.intern(b))})
}

// tooLong refuses a string longer than MaxString.
func (d *decoder) tooLong(op byte, at int64, n int) error {
	return d.fail(at, "%s declares a string of %d bytes or more, more than the limit of %d for one string (frame names, file names and other strings of a snapshot are far shorter)", opName(op), n, MaxString)
}

// text handles the protocol 0/1 opcodes whose argument is a line.
func (d *decoder) text(op byte, at int64) error {
	limit := maxNumberLine
	switch op {
	case opUnicode:
		limit = MaxString
	case opInt, opLong:
		limit = maxIntDigits + 2 // a sign, and LONG's trailing L
	}
	line, err := d.in.line(limit)
	if errors.Is(err, errLongLine) {
		if op == opUnicode {
			return d.tooLong(op, at, limit+1)
		}
		return d.fail(at, "%s: a line longer than %d bytes", opName(op), limit)
	}
	if err != nil {
		return d.truncated(at, "the argument of "+opName(op), err)
	}
	s := string(line)
	bad := func() error { return d.fail(at, "%s: malformed argument %q", opName(op), clip(s)) }
	switch op {
	case opInt, opLong:
		s = strings.TrimSuffix(s, "L")
		switch s {
		case "00":
			return d.push(Value{kind: kBool})
		case "01":
			return d.push(Value{kind: kBool, bits: 1})
		}
		x, ok := new(big.Int).SetString(s, 10)
		if !ok {
			return bad()
		}
		return d.push(d.long(bigToLE(x)))
	case opFloat:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return bad()
		}
		return d.push(Value{kind: kFloat, bits: math.Float64bits(f)})
	case opUnicode:
		return d.push(Value{kind: kStr, bits: uint64(d.intern([]byte(unescapeRaw(s))))})
	case opString:
		// Python 2's str: a quoted literal with backslash escapes, read
		// by Python 3 as ASCII text.
		if len(s) < 2 || s[0] != s[len(s)-1] || s[0] != '\'' && s[0] != '"' {
			return d.fail(at, "STRING: the argument must be quoted, found %q", clip(s))
		}
		b, ok := unescapeString(s[1 : len(s)-1])
		if !ok {
			return bad()
		}
		return d.push(Value{kind: kStr, bits: uint64(d.intern(b))})
	case opGet, opPut:
		idx, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return bad()
		}
		if op == opGet {
			return d.get(idx)
		}
		if len(d.stack) == 0 {
			return errors.New("empty stack")
		}
		d.memoPut(idx, d.stack[len(d.stack)-1])
	}
	return nil
}

// bigToLE encodes x as little-endian two's complement.
func bigToLE(x *big.Int) []byte {
	n := x.BitLen()/8 + 1
	y := new(big.Int).Set(x)
	if x.Sign() < 0 {
		y.Add(y, new(big.Int).Lsh(big.NewInt(1), uint(8*n)))
	}
	be := y.FillBytes(make([]byte, n))
	for i, j := 0, n-1; i < j; i, j = i+1, j-1 {
		be[i], be[j] = be[j], be[i]
	}
	return be
}

// unescapeRaw undoes raw-unicode-escape (\uXXXX, \UXXXXXXXX) of UNICODE.
func unescapeRaw(s string) string {
	if !strings.Contains(s, `\u`) && !strings.Contains(s, `\U`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) && (s[i+1] == 'u' || s[i+1] == 'U') {
			w := 4
			if s[i+1] == 'U' {
				w = 8
			}
			if i+2+w <= len(s) {
				if r, err := strconv.ParseUint(s[i+2:i+2+w], 16, 32); err == nil {
					b.WriteRune(rune(r))
					i += 1 + w
					continue
				}
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unescapeString undoes the escapes of a Python 2 string literal
// (codecs.escape_decode); the result must be ASCII.
func unescapeString(s string) ([]byte, bool) {
	var b []byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			b = append(b, c)
			continue
		}
		if i++; i == len(s) {
			return nil, false
		}
		switch c = s[i]; c {
		case '\n': // a line continuation
		case '\\', '\'', '"':
			b = append(b, c)
		case 'a', 'b', 'f', 'n', 'r', 't', 'v':
			b = append(b, "\a\b\f\n\r\t\v"[strings.IndexByte("abfnrtv", c)])
		case 'x':
			if i+2 >= len(s) {
				return nil, false
			}
			n, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
			if err != nil {
				return nil, false
			}
			b = append(b, byte(n))
			i += 2
		case '0', '1', '2', '3', '4', '5', '6', '7':
			n, j := 0, i
			for ; j < len(s) && j < i+3 && s[j] >= '0' && s[j] <= '7'; j++ {
				n = n*8 + int(s[j]-'0')
			}
			b = append(b, byte(n))
			i = j - 1
		default:
			b = append(b, '\\', c)
		}
	}
	for _, c := range b {
		if c >= 0x80 {
			return nil, false
		}
	}
	return b, true
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

var opNames = map[byte]string{
	opMark: "MARK", opStop: "STOP", opPop: "POP", opPopMark: "POP_MARK", opDup: "DUP",
	opFloat: "FLOAT", opInt: "INT", opBinInt: "BININT", opBinInt1: "BININT1", opLong: "LONG",
	opBinInt2: "BININT2", opNone: "NONE", opBinString: "BINSTRING", opShortBinString: "SHORT_BINSTRING",
	opUnicode: "UNICODE", opBinUnicode: "BINUNICODE", opAppend: "APPEND", opDict: "DICT",
	opEmptyDict: "EMPTY_DICT", opAppends: "APPENDS", opGet: "GET", opBinGet: "BINGET", opString: "STRING",
	opLongBinGet: "LONG_BINGET", opList: "LIST", opEmptyList: "EMPTY_LIST", opPut: "PUT",
	opBinPut: "BINPUT", opLongBinPut: "LONG_BINPUT", opSetItem: "SETITEM", opTuple: "TUPLE",
	opEmptyTuple: "EMPTY_TUPLE", opSetItems: "SETITEMS", opBinFloat: "BINFLOAT", opProto: "PROTO",
	opTuple1: "TUPLE1", opTuple2: "TUPLE2", opTuple3: "TUPLE3", opNewTrue: "NEWTRUE",
	opNewFalse: "NEWFALSE", opLong1: "LONG1", opLong4: "LONG4", opBinBytes: "BINBYTES",
	opShortBinBytes: "SHORT_BINBYTES", opShortBinUni: "SHORT_BINUNICODE", opBinUnicode8: "BINUNICODE8",
	opBinBytes8: "BINBYTES8", opMemoize: "MEMOIZE", opFrame: "FRAME", opByteArray8: "BYTEARRAY8",
}

func opName(op byte) string {
	if n, ok := opNames[op]; ok {
		return n
	}
	if n, ok := refused[op]; ok {
		return n
	}
	return fmt.Sprintf("opcode 0x%02x", op)
}

// input is a buffered reader that hands out slices of its buffer and
// knows the offset of every byte.
type input struct {
	r   io.Reader
	buf []byte // buf[pos:] is unread
	pos int
	off int64 // offset of buf[0]
	err error
}

func (in *input) offset() int64 { return in.off + int64(in.pos) }

// read returns the next n bytes; the slice is valid until the next read.
func (in *input) read(n int) ([]byte, error) {
	if len(in.buf)-in.pos < n {
		if err := in.fill(n); err != nil {
			return nil, err
		}
	}
	b := in.buf[in.pos : in.pos+n]
	in.pos += n
	return b, nil
}

// fill makes n bytes available. The buffer doubles only when it is full
// of real data, so a huge declared length costs memory only as far as the
// file really goes.
func (in *input) fill(n int) error {
	if in.pos > 0 {
		m := copy(in.buf[:cap(in.buf)], in.buf[in.pos:])
		in.off += int64(in.pos)
		in.buf, in.pos = in.buf[:m], 0
	}
	for len(in.buf) < n {
		if in.err != nil {
			if in.err == io.EOF {
				return io.ErrUnexpectedEOF
			}
			return in.err
		}
		if len(in.buf) == cap(in.buf) {
			grown := make([]byte, len(in.buf), 2*cap(in.buf)+4096)
			copy(grown, in.buf)
			in.buf = grown
		}
		m, err := in.r.Read(in.buf[len(in.buf):cap(in.buf)])
		in.buf = in.buf[:len(in.buf)+m]
		if err != nil {
			in.err = err
		}
	}
	return nil
}

var errLongLine = errors.New("line too long")

// line reads up to and without a newline of at most limit bytes. Each byte
// is looked at once: a long line costs time in proportion to its length.
func (in *input) line(limit int) ([]byte, error) {
	seen := 0 // bytes after pos known not to be a newline
	for {
		if i := bytes.IndexByte(in.buf[in.pos+seen:], '\n'); i >= 0 {
			n := seen + i
			if n > limit {
				return nil, errLongLine
			}
			b := in.buf[in.pos : in.pos+n]
			in.pos += n + 1
			return b, nil
		}
		seen = len(in.buf) - in.pos
		if seen > limit {
			return nil, errLongLine
		}
		if err := in.fill(seen + 1); err != nil {
			return nil, err
		}
	}
}
