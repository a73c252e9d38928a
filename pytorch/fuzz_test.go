package pytorch

import (
	"bytes"
	"testing"
)

// FuzzDecode: any input gives traces or an error, never a panic; what
// decodes also exports and decodes again.
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
		if _, err := Decode(&out); err != nil {
			t.Fatalf("decoding the export: %v", err)
		}
	})
}
