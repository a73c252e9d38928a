package compare

import (
	"time"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/incident"
)

// FromJobs is an Options.Needed that asks jobs for the traces' what-if
// tables, starting the replays of those without one, and waits up to wait
// (in all) for them. A trace needs what its recorded settings' replays
// say, known before the variants' end: a table with only that row done
// answers with it; one with none by then is "running".
func FromJobs(jobs *incident.Jobs, wait time.Duration) func(ts ...gpu.Trace) []Needed {
	return func(ts ...gpu.Trace) []Needed {
		out := make([]Needed, len(ts))
		running := make([]*incident.Job, len(ts))
		for i, t := range ts {
			if _, err := caching.ParseConfig(t.Settings); err != nil {
				out[i] = Needed{Status: "unavailable", Text: "its allocator settings do not parse: " + err.Error()}
				continue
			}
			running[i] = jobs.WhatIf(t.ID, t.LastSeq)
		}
		timer := time.NewTimer(wait)
		defer timer.Stop()
		expired := false
		for i, j := range running {
			if j == nil {
				continue
			}
			if !expired {
				select {
				case <-j.Original:
				case <-timer.C:
					expired = true
				}
			}
			out[i] = neededOf(j)
		}
		return out
	}
}

// neededOf is what job j says of the memory its trace needs so far.
func neededOf(j *incident.Job) Needed {
	select {
	case <-j.Done:
		if j.Err != nil {
			return Needed{Status: "unavailable", Text: j.Err.Error()}
		}
		n := Needed{Status: "done", Text: j.Table.Needed()}
		if len(j.Table.Rows) > 0 {
			n.Bytes = j.Table.Rows[0].CapacityNeeded
		}
		return n
	default:
	}
	select {
	case <-j.Original:
		return Needed{Status: "done", Text: incident.NeededFirst(j.Needed, j.Device), Bytes: j.Needed.CapacityNeeded}
	default:
		return Needed{Status: "running", Text: "the what-if replays are still running"}
	}
}
