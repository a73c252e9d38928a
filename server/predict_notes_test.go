package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// A prediction names traces as their pages do, by name (with the id only
// where two share one), says when two traces make the same requests, and
// refuses two at one batch size as a request it cannot answer.
func TestPredictNamesAndNotes(t *testing.T) {
	f := newFixture(t, Options{})
	a, b := recordGPT(t, f.db, 2, 80<<30), recordGPT(t, f.db, 4, 80<<30)
	again := recordGPT(t, f.db, 2, 80<<30) // the same run, under the same name
	var e struct{ Error string }
	body := predicted(t, f.srv.URL+"/api/compare/"+a+"/"+b+"/predict?batch_a=8&batch_b=8", http.StatusUnprocessableEntity)
	if json.Unmarshal(body, &e); e.Error != `"gpt batch 2" and "gpt batch 4" are both at batch 8: a fit takes distinct values` {
		t.Errorf("one batch size: %s", body)
	}
	var res struct {
		Notes   []string `json:"notes"`
		Largest *int     `json:"largest_batch"`
	}
	body = predicted(t, f.srv.URL+"/api/compare/"+a+"/"+again+"/predict?batch_a=2&batch_b=4&at=8", http.StatusOK)
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatal(err)
	}
	want := `"gpt batch 2" (` + a + `) at batch 2 and "gpt batch 2" (` + again + `) at batch 4 make the same requests, every size alike`
	if len(res.Notes) != 1 || !strings.HasPrefix(res.Notes[0], want) || res.Largest != nil {
		t.Errorf("the same requests: notes %q, largest %v", res.Notes, res.Largest)
	}
	// A snapshot does not say its device: the form does not make one up.
	snap := importSnapshotOf(t, f.db, "pytorch-2.11", "train_default.pickle")[0].ID
	page := string(f.get(t, "/compare/"+snap+"/"+a, http.StatusOK))
	if strings.Contains(page, "A&#39;s: 0 B") || !strings.Contains(page, `placeholder="A&#39;s unknown: 80.00 GiB"`) {
		t.Errorf("the device field of a snapshot's Predict form: %s", page[strings.Index(page, `name="capacity"`)-200:][:400])
	}
	page = pageDone(t, f.srv.URL+"/compare/"+a+"/"+again+"/predict?batch_a=2&batch_b=4&at=8", `data-running="1"`)
	if !strings.Contains(page, `<p class="note predict-note">`) || !strings.Contains(page, "make the same requests, every size alike") {
		t.Error("the Predict page does not say the two make the same requests")
	}
}
