package pytorch

import (
	"bytes"
	"testing"
)

// FuzzDecode: any input gives traces or an error, never a panic; what
// decodes also exports, and the export decodes to traces that export to
// the same bytes again.
func FuzzDecode(f *testing.F) {
	f.Add([]byte("\x80\x04]\x94."))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = Unpickle(bytes.NewReader(data))
		traces, err := Decode(bytes.NewReader(data))
		if err != nil || len(traces) == 0 {
			return
		}
		var out bytes.Buffer
		if err := Export(&out, traces...); err != nil {
			t.Fatalf("export: %v", err)
		}
		again, err := Decode(bytes.NewReader(out.Bytes()))
		if err != nil {
			t.Fatalf("decoding the export: %v", err)
		}
		var out2 bytes.Buffer
		if err := Export(&out2, again...); err != nil {
			t.Fatalf("export of the export: %v", err)
		}
		if !bytes.Equal(out.Bytes(), out2.Bytes()) {
			t.Fatalf("the export of the export differs (%d bytes, then %d)", out.Len(), out2.Len())
		}
	})
}
