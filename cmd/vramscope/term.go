package main

import (
	"errors"
	"fmt"
	"io"
	"unicode"
	"unicode/utf8"

	"vramscope/gpu"
)

// checkName is gpu.CheckName for a name the command line gives: a blank
// one is refused too (the defaults are never blank).
func checkName(name string) (string, error) {
	name, err := gpu.CheckName(name)
	if err == nil && name == "" {
		err = errors.New("it is blank")
	}
	return name, err
}

// termWriter passes text to a terminal with what would drive it written
// as Go escapes (\x1b, \u202e): control characters but tab, newline and
// carriage return (an escape sequence that recolours, moves the cursor,
// retitles the window or writes to the clipboard), bytes that are not
// UTF-8 (a lone 0x9b is a control sequence to some terminals), and
// bidirectional formatting characters (a right-to-left override shows the
// rest of the line reversed) and line and paragraph separators. Names,
// frames and settings come from uploaded files; the commands write them
// through this, never raw, and where a line holds one, as oneLine: the
// line breaks this lets pass are the commands' own. Each Write is escaped
// alone: fmt and text/tabwriter never split a character between two.
type termWriter struct{ w io.Writer }

func (t termWriter) Write(p []byte) (int, error) {
	clean := true
	for _, c := range p {
		if c < 0x20 && c != '\t' && c != '\n' && c != '\r' || c >= 0x7f {
			clean = false // worth a closer look: a control byte, or beyond ASCII
			break
		}
	}
	if clean {
		return t.w.Write(p)
	}
	if _, err := t.w.Write(appendEscaped(make([]byte, 0, len(p)+16), p, true)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// oneLine is s, text from an uploaded file, as one cell of one line: what
// termWriter escapes, and tab, newline and carriage return too (a frame
// name that ends a line or returns to its start would forge the lines
// after it), so no tabwriter reads a cell or line end in it either.
func oneLine(s string) string { return string(appendEscaped(nil, []byte(s), false)) }

// appendEscaped appends p to out with what would drive a terminal written
// as Go escapes (see termWriter); tab, newline and carriage return pass
// when breaks is true.
func appendEscaped(out, p []byte, breaks bool) []byte {
	for i := 0; i < len(p); {
		r, size := utf8.DecodeRune(p[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			out = fmt.Appendf(out, `\x%02x`, p[i])
		case breaks && (r == '\t' || r == '\n' || r == '\r'):
			out = append(out, byte(r))
		case r < 0x80 && unicode.IsControl(r):
			out = fmt.Appendf(out, `\x%02x`, r)
		case unicode.IsControl(r), gpu.IsBidiControl(r), unicode.In(r, unicode.Zl, unicode.Zp):
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = append(out, p[i:i+size]...)
		}
		i += size
	}
	return out
}
