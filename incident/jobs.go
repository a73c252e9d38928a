package incident

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"vramscope/replay"
	"vramscope/store"
)

// Jobs computes what-if tables of stored traces in the background and
// keeps the recent ones: each replays a whole trace many times, which can
// take a while on big traces, so a caller can wait a little and answer
// "still running" instead. One table answers every incident of a trace.
//
// A table is computed once for the database, not once per process: the
// job is taken in the database (store.TakeJob) by the first process to ask
// and renewed while it runs; the others wait for its answer there, and
// take it over when its lease runs out (the process running it died).
type Jobs struct {
	db    JobStore
	slots chan struct{} // one token per replay allowed to run at once
	mu    sync.Mutex
	keep  int
	jobs  map[jobKey]*Job
	keys  []jobKey
}

// JobStore is the store of traces that also keeps jobs (store.DB).
type JobStore interface {
	Store
	TakeJob(key, traceID string, lease time.Duration) (store.Job, error)
	TakeOrphanJob(lease time.Duration) (store.Job, bool, error)
	RenewJob(key string, lease time.Duration) error
	JobPartial(key string, partial []byte) error
	FinishJob(key string, result []byte) error
	DropJob(key string) error
}

// A job's lease, renewed every third of it while it runs: a process that
// died leaves its job to others this long after its last renewal. Those
// waiting look again every JobPoll.
var (
	JobLease = 5 * time.Second
	JobPoll  = 200 * time.Millisecond
)

type jobKey struct {
	id      string
	lastSeq int64 // a live trace that grew gets a new replay
}

func (k jobKey) String() string { return JobKey(k.id, k.lastSeq) }

// jobPrefix begins the database's keys of what-if jobs; its number counts
// the forms of their answers, so that an answer kept in an older form (its
// rows without what the page now reads) is computed again, not shown.
const jobPrefix = "whatif2/"

// JobKey is the database's key (store.TakeJob) of the what-if job of
// trace id as it stands with lastSeq its last event.
func JobKey(id string, lastSeq int64) string { return fmt.Sprintf("%s%s/%d", jobPrefix, id, lastSeq) }

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
	// Device says the device the replays run on (Table.DeviceText).
	Device string

	// Takes is how many times the job was taken in the database before
	// this answer (1 unless a process running it died).
	Takes int
	// Here says whether this process ran the replays.
	Here bool
}

// NewJobs keeps the last keep tables of db's traces; slots bounds the
// replays running at once (its capacity).
func NewJobs(db JobStore, keep int, slots chan struct{}) *Jobs {
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
		original := sync.OnceFunc(func() { close(j.Original) })
		defer original() // after Done when the job failed first
		defer close(j.Done)
		if j.Err = c.answer(k, j, original); j.Err != nil {
			c.mu.Lock()
			if c.jobs[k] == j {
				delete(c.jobs, k)
			}
			c.mu.Unlock()
		}
	}()
	return j
}

// stored is a job's answer as the database keeps it (Partial: Table empty).
type stored struct {
	Table    Table    `json:"table"`
	Variants []string `json:"variants"` // the rows' Variant
	Needed   WhatIf   `json:"needed"`
	Capacity uint64   `json:"capacity"`
	Device   string   `json:"device"`
}

func (j *Job) stored() []byte {
	s := stored{Table: j.Table, Needed: j.Needed, Capacity: j.Capacity, Device: j.Device}
	for _, r := range j.Table.Rows {
		s.Variants = append(s.Variants, r.Variant)
	}
	b, _ := json.Marshal(s)
	return b
}

func (j *Job) load(b []byte) error {
	var s stored
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a stored what-if answer: %w", err)
	}
	for i := range s.Table.Rows {
		if i < len(s.Variants) {
			s.Table.Rows[i].Variant = s.Variants[i]
		}
	}
	j.Table, j.Needed, j.Capacity, j.Device = s.Table, s.Needed, s.Capacity, s.Device
	return nil
}

// answer fills j: from the database when the job is done, by running it
// when this process takes it, else by waiting for the process that runs it.
func (c *Jobs) answer(k jobKey, j *Job, original func()) error {
	for {
		st, err := c.db.TakeJob(k.String(), k.id, JobLease)
		if err != nil {
			return err
		}
		j.Takes = st.Takes
		switch {
		case st.Done:
			if err := j.load(st.Result); err != nil {
				return err
			}
			original()
			return nil
		case st.Mine:
			j.Here = true
			return c.run(k, j, original)
		case st.Partial != nil:
			if err := j.load(st.Partial); err == nil {
				original()
			}
		}
		time.Sleep(JobPoll)
	}
}

// run computes the job here, renewing its lease, and stores the answer.
func (c *Jobs) run(k jobKey, j *Job, original func()) error {
	key := k.String()
	stop := make(chan struct{})
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		tick := time.NewTicker(JobLease / 3)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				c.db.RenewJob(key, JobLease) // a lost job is found at its end
			}
		}
	}()
	c.slots <- struct{}{}
	rec, err := c.db.Recording(k.id)
	if err == nil {
		s := replay.FromRecording(rec)
		s.Use(0, replay.DefaultCapacity)
		j.Capacity, j.Device = s.Capacity.Bytes, deviceText(s.Capacity)
		j.Table, err = answer(s, func(row WhatIf) {
			j.Needed = row
			original()
			c.db.JobPartial(key, j.stored())
		})
	}
	<-c.slots
	close(stop)
	<-renewed
	if err != nil {
		c.db.DropJob(key)
		return err
	}
	// Lost (another took it over while this one was stalled): the answer
	// is the same, and this process still gives it.
	c.db.FinishJob(key, j.stored())
	return nil
}

// Adopt takes a job whose process died before it ended, if there is one,
// and runs it here: a what-if no page waits on any more is still finished
// and kept. Servers call it every JobLease; false when there was none.
func (c *Jobs) Adopt() bool {
	st, ok, err := c.db.TakeOrphanJob(JobLease)
	if err != nil || !ok {
		return false
	}
	var k jobKey
	rest, ours := strings.CutPrefix(st.Key, jobPrefix)
	i := strings.LastIndexByte(rest, '/')
	if ours && i >= 0 {
		k.id = rest[:i]
		k.lastSeq, err = strconv.ParseInt(rest[i+1:], 10, 64)
	}
	if !ours || i < 0 || err != nil {
		c.db.DropJob(st.Key) // no job of ours, or of an older form
		return false
	}
	j := &Job{Done: make(chan struct{}), Original: make(chan struct{}), Takes: st.Takes, Here: true}
	c.mu.Lock()
	if _, ok := c.jobs[k]; !ok {
		c.jobs[k] = j
		c.keys = append(c.keys, k)
	}
	c.mu.Unlock()
	go func() {
		original := sync.OnceFunc(func() { close(j.Original) })
		defer original()
		defer close(j.Done)
		if j.Err = c.run(k, j, original); j.Err != nil {
			c.mu.Lock()
			if c.jobs[k] == j {
				delete(c.jobs, k)
			}
			c.mu.Unlock()
		}
	}()
	return true
}

// Len is how many jobs are kept.
func (c *Jobs) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.jobs)
}
