package store

import (
	"database/sql"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/mattn/go-sqlite3"

	"vramscope/gpu"
)

// Running out of disk. SQLite needs free space to change anything, even
// to delete, so a database whose disk filled up could only be cleared from
// outside. The store keeps a reserve file beside the database and gives it
// up when a delete or the start-up meets a full disk; deletes go in small
// transactions, so the write-ahead log they need stays within the reserve;
// and freed pages go back to the file system (incremental vacuum), after
// which the reserve is taken again. Imports never use the reserve: they
// fail with ErrDiskFull.

// ErrDiskFull is wrapped by errors of writes that found the disk full.
var ErrDiskFull = errors.New("the disk holding the database is full")

const (
	// reserveSize is the reserve file's size: room for a delete batch, a
	// vacuum step and the log's shared-memory index.
	reserveSize = 16 << 20
	// deleteBatch: rows removed per transaction of a delete.
	deleteBatch = 2000
	// vacuumStep: pages given back per transaction of a vacuum.
	vacuumStep = 1000
)

func (b *sqliteBackend) reservePath() string { return b.path + "-reserve" }

// isFull says whether err is the database, or the OS under it, finding no
// room.
func isFull(err error) bool {
	var se sqlite3.Error
	var pe *pgconn.PgError
	return errors.Is(err, ErrDiskFull) || errors.As(err, &se) && (se.Code == sqlite3.ErrFull || se.SystemErrno == syscall.ENOSPC) ||
		errors.As(err, &pe) && pe.Code == "53100" /* disk_full */ || errors.Is(err, syscall.ENOSPC)
}

// full wraps an error of a full disk as ErrDiskFull.
func full(err error) error {
	if err != nil && isFull(err) && !errors.Is(err, ErrDiskFull) {
		return fmt.Errorf("%w: %v", ErrDiskFull, err)
	}
	return err
}

// FreeSpace is the space left for the database on its file system, not
// counting the reserve; an error where the store cannot know it (a
// database server's disk).
func (db *DB) FreeSpace() (uint64, error) { return db.be.freeSpace() }

func (b *sqliteBackend) freeSpace() (uint64, error) { return freeSpace(b.path) }

func freeSpace(path string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// takeReserve writes the reserve file if it is missing and the disk has
// room for it. It comes before anything else: without it, a full disk
// could hold a database that cannot even be opened.
func (b *sqliteBackend) takeReserve() {
	p := b.reservePath()
	if st, err := os.Stat(p); err == nil && st.Size() >= reserveSize {
		return
	}
	if free, err := freeSpace(b.path); err != nil || free < reserveSize+1<<20 {
		return
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return
	}
	// Written, not truncated to size: a sparse file would hold no room.
	zeros := make([]byte, 1<<20)
	for n := 0; n < reserveSize && err == nil; n += len(zeros) {
		_, err = f.Write(zeros)
	}
	if err = errors.Join(err, f.Sync(), f.Close()); err != nil {
		os.Remove(p)
	}
}

// giveReserve removes the reserve file; true if there was one.
func (b *sqliteBackend) giveReserve() bool { return os.Remove(b.reservePath()) == nil }

// roomy runs fn; when it meets a full disk, it gives up the reserve and
// runs it once more.
func (db *DB) roomy(fn func() error) error {
	err := fn()
	if isFull(err) && db.be.giveReserve() {
		err = fn()
	}
	return full(err)
}

// hidden is the condition readers put on traces: imports not yet finished
// and traces being deleted are not shown.
const hidden = "status NOT IN ('" + statusImporting + "', '" + statusDeleting + "')"

// Statuses the store gives traces that readers do not see.
const (
	statusImporting = "importing" // written by an import, shown by its last transaction
	statusDeleting  = "deleting"  // being removed, a batch at a time
)

// remove deletes every row of a trace marked deleting, in batches, then
// gives the freed pages back to the file system.
func (db *DB) remove(tid int64) error {
	var upload string
	if err := db.r.QueryRow("SELECT upload FROM traces WHERE tid = ?", tid).Scan(&upload); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	exec := func(q string, args ...any) (int64, error) {
		var n int64
		err := db.roomy(func() error {
			return db.write(func(tx *sql.Tx) error {
				res, err := tx.Exec(q, args...)
				if err != nil {
					return err
				}
				n, err = res.RowsAffected()
				return err
			})
		})
		return n, err
	}
	if _, err := exec("DELETE FROM permalinks WHERE trace_id = (SELECT id FROM traces WHERE tid = ?)", tid); err != nil {
		return err
	}
	if _, err := exec("DELETE FROM jobs WHERE trace_id = (SELECT id FROM traces WHERE tid = ?)", tid); err != nil {
		return err
	}
	for _, t := range traceTables {
		key := db.be.deleteKey(t)
		q := fmt.Sprintf("DELETE FROM %s WHERE (%s) IN (SELECT %s FROM %s WHERE tid = ? LIMIT %d)", t, key, key, t, deleteBatch)
		for {
			n, err := exec(q, tid)
			if err != nil {
				return err
			}
			if n == 0 {
				break
			}
		}
	}
	if upload != "" {
		// The upload goes with its last trace.
		err := db.roomy(func() error {
			return db.write(func(tx *sql.Tx) error { return dropUpload(tx, upload, true) })
		})
		if err != nil {
			return err
		}
	}
	if err := db.be.compact(db); err != nil {
		return err
	}
	db.be.takeReserve()
	return nil
}

// shrinkLog checkpoints the write-ahead log and truncates it: the file
// keeps its largest size otherwise, and a transaction that failed on a
// full disk made it as large as the disk allowed.
func (db *DB) shrinkLog() error {
	return db.direct(func(c *sql.DB) error {
		_, err := c.Exec("PRAGMA wal_checkpoint(TRUNCATE)")
		return err
	})
}

// withoutRowid names the primary key of the tables that have no rowid.
var withoutRowid = map[string]string{
	"stacks": "tid, sid", "usage_levels": "tid, k, b", "alloc_classes": "tid, sclass, dclass", "incidents": "tid, n",
	"event_extras": "tid, xid", "event_extra_runs": "tid, first_seq", "snapshot_segments": "tid, n",
}

// compact gives the free pages back to the file system, a step at a time
// (a database made before auto_vacuum was on keeps them for reuse), then
// shrinks the log.
func (b *sqliteBackend) compact(db *DB) error {
	defer db.shrinkLog()
	last := int64(-1)
	for {
		var mode, free int64
		err := db.roomy(func() error {
			return db.direct(func(c *sql.DB) error {
				if err := c.QueryRow("PRAGMA auto_vacuum").Scan(&mode); err != nil {
					return err
				}
				if err := c.QueryRow("PRAGMA freelist_count").Scan(&free); err != nil || mode != autoVacuumIncremental || free == 0 || free == last {
					return err
				}
				// incremental_vacuum cannot run inside a transaction, and
				// frees a page per step: its rows are read to the end.
				rows, err := c.Query(fmt.Sprintf("PRAGMA incremental_vacuum(%d)", vacuumStep))
				if err != nil {
					return err
				}
				for rows.Next() {
				}
				return errors.Join(rows.Err(), rows.Close())
			})
		})
		if err != nil || mode != autoVacuumIncremental || free == 0 || free == last {
			return err
		}
		last = free
	}
}

// autoVacuumIncremental is PRAGMA auto_vacuum's value for INCREMENTAL.
const autoVacuumIncremental = 2

// ExpireEmpty deletes the traces of source that never got an event, made
// before before, that no one is writing; it returns how many.
func (db *DB) ExpireEmpty(source gpu.TraceSource, before time.Time) (int, error) {
	var gone []int64
	err := db.write(func(tx *sql.Tx) error {
		rows, err := tx.Query("SELECT tid, owner_pid, status FROM traces WHERE source = ? AND event_count = 0 AND created_us < ? AND "+hidden,
			string(source), before.UnixMicro())
		if err != nil {
			return err
		}
		for rows.Next() {
			var tid, pid int64
			var status string
			if err := rows.Scan(&tid, &pid, &status); err != nil {
				rows.Close()
				return err
			}
			if gpu.TraceStatus(status) != gpu.StatusLive || !db.alive(tid, pid) {
				gone = append(gone, tid)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, tid := range gone {
			if _, err := tx.Exec("UPDATE traces SET status = ? WHERE tid = ?", statusDeleting, tid); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, tid := range gone {
		if err := db.remove(tid); err != nil {
			return 0, err
		}
	}
	return len(gone), nil
}
