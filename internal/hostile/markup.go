package hostile

import (
	"bytes"
	"fmt"
	"os"
	"reflect"
	"testing"

	ogórek "github.com/kisielk/og-rek"
)

// Markup are strings that a page would turn into markup, script or a link
// if it wrote them as HTML or into an attribute or URL unescaped. Each
// marks what it would make with the class or data attribute "pwn", so a
// page that renders one as markup has an element that matches PwnSelector;
// the handlers, if they ever ran, set document.documentElement.dataset.pwned.
var Markup = []string{
	`<img src=x class=pwn onerror="document.documentElement.dataset.pwned=1">`,
	`"><script>document.documentElement.dataset.pwned=1</script><b class=pwn>`,
	`javascript:document.documentElement.dataset.pwned=1`,
	`' onmouseover='document.documentElement.dataset.pwned=1' data-pwn='`,
	`</textarea></title></style><svg class=pwn onload="document.documentElement.dataset.pwned=1">`,
	"\x1b]0;pwned\x07\x1b[31mred\x1b[0m \u202eevil\u202c",
}

// PwnSelector matches what a string of Markup becomes when a page renders
// it as markup or as a link.
const PwnSelector = `.pwn, [data-pwn], img[src="x"], svg.pwn, a[href^="javascript:" i], script:not([src]):not([type="application/json"])`

// MarkupSnapshot is the real snapshot at path (a dict of segments and
// device_traces, as _dump_snapshot writes) with Markup in every string a
// page shows: frame names and filenames, each event's compile_context and
// user_metadata, external_annotations (added, one START and END pair per
// string), allocator_settings keys and values (added beside PyTorch's),
// and an out-of-memory entry at the end of device 0's trace so that the
// incident page has one to show. It is pickled again with the og-rek
// encoder: well-formed, and with nothing but plain values.
func MarkupSnapshot(tb testing.TB, path string) []byte {
	tb.Helper()
	return SnapshotWith(tb, path, Markup)
}

// SnapshotWith is MarkupSnapshot with strs in place of Markup.
func SnapshotWith(tb testing.TB, path string, strs []string) []byte {
	tb.Helper()
	f, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	v, err := ogórek.NewDecoder(bytes.NewReader(f)).Decode()
	if err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	snap, ok := v.(map[any]any)
	if !ok {
		tb.Fatalf("%s: the top level is %T, not a dict", path, v)
	}
	pick := func(i int) string { return strs[i%len(strs)] }
	n := 0
	renamed := map[uintptr]bool{} // frame dicts are shared between stacks: each is renamed once
	frames := func(fs any) {
		list, _ := fs.([]any)
		for _, fr := range list {
			d, ok := fr.(map[any]any)
			if !ok || renamed[reflect.ValueOf(d).Pointer()] {
				continue
			}
			renamed[reflect.ValueOf(d).Pointer()] = true
			d["name"] = fmt.Sprint(d["name"]) + " " + pick(n)
			d["filename"] = pick(n+1) + "/" + fmt.Sprint(d["filename"])
			n++
		}
	}
	for _, s := range snap["segments"].([]any) {
		seg := s.(map[any]any)
		frames(seg["frames"])
		for _, b := range seg["blocks"].([]any) {
			frames(b.(map[any]any)["frames"])
		}
	}
	var last map[any]any
	traces, _ := snap["device_traces"].([]any)
	for _, tr := range traces {
		for i, e := range tr.([]any) {
			ev := e.(map[any]any)
			frames(ev["frames"])
			ev["compile_context"] = pick(i)
			ev["user_metadata"] = pick(i + 1)
			last = ev
		}
	}
	if last == nil {
		tb.Fatalf("%s: no trace entries", path)
	}
	t0 := last["time_us"]
	oom := map[any]any{"action": "oom", "device_free": int64(1 << 20), "size": int64(1 << 40), "stream": int64(0),
		"time_us": t0, "frames": last["frames"], "compile_context": pick(0), "user_metadata": pick(1)}
	traces[0] = append(traces[0].([]any), oom)
	var anns []any
	for _, m := range strs {
		for _, stage := range []string{"START", "END"} {
			anns = append(anns, map[any]any{"stage": stage, "name": m, "device": int64(0), "time_us": t0})
		}
	}
	snap["external_annotations"] = anns
	settings, _ := snap["allocator_settings"].(map[any]any)
	if settings == nil {
		settings = map[any]any{"PYTORCH_CUDA_ALLOC_CONF": ""}
		snap["allocator_settings"] = settings
	}
	for i, m := range strs {
		settings[m] = pick(i + 1)
	}
	var out bytes.Buffer
	if err := ogórek.NewEncoderWithConfig(&out, &ogórek.EncoderConfig{Protocol: 4}).Encode(snap); err != nil {
		tb.Fatal(err)
	}
	return out.Bytes()
}
