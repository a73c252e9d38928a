package store

import (
	"sync"

	"vramscope/gpu"
)

// TraceChange is what a commit of another handle of the database (another
// server sharing a PostgreSQL database) did to a trace that is shown while
// it grows: where it stands now.
type TraceChange struct {
	ID      string          `json:"id"`
	Status  gpu.TraceStatus `json:"status"`
	LastSeq int64           `json:"seq"`
	Events  int64           `json:"events"`
	FirstUS int64           `json:"first_us"`
	LastUS  int64           `json:"last_us"`
	From    int64           `json:"from"` // the owner that wrote it
}

// watchers are the functions Watch registered.
type watchers struct {
	mu   sync.Mutex
	next int
	fns  map[int]func(TraceChange)
}

// Watch calls fn (on one goroutine, in commit order) with every change
// other handles of the database commit to the traces they write; cancel
// stops it. A SQLite file has one server: fn is not called.
func (db *DB) Watch(fn func(TraceChange)) (cancel func()) {
	db.watch.mu.Lock()
	defer db.watch.mu.Unlock()
	if db.watch.fns == nil {
		db.watch.fns = map[int]func(TraceChange){}
	}
	id := db.watch.next
	db.watch.next++
	db.watch.fns[id] = fn
	return func() {
		db.watch.mu.Lock()
		delete(db.watch.fns, id)
		db.watch.mu.Unlock()
	}
}

// changed hands ch to the watchers, unless this handle wrote it.
func (db *DB) changed(ch TraceChange) {
	if ch.From == db.owner {
		return
	}
	db.watch.mu.Lock()
	fns := make([]func(TraceChange), 0, len(db.watch.fns))
	for _, fn := range db.watch.fns {
		fns = append(fns, fn)
	}
	db.watch.mu.Unlock()
	for _, fn := range fns {
		fn(ch)
	}
}
