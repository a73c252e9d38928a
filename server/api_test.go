package server

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/static"
	"vramscope/store"
)

// fixture is one server over a database holding one recorded trace.
type fixture struct {
	db    *store.DB
	srv   *httptest.Server
	id    string
	trace gpu.Trace
	final string // the allocator's own memory_summary() at the end
}

func newFixture(t *testing.T, opt Options) *fixture {
	t.Helper()
	db := testkit.OpenDB(t)
	id, st, err := record(db, "fixture "+xssFrame, workload{Steps: 4, Layers: 6, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := db.Trace(id)
	if err != nil {
		t.Fatal(err)
	}
	opt.DB = db
	opt.Logger = quietLogger()
	srv := httptest.NewServer(New(opt).Handler())
	t.Cleanup(srv.Close)
	return &fixture{db: db, srv: srv, id: id, trace: tr, final: st.Summary(0, false)}
}

func (f *fixture) get(t *testing.T, path string, want int) []byte {
	t.Helper()
	res, err := http.Get(f.srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != want {
		t.Fatalf("GET %s: status %d, want %d: %s", path, res.StatusCode, want, b)
	}
	return b
}

func (f *fixture) getJSON(t *testing.T, path string, v any) {
	t.Helper()
	if err := json.Unmarshal(f.get(t, path, http.StatusOK), v); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

func errorOf(t *testing.T, b []byte) string {
	t.Helper()
	var e struct{ Error string }
	if err := json.Unmarshal(b, &e); err != nil || e.Error == "" {
		t.Fatalf("not a JSON error: %s", b)
	}
	return e.Error
}

func TestTracesListAndGet(t *testing.T) { testkit.EachBackend(t, testTracesListAndGet) }

func testTracesListAndGet(t *testing.T) {
	f := newFixture(t, Options{})
	var list struct{ Traces []gpu.Trace }
	f.getJSON(t, "/api/traces", &list)
	if len(list.Traces) != 1 || list.Traces[0].ID != f.id {
		t.Fatalf("list = %+v", list)
	}
	tr := list.Traces[0]
	if tr.Events == 0 || tr.PeakAllocated == 0 || tr.PeakReserved < tr.PeakAllocated || tr.Status != gpu.StatusComplete {
		t.Fatalf("trace = %+v", tr)
	}
	var one gpu.Trace
	f.getJSON(t, "/api/traces/"+f.id, &one)
	if one.ID != f.id || one.Events != tr.Events {
		t.Fatalf("trace = %+v", one)
	}
	if e := errorOf(t, f.get(t, "/api/traces/nope", http.StatusNotFound)); !strings.Contains(e, "nope") {
		t.Fatalf("error %q does not name the trace", e)
	}
	errorOf(t, f.get(t, "/api/nothing", http.StatusNotFound))
}

func TestBadParametersAreNamed(t *testing.T) { testkit.EachBackend(t, testBadParametersAreNamed) }

func testBadParametersAreNamed(t *testing.T) {
	f := newFixture(t, Options{})
	base := "/api/traces/" + f.id
	for path, param := range map[string]string{
		base + "/usage?t1=5":                 "t0",
		base + "/usage?t0=5":                 "t1",
		base + "/usage?t0=x&t1=5":            "t0",
		base + "/usage?t0=9&t1=5":            "t1",
		base + "/usage?t0=1&t1=5&n=0":        "n",
		base + "/bands?t0=1&t1=5&w=5&h=1":    "h",
		base + "/layout":                     "t",
		base + "/summary?t=1&abbreviated=no": "abbreviated",
		base + "/events?from=5&to=1":         "to",
		base + "/events?from=0&to=100000":    "to",
		base + "/allocations/x":              "seq",
		base + "/stacks/0":                   "sid",
	} {
		e := errorOf(t, f.get(t, path, http.StatusBadRequest))
		if !strings.Contains(e, "parameter "+param) {
			t.Errorf("GET %s: error %q does not name parameter %s", path, e, param)
		}
	}
	for _, path := range []string{"/usage?t0=1&t1=5", "/bands?t0=1&t1=5", "/layout?t=1", "/summary?t=1", "/events?from=0&to=5", "/allocations/0"} {
		errorOf(t, f.get(t, "/api/traces/unknown"+path, http.StatusNotFound))
	}
}

func TestUsageFollowsTheTrace(t *testing.T) { testkit.EachBackend(t, testUsageFollowsTheTrace) }

func testUsageFollowsTheTrace(t *testing.T) {
	f := newFixture(t, Options{})
	tr := f.trace
	var u store.UsageColumns
	f.getJSON(t, "/api/traces/"+f.id+"/usage?t0="+itoa(tr.FirstUS)+"&t1="+itoa(tr.LastUS)+"&n=200", &u)
	if n := len(u.Events); n == 0 || n > 200 || len(u.Reserved) != 2*n || len(u.Allocated) != 2*n {
		t.Fatalf("%d buckets, %d reserved values", n, len(u.Reserved))
	}
	var peakA, peakR uint64
	var events int64
	for i := range u.Events {
		events += u.Events[i]
		peakA = max(peakA, u.Allocated[2*i+1])
		peakR = max(peakR, u.Reserved[2*i+1])
		if u.Allocated[2*i] > u.Allocated[2*i+1] || u.Allocated[2*i+1] > u.Reserved[2*i+1] {
			t.Fatalf("bucket %d: allocated %d..%d, reserved max %d", i, u.Allocated[2*i], u.Allocated[2*i+1], u.Reserved[2*i+1])
		}
	}
	if peakA != tr.PeakAllocated || peakR != tr.PeakReserved || events != tr.Events {
		t.Fatalf("peaks %d/%d events %d, trace says %d/%d events %d", peakA, peakR, events, tr.PeakAllocated, tr.PeakReserved, tr.Events)
	}
}

func TestBandsStackUnderAllocated(t *testing.T) { testkit.EachBackend(t, testBandsStackUnderAllocated) }

func testBandsStackUnderAllocated(t *testing.T) {
	f := newFixture(t, Options{})
	tr := f.trace
	window := "/api/traces/" + f.id + "/bands?t0=" + itoa(tr.FirstUS) + "&t1=" + itoa(tr.LastUS) + "&w=300&h=200"
	check := func(b *store.Bands) {
		t.Helper()
		if len(b.Bands) == 0 || len(b.Allocated) != 300 || b.YMax != tr.PeakReserved || b.M1 <= b.M0 {
			t.Fatalf("%d bands, %d columns, y_max %d (peak reserved %d), range [%d, %d)", len(b.Bands), len(b.Allocated), b.YMax, tr.PeakReserved, b.M0, b.M1)
		}
		if b.MinBytes != (b.M1-b.M0+199)/200 {
			t.Fatalf("min_bytes %d for the range [%d, %d) over 200 rows", b.MinBytes, b.M0, b.M1)
		}
		for _, band := range b.Bands {
			if band.Size < b.MinBytes {
				t.Fatalf("band %d is %d bytes, under a pixel (%d)", band.Seq, band.Size, b.MinBytes)
			}
			if len(band.Runs) == 0 || band.Runs[0] != int64(band.C0) {
				t.Fatalf("band %d: runs %v do not start at c0 %d", band.Seq, band.Runs, band.C0)
			}
		}
		// In every column the bands stack without overlap, under the
		// allocated envelope, and each reaches into the range somewhere.
		reaches := map[int64]bool{}
		for c := 0; c < 300; c++ {
			type span struct{ lo, hi uint64 }
			var spans []span
			for _, band := range b.Bands {
				if c < band.C0 || c > band.C1 {
					continue
				}
				off := band.Runs[1]
				for r := 0; r < len(band.Runs) && band.Runs[r] <= int64(c); r += 2 {
					off = band.Runs[r+1]
				}
				spans = append(spans, span{uint64(off), uint64(off) + band.Size})
				if uint64(off) < b.M1 && uint64(off)+band.Size > b.M0 {
					reaches[band.Seq] = true
				}
			}
			sort.Slice(spans, func(i, j int) bool { return spans[i].lo < spans[j].lo })
			for i, sp := range spans {
				if i > 0 && sp.lo < spans[i-1].hi || sp.hi > b.Allocated[c] {
					t.Fatalf("column %d: band [%d, %d) overlaps or passes the allocated %d", c, sp.lo, sp.hi, b.Allocated[c])
				}
			}
		}
		if len(reaches) != len(b.Bands) {
			t.Fatalf("%d of %d bands never reach the range", len(b.Bands)-len(reaches), len(b.Bands))
		}
	}
	var whole store.Bands
	f.getJSON(t, window, &whole)
	check(&whole)
	// A narrow memory range at the activations' level: smaller allocations
	// become bands, and the 200 KiB temporaries can be reached.
	var narrow store.Bands
	f.getJSON(t, window+"&m0="+itoa(int64(whole.M1/2))+"&m1="+itoa(int64(whole.M1/2+16<<20)), &narrow)
	check(&narrow)
	if narrow.MinBytes >= 200<<10 || narrow.M0 != whole.M1/2 {
		t.Fatalf("narrow range [%d, %d): min_bytes %d", narrow.M0, narrow.M1, narrow.MinBytes)
	}
	for _, q := range []string{"&m0=5", "&m1=5", "&m0=9&m1=9", "&m0=-1&m1=9", "&format=xml"} {
		e := errorOf(t, f.get(t, window+q, http.StatusBadRequest))
		if !strings.Contains(e, "parameter m") && !strings.Contains(e, "parameter format") {
			t.Errorf("%s: %q", q, e)
		}
	}
	// The binary form holds the same answer.
	body := f.get(t, window+"&format=bin", http.StatusOK)
	if got := decodeBandsBinary(t, body); !reflect.DeepEqual(got, whole) {
		t.Fatalf("binary bands differ from JSON:\n%+v\n%+v", got.Bands[:1], whole.Bands[:1])
	}
	if len(body) >= len(mustJSON(t, whole)) {
		t.Errorf("binary bands are %d bytes, JSON %d", len(body), len(mustJSON(t, whole)))
	}
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decodeBandsBinary reads the binary form back, as the page does.
func decodeBandsBinary(t *testing.T, b []byte) store.Bands {
	t.Helper()
	if string(b[:4]) != "VSB2" {
		t.Fatalf("tag %q", b[:4])
	}
	u := func(i int) int { return int(binary.LittleEndian.Uint32(b[4+4*i:])) }
	w, nb, nr, nf, ng := u(0), u(1), u(2), u(6), u(7)
	at := 40
	f := func() float64 { v := math.Float64frombits(binary.LittleEndian.Uint64(b[at:])); at += 8; return v }
	o := store.Bands{W: w, Dropped: u(3), Samples: u(4), Sampled: "columns", Events: u(5)&2 != 0, Allocated: make([]uint64, w),
		Bands: make([]store.Band, nb), Folds: make([]store.Fold, nf)}
	if u(5)&1 != 0 {
		o.Sampled = "checkpoints"
	}
	o.T0, o.T1, o.M0, o.M1, o.YMax, o.MinBytes = int64(f()), int64(f()), uint64(f()), uint64(f()), uint64(f()), uint64(f())
	for i := range o.Allocated {
		o.Allocated[i] = uint64(f())
	}
	band := func(of func(i int) *store.Band, n int) {
		for i := range n {
			of(i).Seq = int64(f())
		}
		for i := range n {
			of(i).Addr = uint64(f())
		}
		for i := range n {
			of(i).Size = uint64(f())
		}
		for i := range n {
			of(i).Requested = uint64(f())
		}
	}
	band(func(i int) *store.Band { return &o.Bands[i] }, nb)
	offs := make([]float64, nr)
	for i := range offs {
		offs[i] = f()
	}
	for i := range o.Folds {
		o.Folds[i].Offset = uint64(f())
	}
	for i := range o.Folds {
		o.Folds[i].Size = uint64(f())
	}
	band(func(i int) *store.Band { return &o.Folds[i].Rep }, nf)
	g := func() int { v := int(binary.LittleEndian.Uint32(b[at:])); at += 4; return v }
	for i := range o.Bands {
		o.Bands[i].Stack = gpu.StackID(g())
	}
	for i := range o.Bands {
		o.Bands[i].C0 = g()
	}
	for i := range o.Bands {
		o.Bands[i].C1 = g()
	}
	first := make([]int, nb+1)
	for i := range first {
		first[i] = g()
	}
	cols := make([]int, nr)
	for i := range cols {
		cols[i] = g()
	}
	for i := range o.Folds {
		o.Folds[i].C0 = g()
	}
	for i := range o.Folds {
		o.Folds[i].C1 = g()
	}
	for i := range o.Folds {
		o.Folds[i].Group = uint32(g())
	}
	for i := range o.Folds {
		o.Folds[i].Count = g()
	}
	for i := range o.Folds {
		o.Folds[i].Rep.Stack = gpu.StackID(g())
	}
	if err := json.Unmarshal(b[at:at+ng], &o.Groups); err != nil {
		t.Fatal(err)
	}
	if at += ng; at != len(b) {
		t.Fatalf("read %d of %d bytes", at, len(b))
	}
	for i := range o.Bands {
		for r := first[i]; r < first[i+1]; r++ {
			o.Bands[i].Runs = append(o.Bands[i].Runs, int64(cols[r]), int64(offs[r]))
		}
	}
	return o
}

func TestLayoutAndSummaryAtTheEnd(t *testing.T) { testkit.EachBackend(t, testLayoutAndSummaryAtTheEnd) }

func testLayoutAndSummaryAtTheEnd(t *testing.T) {
	f := newFixture(t, Options{})
	tr := f.trace
	var l store.LayoutColumns
	mid := (tr.FirstUS + tr.LastUS) / 2
	f.getJSON(t, "/api/traces/"+f.id+"/layout?t="+itoa(mid), &l)
	if l.SegmentCount == 0 || len(l.Segments) != store.SegmentColumns*l.SegmentCount || len(l.Blocks) != store.BlockColumns*l.BlockCount {
		t.Fatalf("layout: %d segments (%d values), %d blocks (%d values)", l.SegmentCount, len(l.Segments), l.BlockCount, len(l.Blocks))
	}
	var reserved, allocated int64
	for i := 0; i < len(l.Segments); i += store.SegmentColumns {
		reserved += l.Segments[i+1]
	}
	for i := 0; i < len(l.Blocks); i += store.BlockColumns {
		if l.Blocks[i+3] == 1 {
			allocated += l.Blocks[i+1]
		}
	}
	if uint64(reserved) != l.Figures.Reserved || uint64(allocated) != l.Figures.Allocated {
		t.Fatalf("blocks sum to %d reserved, %d allocated; figures say %+v", reserved, allocated, l.Figures)
	}
	// At the end the rebuilt statistics are the allocator's own.
	got := string(f.get(t, "/api/traces/"+f.id+"/summary?t="+itoa(tr.LastUS), http.StatusOK))
	gl, wl := strings.Split(got, "\n"), strings.Split(f.final, "\n")
	if len(gl) != len(wl) {
		t.Fatalf("summary has %d lines, want %d:\n%s", len(gl), len(wl), got)
	}
	for i := range gl {
		if gl[i] != wl[i] {
			t.Errorf("line %d:\n got %q\nwant %q", i, gl[i], wl[i])
		}
	}
}

func TestAllocationEventsAndStack(t *testing.T) { testkit.EachBackend(t, testAllocationEventsAndStack) }

func testAllocationEventsAndStack(t *testing.T) {
	f := newFixture(t, Options{})
	var l store.LayoutColumns
	f.getJSON(t, "/api/traces/"+f.id+"/layout?t="+itoa((f.trace.FirstUS+f.trace.LastUS)/2), &l)
	var seq int64 = -1
	for i := 0; i < len(l.Blocks); i += store.BlockColumns {
		if l.Blocks[i+3] == 1 && l.Blocks[i+1] == 96<<20 {
			seq = l.Blocks[i+4]
		}
	}
	if seq < 0 {
		t.Fatal("the 96 MiB parameter is not in the layout")
	}
	var a allocationJSON
	f.getJSON(t, "/api/traces/"+f.id+"/allocations/"+itoa(seq), &a)
	if a.Size != 96<<20 || len(a.Frames) != 1 || a.Frames[0].Name != xssFrame {
		t.Fatalf("allocation = %+v", a)
	}
	if len(a.Events) != 3 || a.Events[0].Action != "alloc" || a.Events[1].Action != "free_requested" || a.Events[2].Action != "free_completed" {
		t.Fatalf("events = %+v", a.Events)
	}
	var st struct{ Frames []struct{ Name string } }
	f.getJSON(t, "/api/traces/"+f.id+"/stacks/"+itoa(int64(a.Stack)), &st)
	if len(st.Frames) != 1 || st.Frames[0].Name != xssFrame {
		t.Fatalf("stack = %+v", st)
	}
	errorOf(t, f.get(t, "/api/traces/"+f.id+"/allocations/99999999", http.StatusNotFound))
	var evs struct{ Events []eventJSON }
	f.getJSON(t, "/api/traces/"+f.id+"/events?from=0&to=10", &evs)
	if len(evs.Events) != 10 || evs.Events[0].Seq != 0 {
		t.Fatalf("events = %+v", evs)
	}
}

var scriptTag = regexp.MustCompile(`<script[^>]*>`)

func TestPagesAreSafeAndCached(t *testing.T) { testkit.EachBackend(t, testPagesAreSafeAndCached) }

func testPagesAreSafeAndCached(t *testing.T) {
	f := newFixture(t, Options{})
	for _, path := range []string{"/", "/traces/" + f.id} {
		res, err := http.Get(f.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("%s: %d", path, res.StatusCode)
		}
		h := res.Header
		if !strings.Contains(h.Get("Content-Security-Policy"), "script-src 'self'") ||
			!strings.Contains(h.Get("Content-Security-Policy"), "frame-ancestors 'none'") ||
			!strings.HasPrefix(h.Get("Content-Security-Policy"), "default-src 'none';") ||
			!strings.Contains(h.Get("Content-Security-Policy"), "require-trusted-types-for 'script'; trusted-types 'none'") ||
			h.Get("Cross-Origin-Opener-Policy") != "same-origin" || h.Get("Cross-Origin-Resource-Policy") != "same-origin" ||
			h.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("%s: security headers %v", path, h)
		}
		for _, tag := range scriptTag.FindAllString(string(body), -1) {
			if !strings.Contains(tag, `src="`+static.Prefix()) {
				t.Fatalf("%s: inline or foreign script %s", path, tag)
			}
		}
		if strings.Contains(string(body), xssFrame) || !strings.Contains(string(body), "&lt;img src=x onerror=alert(1)&gt;") {
			t.Fatalf("%s: the trace name is not escaped", path)
		}
	}
	f.get(t, "/traces/nope", http.StatusNotFound)

	url := f.srv.URL + static.Prefix() + "view.js"
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	etag := res.Header.Get("ETag")
	if res.StatusCode != 200 || etag == "" || !strings.Contains(res.Header.Get("Cache-Control"), "immutable") ||
		!strings.HasPrefix(res.Header.Get("Content-Type"), "text/javascript") {
		t.Fatalf("static: %d %v", res.StatusCode, res.Header)
	}
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("If-None-Match", etag)
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNotModified {
		t.Fatalf("conditional GET: %d", res.StatusCode)
	}
	f.get(t, "/static/"+static.Version+"/nope.js", http.StatusNotFound)
}

func post(t *testing.T, url string, body io.Reader) (int, []byte) {
	t.Helper()
	res, err := http.Post(url, "application/octet-stream", body)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

func TestUploadAndDelete(t *testing.T) { testkit.EachBackend(t, testUploadAndDelete) }

func testUploadAndDelete(t *testing.T) {
	f := newFixture(t, Options{MaxUploadBytes: 3 << 20})
	path := testkit.Snapshot(t, "oom_nonexpandable.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	code, b := post(t, f.srv.URL+"/api/traces?name=oom_nonexpandable.json", bytes.NewReader(data))
	if code != http.StatusCreated {
		t.Fatalf("upload: %d %s", code, b)
	}
	var up uploadJSON
	json.Unmarshal(b, &up)
	if len(up.Traces) == 0 || up.URL != "/traces/"+up.Traces[0].ID || up.Traces[0].Source != gpu.SourceSnapshot {
		t.Fatalf("upload = %s", b)
	}
	f.get(t, up.URL, http.StatusOK)

	code, b = post(t, f.srv.URL+"/api/traces?name=x", strings.NewReader("hello, not a pickle"))
	if code != http.StatusBadRequest || !strings.Contains(errorOf(t, b), "snapshot") {
		t.Fatalf("bad upload: %d %s", code, b)
	}
	code, b = post(t, f.srv.URL+"/api/traces", bytes.NewReader(make([]byte, 4<<20)))
	if code != http.StatusRequestEntityTooLarge {
		t.Fatalf("large upload: %d %s", code, b)
	}
	errorOf(t, b)
	if traces, _ := f.db.Traces(); len(traces) != 1+len(up.Traces) {
		t.Fatalf("refused uploads left traces: %d", len(traces))
	}

	req, _ := http.NewRequest("DELETE", f.srv.URL+"/api/traces/"+up.Traces[0].ID, nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNoContent {
		t.Fatalf("delete: %d", res.StatusCode)
	}
	f.get(t, "/api/traces/"+up.Traces[0].ID, http.StatusNotFound)
	res, _ = http.DefaultClient.Do(req)
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound {
		t.Fatalf("second delete: %d", res.StatusCode)
	}
}

func TestTokenGuardsWrites(t *testing.T) { testkit.EachBackend(t, testTokenGuardsWrites) }

func testTokenGuardsWrites(t *testing.T) {
	f := newFixture(t, Options{Token: "s3cret"})
	req, _ := http.NewRequest("DELETE", f.srv.URL+"/api/traces/"+f.id, nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("delete without token: %d", res.StatusCode)
	}
	req.Header.Set("Authorization", "Bearer s3cret")
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNoContent {
		t.Fatalf("delete with token: %d", res.StatusCode)
	}
}

func itoa(n int64) string { return strconvI(n) }

// TestCrossSiteWritesRefused: a page on another site cannot upload or
// delete through the user's browser, even with no token configured.
func TestCrossSiteWritesRefused(t *testing.T) { testkit.EachBackend(t, testCrossSiteWritesRefused) }

func testCrossSiteWritesRefused(t *testing.T) {
	f := newFixture(t, Options{})
	body := strings.NewReader("\x80\x04N.")
	for _, h := range []map[string]string{{"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}} {
		for _, req := range []*http.Request{
			mustReq(t, http.MethodPost, f.srv.URL+"/api/traces?name=x", body),
			mustReq(t, http.MethodDelete, f.srv.URL+"/api/traces/"+f.id, nil),
		} {
			for k, v := range h {
				req.Header.Set(k, v)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusForbidden {
				t.Errorf("%s %s with %v: status %d, want 403", req.Method, req.URL.Path, h, res.StatusCode)
			}
		}
	}
	if _, err := f.db.Trace(f.id); err != nil {
		t.Fatalf("the trace went: %v", err)
	}
	// The page's own origin may write.
	req := mustReq(t, http.MethodDelete, f.srv.URL+"/api/traces/"+f.id, nil)
	req.Header.Set("Origin", f.srv.URL)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNoContent {
		t.Errorf("same-origin delete: status %d", res.StatusCode)
	}
}

func mustReq(t *testing.T, method, url string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return req
}
