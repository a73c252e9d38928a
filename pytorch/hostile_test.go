package pytorch

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"vramscope/internal/hostile"
)

// within runs decode and checks that what it allocated stays within twice
// the memory budget of the input it could have read (transient copies and
// slice growth included), and returns its error.
func within(t *testing.T, name string, decompressed int64, decode func() error) error {
	t.Helper()
	var err error
	grew := allocated(func() { err = decode() })
	if bound := 2 * (memBase + memPerByte*uint64(decompressed)); grew > bound {
		t.Errorf("%s: allocated %d MiB, more than twice the budget of %d input bytes (%d MiB)", name, grew>>20, decompressed, bound>>20)
	}
	return err
}

// Text lines cost time and memory in proportion to their length: a 512
// KiB UNICODE line decodes allocating a small multiple of itself (it was
// quadratic, a buffer one byte longer for each byte), and lines past
// their opcode's limit are refused, naming it.
func TestTextLinesAreLinear(t *testing.T) {
	in := hostile.LongLine(opUnicode, 512<<10)
	var x any
	err := within(t, "512 KiB UNICODE", int64(len(in)), func() (err error) { x, err = Unpickle(bytes.NewReader(in)); return })
	if err != nil || len(x.(string)) != 512<<10 {
		t.Fatalf("got %T, %v", x, err)
	}
	if grew := allocated(func() { Unpickle(bytes.NewReader(in)) }); grew > 16*uint64(len(in)) {
		t.Errorf("a %d-byte line allocated %d bytes", len(in), grew)
	}
	for op, want := range map[byte]string{
		opUnicode: "UNICODE declares a string of 1048577 bytes or more, more than the limit of 1048576",
		opInt:     "INT: a line longer than 4302 bytes",
		opLong:    "LONG: a line longer than 4302 bytes",
		opFloat:   "FLOAT: a line longer than 256 bytes",
		opGet:     "GET: a line longer than 256 bytes",
	} {
		in := hostile.LongLine(op, 64<<20)
		err := within(t, opName(op), 2<<20, func() error { _, err := Unpickle(bytes.NewReader(in)); return err })
		var pe *Error
		if !errors.As(err, &pe) || pe.Offset != 2 || !strings.Contains(err.Error(), want) {
			t.Errorf("%s line of 64 MiB: got %v, want %q at byte offset 2", opName(op), err, want)
		}
	}
}

// The memory of a decode follows the bytes it has read: each input of the
// attack run is refused with a LimitError or a clear Error before its
// memory passes the budget of what it could read.
func TestDecodeMemoryBoundedByInput(t *testing.T) {
	cases := []struct {
		name         string
		in           []byte
		decompressed int64
		want         string
	}{
		// 4 MiB of empty device_traces lists: 4.19 GB before.
		{"empty trace lists", hostile.EmptyTraceLists(4 << 20), 4 << 20, "expands to more values"},
		// 98 KB of gzip, DUP/LIST rounds: 2.77 GB before.
		{"dup/list rounds", hostile.DupListRounds(1000, 100_000), 100 << 20, "expands to more values"},
		// 1 MiB of gzip, one 1 GiB BINBYTES8: 3.23 GB before.
		{"1 GiB bytes", hostile.BigBytes(1 << 30), 1 << 30, "BINBYTES8 declares a string of 1073741824 bytes or more, more than the limit of 1048576"},
		// 1 MiB of gzip, a 1000 MB frame name: 5.23 GB and a 500 before.
		{"1000 MB frame name", hostile.LongFrameName(1000 << 20), 1000 << 20, "BINUNICODE8 declares a string of 1048576000 bytes"},
		// a 100 MB frame name was stored.
		{"100 MB frame name", hostile.LongFrameName(100 << 20), 100 << 20, "BINUNICODE8 declares a string of 104857600 bytes"},
		{"64 MiB UNICODE line", hostile.GzipLongLine(opUnicode, 64<<20), 64 << 20, "UNICODE declares a string of 1048577 bytes or more"},
	}
	for _, c := range cases {
		err := within(t, c.name, c.decompressed, func() error { _, err := Decode(bytes.NewReader(c.in)); return err })
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s (%d bytes): got %v, want %q", c.name, len(c.in), err, c.want)
		}
		var le *LimitError
		if strings.Contains(c.want, "expands") && !errors.As(err, &le) {
			t.Errorf("%s: %T is not a LimitError", c.name, err)
		}
	}
}

// Every real snapshot of both sets decodes within the budget: those of a
// megabyte or more (mostly trace entries) use under a third of it (the
// older set 1.7 to 4 bytes per byte read, PyTorch 2.11's big.pickle.gz
// 4.1); the densest small ones (segments only) come near it, within what
// every input may use.
func TestRealSnapshotsWithinBudget(t *testing.T) {
	for _, f := range realFiles(t) {
		r, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		d, root, err := decodeValue(r, true, Options{})
		r.Close()
		if err == nil {
			_, err = (&converter{d: d}).convert(root)
		}
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if d.read() >= 1<<20 && d.peak > memPerByte*d.read()/3 {
			t.Errorf("%s: peak %d bytes for %d read, over a third of the budget", filepath.Base(f), d.peak, d.read())
		}
	}
}

// A gzip that decompresses past MaxBytes is refused once it gets there.
func TestDecompressedBytesCapped(t *testing.T) {
	in := hostile.DupPop(8 << 20) // 16 MiB decompressed
	_, err := DecodeWith(bytes.NewReader(in), Options{MaxBytes: 1 << 20})
	var le *LimitError
	if !errors.As(err, &le) || le.Offset != 1<<20 || !strings.Contains(err.Error(), "larger than 1048576 bytes once decompressed") {
		t.Fatalf("got %v, want a LimitError at byte 1048576", err)
	}
	// Below the cap the same file decodes (to a value that is no snapshot).
	if _, err := DecodeWith(bytes.NewReader(in), Options{MaxBytes: 32 << 20}); err == nil || errors.As(err, &le) {
		t.Fatalf("under the cap: got %v, want a structure error", err)
	}
}

// A decode stops when its context ends: a client gone or a time budget
// spent. The cause is returned, wrapped.
func TestDecodeStopsWithItsContext(t *testing.T) {
	in := hostile.DupPop(64 << 20)
	ctx, cancel := context.WithCancelCause(context.Background())
	gone := errors.New("the client went away")
	cancel(gone)
	_, err := DecodeWith(bytes.NewReader(in), Options{Context: ctx})
	if !errors.Is(err, gone) {
		t.Fatalf("got %v, want the context's cause", err)
	}
	// In the middle: a reader that cancels once 16 KiB have been read.
	ctx, cancel = context.WithCancelCause(context.Background())
	r := &cancelAfter{r: bytes.NewReader(in), n: 16, cancel: func() { cancel(gone) }}
	_, err = DecodeWith(r, Options{Context: ctx})
	var pe *Error
	if !errors.Is(err, gone) || !errors.As(err, &pe) || pe.Offset == 0 {
		t.Fatalf("got %v, want the cause at a byte offset", err)
	}
	// A JSON snapshot too, and the conversion after the decode.
	ctx, cancel = context.WithCancelCause(context.Background())
	cancel(gone)
	if _, err := DecodeWith(strings.NewReader(`{"segments": []}`), Options{Context: ctx}); !errors.Is(err, gone) {
		t.Fatalf("json: got %v", err)
	}
}

type cancelAfter struct {
	r      *bytes.Reader
	n      int
	cancel func()
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	if c.n--; c.n == 0 {
		c.cancel()
	}
	return c.r.Read(p[:min(len(p), 1024)])
}

// JSON tokens cannot grow past the string limit: the decoder stops
// reading ahead of the last token it handed over.
func TestJSONTokensCapped(t *testing.T) {
	long := `{"segments": [], "x": "` + strings.Repeat("a", 4<<20) + `"}`
	err := within(t, "json string", int64(len(long)), func() error { _, err := Decode(strings.NewReader(long)); return err })
	if err == nil || !strings.Contains(err.Error(), "a token longer than the limit of 1048576 bytes") {
		t.Fatalf("got %v", err)
	}
	num := `{"segments": [], "x": ` + strings.Repeat("9", 10000) + `}`
	if _, err := Decode(strings.NewReader(num)); err == nil || !strings.Contains(err.Error(), "a number of 10000 characters") {
		t.Fatalf("got %v", err)
	}
}
