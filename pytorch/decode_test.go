package pytorch

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/internal/hostile"
	"vramscope/internal/testkit"
)

func readReal(t testing.TB, name string) []byte {
	b, err := os.ReadFile(testkit.Snapshot(t, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decodeBytes(t testing.TB, b []byte) []*Trace {
	t.Helper()
	tr, err := Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// sameTraces compares two decodes, ignoring file-level warnings.
func sameTraces(t *testing.T, want, got []*Trace) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("%d traces, want %d", len(got), len(want))
	}
	for i := range want {
		w, g := *want[i], *got[i]
		w.Warnings, g.Warnings = nil, nil
		if !reflect.DeepEqual(w, g) {
			diffTrace(t, &w, &g)
		}
	}
}

func diffTrace(t *testing.T, w, g *Trace) {
	t.Helper()
	wv, gv := reflect.ValueOf(*w), reflect.ValueOf(*g)
	for i := 0; i < wv.NumField(); i++ {
		if !reflect.DeepEqual(wv.Field(i).Interface(), gv.Field(i).Interface()) {
			t.Errorf("device %d: field %s differs", w.Device, wv.Type().Field(i).Name)
		}
	}
}

func TestGzipAndJSONGiveTheSameTraces(t *testing.T) {
	raw := readReal(t, "snapshot_action_entry.pickle")
	want := decodeBytes(t, raw)

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw)
	zw.Close()
	sameTraces(t, want, decodeBytes(t, gz.Bytes()))

	generic, err := Unpickle(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(generic)
	if err != nil {
		t.Fatal(err)
	}
	// JSON has no float 0.0 apart from 0, and no tuples: compare the
	// settings' meaning, and the traces without how their dicts were
	// written.
	got := decodeBytes(t, append([]byte("\n "), js...))
	for _, tr := range append(got, want...) {
		tr.Settings.Raw = nil
		tr.Snapshot = nil
		for i := range tr.Segments {
			tr.Segments[i].Form = nil
		}
	}
	sameTraces(t, want, got)
}

// A gzipped snapshot is checked to the end of the gzip stream (its CRC-32
// and length come after the pickle's STOP): a corrupt or cut trailer, or
// bytes that are not gzip after it, are refused; an error inside says its
// offsets are into the decompressed data.
func TestGzipCheckedToItsEnd(t *testing.T) {
	raw := readReal(t, "settings_no_annotations.pickle")
	js := []byte(`{"segments": [], "device_traces": [[{"action": "oom", "device_free": 1, "size": 5, "stream": 0}]]}`)
	for _, in := range [][]byte{raw, js} {
		gz := hostile.Gzip(in)
		crc := bytes.Clone(gz)
		crc[len(crc)-6] ^= 1
		for what, bad := range map[string][]byte{
			"a corrupt CRC":           crc,
			"a cut trailer":           gz[:len(gz)-3],
			"bytes that are not gzip": append(bytes.Clone(gz), "junk"...),
		} {
			_, err := Decode(bytes.NewReader(bad))
			if err == nil || !strings.Contains(err.Error(), "gzip") {
				t.Errorf("%.10q with %s: %v", in, what, err)
			}
		}
		if _, err := Decode(bytes.NewReader(gz)); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Decode(bytes.NewReader(hostile.Gzip(raw[:len(raw)/2])))
	if err == nil || !strings.Contains(err.Error(), "offsets are into the decompressed data") {
		t.Errorf("cut inside: %v", err)
	}
}

func TestNotASnapshot(t *testing.T) {
	for _, in := range []string{"", "   ", "hello", "\x00\x01"} {
		if _, err := Decode(strings.NewReader(in)); err == nil {
			t.Errorf("%q decoded", in)
		}
	}
}

func TestMissingKeysNameTheKeyAndWhere(t *testing.T) {
	cases := map[string]string{
		`{"device_traces": []}`: `top level: missing key "segments"`,
		`{"segments": [{"device": 0, "address": 0, "total_size": 512}]}`:                                                  `segments[0]: missing key "blocks"`,
		`{"segments": [{"device": 0, "address": 0, "total_size": 512, "blocks": [{"size": 512}]}]}`:                       `segments[0].blocks[0]: missing key "state"`,
		`{"segments": [], "device_traces": [[], [{"action": "alloc", "size": 5}]]}`:                                       `device_traces[1][0]: missing key "addr"`,
		`{"segments": [], "device_traces": [[{"action": "oom", "size": 5}]]}`:                                             `device_traces[0][0]: missing key "device_free"`,
		`{"segments": [], "device_traces": [[{"addr": 1, "size": 5}]]}`:                                                   `device_traces[0][0]: missing key "action"`,
		`{"segments": [{"device": 0, "address": 0, "total_size": 1024, "blocks": [{"size": 512, "state": "inactive"}]}]}`: `segments[0]: blocks cover 512 bytes, total_size says 1024`,
		`{"segments": [{"device": 0, "address": 0, "total_size": 512, "blocks": [{"size": 512, "state": "x"}]}]}`:         `unknown block state "x"`,
		`{"segments": [{"device": 0, "address": 0, "total_size": 512, "frames": [{"name": "f"}], "blocks": []}]}`:         `segments[0].frames: want a list of frames`,
	}
	for in, want := range cases {
		_, err := Decode(strings.NewReader(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s\n got %v\nwant %q", in, err, want)
		}
	}
}

// newer and unusual keys: pending-free blocks, private pools, unknown
// trace fields and actions are kept and survive export.
func TestNewerLayoutKeptAndExported(t *testing.T) {
	in := `{"segments": [{"device": 0, "address": 4096, "total_size": 2097152, "stream": 7,
	  "segment_type": "small", "segment_pool_id": [1, 2], "is_expandable": false, "frames": [],
	  "blocks": [{"address": 4096, "size": 1024, "requested_size": 1000, "state": "active_pending_free",
	              "frames": [{"name": "f", "filename": "a.py", "line": 3}]},
	             {"address": 5120, "size": 2096128, "requested_size": 0, "state": "inactive", "frames": []}]}],
	 "device_traces": [[
	  {"action": "alloc", "addr": 4096, "size": 1000, "stream": 7, "time_us": 10, "compile_context": "N/A",
	   "user_metadata": "step 1", "pool_id": [1, 2], "forward_frames": ["x"],
	   "frames": [{"name": "f", "filename": "a.py", "line": 3}]},
	  {"action": "annotate", "addr": 4096, "size": 0, "stream": 7, "time_us": 11},
	  {"action": "free_requested", "addr": 4096, "size": 1000, "stream": 7, "time_us": 12}]],
	 "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64,roundup_power2_divisions:4",
	   "max_split_size": 67108864, "expandable_segments": false,
	   "roundup_power2_divisions": {"1": 4, "2": 4, "32768": 8}},
	 "external_annotations": [{"stage": "START", "name": "fwd", "device": 0, "time_us": 9, "extra": 1}],
	 "host_segments": []}`
	traces := decodeBytes(t, []byte(in))
	if len(traces) != 1 {
		t.Fatalf("%d traces", len(traces))
	}
	tr := traces[0]
	if len(tr.Mismatches) != 0 {
		t.Errorf("mismatches: %v", tr.Mismatches)
	}
	b := tr.Final.Segments[0].Blocks[0]
	if b.State != gpu.BlockPendingFree || b.Requested != 1000 || tr.Stack(b.Stack)[0].Filename != "a.py" {
		t.Errorf("block %+v", b)
	}
	if tr.Segments[0].PoolID != [2]int64{1, 2} || tr.Final.Segments[0].Pool != gpu.PoolSmall {
		t.Errorf("segment %+v %+v", tr.Segments[0], tr.Final.Segments[0])
	}
	r := tr.Settings.Rules
	if r.MaxSplitSize != 64<<20 || r.RoundupDivisions[0] != 4 || r.RoundupDivisions[1] != 4 || r.RoundupDivisions[15] != 8 {
		t.Errorf("rules %+v", r)
	}
	x := tr.Extra(0)
	if ff, _ := x.Other.Get("forward_frames"); x == nil || x.CompileContext != "N/A" || x.UserMetadata != "step 1" || ff == nil {
		t.Errorf("extra %+v", x)
	}
	if x := tr.Extra(1); x == nil || x.Action != "annotate" || tr.Events[1].Action != gpu.ActionNone {
		t.Errorf("annotate %+v", x)
	}
	if tr.Events[0].BlockSize != 1024 {
		t.Errorf("block size %d", tr.Events[0].BlockSize)
	}
	anns := tr.Annotations()
	if extra, _ := anns[0].Form.other("extra"); len(anns) != 1 || extra != int64(1) {
		t.Errorf("annotations %+v", anns)
	}
	if hs, ok := tr.Snapshot.Other.Get("host_segments"); !ok || hs == nil {
		t.Errorf("top level %+v", tr.Snapshot)
	}
	var out bytes.Buffer
	if err := Export(&out, tr); err != nil {
		t.Fatal(err)
	}
	sameTraces(t, traces, decodeBytes(t, out.Bytes()))
}

// A trace that disagrees with the segments is kept, with the mismatch;
// the event that does not fit is left out of Events.
func TestMismatchRecordedNotFatal(t *testing.T) {
	in := `{"segments": [{"device": 0, "address": 0, "total_size": 2097152, "segment_type": "small",
	  "blocks": [{"size": 2097152, "state": "inactive"}]}],
	 "device_traces": [[{"action": "alloc", "addr": 0, "size": 512, "stream": 0},
	                    {"action": "free_completed", "addr": 99999999, "size": 512, "stream": 0}]]}`
	tr := decodeBytes(t, []byte(in))[0]
	if len(tr.Mismatches) == 0 || tr.Mismatches[0].Event.Seq != 1 {
		t.Fatalf("mismatches %v", tr.Mismatches)
	}
	if len(tr.Events) != 1 || tr.Events[0].Seq != 0 {
		t.Errorf("events %v, want the first only", tr.Events)
	}
	if tr.Mismatches[0].Event.TimeUS != 1 || tr.HasTime {
		t.Errorf("time %d", tr.Mismatches[0].Event.TimeUS)
	}
}

// Every real file of both sets exports to a file that decodes to the same
// traces, all devices together and each alone.
func TestExportRoundTripRealFiles(t *testing.T) {
	for _, path := range realFiles(t) {
		name := filepath.Base(path)
		t.Run(name, func(t *testing.T) { roundTrip(t, path) })
	}
}

// roundTrip is TestExportRoundTripRealFiles of one file, a subtest named
// after it: a file that does not decode fails naming itself, and the
// other files are still tried.
func roundTrip(t *testing.T, path string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := decodeBytes(t, raw)
	var out bytes.Buffer
	if err := Export(&out, want...); err != nil {
		t.Fatal(err)
	}
	got := decodeBytes(t, out.Bytes())
	// Devices below the highest come back as empty traces.
	byDev := map[int]*Trace{}
	for _, g := range got {
		byDev[g.Device] = g
	}
	var matched []*Trace
	for _, w := range want {
		matched = append(matched, byDev[w.Device])
		delete(byDev, w.Device)
	}
	for dev, g := range byDev {
		if len(g.Events)+len(g.Final.Segments) != 0 {
			t.Errorf("device %d appeared with data", dev)
		}
	}
	t.Run("all", func(t *testing.T) { sameTraces(t, want, matched) })
	// One trace alone.
	last := want[len(want)-1]
	out.Reset()
	if err := Export(&out, last); err != nil {
		t.Fatal(err)
	}
	for _, g := range decodeBytes(t, out.Bytes()) {
		if g.Device == last.Device {
			// Alone, its segments come first in the file.
			for i := range g.Segments {
				g.Segments[i].Index = last.Segments[i].Index
			}
			t.Run("alone", func(t *testing.T) { sameTraces(t, []*Trace{last}, []*Trace{g}) })
		}
	}
}

func TestRefusedOpcodes(t *testing.T) {
	cases := map[string][]byte{
		"GLOBAL":       []byte("\x80\x02cposix\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03."),
		"STACK_GLOBAL": []byte("\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x8c\x06system\x93."),
		"REDUCE":       []byte("\x80\x04N)R."),
		"BUILD":        []byte("\x80\x04}}b."),
		"NEWOBJ":       []byte("\x80\x04N)\x81."),
		"EXT1":         []byte("\x80\x04\x82\x01."),
		"BINPERSID":    []byte("\x80\x04NQ."),
		"NEXT_BUFFER":  []byte("\x80\x05\x97."),
		// Protocols 0 and 1 have no PROTO; their dicts and lists start
		// with MARK, EMPTY_DICT or EMPTY_LIST.
		"INST":     []byte("(S'ls'\nios\nsystem\n."),
		"OBJ":      []byte("(N(No."),
		"PERSID":   []byte("]Pid\n."),
		"GLOBAL ":  []byte("(dp0\nVsegments\np1\ncos\nsystem\n."),
		"GLOBAL  ": []byte("}q\x00(X\x08\x00\x00\x00segmentsq\x01cposix\nsystem\nq\x02."),
	}
	for name, in := range cases {
		for _, f := range []func() error{
			func() error { _, err := Unpickle(bytes.NewReader(in)); return err },
			func() error { _, err := Decode(bytes.NewReader(in)); return err },
		} {
			err := f()
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), strings.TrimSpace(name)) || !strings.Contains(err.Error(), "byte offset") {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
}

func TestHostileInputs(t *testing.T) {
	deepMarks := append([]byte("\x80\x04"), bytes.Repeat([]byte("("), 5000)...)
	// l0 = []; l(i+1) = [l(i)], built through the memo with a flat stack.
	chain := []byte("\x80\x04]\x940")
	for i := 0; i < 3000; i++ {
		chain = append(chain, ']', 0x94, 'j', byte(i), byte(i>>8), 0, 0, 'a', '0')
	}
	chain = append(chain, 'j', 3000&255, 3000>>8, 0, 0, '.')
	// Shared references: each list holds the previous one twice, 2^60 leaves.
	laughs := []byte("\x80\x04]\x940")
	for i := 0; i < 60; i++ {
		laughs = append(laughs, ']', 0x94, '(', 'h', byte(i), 'h', byte(i), 'e', '0')
	}
	laughs = append(laughs, 'h', 60, '.')
	cases := map[string]struct {
		in   []byte
		want string
	}{
		"deep marks":         {deepMarks, "nesting deeper than"},
		"deep values":        {chain, "nested deeper than"},
		"shared expansion":   {laughs, "expands to more values"},
		"huge unicode8":      {[]byte("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7fabc"), "more than the limit"},
		"huge binunicode":    {[]byte("\x80\x04X\xff\xff\xff\xffabc"), "more than the limit"},
		"declared not there": {append([]byte("\x80\x04B\x00\x00\x0f\x00"), make([]byte, 1000)...), "truncated"},
		"huge long4":         {[]byte("\x80\x04\x8b\xff\xff\xff\x7f\x01"), "more than the limit"},
		"unset memo":         {[]byte("\x80\x04h\x05."), "never set"},
		"far memo":           {[]byte("\x80\x04Kdr\x00\x00\x00\xf00j\x00\x00\x00\xf0."), ""},
		"bad protocol":       {[]byte("\x80\x09N."), "protocol 9"},
		"stop early":         {[]byte("\x80\x04K\x01K\x02."), "STOP with 2 values"},
		"append to int":      {[]byte("\x80\x04K\x01K\x02a."), "appending to a int"},
	}
	for name, c := range cases {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := Unpickle(bytes.NewReader(c.in))
		runtime.ReadMemStats(&after)
		if c.want == "" {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		} else if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", name, err, c.want)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
			t.Errorf("%s: allocated %d MiB", name, grew>>20)
		}
	}
}

func TestTruncatedEverywhere(t *testing.T) {
	for _, name := range []string{"two_gpus_expandable_state_only.pickle", "empty_four_devices.pickle"} {
		raw := readReal(t, name)
		for i := 0; i < len(raw); i++ {
			_, err := Decode(bytes.NewReader(raw[:i]))
			if err == nil {
				t.Fatalf("%s cut at %d decoded", name, i)
			}
			var pe *Error
			if i > 0 && (!errors.As(err, &pe) || pe.Offset > int64(i)) {
				t.Fatalf("%s cut at %d: %v", name, i, err)
			}
		}
	}
}

// Frame lines are unsigned 64-bit: 2^64-1 (a 9-byte LONG1) decodes, and
// anything wider is clamped with a warning.
func TestWideLines(t *testing.T) {
	raw := readReal(t, "uint64_line_annotations.pickle")
	found := false
	for _, st := range decodeBytes(t, raw)[0].Stacks {
		for _, f := range st {
			found = found || f.Line == 1<<64-1
		}
	}
	if !found {
		t.Error("no frame with line 2^64-1")
	}
	in := `{"segments": [{"device": 0, "address": 0, "total_size": 512, "frames": [{"name": "f", "filename": "a", "line": 36893488147419103232}],
	 "blocks": [{"size": 512, "state": "inactive"}]}]}`
	tr := decodeBytes(t, []byte(in))[0]
	if len(tr.Warnings) != 1 || tr.Stack(tr.Segments[0].Stack)[0].Line != 1<<64-1 {
		t.Errorf("warnings %v stacks %v", tr.Warnings, tr.Stacks)
	}
}

// Protocol 0's text opcodes: Python 2's quoted STRING with its escapes,
// and malformed or cut arguments named with their byte offset.
func TestProtocol0Text(t *testing.T) {
	v, err := Unpickle(strings.NewReader("(dp0\nS'k'\np1\nS'a\\n\\x41\\101\\'q'\np2\nsVx\\u00e9\nI01\ns."))
	if err != nil {
		t.Fatal(err)
	}
	if want := (Dict{{"k", "a\nAA'q"}, {"xé", true}}); !reflect.DeepEqual(v, want) {
		t.Errorf("got %#v, want %#v", v, want)
	}
	for in, want := range map[string]string{
		"(dp0\nS'k\np1\n":      "byte offset 5: STRING: the argument must be quoted",
		"(S'\\xff'\n.":         "byte offset 1: STRING: malformed argument",
		"(dp0\nVsegm":          "byte offset 5: input ends inside the argument of UNICODE",
		"(dp0\nI12x\n":         "byte offset 5: INT: malformed argument",
		"(lp0\ng7\n.":          "byte offset 5: GET: memo slot 7 was never set",
		"\x80\x06}.":           "byte offset 0: pickle protocol 6 is not supported",
		"}q\x00(X\x02\x00\x00": "byte offset 4: input ends inside the argument of BINUNICODE",
	} {
		if _, err := Unpickle(strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}

// An event list keeps millions of events in order, its first chunks
// small, and gathers them into one slice.
func TestEventListChunks(t *testing.T) {
	var el eventList
	const n = 3 * eventChunk * 25
	room := 0
	for i := range n {
		room += el.add(gpu.Event{Seq: int64(i)})
	}
	if room >= n+eventChunk || cap(el.chunks[0]) != 64 {
		t.Fatalf("room for %d events in %d chunks, the first of %d", room, len(el.chunks), cap(el.chunks[0]))
	}
	all := el.all()
	if len(all) != n || el.n != n {
		t.Fatalf("%d events gathered of %d", len(all), n)
	}
	for i, e := range all {
		if e.Seq != int64(i) {
			t.Fatalf("event %d has seq %d", i, e.Seq)
		}
	}
	if again := el.all(); &again[0] != &all[0] {
		t.Error("a second all() gathered again")
	}
}
