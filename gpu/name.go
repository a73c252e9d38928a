package gpu

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxNameBytes bounds the name of a trace or a run: 255 bytes of UTF-8,
// the longest file name Linux, macOS and Windows file systems hold, so
// that every snapshot's file name fits while a name stays a line that
// pages, lists and terminals can show whole.
const MaxNameBytes = 255

// CheckName returns name without the white space around it (empty when
// it was only white space: the caller's default applies), or why it
// cannot name a trace or a run: longer than MaxNameBytes, not UTF-8, or
// holding a control character (a newline, a tab, an escape that drives a
// terminal) or a bidirectional formatting character (a right-to-left
// override that shows the text around it reversed). The error does not
// repeat the name, which may be long.
func CheckName(name string) (string, error) {
	name = strings.TrimSpace(name)
	if len(name) > MaxNameBytes {
		return "", fmt.Errorf("a name is at most %d bytes, this one is %d", MaxNameBytes, len(name))
	}
	for i, r := range name {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(name[i:], "\uFFFD"):
			return "", fmt.Errorf("a name is UTF-8 text; byte %d of this one is not", i)
		case unicode.IsControl(r):
			return "", fmt.Errorf("a name is one line of plain text; byte %d of this one is the control character %U", i, r)
		case IsBidiControl(r):
			return "", fmt.Errorf("a name is plain text; byte %d of this one is the bidirectional formatting character %U, which reorders what is shown around it", i, r)
		}
	}
	return name, nil
}

// IsBidiControl is whether r is one of Unicode's explicit directional
// formatting characters (marks, embeddings, overrides and isolates).
func IsBidiControl(r rune) bool {
	switch {
	case r == '\u061C', r == '\u200E', r == '\u200F':
		return true
	case r >= '\u202A' && r <= '\u202E', r >= '\u2066' && r <= '\u2069':
		return true
	}
	return false
}
