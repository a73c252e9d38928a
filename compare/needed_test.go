package compare

import (
	"errors"
	"strings"
	"testing"

	"vramscope/incident"
)

// A job's answer so far: the whole table's, the recorded settings' row
// alone while the variants replay, or nothing yet.
func TestNeededOf(t *testing.T) {
	closed := func() chan struct{} { c := make(chan struct{}); close(c); return c }
	row := incident.WhatIf{AllocConf: "", CapacityNeeded: 6 << 30}
	whole := incident.Table{Capacity: 80 << 30, Rows: []incident.WhatIf{row, {Variant: "expandable_segments:True", CapacityNeeded: 5 << 30}}}
	for _, c := range []struct {
		name   string
		job    *incident.Job
		status string
		bytes  uint64
		text   string
	}{
		{"done", &incident.Job{Done: closed(), Original: closed(), Table: whole, Needed: row}, "done", 6 << 30, "with expandable_segments:True"},
		{"original", &incident.Job{Done: make(chan struct{}), Original: closed(), Needed: row, Capacity: 80 << 30}, "done", 6 << 30, "still running"},
		{"running", &incident.Job{Done: make(chan struct{}), Original: make(chan struct{})}, "running", 0, "still running"},
		{"failed", &incident.Job{Done: closed(), Original: closed(), Err: errors.New("no such trace")}, "unavailable", 0, "no such trace"},
	} {
		n := neededOf(c.job)
		if n.Status != c.status || n.Bytes != c.bytes || !strings.Contains(n.Text, c.text) {
			t.Errorf("%s: %+v", c.name, n)
		}
	}
}
