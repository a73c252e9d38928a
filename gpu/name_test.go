package gpu_test

import (
	"strings"
	"testing"

	"vramscope/gpu"
)

func TestCheckName(t *testing.T) {
	for _, c := range []struct{ in, want, err string }{
		{"training_22k.pickle", "training_22k.pickle", ""},
		{"  rank 0 · 训练  ", "rank 0 · 训练", ""},
		{"<img src=x onerror=alert(1)>", "<img src=x onerror=alert(1)>", ""}, // markup is text: pages escape it
		{"javascript:alert(1)", "javascript:alert(1)", ""},
		{" \t\n ", "", ""},
		{"", "", ""},
		{"snap\u00a0shot", "snap\u00a0shot", ""},
		{strings.Repeat("é", 127), strings.Repeat("é", 127), ""},
		{strings.Repeat("x", 255), strings.Repeat("x", 255), ""},
		{strings.Repeat("x", 256), "", "at most 255 bytes, this one is 256"},
		{strings.Repeat("x", 1<<20), "", "at most 255 bytes, this one is 1048576"},
		{"evil\x1b[31mred", "", "byte 4 of this one is the control character U+001B"},
		{"two\nlines", "", "byte 3 of this one is the control character U+000A"},
		{"a\tb", "", "control character U+0009"},
		{"a\u0085b", "", "control character U+0085"},
		{"a\x7fb", "", "control character U+007F"},
		{"snapshot\u202Eelkcip.exe", "", "byte 8 of this one is the bidirectional formatting character U+202E"},
		{"x\u2066y", "", "U+2066"},
		{"x\u200Fy", "", "U+200F"},
		{"bad\xffutf8", "", "byte 3 of this one is not"},
		{"replacement \uFFFD is text", "replacement \uFFFD is text", ""},
	} {
		got, err := gpu.CheckName(c.in)
		short := c.in[:min(len(c.in), 40)]
		switch {
		case c.err == "" && err != nil:
			t.Errorf("CheckName(%q): %v", short, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("CheckName(%q) = %q, %v; want an error saying %q", short, got, err, c.err)
		case c.err == "" && got != c.want:
			t.Errorf("CheckName(%q) = %q, want %q", short, got, c.want)
		case err != nil && len(err.Error()) > 200:
			t.Errorf("CheckName(%q): the error repeats the name: %d bytes", short, len(err.Error()))
		}
	}
}
