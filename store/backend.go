package store

import (
	"database/sql"
	"time"
)

// backend is what differs between the databases the store keeps its rows
// in: SQLite (one file, one process writing) and PostgreSQL (one database
// that several servers share). The SQL the rest of the package writes is
// the part of both dialects they agree on, with ? for parameters.
type backend interface {
	// readOptions opens a read transaction: every query of one answer
	// sees the same committed state.
	readOptions() *sql.TxOptions
	// alive says whether owner (another process's or server's owner_pid)
	// still writes what it owns.
	alive(owner int64) bool
	// lockTx makes the transaction the only one of any process in the
	// section name until it ends: finding and then changing rows (a run
	// lacking a rank, leftovers to tidy) must not interleave.
	lockTx(tx *sql.Tx, name string) error
	// deleteKey is the column list a batched delete of table picks rows by.
	deleteKey(table string) string
	// notify tells every handle of the database, after tx commits, that
	// trace ch.ID changed.
	notify(tx *sql.Tx, ch TraceChange) error
	// clock is the time that judges leases. Servers sharing a database
	// judge each other's by one clock, the database's, not their own.
	clock(q querier) (time.Time, error)
	// skipLocked ends a SELECT that takes one row of a queue, skipping the
	// rows other transactions have taken.
	skipLocked() string

	// Disk space: the free space left to the database (an error where it
	// cannot be known), and a reserve given up when the disk is full so
	// that deletes can still run.
	freeSpace() (uint64, error)
	takeReserve()
	giveReserve() bool
	// compact gives the space of deleted rows back.
	compact(db *DB) error

	close() error
}
