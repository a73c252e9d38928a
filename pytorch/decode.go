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
		return formatUnknown, false, fmt.Errorf("not a PyTorch snapshot: it starts with bytes % x (want a pickle, JSON or gzip)", head)
	}
}

// ImportGCPercent is the garbage collector's target a process importing a
// big snapshot should run with (debug.SetGCPercent): the decoded data is
// about as large as the file, and Go's default of 100 lets the heap reach
// twice the live data, so peak memory would pass twice the file size.
const ImportGCPercent = 30

// Decode reads a snapshot (pickle protocol 0 to 5, JSON, either gzipped)
// and returns one trace per device it mentions, ordered by device.
func Decode(r io.Reader) ([]*Trace, error) {
	d, root, err := decodeValue(r, true)
	if err != nil {
		return nil, err
	}
	c := &converter{d: d, budget: budgetFor(d)}
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
	budget := budgetFor(d)
	x, err := d.toAny(root, 0, &budget)
	if err != nil {
		return nil, &Error{Offset: d.in.offset(), Msg: err.Error()}
	}
	return x, nil
}

// budgetFor bounds the values a conversion may make: a few per input
// byte, so shared memo references cannot turn a small file into a huge
// tree.
func budgetFor(d *decoder) int {
	return int(min(4*max(d.in.offset(), d.jsonRead)+1<<16, math.MaxInt32))
}

func decodeValue(r io.Reader, snap bool) (*decoder, Value, error) {
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
		br = bufio.NewReaderSize(zr, 64<<10)
		if f, gz, err = sniff(br); err != nil {
			return nil, Value{}, fmt.Errorf("gzip: %w", err)
		}
		if gz {
			return nil, Value{}, errors.New("gzip: the data inside is gzipped again")
		}
	}
	d := newDecoder(br, snap)
	var v Value
	if f == formatJSON {
		v, err = d.fromJSON(br)
	} else {
		v, err = d.unpickle()
	}
	if err != nil && gz {
		err = fmt.Errorf("gzip (offsets are into the decompressed data): %w", err)
	}
	return d, v, err
}

// fromJSON builds the same values from JSON, through the same hooks
// (frames interning, trace entries as events).
func (d *decoder) fromJSON(r io.Reader) (Value, error) {
	dec := json.NewDecoder(r)
	dec.UseNumber()
	v, err := d.jsonValue(dec, 0)
	if err != nil {
		return Value{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return Value{}, &Error{Offset: dec.InputOffset(), Msg: "json: data after the top-level value"}
	}
	return v, nil
}

func (d *decoder) jsonValue(dec *json.Decoder, depth int) (Value, error) {
	at := dec.InputOffset()
	tok, err := dec.Token()
	d.jsonRead = dec.InputOffset()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Value{}, &Error{Offset: at, Msg: "json: " + err.Error()}
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
		return jsonNumber(t, at)
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
				items = append(items, v)
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

func jsonNumber(n json.Number, at int64) (Value, error) {
	s := string(n)
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return Value{kind: kInt, bits: uint64(i)}, nil
	}
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		return Value{kind: kUint, bits: u}, nil
	}
	if x, ok := new(big.Int).SetString(s, 10); ok {
		return Value{kind: kBig, obj: &object{big: x, memo: -1}}, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return Value{}, &Error{Offset: at, Msg: fmt.Sprintf("json: bad number %q", clip(s))}
	}
	return Value{kind: kFloat, bits: math.Float64bits(f)}, nil
}
