package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"vramscope/gpu"
	"vramscope/internal/testkit"
)

// estimateFile is an estimate made on a CPU (see pytorch/estimate_test.go).
const estimateFile = "../pytorch/testdata/estimate_gpt.pickle"

// uploadEstimate POSTs a snapshot file to /api/traces as a browser or curl
// would and returns the first trace's id.
func uploadEstimate(t *testing.T, url, path, name string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(url+"/api/traces?name="+name, "application/octet-stream", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		Traces []gpu.Trace `json:"traces"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK || len(got.Traces) != 1 {
		t.Fatalf("upload %s: %s, %v, %+v", path, resp.Status, err, got)
	}
	return got.Traces[0].ID
}

// An estimate uploaded like any snapshot is listed as one, and its trace
// view, incident and comparison pages say above their figures that they
// were estimated on a CPU, not recorded, and what the estimate cannot
// see; an estimate for a device too small has the incident of the OOM it
// would hit.
func TestBrowserEstimate(t *testing.T) {
	ctx := browser(t)
	db := testkit.OpenDB(t)
	srv := serve(t, db)
	dir := shotDir(t)
	id := uploadEstimate(t, srv.URL, estimateFile, "gpt")

	// The same estimate for a device whose allocator has 48 MiB: it runs
	// out of memory at the second cuBLAS workspace.
	small := filepath.Join(t.TempDir(), "small.pickle")
	testkit.Python3(t, `import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
s["vramscope_estimate"]["device_memory"] = (48 + 512) << 20
pickle.dump(s, open(sys.argv[2], "wb"), protocol=4)`, estimateFile, small)
	oom := uploadEstimate(t, srv.URL, small, "gpt-small")

	within(t, ctx, "list", chromedp.Navigate(srv.URL+"/"))
	list := within(t, ctx, "list text", chromedp.Text(`table`))
	if strings.Count(list, "estimate (CPU)") != 2 {
		t.Fatalf("the list does not say the traces are estimates:\n%s", list)
	}

	within(t, ctx, "trace view", chromedp.Navigate(srv.URL+"/traces/"+id))
	waitReady(t, ctx)
	notes := within(t, ctx, "notes", chromedp.Text(`#page-notes`))
	for _, want := range []string{"Estimated on a CPU, not recorded: 3 optimizer steps of train.py", "for a device of 80.00 GiB",
		"Added as PyTorch allocates them: 2× cuBLAS workspace of 32.00 MiB, 1× cuBLASLt workspace of 1.00 MiB",
		"Outside the allocator: the CUDA context, about 512.00 MiB"} {
		if !strings.Contains(notes, want) {
			t.Errorf("the trace view's notes lack %q: %q", want, notes)
		}
	}
	screenshot(t, ctx, dir, "estimate-trace")

	within(t, ctx, "incident", chromedp.Navigate(srv.URL+"/traces/"+oom+"/incidents/1"))
	waitFor(t, ctx, "the incident page", `document.getElementById("incident")?.dataset.ready === "1" && document.getElementById("incident").dataset.whatif === "done"`)
	notes = within(t, ctx, "incident notes", chromedp.Text(`#page-notes`))
	verdict := within(t, ctx, "verdict", chromedp.Text(`#verdict`))
	if !strings.Contains(notes, "Estimated on a CPU, not recorded") || !strings.Contains(notes, "for a device of 560.00 MiB") || verdict == "" {
		t.Fatalf("incident notes %q, verdict %q", notes, verdict)
	}
	screenshot(t, ctx, dir, "estimate-incident")

	within(t, ctx, "compare", chromedp.Navigate(srv.URL+"/compare/"+id+"/"+oom))
	notes = within(t, ctx, "compare notes", chromedp.Text(`#page-notes`))
	if !strings.Contains(notes, "A: Estimated on a CPU, not recorded") || !strings.Contains(notes, "B: Estimated on a CPU, not recorded") {
		t.Fatalf("compare notes %q", notes)
	}
}
