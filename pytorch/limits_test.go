package pytorch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// allocated runs f and returns the bytes it allocated.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// pk builds pickle opcodes for tests.
type pk []byte

func (p pk) str(s string) pk {
	p = append(p, opBinUnicode)
	p = binary.LittleEndian.AppendUint32(p, uint32(len(s)))
	return append(p, s...)
}

func (p pk) int(n uint32) pk {
	return binary.LittleEndian.AppendUint32(append(p, opBinInt), n)
}

func (p pk) put(idx uint32) pk {
	return binary.LittleEndian.AppendUint32(append(p, opLongBinPut), idx)
}

func (p pk) get(idx uint32) pk {
	return binary.LittleEndian.AppendUint32(append(p, opLongBinGet), idx)
}

// BINPUTs far apart must not fill the gaps between them: the memo's
// memory stays in proportion to the input read.
func TestSparseMemoBoundedByInput(t *testing.T) {
	in := pk("\x80\x02N")
	for i := uint32(1); i <= 1000; i++ {
		in = in.put(i * 65535)
	}
	in = append(in, "0N."...)
	var err error
	grew := allocated(func() { _, err = Unpickle(bytes.NewReader(in)) })
	if err != nil {
		t.Fatal(err)
	}
	if grew > 64<<20 {
		t.Errorf("%d bytes of input allocated %d MiB", len(in), grew>>20)
	}

	// A slot set before the memo reaches it is still found once it does.
	in = pk("\x80\x02").str("far").put(5000)
	in = append(in, '0')
	for i := uint32(0); i < 6000; i++ {
		in = append(in.str("x").put(i), '0')
	}
	in = append(in.get(5000), '.')
	x, err := Unpickle(bytes.NewReader(in))
	if err != nil || x != "x" {
		t.Errorf("got %v, %v; want the slot set last", x, err)
	}
	in = pk("\x80\x02").str("far").put(5000)
	in = append(in, '0')
	for i := uint32(0); i < 6000; i++ {
		if i != 5000 {
			in = append(in.str("x").put(i), '0')
		}
	}
	in = append(in.get(5000), '.')
	if x, err = Unpickle(bytes.NewReader(in)); err != nil || x != "far" {
		t.Errorf("got %v, %v; want the slot set first", x, err)
	}
}

// snapshotWith builds a snapshot pickle with one trace of n entries
// {action: "annotate", addr, size, x} (annotations, which the segments
// cannot contradict), the x of each written by value(i, p).
func snapshotWith(n int, value func(i int, p pk) pk) []byte {
	p := pk("\x80\x02}(").str("segments")
	p = append(p, ']')
	p = p.str("device_traces")
	p = append(p, "]]("...)
	for i := 0; i < n; i++ {
		p = append(p, "}("...)
		p = p.str("action").str("annotate").str("addr").int(uint32(512 * i)).str("size").int(512).str("x")
		p = value(i, p)
		p = append(p, 'u')
	}
	return append(p, "eau."...) // entries into the trace, trace into device_traces
}

// list writes a list of n small ints, memoized at slot idx.
func list(p pk, idx uint32, n int) pk {
	p = append(p, ']')
	p = p.put(idx)
	p = append(p, '(')
	for j := 0; j < n; j++ {
		p = append(p, opBinInt1, byte(j))
	}
	return append(p, 'e')
}

// A large value of an unknown key that every trace entry refers to
// through the memo is converted once, not once per entry.
func TestSharedUnknownValueConvertedOnce(t *testing.T) {
	const n = 100_000
	in := snapshotWith(200, func(i int, p pk) pk {
		if i == 0 {
			return list(p, 1<<20, n)
		}
		return p.get(1 << 20)
	})
	var traces []*Trace
	var err error
	grew := allocated(func() { traces, err = Decode(bytes.NewReader(in)) })
	if err != nil {
		t.Fatal(err)
	}
	if grew > 64<<20 {
		t.Errorf("%d bytes of input allocated %d MiB", len(in), grew>>20)
	}
	tr := traces[0]
	if len(tr.Events) != 200 || len(tr.Extras) != 1 {
		t.Fatalf("%d events, %d extras; want 200 and 1", len(tr.Events), len(tr.Extras))
	}
	v, _ := tr.Extras[0].Other.Get("x")
	if x, ok := v.([]any); !ok || len(x) != n || x[n-1] != int64((n-1)&255) {
		t.Errorf("x is %T of %d", v, len(x))
	}
}

// Unknown values that each reach a shared large value draw on one budget
// for the whole file: a small file cannot make them expand without end.
func TestUnknownValuesShareOneBudget(t *testing.T) {
	in := snapshotWith(200, func(i int, p pk) pk {
		p = append(p, '(')
		if i == 0 {
			p = list(p, 1<<20, 100_000)
		} else {
			p = p.get(1 << 20)
		}
		return append(p, 'l') // [shared]: a new list each time
	})
	var err error
	grew := allocated(func() { _, err = Decode(bytes.NewReader(in)) })
	var le *LimitError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "expands to more values") {
		t.Fatalf("got %v, want a LimitError that the data expands", err)
	}
	if grew > 64<<20 {
		t.Errorf("%d bytes of input allocated %d MiB", len(in), grew>>20)
	}
}

// Equal unknown values share one EventExtra; different ones do not, and
// neither do values written in another key order, since export writes
// them back in their own order.
func TestUnknownValuesDeduplicated(t *testing.T) {
	in := `{"segments": [], "device_traces": [[
	  {"action": "annotate", "addr": 0, "size": 512, "x": {"a": 1, "b": [1, "s"]}, "y": 2},
	  {"action": "annotate", "addr": 512, "size": 512, "x": {"a": 1, "b": [1, "s"]}, "y": 2},
	  {"action": "annotate", "addr": 1024, "size": 512, "y": 2, "x": {"a": 1, "b": [1, "s"]}},
	  {"action": "annotate", "addr": 1536, "size": 512, "x": {"b": [1, "s"], "a": 1}, "y": 2},
	  {"action": "annotate", "addr": 2048, "size": 512, "x": {"a": 1, "b": [1, "t"]}, "y": 2},
	  {"action": "annotate", "addr": 2560, "size": 512, "x": {"a": true, "b": [1, "s"]}, "y": 2}]]}`
	tr := decodeBytes(t, []byte(in))[0]
	of := tr.ExtraOf
	if len(tr.Extras) != 5 || of[0] != of[1] || len(map[uint32]bool{of[1]: true, of[2]: true, of[3]: true, of[4]: true, of[5]: true}) != 5 {
		t.Errorf("extras %v of %v", of, tr.Extras)
	}
}

// Bytes referenced again and again are copies, and count against the
// budget by their size.
func TestSharedBytesBounded(t *testing.T) {
	in := pk("\x80\x02]")
	in = append(in, opBinBytes)
	in = binary.LittleEndian.AppendUint32(in, 64<<10)
	in = append(in, make([]byte, 64<<10)...)
	in = append(in.put(0), "0("...) // memoized and popped: the list is below
	for i := 0; i < 2000; i++ {
		in = in.get(0)
	}
	in = append(in, "e."...)
	var err error
	grew := allocated(func() { _, err = Unpickle(bytes.NewReader(in)) })
	if err == nil || !strings.Contains(err.Error(), "expands to more values") {
		t.Errorf("got %v, want that the data expands", err)
	}
	if grew > 64<<20 {
		t.Errorf("%d bytes of input allocated %d MiB", len(in), grew>>20)
	}
}

// A segment or block whose end is beyond 2^64 is refused, naming it.
func TestSegmentBoundsDoNotWrap(t *testing.T) {
	cases := map[string]string{
		`{"segments": [{"device": 0, "address": 18446744073709551104, "total_size": 1024,
		   "blocks": [{"size": 1024, "state": "inactive"}]}]}`: `segments[0]: address + total_size overflows`,
		`{"segments": [{"device": 0, "address": 18446744073709551104, "total_size": 512,
		   "blocks": [{"size": 512, "state": "inactive"}]}]}`: `segments[0]: address + total_size overflows`,
		`{"segments": [{"device": 0, "address": 0, "total_size": 512, "blocks": [{"size": 512, "state": "inactive"}]},
		  {"device": 0, "address": 4096, "total_size": 4096,
		   "blocks": [{"size": 18446744073709551615, "state": "inactive"}, {"size": 4097, "state": "inactive"}]}]}`: `segments[1].blocks[0]: address + size overflows`,
	}
	for in, want := range cases {
		_, err := Decode(strings.NewReader(in))
		var se *StructureError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s\n got %v\nwant %q", in, err, want)
		}
	}
}

// The budgets grow with the JSON read too: a large JSON snapshot with
// unknown keys in every entry decodes.
func TestLargeJSONWithinBudget(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"segments": [`)
	for i := 0; i < 30000; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, `{"device": 0, "address": %d, "total_size": 1024, "blocks": [{"size": 512, "state": "inactive"}, {"size": 512, "state": "inactive"}]}`, 1024*i)
	}
	b.WriteString(`], "device_traces": [[`)
	for i := 0; i < 5000; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, `{"action": "annotate", "addr": 0, "size": 0, "x": [%d, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]}`, i)
	}
	b.WriteString(`]]}`)
	tr := decodeBytes(t, []byte(b.String()))[0]
	if len(tr.Final.Segments) != 30000 || len(tr.Events) != 5000 || len(tr.Extras) != 5000 {
		t.Errorf("%d segments, %d events, %d extras", len(tr.Final.Segments), len(tr.Events), len(tr.Extras))
	}
}
