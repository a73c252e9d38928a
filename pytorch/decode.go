package pytorch

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"os"
	"strconv"
)

// format is how a snapshot file is encoded, found from its first bytes.
type format int

const (
	formatUnknown format = iota
	formatPickle
	formatJSON
)

// sniff looks at the first bytes: 0x80 is a pickle PROTO; ( } ] a pickle
// of protocol 0 or 1 (which have no PROTO), starting a dict or a list;
// { or [ JSON; 1f 8b gzip. The file name's extension is never trusted.
func sniff(br *bufio.Reader) (f format, gz bool, err error) {
	head, err := br.Peek(2)
	if len(head) == 0 {
		if err == io.EOF {
			return formatUnknown, false, errors.New("the file is empty")
		}
		return formatUnknown, false, err
	}
	switch {
	case len(head) == 2 && head[0] == 0x1f && head[1] == 0x8b:
		return formatUnknown, true, nil
	case head[0] == 0x80, head[0] == opMark, head[0] == opEmptyDict, head[0] == opEmptyList:
		return formatPickle, false, nil
	}
	for i := 1; ; i++ {
		b, err := br.Peek(i)
		if len(b) < i {
			return formatUnknown, false, errors.New("the file holds only white space")
		}
		switch c := b[i-1]; c {
		case ' ', '\t', '\r', '\n':
			if err != nil || i > 4096 {
				return formatUnknown, false, errors.New("not a snapshot: white space only")
			}
			continue
		case '{', '[':
			return formatJSON, false, nil
		}
		if b, _ := br.Peek(262); len(b) == 262 && string(b[257:]) == "ustar" {
			return formatUnknown, false, errors.New("not a PyTorch snapshot but a tar archive (of the snapshots of a run?)")
		}
		return formatUnknown, false, fmt.Errorf("not a PyTorch snapshot: it starts with bytes % x (want a pickle, JSON or gzip)", head)
	}
}

// MemoryLimit is the soft memory limit (debug.SetMemoryLimit) for a
// process decoding and storing snapshots of size bytes at once, not
// compressed: 7/4 of them, at least 64 MiB. The decoded data peaks at
// about 1.3 times the file, so the garbage collector keeps its default
// target until the heap nears the limit, and the process stays under
// twice the file. (A lower target instead, 30, cost a third more CPU
// and lowered nothing at the peak of a 100 MB import.)
func MemoryLimit(size int64) int64 { return max(64<<20, size/4*7) }

// Decode reads a snapshot (pickle protocol 0 to 5, JSON, either gzipped)
// and returns one trace per device it mentions, ordered by device.
func Decode(r io.Reader) ([]*Trace, error) { return DecodeWith(r, Options{}) }

// DecodeWith is Decode within the bounds of opt. Besides the errors of
// Decode, it returns a *LimitError for input past opt.MaxBytes or that
// describes more data than its size can hold, and the context's cause
// (wrapped) when opt.Context ends first.
func DecodeWith(r io.Reader, opt Options) ([]*Trace, error) {
	d, root, err := decodeValue(r, true, opt)
	if err != nil {
		return nil, err
	}
	c := &converter{d: d}
	return c.convert(root)
}

// DecodeFile is Decode on a file.
func DecodeFile(path string) ([]*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Decode(f)
}

// Unpickle decodes any pickle of plain data (protocols 0 to 5) into Go
// values: nil, bool, int64, uint64, *big.Int, float64, string, []byte,
// []any, Tuple, map[string]any, map[any]any. Opcodes that import or call
// code are refused.
func Unpickle(r io.Reader) (any, error) {
	d := newDecoder(r, false)
	root, err := d.unpickle()
	if err != nil {
		return nil, err
	}
	x, err := d.toAny(root, 0)
	if err != nil {
		if d.over != nil {
			return nil, d.over
		}
		return nil, &Error{Offset: d.in.offset(), Msg: err.Error()}
	}
	return x, nil
}

func decodeValue(r io.Reader, snap bool, opt Options) (*decoder, Value, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	f, gz, err := sniff(br)
	if err != nil {
		return nil, Value{}, err
	}
	if gz {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, Value{}, fmt.Errorf("gzip: %w", err)
		}
		br = bufio.NewReaderSize(&limitReader{r: zr, ctx: opt.Context, max: opt.MaxBytes}, 64<<10)
		var again bool
		if f, again, err = sniff(br); err != nil {
			return nil, Value{}, fmt.Errorf("gzip: %w", err)
		}
		if again {
			return nil, Value{}, errors.New("gzip: the data inside is gzipped again")
		}
	} else if opt.Context != nil || opt.MaxBytes > 0 {
		br = bufio.NewReaderSize(&limitReader{r: br, ctx: opt.Context, max: opt.MaxBytes}, 64<<10)
	}
	d := newDecoder(br, snap)
	d.ctx = opt.Context
	var v Value
	if f == formatJSON {
		v, err = d.fromJSON(br)
	} else {
		v, err = d.unpickle()
	}
	var le *LimitError
	if err != nil && gz && !errors.As(err, &le) {
		err = fmt.Errorf("gzip (offsets are into the decompressed data): %w", err)
	}
	if err == nil && gz {
		// The pickle ends before the gzip stream does, and gzip checks its
		// data (CRC-32 and length) only at the stream's end: read it there.
		if _, err = io.Copy(io.Discard, br); err != nil && !errors.As(err, &le) {
			err = fmt.Errorf("gzip: the file is corrupt or cut short after the snapshot's last byte (decompressed offset %d): %w", d.in.offset(), err)
		}
	}
	return d, v, err
}

// fromJSON builds the same values from JSON, through the same hooks
// (frames interning, trace entries as events).
func (d *decoder) fromJSON(r io.Reader) (Value, error) {
	dec := json.NewDecoder(&tokenReader{r: r, d: d})
	dec.UseNumber()
	v, err := d.jsonValue(dec, 0)
	if err != nil {
		return Value{}, err
	}
	var syntax *json.SyntaxError
	var le *LimitError
	switch _, err := dec.Token(); {
	case err == io.EOF:
	case errors.As(err, &le):
		return Value{}, le
	case err == nil || errors.As(err, &syntax):
		return Value{}, &Error{Offset: dec.InputOffset(), Msg: "json: data after the top-level value"}
	default: // the reader's: a gzip stream that does not check
		return Value{}, &Error{Offset: dec.InputOffset(), Msg: "json: after the top-level value: " + err.Error(), Err: err}
	}
	return v, nil
}

func (d *decoder) jsonValue(dec *json.Decoder, depth int) (Value, error) {
	at := dec.InputOffset()
	tok, err := dec.Token()
	d.jsonRead = dec.InputOffset()
	if err == nil && d.over != nil {
		return Value{}, d.over
	}
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		var le *LimitError
		if errors.As(err, &le) {
			return Value{}, le
		}
		return Value{}, &Error{Offset: at, Msg: "json: " + err.Error(), Err: err}
	}
	if depth > maxDepth {
		return Value{}, &Error{Offset: at, Msg: fmt.Sprintf("json: nesting deeper than %d", maxDepth)}
	}
	switch t := tok.(type) {
	case nil:
		return Value{kind: kNone}, nil
	case bool:
		if t {
			return Value{kind: kBool, bits: 1}, nil
		}
		return Value{kind: kBool}, nil
	case string:
		return Value{kind: kStr, bits: uint64(d.intern([]byte(t)))}, nil
	case json.Number:
		return d.jsonNumber(t, at)
	case json.Delim:
		switch t {
		case '[':
			list := d.newObj(kList, nil)
			var items []Value
			for dec.More() {
				v, err := d.jsonValue(dec, depth+1)
				if err != nil {
					return Value{}, err
				}
				old := cap(items)
				items = append(items, v)
				d.grew(old, cap(items), valueSize)
				if len(items) == 1000 { // hand entries over in batches, as pickle does
					if err := d.appendItems(list, items); err != nil {
						return Value{}, &Error{Offset: at, Msg: "json: " + err.Error()}
					}
					items = items[:0]
				}
			}
			if err := d.appendItems(list, items); err != nil {
				return Value{}, &Error{Offset: at, Msg: "json: " + err.Error()}
			}
			_, err := dec.Token() // ]
			return list, err
		case '{':
			dict := d.newObj(kDict, nil)
			for dec.More() {
				kat := dec.InputOffset()
				kt, err := dec.Token()
				if err != nil {
					return Value{}, &Error{Offset: kat, Msg: "json: " + err.Error()}
				}
				k := Value{kind: kStr, bits: uint64(d.intern([]byte(kt.(string))))}
				v, err := d.jsonValue(dec, depth+1)
				if err != nil {
					return Value{}, err
				}
				if err := d.setItems(dict, []Value{k, v}); err != nil {
					return Value{}, &Error{Offset: kat, Msg: "json: " + err.Error()}
				}
			}
			_, err := dec.Token() // }
			return dict, err
		}
	}
	return Value{}, &Error{Offset: at, Msg: fmt.Sprintf("json: unexpected %v", tok)}
}

func (d *decoder) jsonNumber(n json.Number, at int64) (Value, error) {
	s := string(n)
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return Value{kind: kInt, bits: uint64(i)}, nil
	}
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		return Value{kind: kUint, bits: u}, nil
	}
	if len(s) > maxIntDigits+1 {
		return Value{}, &Error{Offset: at, Msg: fmt.Sprintf("json: a number of %d characters, more than the limit of %d", len(s), maxIntDigits+1)}
	}
	if x, ok := new(big.Int).SetString(s, 10); ok {
		d.charge(objectSize + len(s)/2)
		return Value{kind: kBig, obj: &object{big: x, memo: -1}}, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return Value{}, &Error{Offset: at, Msg: fmt.Sprintf("json: bad number %q", clip(s))}
	}
	return Value{kind: kFloat, bits: math.Float64bits(f)}, nil
}

// tokenReader feeds the JSON decoder, which holds a whole token in memory
// before it hands it over: it refuses to read further than MaxString past
// the last token handed over, so no string or number grows beyond that.
type tokenReader struct {
	r    io.Reader
	d    *decoder
	read int64
}

func (t *tokenReader) Read(p []byte) (int, error) {
	ahead := t.read - t.d.jsonRead
	if ahead > MaxString+64<<10 {
		return 0, &Error{Offset: t.d.jsonRead, Msg: fmt.Sprintf("json: a token longer than the limit of %d bytes (frame names, file names and other strings of a snapshot are far shorter)", MaxString)}
	}
	n, err := t.r.Read(p)
	t.read += int64(n)
	return n, err
}
