package server

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"os"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/store"
	"vramscope/web"
)

// form is a multipart body of files under the names given (folders and
// all, as a browser sends a dropped folder).
func form(t *testing.T, files map[string][]byte, order ...string) (string, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, name := range order {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="file"; filename="`+name+`"`)
		h.Set("Content-Type", "application/octet-stream")
		w, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(files[name])
	}
	mw.WriteField("note", "not a file")
	mw.Close()
	return mw.FormDataContentType(), &buf
}

func postAs(t *testing.T, url, contentType string, body io.Reader) (int, []byte) {
	t.Helper()
	res, err := http.Post(url, contentType, body)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

func readSnapshot(t *testing.T, name string) []byte {
	t.Helper()
	b, err := io.ReadAll(must(t, testkit.Snapshot(t, name)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The two-GPU and the multi-GPU shared snapshots uploaded as one run, the
// ranks in the folders a browser names: the run, its page, its heatmap,
// each trace's run, and its deletion.
func TestUploadRun(t *testing.T) { testkit.EachBackend(t, testUploadRun) }

func testUploadRun(t *testing.T) {
	f := newFixture(t, Options{})
	files := map[string][]byte{
		"job/rank1/snapshot.pickle": readSnapshot(t, "expandable_oom_multigpu.pickle"),
		"job/rank0/snapshot.pickle": readSnapshot(t, "two_gpus_expandable_state_only.pickle"),
	}
	ct, body := form(t, files, "job/rank1/snapshot.pickle", "job/rank0/snapshot.pickle")
	code, b := postAs(t, f.srv.URL+"/api/traces?run=job", ct, body)
	if code != http.StatusCreated {
		t.Fatalf("upload: %d %s", code, b)
	}
	var up runUploadJSON
	if err := json.Unmarshal(b, &up); err != nil {
		t.Fatal(err)
	}
	if up.URL != "/runs/"+up.Run || len(up.Ranks) != 2 || up.Ranks[0].Rank != 0 || up.Ranks[0].File != "job/rank0/snapshot.pickle" ||
		len(up.Ranks[0].Traces) != 2 || len(up.Ranks[1].Traces) != 3 || len(up.Traces) != 5 {
		t.Fatalf("answer %s", b)
	}
	var run gpu.Run
	f.getJSON(t, "/api/runs/"+up.Run, &run)
	if run.Name != "job" || len(run.Ranks) != 2 || run.Ranks[1].Traces[1].OOMs != 1 {
		t.Fatalf("run %+v", run)
	}
	page := string(f.get(t, up.URL, http.StatusOK))
	if !strings.Contains(page, `id="heatmap"`) || !strings.Contains(page, "rank 1 · cuda:2") {
		t.Errorf("run page:\n%s", page)
	}
	// The list folds the run's five traces into one row, with the highest
	// peak of any rank and its OOM; the fixture's trace keeps its own.
	list := string(f.get(t, "/", http.StatusOK))
	if n := strings.Count(list, `class="run-row"`); n != 1 || !strings.Contains(list, `data-run="`+up.Run+`"`) ||
		!strings.Contains(list, "2 ranks, 5 traces") || strings.Count(list, "<tr data-id=") != 1 {
		t.Errorf("list: %d run rows\n%s", n, list)
	}
	var peak uint64
	for _, tr := range up.Traces {
		peak = max(peak, tr.PeakReserved)
	}
	if !strings.Contains(list, `<td class="num">`+web.Bytes(peak)+`</td>`) {
		t.Errorf("the list does not show the run's peak %s", web.Bytes(peak))
	}
	if !strings.Contains(string(f.get(t, "/?name=JOB", http.StatusOK)), `data-run="`+up.Run+`"`) {
		t.Error("the list's name filter does not find the run by its name")
	}
	var h store.Heatmap
	f.getJSON(t, "/api/runs/"+up.Run+"/heatmap?series=reserved&n=50", &h)
	if h.Series != "reserved" || len(h.Rows) != 5 || len(h.Rows[0].Max) == 0 || len(h.Rows[0].Max) > 50 || h.Rows[3].OOMSeq < 0 {
		t.Fatalf("heatmap %+v", h)
	}
	var tr traceJSON
	f.getJSON(t, "/api/traces/"+up.Ranks[1].Traces[0], &tr)
	if tr.Run == nil || tr.Run.ID != up.Run || tr.Run.Rank != 1 {
		t.Errorf("the trace's run: %+v", tr.Run)
	}
	for _, bad := range []string{"?series=active", "?n=0", "?n=5000", "?t0=10&t1=5", "?t0=x"} {
		b := f.get(t, "/api/runs/"+up.Run+"/heatmap"+bad, http.StatusBadRequest)
		if e := errorOf(t, b); !strings.Contains(e, "parameter") {
			t.Errorf("%s: %s", bad, e)
		}
	}
	f.get(t, "/runs/nonesuch", http.StatusNotFound)
	errorOf(t, f.get(t, "/api/runs/nonesuch", http.StatusNotFound))
	errorOf(t, f.get(t, "/api/runs/nonesuch/heatmap", http.StatusNotFound))

	res, err := http.DefaultClient.Do(mustReq(t, http.MethodDelete, f.srv.URL+"/api/runs/"+up.Run, nil))
	if err != nil || res.StatusCode != http.StatusNoContent {
		t.Fatalf("delete: %v %v", res.Status, err)
	}
	f.get(t, "/api/runs/"+up.Run, http.StatusNotFound)
	f.get(t, "/api/traces/"+up.Ranks[0].Traces[0], http.StatusNotFound)
	if ts, _ := f.db.Traces(); len(ts) != 1 {
		t.Errorf("%d traces left, want the fixture's", len(ts))
	}
}

// A tar body is a run; a bad file in a run, or ranks that do not fit the
// files, are the client's mistakes, and nothing is kept.
func TestUploadRunTarAndRefusals(t *testing.T) { testkit.EachBackend(t, testUploadRunTarAndRefusals) }

func testUploadRunTarAndRefusals(t *testing.T) {
	f := newFixture(t, Options{})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range []string{"rank0.pickle", "rank1.pickle"} {
		body := readSnapshot(t, "settings_no_annotations.pickle")
		tw.WriteHeader(&tar.Header{Name: name, Size: int64(len(body)), Mode: 0o644, Typeflag: tar.TypeReg})
		tw.Write(body)
	}
	tw.Close()
	tarred := buf.Bytes()
	code, b := post(t, f.srv.URL+"/api/traces?name=job.tar", bytes.NewReader(tarred))
	if code != http.StatusCreated {
		t.Fatalf("tar: %d %s", code, b)
	}
	var up runUploadJSON
	json.Unmarshal(b, &up)
	var run gpu.Run
	f.getJSON(t, "/api/runs/"+up.Run, &run)
	if run.Name != "job" || len(run.Ranks) != 2 {
		t.Fatalf("run %+v", run)
	}
	before, _ := f.db.Traces()

	files := map[string][]byte{"rank0.pickle": readSnapshot(t, "settings_no_annotations.pickle"), "rank1.pickle": []byte("\x80\x04garbage")}
	ct, body := form(t, files, "rank0.pickle", "rank1.pickle")
	code, b = postAs(t, f.srv.URL+"/api/traces?run=bad", ct, body)
	if code != http.StatusBadRequest || !strings.Contains(errorOf(t, b), "rank1.pickle") {
		t.Fatalf("a bad rank: %d %s", code, b)
	}
	code, b = post(t, f.srv.URL+"/api/traces?ranks=0", bytes.NewReader(tarred))
	if msg := errorOf(t, b); code != http.StatusBadRequest || !strings.HasPrefix(msg, "the run was refused: 1 ranks given") {
		t.Fatalf("one rank for two files: %d %s", code, b)
	}
	code, b = post(t, f.srv.URL+"/api/traces?run=%20", bytes.NewReader(tarred))
	if code != http.StatusBadRequest || !strings.Contains(errorOf(t, b), "no name") {
		t.Fatalf("a run named by a space: %d %s", code, b)
	}
	ct, body = form(t, files, "rank0.pickle")
	code, b = postAs(t, f.srv.URL+"/api/traces", strings.Replace(ct, "boundary=", "boundary=x", 1), body)
	if code != http.StatusBadRequest || !strings.Contains(errorOf(t, b), "boundary") {
		t.Fatalf("a form whose boundary is not the Content-Type's: %d %s", code, b)
	}
	code, b = post(t, f.srv.URL+"/api/traces?ranks=0,x", bytes.NewReader(tarred))
	if code != http.StatusBadRequest {
		t.Fatalf("a bad rank list: %d %s", code, b)
	}
	if after, _ := f.db.Traces(); len(after) != len(before) {
		t.Errorf("refused runs left %d traces", len(after)-len(before))
	}
	// One file with ?run= is a run of one rank.
	code, b = post(t, f.srv.URL+"/api/traces?run=solo&name=rank4.pickle", bytes.NewReader(files["rank0.pickle"]))
	if code != http.StatusCreated {
		t.Fatalf("one file: %d %s", code, b)
	}
	json.Unmarshal(b, &up)
	if len(up.Ranks) != 1 || up.Ranks[0].Rank != 4 {
		t.Errorf("one file: %s", b)
	}
}

// A form of several files without ?run= is refused whole: its first file
// alone is not what was sent. A form of one file (and other fields) is
// that file.
func TestUploadFormOfSeveralFilesNeedsRun(t *testing.T) {
	testkit.EachBackend(t, testUploadFormOfSeveralFilesNeedsRun)
}

func testUploadFormOfSeveralFilesNeedsRun(t *testing.T) {
	f := newFixture(t, Options{})
	before, _ := f.db.Traces()
	snap := readSnapshot(t, "settings_no_annotations.pickle")
	ct, body := form(t, map[string][]byte{"a.pickle": snap, "b.pickle": snap[:len(snap)/2]}, "a.pickle", "b.pickle")
	code, b := postAs(t, f.srv.URL+"/api/traces", ct, body)
	if code != http.StatusBadRequest {
		t.Fatalf("two files: %d %s", code, b)
	}
	if msg := errorOf(t, b); !strings.Contains(msg, `"b.pickle"`) || !strings.Contains(msg, "?run=") {
		t.Errorf("two files: %s", msg)
	}
	if after, _ := f.db.Traces(); len(after) != len(before) {
		t.Fatalf("a refused form left %d traces", len(after)-len(before))
	}
	ct, body = form(t, map[string][]byte{"a.pickle": snap}, "a.pickle")
	code, b = postAs(t, f.srv.URL+"/api/traces", ct, body)
	if code != http.StatusCreated {
		t.Fatalf("one file: %d %s", code, b)
	}
	var up uploadJSON
	json.Unmarshal(b, &up)
	if len(up.Traces) != 1 || up.Traces[0].Name != "a.pickle" {
		t.Errorf("one file: %s", b)
	}
}

func must(t *testing.T, path string) io.Reader {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b)
}
