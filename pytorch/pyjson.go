package pytorch

// Decoded Python values as JSON text, so the store keeps what vramscope
// does not interpret as data SQLite can query (json_extract) rather than as
// an opaque pickle. Plain JSON loses what a pickle says (tuples, bytes,
// int against float, non-string keys, key order under Go's maps); no JSON
// library keeps those, so the few tagged forms below are written by hand:
//
//	None, bool, int, str, list  null, true/false, digits, "...", [...]
//	float                       a number with '.' or 'e'; {"$float": "nan"|"inf"|"-inf"}
//	dict with string keys       {...} in the dict's order
//	other dicts                 {"$dict": [[key, value], ...]}
//	tuple                       {"$tuple": [...]}
//	bytes                       {"$bytes": "<base64>"}
//	str that is not UTF-8       {"$str": "<base64>"} (lone surrogates)
//
// A dict with a key that starts with '$' is written as a $dict, so no dict
// reads back as a tag.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MarshalValue writes a value Unpickle can return as JSON text.
func MarshalValue(v any) (string, error) {
	b, err := appendValue(nil, v, 0)
	return string(b), err
}

func appendValue(b []byte, v any, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("values nested deeper than %d", maxDepth)
	}
	var err error
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		return strconv.AppendBool(b, x), nil
	case int:
		return strconv.AppendInt(b, int64(x), 10), nil
	case int64:
		return strconv.AppendInt(b, x, 10), nil
	case uint64:
		return strconv.AppendUint(b, x, 10), nil
	case *big.Int:
		return x.Append(b, 10), nil
	case float64:
		switch {
		case math.IsNaN(x):
			return append(b, `{"$float":"nan"}`...), nil
		case math.IsInf(x, 1):
			return append(b, `{"$float":"inf"}`...), nil
		case math.IsInf(x, -1):
			return append(b, `{"$float":"-inf"}`...), nil
		}
		n := len(b)
		b = strconv.AppendFloat(b, x, 'g', -1, 64)
		if !bytes.ContainsAny(b[n:], ".e") {
			b = append(b, ".0"...)
		}
		return b, nil
	case string:
		if !utf8.ValidString(x) {
			b = append(b, `{"$str":"`...)
			b = base64.StdEncoding.AppendEncode(b, []byte(x))
			return append(b, `"}`...), nil
		}
		return appendString(b, x), nil
	case []byte:
		b = append(b, `{"$bytes":"`...)
		b = base64.StdEncoding.AppendEncode(b, x)
		return append(b, `"}`...), nil
	case []any:
		return appendList(b, x, depth)
	case Tuple:
		b = append(b, `{"$tuple":`...)
		if b, err = appendList(b, x, depth); err != nil {
			return nil, err
		}
		return append(b, '}'), nil
	case Dict:
		plain := true
		for _, kv := range x {
			k, ok := kv.Key.(string)
			plain = plain && ok && !strings.HasPrefix(k, "$")
		}
		if plain {
			b = append(b, '{')
			for i, kv := range x {
				if i > 0 {
					b = append(b, ',')
				}
				b = append(appendString(b, kv.Key.(string)), ':')
				if b, err = appendValue(b, kv.Value, depth+1); err != nil {
					return nil, err
				}
			}
			return append(b, '}'), nil
		}
		b = append(b, `{"$dict":[`...)
		for i, kv := range x {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '[')
			if b, err = appendValue(b, kv.Key, depth+1); err != nil {
				return nil, err
			}
			b = append(b, ',')
			if b, err = appendValue(b, kv.Value, depth+1); err != nil {
				return nil, err
			}
			b = append(b, ']')
		}
		return append(b, "]}"...), nil
	}
	return nil, fmt.Errorf("cannot write a %T as a value", v)
}

func appendList(b []byte, xs []any, depth int) ([]byte, error) {
	b = append(b, '[')
	var err error
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		if b, err = appendValue(b, x, depth+1); err != nil {
			return nil, err
		}
	}
	return append(b, ']'), nil
}

func appendString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a valid UTF-8 string always marshals
	return append(b, q...)
}

// UnmarshalValue reads what MarshalValue wrote.
func UnmarshalValue(s string) (any, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	v, err := readValue(dec, 0)
	if err != nil {
		return nil, fmt.Errorf("stored value: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("stored value: data after the value")
	}
	return v, nil
}

func readValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("values nested deeper than %d", maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case nil, bool, string:
		return t, nil
	case json.Number:
		return readNumber(string(t))
	case json.Delim:
		if t == '[' {
			return readList(dec, depth)
		}
		if t != '{' {
			return nil, fmt.Errorf("unexpected %v", t)
		}
	}
	var d Dict
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, err
		}
		k := kt.(string)
		if len(d) == 0 && strings.HasPrefix(k, "$") {
			return readTagged(dec, k, depth)
		}
		v, err := readValue(dec, depth+1)
		if err != nil {
			return nil, err
		}
		d = append(d, KV{k, v})
	}
	if _, err := dec.Token(); err != nil { // }
		return nil, err
	}
	if d == nil {
		d = Dict{}
	}
	return d, nil
}

// readTagged reads the value of a tag and the closing brace.
func readTagged(dec *json.Decoder, key string, depth int) (any, error) {
	var v any
	switch key {
	case "$float", "$bytes", "$str":
		var s string
		if err := dec.Decode(&s); err != nil {
			return nil, err
		}
		switch key {
		case "$float":
			f, ok := map[string]float64{"nan": math.NaN(), "inf": math.Inf(1), "-inf": math.Inf(-1)}[s]
			if !ok {
				return nil, fmt.Errorf("bad $float %q", s)
			}
			v = f
		default:
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return nil, err
			}
			if key == "$str" {
				v = string(b)
			} else {
				v = b
			}
		}
	case "$tuple":
		x, err := readValue(dec, depth+1)
		if err != nil {
			return nil, err
		}
		l, ok := x.([]any)
		if !ok {
			return nil, errors.New("$tuple is not a list")
		}
		v = Tuple(l)
	case "$dict":
		x, err := readValue(dec, depth+1)
		if err != nil {
			return nil, err
		}
		l, ok := x.([]any)
		if !ok {
			return nil, errors.New("$dict is not a list")
		}
		d := make(Dict, len(l))
		for i, it := range l {
			p, ok := it.([]any)
			if !ok || len(p) != 2 {
				return nil, errors.New("$dict item is not a pair")
			}
			d[i] = KV{p[0], p[1]}
		}
		v = d
	default:
		return nil, fmt.Errorf("unknown tag %q", key)
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, fmt.Errorf("%s: want the end of the object", key)
	}
	return v, nil
}

func readList(dec *json.Decoder, depth int) (any, error) {
	out := []any{}
	for dec.More() {
		v, err := readValue(dec, depth+1)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	_, err := dec.Token() // ]
	return out, err
}

func readNumber(s string) (any, error) {
	if strings.ContainsAny(s, ".eE") {
		return strconv.ParseFloat(s, 64)
	}
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return i, nil
	}
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		return u, nil
	}
	x, ok := new(big.Int).SetString(s, 10)
	if !ok {
		return nil, fmt.Errorf("bad number %q", s)
	}
	return x, nil
}
