package server

import (
	"bytes"
	"testing"

	"vramscope/internal/testkit"
)

// The trace list on real snapshots: a snapshot without time_us counts its
// events as its duration (its times are event indexes, not
// microseconds), one of no events has none, a snapshot's device is named
// once, and a page past the last says so and links back.
func TestListRealSnapshots(t *testing.T) { testkit.EachBackend(t, testListRealSnapshots) }

func testListRealSnapshots(t *testing.T) {
	db := testkit.OpenDB(t)
	noTime := importSnapshot(t, db, "no_time_us_segment_churn.pickle")[0]
	state := importSnapshot(t, db, "two_gpus_expandable_state_only.pickle")[0]
	timed := importSnapshot(t, db, "training_22k_user_metadata.pickle")[0]
	l := listen(t, db, Options{})
	_, page := l.do(t, "GET", "/", "", nil, nil)
	row := func(id string) string {
		i := bytes.Index(page, []byte(`<tr data-id="`+id+`"`))
		if i < 0 {
			t.Fatalf("no row for %s", id)
		}
		j := bytes.Index(page[i:], []byte("</tr>"))
		return string(page[i : i+j])
	}
	for _, c := range []struct{ id, want, not string }{
		{noTime.ID, ">10327 events<", " ms<"},
		{state.ID, ">–<", "µs<"},
		{timed.ID, ">646.7 ms<", "events<"},
	} {
		r := row(c.id)
		if !bytes.Contains([]byte(r), []byte(c.want)) || bytes.Contains([]byte(r), []byte(c.not)) {
			t.Errorf("want %q and no %q in\n%s", c.want, c.not, r)
		}
		if bytes.Contains([]byte(r), []byte(`<span class="dim">(cuda:0)</span>`)) {
			t.Errorf("the device is named twice:\n%s", r)
		}
	}
	_, page = l.do(t, "GET", "/?page=2", "", nil, nil)
	if !bytes.Contains(page, []byte("none of 4")) || !bytes.Contains(page, []byte(`<a href="/">Last page</a>`)) || bytes.Contains(page, []byte("51–50")) {
		t.Errorf("a page past the last:\n%s", page)
	}
}
