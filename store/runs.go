package store

// Runs: the ranks of one job, each an upload (see uploads.go).

import (
	"database/sql"
	"errors"
	"fmt"
	"time"

	"vramscope/gpu"
)

// ErrRankTaken is returned (wrapped) when a run already has an upload for
// a rank.
var ErrRankTaken = errors.New("rank already taken")

// CreateRun stores a run's record and returns its id; its ranks join it
// as uploads (gpu.Upload.Run and Rank). worldSize is how many ranks the
// job had (0: unknown).
func (db *DB) CreateRun(name string, worldSize int) (string, error) {
	id := newTraceID()
	err := db.write(func(tx *sql.Tx) error { return insertRun(tx, id, name, worldSize) })
	if err != nil {
		return "", fmt.Errorf("store: create run: %w", err)
	}
	return id, nil
}

func insertRun(tx *sql.Tx, id, name string, worldSize int) error {
	_, err := tx.Exec("INSERT INTO runs (id, name, created_us, world_size) VALUES (?,?,?,?)", id, name, time.Now().UnixMicro(), max(worldSize, 0))
	return err
}

// JoinRun stores upload u as rank u.Rank of the newest run named name
// that has no upload for that rank yet, creating the run when there is
// none, and returns u with its ID and Run: the ranks of a job that stream
// live each find the run the first of them made. A world size it learns
// (0: unknown) is kept.
func (db *DB) JoinRun(name string, worldSize int, u gpu.Upload) (gpu.Upload, error) {
	if u.Rank < 0 {
		return u, fmt.Errorf("store: join run %q: rank %d is negative", name, u.Rank)
	}
	u.ID = NewUploadID()
	err := db.write(func(tx *sql.Tx) error {
		if err := db.be.lockTx(tx, "runs"); err != nil {
			return err
		}
		err := tx.QueryRow(`SELECT id FROM runs r WHERE name = ? AND NOT EXISTS (SELECT 1 FROM uploads u WHERE u.run = r.id AND u.rank = ?)
			ORDER BY created_us DESC LIMIT 1`, name, u.Rank).Scan(&u.Run)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			u.Run = newTraceID()
			err = insertRun(tx, u.Run, name, worldSize)
		case err == nil && worldSize > 0:
			_, err = tx.Exec("UPDATE runs SET world_size = CASE WHEN world_size > ?1 THEN world_size ELSE ?1 END WHERE id = ?2", worldSize, u.Run)
		}
		if err != nil {
			return err
		}
		return insertUpload(tx, u.ID, u)
	})
	if err != nil {
		return u, fmt.Errorf("store: join run %q: %w", name, err)
	}
	return u, nil
}

// checkRank checks that run exists and has no upload for rank.
func checkRank(q querier, run string, rank int) error {
	var n int
	if err := q.QueryRow("SELECT count(*) FROM runs WHERE id = ?", run).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("run %q: %w", run, ErrNotFound)
	}
	if rank < 0 {
		return fmt.Errorf("run %q: rank %d is negative", run, rank)
	}
	if err := q.QueryRow("SELECT count(*) FROM uploads WHERE run = ? AND rank = ?", run, rank).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return fmt.Errorf("run %q, rank %d: %w", run, rank, ErrRankTaken)
	}
	return nil
}

// Run returns a run with its ranks, by rank, each with its traces by
// device.
func (db *DB) Run(id string) (gpu.Run, error) {
	r := gpu.Run{ID: id}
	var created int64
	err := db.r.QueryRow("SELECT name, created_us, world_size FROM runs WHERE id = ?", id).Scan(&r.Name, &created, &r.WorldSize)
	if errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("run %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return r, err
	}
	r.Created = time.UnixMicro(created).UTC()
	ts, err := db.queryTraces(`WHERE upload IN (SELECT id FROM uploads WHERE run = ?1) AND `+hidden+`
		ORDER BY (SELECT rank FROM uploads u WHERE u.id = traces.upload), device_ordinal, tid`, id)
	if err != nil {
		return r, err
	}
	ranks, err := db.uploadRanks(id)
	if err != nil {
		return r, err
	}
	for _, t := range ts {
		n := len(r.Ranks)
		if n == 0 || r.Ranks[n-1].Upload != t.Upload {
			r.Ranks = append(r.Ranks, gpu.RunRank{Rank: ranks[t.Upload], Upload: t.Upload})
			n++
		}
		r.Ranks[n-1].Traces = append(r.Ranks[n-1].Traces, t)
	}
	return r, nil
}

// uploadRanks maps the uploads of a run to their ranks.
func (db *DB) uploadRanks(run string) (map[string]int, error) {
	rows, err := db.r.Query("SELECT id, rank FROM uploads WHERE run = ?", run)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var rank int
		if err := rows.Scan(&id, &rank); err != nil {
			return nil, err
		}
		out[id] = rank
	}
	return out, rows.Err()
}

// RunOf says which run upload is a rank of; ok is false for none.
func (db *DB) RunOf(upload string) (of gpu.RunOf, ok bool, err error) {
	if upload == "" {
		return of, false, nil
	}
	err = db.r.QueryRow(`SELECT r.id, r.name, u.rank, r.world_size FROM uploads u JOIN runs r ON r.id = u.run WHERE u.id = ?`, upload).
		Scan(&of.ID, &of.Name, &of.Rank, &of.WorldSize)
	if errors.Is(err, sql.ErrNoRows) {
		return of, false, nil
	}
	return of, err == nil, err
}

// DeleteRun removes a run with every upload of it and their traces, as
// DeleteUpload does; a run with a trace still being written is refused
// (ErrBusy).
func (db *DB) DeleteRun(id string) error {
	var tids []int64
	err := db.roomy(func() error {
		tids = tids[:0]
		return db.write(func(tx *sql.Tx) error {
			var n int
			if err := tx.QueryRow("SELECT count(*) FROM runs WHERE id = ?", id).Scan(&n); err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("run %q: %w", id, ErrNotFound)
			}
			const ofRun = " upload IN (SELECT id FROM uploads WHERE run = ?)"
			rows, err := tx.Query("SELECT tid, id, owner_pid, status FROM traces WHERE"+ofRun, id)
			if err != nil {
				return err
			}
			for rows.Next() {
				var tid, pid int64
				var trace, status string
				if err := rows.Scan(&tid, &trace, &pid, &status); err != nil {
					rows.Close()
					return err
				}
				if gpu.TraceStatus(status) == gpu.StatusLive && db.alive(tid, pid) {
					rows.Close()
					return fmt.Errorf("trace %q of run %q is being written; stop its writer first: %w", trace, id, ErrBusy)
				}
				tids = append(tids, tid)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			if _, err := tx.Exec("UPDATE traces SET status = ? WHERE"+ofRun, statusDeleting, id); err != nil {
				return err
			}
			for _, q := range []string{"DELETE FROM annotations WHERE" + ofRun, "DELETE FROM uploads WHERE run = ?", "DELETE FROM runs WHERE id = ?"} {
				if _, err := tx.Exec(q, id); err != nil {
					return err
				}
			}
			return nil
		})
	})
	for _, tid := range tids {
		if err == nil {
			err = db.remove(tid)
		}
	}
	return err
}

// dropEmptyRun removes run when no upload of it is left.
func dropEmptyRun(tx *sql.Tx, run string) error {
	if run == "" {
		return nil
	}
	_, err := tx.Exec("DELETE FROM runs WHERE id = ? AND NOT EXISTS (SELECT 1 FROM uploads WHERE run = ?)", run, run)
	return err
}

// Heatmap is a run's memory over one window, as its page draws it: a row
// per trace (rank × device), each bucket the greatest value of one series
// in it. Buckets are BucketUS wide from StartUS, the same for every row.
type Heatmap struct {
	Series   string       `json:"series"` // "allocated" or "reserved"
	StartUS  int64        `json:"start_us"`
	BucketUS int64        `json:"bucket_us"`
	Rows     []HeatmapRow `json:"rows"`
}

// HeatmapRow is one trace of a run in a Heatmap.
type HeatmapRow struct {
	Rank   int             `json:"rank"`
	Device int             `json:"device"`
	Trace  string          `json:"trace"`
	Name   string          `json:"name"`
	Status gpu.TraceStatus `json:"status"`
	// Peak is the series' peak over the whole trace: for allocated bytes
	// after event PeakSeq at PeakUS, exactly; for reserved bytes PeakUS is
	// the start of the window's bucket that reaches it, -1 when none does
	// (PeakSeq -1).
	Peak    uint64   `json:"peak_bytes"`
	PeakUS  int64    `json:"peak_us"`
	PeakSeq int64    `json:"peak_seq"`
	OOMs    int64    `json:"oom_count"`
	OOMUS   int64    `json:"oom_us"`  // the first OOM's time
	OOMSeq  int64    `json:"oom_seq"` // and event; -1 without one
	Max     []uint64 `json:"max"`
}

// HeatmapSeries are the series a heatmap shows, by name.
var HeatmapSeries = map[string]Series{"allocated": SeriesAllocated, "reserved": SeriesReserved}

// RunWindow is the time a run's traces span, [t0, t1].
func RunWindow(r gpu.Run) (t0, t1 int64) {
	t0, t1 = 1<<62, -1<<62
	for _, rk := range r.Ranks {
		for _, t := range rk.Traces {
			if t.Events > 0 {
				t0, t1 = min(t0, t.FirstUS), max(t1, t.LastUS)
			}
		}
	}
	if t1 < t0 {
		return 0, 0
	}
	return t0, t1
}

// RunHeatmap reads the heatmap of run r over [t0, t1] in at most n
// buckets, series "allocated" or "reserved".
func (db *DB) RunHeatmap(r gpu.Run, t0, t1 int64, n int, series string) (Heatmap, error) {
	s, ok := HeatmapSeries[series]
	if !ok {
		return Heatmap{}, fmt.Errorf("store: heatmap series %q (allocated or reserved)", series)
	}
	out := Heatmap{Series: series, Rows: []HeatmapRow{}}
	var ids []string
	for _, rk := range r.Ranks {
		for _, t := range rk.Traces {
			ids = append(ids, t.ID)
			row := HeatmapRow{Rank: rk.Rank, Device: t.DeviceOrdinal, Trace: t.ID, Name: t.Name, Status: t.Status,
				Peak: t.PeakAllocated, PeakUS: t.PeakUS, PeakSeq: t.PeakSeq, OOMs: t.OOMs, OOMSeq: -1}
			if s == SeriesReserved {
				row.Peak, row.PeakUS, row.PeakSeq = t.PeakReserved, -1, -1
			}
			if t.OOMs > 0 {
				ins, err := db.Incidents(t.ID)
				if err != nil {
					return out, err
				}
				if len(ins) > 0 {
					row.OOMUS, row.OOMSeq = ins[0].TimeUS, ins[0].Seq
				}
			}
			out.Rows = append(out.Rows, row)
		}
	}
	us, err := db.Usages(ids, t0, t1, n, s)
	if err != nil {
		return out, err
	}
	for i, u := range us {
		row := &out.Rows[i]
		out.BucketUS = u.BucketUS
		if len(u.Buckets) > 0 {
			out.StartUS = u.Buckets[0].StartUS
		}
		row.Max = make([]uint64, len(u.Buckets))
		best := -1
		for j, b := range u.Buckets {
			v := b.Allocated.Max
			if s == SeriesReserved {
				v = b.Reserved.Max
			}
			row.Max[j] = v
			if best < 0 || v > row.Max[best] {
				best = j
			}
		}
		if s == SeriesReserved && best >= 0 && row.Max[best] == row.Peak {
			row.PeakUS = u.Buckets[best].StartUS
		}
	}
	return out, nil
}
