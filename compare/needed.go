package compare

import (
	"time"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/incident"
)

// FromJobs is an Options.Needed that asks jobs for the traces' what-if
// tables, starting the replays of those without one, and waits up to wait
// (in all) for them; a table not done by then is "running".
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
				case <-j.Done:
				case <-timer.C:
					expired = true
				}
			}
			if expired {
				select {
				case <-j.Done:
				default:
					out[i] = Needed{Status: "running", Text: "the what-if replays are still running"}
					continue
				}
			}
			if j.Err != nil {
				out[i] = Needed{Status: "unavailable", Text: j.Err.Error()}
				continue
			}
			out[i] = Needed{Status: "done", Text: j.Table.Needed()}
			if len(j.Table.Rows) > 0 {
				out[i].Bytes = j.Table.Rows[0].CapacityNeeded
			}
		}
		return out
	}
}
