package store

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"os"

	"vramscope/gpu"
)

// ResumeTrace reopens a live trace whose writer is gone, or an incomplete
// one, for appending (live ingest resuming after a dropped connection). It
// returns the writer and the seq of the last stored event (-1 if none); the
// next event must have a greater seq.
func (db *DB) ResumeTrace(id string) (*Writer, int64, error) {
	r, err := db.begin(id)
	if err != nil {
		return nil, 0, err
	}
	defer r.close()
	t := r.trace
	var pid int64
	if err := r.tx.QueryRow("SELECT owner_pid FROM traces WHERE tid = ?", r.tid).Scan(&pid); err != nil {
		return nil, 0, err
	}
	switch {
	case t.Status == StatusLive && processAlive(db.path, r.tid, int(pid)):
		return nil, 0, fmt.Errorf("store: trace %s is still being written", id)
	case t.Status != StatusLive && t.Status != StatusIncomplete:
		return nil, 0, fmt.Errorf("store: trace %s is %s; only live or incomplete traces can be resumed", id, t.Status)
	}

	l, _, err := r.layoutAtSeq(t.LastSeq)
	if err != nil {
		return nil, 0, err
	}
	w := newWriter(db, l)
	w.id, w.tid = t.ID, r.tid
	w.n, w.first, w.firstUS, w.lastSeq, w.lastUS = t.Events, t.FirstSeq, t.FirstUS, t.LastSeq, t.LastUS
	w.peak = totals{t.PeakReserved, t.PeakAllocated, t.PeakActive}
	w.ooms = t.OOMs
	if t.Events > 0 {
		w.pyr.resumed, w.pyr.priorUS = true, t.LastUS
	}

	// Totals and counts after the last event; an unfilled last chunk is
	// taken up again and rewritten as it grows.
	c, err := r.oneChunk("1 ORDER BY first_seq DESC LIMIT 1")
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
		err := c.walk(func(e *gpu.Event, _ bool, tot totals, cnt allocCounts) bool {
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
		// Re-marshal so the key matches what Stack computes.
		var s gpu.Stack
		if err := json.Unmarshal([]byte(frames), &s); err != nil {
			rows.Close()
			return nil, 0, err
		}
		b, _ := json.Marshal(s)
		w.stacks[string(b)] = gpu.StackID(sid)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}

	err = db.write(func(tx *sql.Tx) error {
		_, err := tx.Exec("UPDATE traces SET status = ?, owner_pid = ? WHERE tid = ?", string(StatusLive), os.Getpid(), w.tid)
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	w.register()
	return w, t.LastSeq, nil
}

// loadBins takes up the unfilled last row of every allocation bin.
func (w *Writer) loadBins(r *reader) error {
	rows, err := r.tx.Query(`SELECT c.sclass, c.dclass, b.min_free, b.first_seq, b.max_free, b.n, b.data
		FROM alloc_classes c JOIN alloc_bins b ON b.rowid = (SELECT rowid FROM alloc_bins
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
