package store

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"vramscope/gpu"
)

// ResumeTrace reopens a live trace whose writer is gone, or an incomplete
// one, for appending (live ingest resuming after a dropped connection). It
// returns the writer and the seq of the last stored event (-1 if none); the
// next event must have a greater seq.
func (db *DB) ResumeTrace(id string) (*Writer, int64, error) {
	tid, prev, err := db.claim(id)
	if err != nil {
		return nil, 0, err
	}
	w, last, err := db.resume(id)
	if err != nil {
		return nil, 0, errors.Join(err, db.unclaim(tid, prev))
	}
	return w, last, nil
}

// claimed is what a trace's status and owner were before a claim.
type claimed struct {
	status gpu.TraceStatus
	pid    int64
}

// claim makes this process the writer of trace id: the check that no one is
// writing it and the taking over are one write transaction, so that of two
// resumes racing (in this process or another) only one gets the trace.
func (db *DB) claim(id string) (int64, claimed, error) {
	var tid int64
	var prev claimed
	registered := false
	err := db.write(func(tx *sql.Tx) error {
		if err := db.be.lockTx(tx, "claim"); err != nil {
			return err
		}
		var t gpu.Trace
		var err error
		if tid, t, err = lookup(tx, id); err != nil {
			return err
		}
		if err := tx.QueryRow("SELECT owner_pid FROM traces WHERE tid = ?", tid).Scan(&prev.pid); err != nil {
			return err
		}
		prev.status = t.Status
		switch {
		case t.Status == gpu.StatusLive && db.alive(tid, prev.pid):
			return fmt.Errorf("store: trace %s is still being written", id)
		case t.Status != gpu.StatusLive && t.Status != gpu.StatusIncomplete:
			return fmt.Errorf("store: trace %s is %s; only live or incomplete traces can be resumed", id, t.Status)
		}
		if _, err := tx.Exec("UPDATE traces SET status = ?, owner_pid = ? WHERE tid = ?", string(gpu.StatusLive), db.owner, tid); err != nil {
			return err
		}
		// Registered before the commit: a claim that runs after this one
		// sees the trace live and its owner, this process, writing it.
		liveMu.Lock()
		liveTraces[liveKey(db.path, tid)] = true
		liveMu.Unlock()
		registered = true
		return nil
	})
	if err != nil {
		if registered {
			db.unregister(tid)
		}
		return 0, prev, err
	}
	return tid, prev, nil
}

// unclaim gives back a trace claim took and resume could not open.
func (db *DB) unclaim(tid int64, prev claimed) error {
	defer db.unregister(tid)
	return db.write(func(tx *sql.Tx) error {
		_, err := tx.Exec("UPDATE traces SET status = ?, owner_pid = ? WHERE tid = ? AND status = ? AND owner_pid = ?",
			string(prev.status), prev.pid, tid, string(gpu.StatusLive), db.owner)
		return err
	})
}

func (db *DB) unregister(tid int64) {
	liveMu.Lock()
	delete(liveTraces, liveKey(db.path, tid))
	liveMu.Unlock()
}

// resume builds the writer of a trace claim has taken.
func (db *DB) resume(id string) (*Writer, int64, error) {
	r, err := db.begin(id)
	if err != nil {
		return nil, 0, err
	}
	defer r.close()
	t := r.trace

	// The statistics and the layout after the last event, counted together.
	stats, _, err := r.statsAtSeq(t.LastSeq)
	if err != nil {
		return nil, 0, err
	}
	w := newWriter(db, stats.Layout())
	w.stats = stats
	w.id, w.tid = t.ID, r.tid
	w.n, w.first, w.firstUS, w.lastSeq, w.lastUS = t.Events, t.FirstSeq, t.FirstUS, t.LastSeq, t.LastUS
	w.peak = gpu.Totals{Reserved: t.PeakReserved, Allocated: t.PeakAllocated, Active: t.PeakActive}
	w.peakSeq, w.peakUS = t.PeakSeq, t.PeakUS
	w.ooms = t.OOMs
	w.dropped = t.Dropped
	if t.Events > 0 {
		w.pyr.resumed, w.pyr.priorUS = true, t.LastUS
	}

	// Totals and counts after the last event; an unfilled last chunk is
	// taken up again and rewritten as it grows.
	c, err := r.oneChunk("true ORDER BY first_seq DESC LIMIT 1")
	if err != nil {
		return nil, 0, err
	}
	if c == nil {
		if w.tot, w.cnt, err = r.initial(); err != nil {
			return nil, 0, err
		}
	} else {
		n := 0
		var st encState
		err := c.walk(func(e *gpu.Event, _ bool, tot gpu.Totals, cnt allocCounts) bool {
			n++
			w.tot, w.cnt = tot, cnt
			st = encState{seq: e.Seq, us: e.TimeUS, addr: e.Addr, stream: e.Stream}
			return true
		})
		if err != nil {
			return nil, 0, err
		}
		if n < chunkSize {
			w.chunk = chunkBuilder{n: n, firstSeq: c.firstSeq, firstUS: c.firstUS, lastSeq: c.lastSeq, lastUS: c.lastUS,
				before: c.before, beforeCnt: c.cnt, st: st, buf: c.data}
		}
	}

	open, err := r.openAllocs()
	if err != nil {
		return nil, 0, err
	}
	for _, a := range open {
		w.open[a.addr] = a
	}
	if err := w.loadBins(r); err != nil {
		return nil, 0, err
	}
	rows, err := r.tx.Query("SELECT sid, frames FROM stacks WHERE tid = ?", r.tid)
	if err != nil {
		return nil, 0, err
	}
	for rows.Next() {
		var sid int64
		var frames string
		if err := rows.Scan(&sid, &frames); err != nil {
			rows.Close()
			return nil, 0, err
		}
		var s gpu.Stack
		if err := json.Unmarshal([]byte(frames), &s); err != nil {
			rows.Close()
			return nil, 0, err
		}
		w.stacks.Add(s, gpu.StackID(sid))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}

	return w, t.LastSeq, nil
}

// loadBins takes up the unfilled last row of every allocation bin.
func (w *Writer) loadBins(r *reader) error {
	rows, err := r.tx.Query(`SELECT c.sclass, c.dclass, b.min_free, b.first_seq, b.max_free, b.n, b.data
		FROM alloc_classes c JOIN alloc_bins b ON b.tid = c.tid AND b.sclass = c.sclass AND b.dclass = c.dclass AND (b.min_free, b.first_seq) = (SELECT min_free, first_seq FROM alloc_bins
			WHERE tid = c.tid AND sclass = c.sclass AND dclass = c.dclass ORDER BY min_free DESC, first_seq DESC LIMIT 1)
		WHERE c.tid = ?`, r.tid)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		b := &bin{}
		if err := rows.Scan(&b.sclass, &b.dclass, &b.minFree, &b.firstSeq, &b.maxFree, &b.n, &b.buf); err != nil {
			return err
		}
		k := binKey{b.sclass, b.dclass}
		if b.n >= binSize {
			w.bins[k] = &bin{sclass: k.s, dclass: k.d}
			continue
		}
		recs := &decoder{buf: b.buf}
		b.prev = allocRec{freeUS: b.minFree}
		for {
			if _, ok := recs.allocRec(&b.prev); !ok {
				break
			}
		}
		if recs.err != nil {
			return fmt.Errorf("trace %s: allocation bin (%d, %d): %w", w.id, k.s, k.d, recs.err)
		}
		w.bins[k] = b
	}
	return rows.Err()
}
