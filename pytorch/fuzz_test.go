package pytorch

import (
	"bytes"
	"testing"

	"vramscope/internal/hostile"
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

// FuzzDecodeGzip: a snapshot wrapped in gzip decodes to what it decodes
// to bare, or fails as it does bare; gzip data of any shape (cut, corrupt,
// gzip in gzip) gives an error, never a panic.
func FuzzDecodeGzip(f *testing.F) {
	f.Add([]byte("\x80\x04]\x94."))
	f.Add([]byte(`{"segments": [], "device_traces": [[]]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = Decode(bytes.NewReader(data)) // the bytes themselves, gzip or not
		bare, errBare := Decode(bytes.NewReader(data))
		gz, errGz := DecodeWith(bytes.NewReader(hostile.Gzip(data)), Options{MaxBytes: 1 << 20})
		if (errBare == nil) != (errGz == nil) {
			if len(data) > 1<<20 {
				return // past the cap only gzipped
			}
			if len(data) >= 2 && data[0] == 0x1f && data[1] == 0x8b {
				return // gzip in gzip is refused
			}
			t.Fatalf("bare: %v; gzipped: %v", errBare, errGz)
		}
		if errBare == nil && len(bare) != len(gz) {
			t.Fatalf("%d traces bare, %d gzipped", len(bare), len(gz))
		}
	})
}
