package pytorch

import (
	"context"
	"fmt"
	"io"
)

// What a decode may cost. A file can declare anything; the decoder's
// memory follows the bytes it has actually read (after decompression), so
// a small file cannot make a large heap however it nests, shares or
// repeats its values.
const (
	// MaxString caps one string or bytes value (a frame name, a file
	// name, metadata). Real snapshots hold strings of a few kilobytes.
	MaxString = 1 << 20
	// memPerByte is the decoded data, in bytes, that one byte of input
	// may account for. A value costs 24 bytes and takes at least two of
	// input when it is not a one-byte DUP or constant, so the densest
	// real snapshots (segments of small blocks, held as dicts until
	// converted, with keys that are memo references) reach about 15;
	// files of trace entries stay under 4.
	memPerByte = 16
	// memBase is what any input may use, however short.
	memBase = 32 << 20
	// maxIntDigits caps the digits of a text INT or LONG, as CPython's
	// int() does (sys.int_info.default_max_str_digits).
	maxIntDigits = 4300
	// maxNumberLine caps the line of a FLOAT, GET or PUT.
	maxNumberLine = 256
	// checkEvery: the steps between looks at the context in loops that
	// read no input (conversion, undo and replay of the events).
	checkEvery = 1 << 14
)

// Options bound one decode.
type Options struct {
	// Context stops the decode when it is done: a client that went away,
	// or a time budget. nil: never.
	Context context.Context
	// MaxBytes caps the bytes read after decompression; 0: no cap.
	MaxBytes int64
}

// LimitError is input refused for its size, not for its form: it
// decompresses beyond the cap, or describes more data than its bytes can
// hold. Offset is where in the (decompressed) input the limit was passed.
type LimitError struct {
	Offset int64
	Msg    string
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("byte offset %d: %s", e.Offset, e.Msg)
}

// LimitReader reads r within opt's bounds, as a decode reads its
// decompressed input: a *LimitError past opt.MaxBytes, the context's
// cause once it is done. An archive of snapshots is read through one.
func LimitReader(r io.Reader, opt Options) io.Reader {
	return &limitReader{r: r, ctx: opt.Context, max: opt.MaxBytes}
}

// limitReader counts the bytes read after decompression, refuses those
// past max and stops when ctx is done.
type limitReader struct {
	r    io.Reader
	ctx  context.Context
	max  int64
	read int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.ctx != nil {
		if err := l.ctx.Err(); err != nil {
			return 0, context.Cause(l.ctx)
		}
	}
	if l.max > 0 {
		if l.read >= l.max {
			// At the cap: fine if the input ends there.
			var one [1]byte
			if n, err := io.ReadFull(l.r, one[:]); n == 0 && err == io.EOF {
				return 0, io.EOF
			}
			return 0, &LimitError{Offset: l.read, Msg: fmt.Sprintf("the snapshot is larger than %d bytes once decompressed, the most this server takes", l.max)}
		}
		p = p[:min(int64(len(p)), l.max-l.read)]
	}
	n, err := l.r.Read(p)
	l.read += int64(n)
	return n, err
}

// charge counts n bytes of decoded data. Past the budget it records the
// first place that went over; the machine stops at its next step.
func (d *decoder) charge(n int) {
	d.mem += int64(n)
	d.peak = max(d.peak, d.mem)
	if d.over == nil && d.mem > memBase+memPerByte*d.read() {
		d.over = &LimitError{Offset: d.read(), Msg: fmt.Sprintf(
			"the data expands to more values than %d bytes of input can hold (%d bytes of memory, more than %d per input byte): shared references, or a file no snapshot resembles",
			d.read(), d.mem, memPerByte)}
	}
}

// credit gives back what charge counted for data let go.
func (d *decoder) credit(n int) { d.mem -= int64(n) }

// grew charges the growth of a slice's capacity from old to new elements
// of size bytes.
func (d *decoder) grew(old, new, size int) {
	if new > old {
		d.charge((new - old) * size)
	}
}

// read is the input read so far, after decompression.
func (d *decoder) read() int64 { return max(d.in.offset(), d.jsonRead) }

// canceled says whether the decode's context is done; loops that read no
// input call it every checkEvery steps.
func (d *decoder) canceled() error {
	if d.ctx == nil {
		return nil
	}
	if d.ctx.Err() != nil {
		return context.Cause(d.ctx)
	}
	return nil
}
