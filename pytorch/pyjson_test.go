package pytorch

import (
	"math"
	"math/big"
	"reflect"
	"strings"
	"testing"
)

// Values JSON alone cannot tell apart come back as they went in.
func TestValueJSONRoundTrip(t *testing.T) {
	huge, _ := new(big.Int).SetString("-123456789012345678901234567890", 10)
	values := []any{
		nil, true, false, int64(-7), uint64(1<<64 - 1), huge, 0.0, math.Copysign(0, -1), 1.0, 1e21, 2.5e-300,
		math.Inf(1), math.Inf(-1), "", "é☃", "\xed\xa0\x80 lone surrogate", []byte{0, 255}, []any{}, Tuple{}, Tuple{int64(1), "a"},
		Dict{}, Dict{{"b", int64(1)}, {"a", []any{Tuple{nil}}}}, Dict{{int64(1), "x"}, {nil, 1.5}, {true, false}},
		Dict{{"$tuple", []any{int64(1)}}}, Dict{{"a", int64(1)}, {"$dict", int64(2)}},
	}
	for _, v := range values {
		s, err := MarshalValue(v)
		if err != nil {
			t.Fatalf("%#v: %v", v, err)
		}
		back, err := UnmarshalValue(s)
		if err != nil {
			t.Fatalf("%#v as %s: %v", v, s, err)
		}
		if !reflect.DeepEqual(back, v) && !(isNegZero(v) && isNegZero(back)) {
			t.Errorf("%#v as %s came back as %#v", v, s, back)
		}
	}
	nan, err := UnmarshalValue(`{"$float":"nan"}`)
	if f, ok := nan.(float64); err != nil || !ok || !math.IsNaN(f) {
		t.Errorf("nan: %v %v", nan, err)
	}
	for _, bad := range []string{``, `{"$tuple":1}`, `{"$float":"x"}`, `{"$bytes":"!"}`, `{"$dict":[[1]]}`, `{"$nope":1}`, `[1,`, `1 2`, `{"$str":"AA==","x":1}`} {
		if _, err := UnmarshalValue(bad); err == nil || !strings.Contains(err.Error(), "stored value") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func isNegZero(v any) bool {
	f, ok := v.(float64)
	return ok && f == 0 && math.Signbit(f)
}

// FuzzUnmarshalValue: stored text gives a value or an error, never a
// panic, and a value writes back as text that reads as the same value.
func FuzzUnmarshalValue(f *testing.F) {
	for _, s := range []string{`null`, `{"a":[1,2.5,{"$tuple":[true]}]}`, `{"$dict":[[1,"x"],[null,{"$bytes":"AP8="}]]}`, `{"$float":"-inf"}`, `{"$str":"7aCA"}`, `123456789012345678901234567890`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := UnmarshalValue(s)
		if err != nil {
			return
		}
		again, err := MarshalValue(v)
		if err != nil {
			t.Fatalf("%q read as %#v, which does not write: %v", s, v, err)
		}
		v2, err := UnmarshalValue(again)
		if err != nil {
			t.Fatalf("%q wrote as %q, which does not read: %v", s, again, err)
		}
		if again2, _ := MarshalValue(v2); again2 != again {
			t.Fatalf("%q: %q, then %q", s, again, again2)
		}
	})
}
