package store

import (
	"database/sql"
	"errors"
	"time"
)

// Job is where a background job stands in the database: done with its
// Result, taken by this process (Mine: run it now, renewing the lease), or
// running elsewhere, with what it has answered so far (Partial, or nil).
type Job struct {
	Key     string
	TraceID string
	Done    bool
	Mine    bool
	Partial []byte
	Result  []byte
	Takes   int // how many times it was taken, this time included
}

// TakeJob looks up job key (of trace traceID): when it is done, its
// answer; when no one runs it, or its runner's lease ran out (the process
// died), it is taken by this process for lease. Of any number of
// processes asking at once, one takes it.
func (db *DB) TakeJob(key, traceID string, lease time.Duration) (Job, error) {
	j := Job{Key: key, TraceID: traceID}
	err := db.write(func(tx *sql.Tx) error {
		j.Done, j.Mine, j.Partial, j.Result = false, false, nil, nil
		now, err := db.be.clock(tx)
		if err != nil {
			return err
		}
		res, err := tx.Exec(`INSERT INTO jobs (key, trace_id, state, owner, lease_us, takes, created_us) VALUES (?,?,'running',?,?,1,?)
			ON CONFLICT (key) DO NOTHING`, key, traceID, db.owner, now.Add(lease).UnixMicro(), now.UnixMicro())
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 1 {
			j.Mine, j.Takes = n == 1, 1
			return err
		}
		// Taken over only where the lease ran out: the condition is
		// checked again on the row as it is when the update locks it.
		res, err = tx.Exec("UPDATE jobs SET owner = ?, lease_us = ?, takes = takes + 1 WHERE key = ? AND state = 'running' AND lease_us < ?",
			db.owner, now.Add(lease).UnixMicro(), key, now.UnixMicro())
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		j.Mine = n == 1
		var state string
		err = tx.QueryRow("SELECT state, takes, partial, result FROM jobs WHERE key = ?", key).Scan(&state, &j.Takes, &j.Partial, &j.Result)
		j.Done = state == "done"
		return err
	})
	return j, err
}

// TakeOrphanJob takes, for lease, a job whose runner's lease ran out, if
// there is one: a job no one asks for any more is still finished.
func (db *DB) TakeOrphanJob(lease time.Duration) (Job, bool, error) {
	var j Job
	found := false
	err := db.write(func(tx *sql.Tx) error {
		found = false
		now, err := db.be.clock(tx)
		if err != nil {
			return err
		}
		err = tx.QueryRow("SELECT key, trace_id FROM jobs WHERE state = 'running' AND lease_us < ? ORDER BY created_us LIMIT 1"+db.be.skipLocked(),
			now.UnixMicro()).Scan(&j.Key, &j.TraceID)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		err = tx.QueryRow("UPDATE jobs SET owner = ?, lease_us = ?, takes = takes + 1 WHERE key = ? RETURNING takes, partial",
			db.owner, now.Add(lease).UnixMicro(), j.Key).Scan(&j.Takes, &j.Partial)
		found, j.Mine = err == nil, err == nil
		return err
	})
	return j, found, err
}

// errJobLost: the job's lease ran out and another process took it.
var errJobLost = errors.New("the job was taken over by another process (its lease ran out)")

// ownJob runs an update of job key that holds only while this process
// owns it.
func (db *DB) ownJob(q string, args ...any) error {
	return db.write(func(tx *sql.Tx) error { return owned(tx.Exec(q, args...)) })
}

// owned is errJobLost where an update of a job this process owned
// changed nothing.
func owned(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return errors.Join(err, errJobLost)
	}
	return nil
}

// RenewJob extends this process's lease on job key; an error when it lost
// the job.
func (db *DB) RenewJob(key string, lease time.Duration) error {
	return db.write(func(tx *sql.Tx) error {
		now, err := db.be.clock(tx)
		if err != nil {
			return err
		}
		return owned(tx.Exec("UPDATE jobs SET lease_us = ? WHERE key = ? AND owner = ? AND state = 'running'",
			now.Add(lease).UnixMicro(), key, db.owner))
	})
}

// JobPartial stores what job key has answered so far, for those waiting
// on other servers.
func (db *DB) JobPartial(key string, partial []byte) error {
	return db.ownJob("UPDATE jobs SET partial = ? WHERE key = ? AND owner = ? AND state = 'running'", partial, key, db.owner)
}

// FinishJob stores job key's answer and marks it done.
func (db *DB) FinishJob(key string, result []byte) error {
	return db.ownJob("UPDATE jobs SET state = 'done', result = ? WHERE key = ? AND owner = ? AND state = 'running'", result, key, db.owner)
}

// DropJob removes a job this process failed to run: the next to ask runs
// it again.
func (db *DB) DropJob(key string) error {
	return db.write(func(tx *sql.Tx) error {
		_, err := tx.Exec("DELETE FROM jobs WHERE key = ? AND owner = ? AND state = 'running'", key, db.owner)
		return err
	})
}
