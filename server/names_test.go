package server

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"testing"

	"io"
	"mime/multipart"
)

// formAs is a multipart body of one file whose Content-Disposition is
// disposition, as a client that writes its own headers sends it.
func formAs(t *testing.T, disposition string, body []byte) (string, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", disposition)
	w, err := mw.CreatePart(h)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(body)
	mw.Close()
	return mw.FormDataContentType(), &buf
}

// Every way an upload is named (?name=, X-Filename, a form's file name,
// ?run=, a run's file names in a form or a tar) refuses a name longer
// than 255 bytes, or holding a control character or a bidirectional
// override, with a 400 that says which rule and nothing stored; white
// space around a name is trimmed, a blank one is the default.
func TestUploadNames(t *testing.T) {
	f := newFixture(t, Options{})
	snap := readSnapshot(t, "settings_no_annotations.pickle")
	before, _ := f.db.Traces()
	long := strings.Repeat("n", 1<<20)
	tarOf := func(names ...string) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, n := range names {
			if err := tw.WriteHeader(&tar.Header{Name: n, Size: int64(len(snap)), Mode: 0o644, Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
				t.Fatal(err)
			}
			tw.Write(snap)
		}
		tw.Close()
		return buf.Bytes()
	}
	send := func(query string, header map[string]string, ct string, body []byte) (int, string) {
		code, b := postWith(t, f.srv.URL+"/api/traces"+query, withType(header, ct), body)
		var e struct{ Error string }
		json.Unmarshal(b, &e)
		return code, e.Error
	}
	raw := "application/octet-stream"
	for _, c := range []struct {
		what, query string
		header      map[string]string
		ct          string
		body        []byte
		want        string
	}{
		{"a 256-byte ?name=", "?name=" + strings.Repeat("n", 256), nil, raw, snap, "name: a name is at most 255 bytes, this one is 256"},
		{"a 1 MiB form file name", "", nil, "", nil, "name: a name is at most 255 bytes, this one is 1048576"},
		{"a right-to-left override in X-Filename", "", map[string]string{"X-Filename": "snap\u202Elekcip.exe"}, raw, snap, "name: a name is plain text; byte 4 of this one is the bidirectional formatting character U+202E"},
		{"an escape in ?name=", "?name=evil%1B]0%3Bpwned%07.pickle", nil, raw, snap, "name: a name is one line of plain text; byte 4 of this one is the control character U+001B"},
		{"a newline in ?name=", "?name=" + url.QueryEscape("two\nlines"), nil, raw, snap, "control character U+000A"},
		{"a right-to-left override in a form's file name", "", nil, "rlo", nil, "bidirectional formatting character U+202E"},
		{"a 256-byte ?run=", "?run=" + strings.Repeat("r", 256), nil, raw, snap, "the run's name: a name is at most 255 bytes"},
		{"a tab in ?run=", "?run=a%09b", nil, raw, snap, "the run's name: a name is one line of plain text; byte 1 of this one is the control character U+0009"},
		{"an escape in a tar's file name", "?name=job.tar", nil, raw, tarOf("rank0.pickle", "rank1\x1b[2J.pickle"), `file "rank1\x1b[2J.pickle": a name is one line of plain text`},
		{"a 64 KiB file name in a tar (its most, near enough)", "?name=job.tar", nil, raw, tarOf("rank0.pickle", "rank1/"+long[:64<<10]), "a name is at most 255 bytes, this one is 65536"},
		{"a blank file name in a tar", "?name=job.tar", nil, raw, tarOf("rank0.pickle", "rank1/   "), "its name is blank"},
	} {
		ct, body := c.ct, c.body
		switch ct {
		case "":
			ctype, b := formAs(t, `form-data; name="file"; filename="`+long+`"`, snap)
			ct, body = ctype, b.Bytes()
		case "rlo":
			ctype, b := formAs(t, `form-data; name="file"; filename*=UTF-8''snap%E2%80%AElekcip.exe`, snap)
			ct, body = ctype, b.Bytes()
		}
		code, msg := send(c.query, c.header, ct, body)
		if code != http.StatusBadRequest || !strings.Contains(msg, c.want) || len(msg) > 400 {
			t.Errorf("%s: %d %.400q; want 400 saying %q", c.what, code, msg, c.want)
		}
	}
	if after, _ := f.db.Traces(); len(after) != len(before) {
		t.Fatalf("refused names left %d traces", len(after)-len(before))
	}
	for _, c := range []struct{ query, header, want string }{
		{"?name=" + url.QueryEscape("  <img src=x onerror=alert(1)> \t"), "", "<img src=x onerror=alert(1)>"},
		{"?name=%20%20", "", "snapshot"},
		{"", " \u00a0 ", "snapshot"},
	} {
		code, b := postWith(t, f.srv.URL+"/api/traces"+c.query, map[string]string{"X-Filename": c.header}, snap)
		var up uploadJSON
		if json.Unmarshal(b, &up); code != http.StatusCreated || len(up.Traces) != 1 || up.Traces[0].Name != c.want {
			t.Errorf("%q %q: %d %s; want the name %q", c.query, c.header, code, b, c.want)
		}
	}
}

// withType is header with Content-Type ct.
func withType(header map[string]string, ct string) map[string]string {
	out := map[string]string{"Content-Type": ct}
	for k, v := range header {
		out[k] = v
	}
	return out
}

func postWith(t *testing.T, url string, header map[string]string, body []byte) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/octet-stream")
	for k, v := range header {
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}
