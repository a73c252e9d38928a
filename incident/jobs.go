package incident

import (
	"sync"

	"vramscope/replay"
)

// Jobs computes what-if tables of stored traces in the background and
// keeps the recent ones: each replays a whole trace many times, which can
// take a while on big traces, so a caller can wait a little and answer
// "still running" instead. One table answers every incident of a trace.
type Jobs struct {
	db    Store
	slots chan struct{} // one token per replay allowed to run at once
	mu    sync.Mutex
	keep  int
	jobs  map[jobKey]*Job
	keys  []jobKey
}

type jobKey struct {
	id      string
	lastSeq int64 // a live trace that grew gets a new replay
}

// Job is one what-if computation; Done closes when Table or Err is set.
// Original closes first, once the replays under the recorded settings
// are done (often a small part of the whole): then Needed holds their
// row, and Capacity the device's (a failed job closes it empty).
type Job struct {
	Done  chan struct{}
	Table Table
	Err   error

	Original chan struct{}
	Needed   WhatIf
	Capacity uint64
}

// NewJobs keeps the last keep tables of db's traces; slots bounds the
// replays running at once (its capacity).
func NewJobs(db Store, keep int, slots chan struct{}) *Jobs {
	return &Jobs{db: db, slots: slots, keep: keep, jobs: map[jobKey]*Job{}}
}

// WhatIf returns the job answering trace id as it stands with lastSeq its
// last event, starting it when there is none. A failed job is forgotten,
// so asking again tries again.
func (c *Jobs) WhatIf(id string, lastSeq int64) *Job {
	k := jobKey{id, lastSeq}
	c.mu.Lock()
	defer c.mu.Unlock()
	if j, ok := c.jobs[k]; ok {
		return j
	}
	if len(c.keys) >= c.keep {
		delete(c.jobs, c.keys[0])
		c.keys = c.keys[1:]
	}
	j := &Job{Done: make(chan struct{}), Original: make(chan struct{})}
	c.jobs[k] = j
	c.keys = append(c.keys, k)
	go func() {
		c.slots <- struct{}{}
		defer func() { <-c.slots }()
		original := sync.OnceFunc(func() { close(j.Original) })
		defer original() // after Done when the job failed first
		defer close(j.Done)
		rec, err := c.db.Recording(id)
		if err == nil {
			s := replay.FromRecording(rec)
			s.Use(0, replay.DefaultCapacity)
			j.Capacity = s.Capacity.Bytes
			j.Table, err = answer(s, func(row WhatIf) {
				j.Needed = row
				original()
			})
		}
		if j.Err = err; err != nil {
			c.mu.Lock()
			if c.jobs[k] == j {
				delete(c.jobs, k)
			}
			c.mu.Unlock()
		}
	}()
	return j
}

// Len is how many jobs are kept.
func (c *Jobs) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.jobs)
}
