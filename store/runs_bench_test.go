package store

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"vramscope/internal/pgtest"

	"vramscope/gpu"
)

// benchRunDB opens (building if needed, cached under os.TempDir) a run of
// ranks traces of n events each: one trace written through a Writer, its
// rows copied for the other ranks.
func benchRunDB(b *testing.B, ranks, n int) (*DB, gpu.Run) {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("vramscope-run-bench-v1-%dx%d.db", ranks, n))
	if addr, ok := pgtest.BenchAddr(b, fmt.Sprintf("bench_run_v1_%dx%d", ranks, n), false); ok {
		path = addr
	}
	if db, err := Open(path); err == nil {
		if runs, err := db.runIDs(); err == nil && len(runs) == 1 {
			if r, err := db.Run(runs[0]); err == nil && len(r.Ranks) == ranks && r.Ranks[ranks-1].Traces[0].Events == int64(n) {
				return db, r
			}
		}
		db.Close()
	}
	path = freshBenchDB(b, path)
	db, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	run, err := db.CreateRun("bench", ranks)
	if err != nil {
		b.Fatal(err)
	}
	g := newGen(42, 1000)
	up, err := db.CreateUpload(gpu.Upload{Name: "rank 0", Top: "{}", Run: run, Rank: 0})
	if err != nil {
		b.Fatal(err)
	}
	meta := testMeta
	meta.Upload = up
	w, err := db.CreateTrace(meta, nil)
	if err != nil {
		b.Fatal(err)
	}
	emitGenerated(b, w, g, n)
	for rank := 1; rank < ranks; rank++ {
		up, err := db.CreateUpload(gpu.Upload{Name: fmt.Sprintf("rank %d", rank), Top: "{}", Run: run, Rank: rank})
		if err != nil {
			b.Fatal(err)
		}
		if err := db.write(func(tx *sql.Tx) error { return copyTrace(tx, w.tid, newTraceID(), up) }); err != nil {
			b.Fatal(err)
		}
	}
	r, err := db.Run(run)
	if err != nil {
		b.Fatal(err)
	}
	return db, r
}

// copyTrace copies the rows of trace tid that usage reads as a new trace
// of upload.
func copyTrace(tx *sql.Tx, tid int64, id, upload string) error {
	const cols = `name, source, device_ordinal, device_name, capacity, settings, rules, status, owner_pid, event_count,
		first_seq, last_seq, first_us, last_us, peak_reserved, peak_allocated, peak_active, oom_count, created_us,
		has_time, peak_seq, peak_us, dropped`
	var to int64
	err := tx.QueryRow("INSERT INTO traces (id, upload, "+cols+") SELECT ?, ?, "+cols+" FROM traces WHERE tid = ? RETURNING tid",
		id, upload, tid).Scan(&to)
	if err != nil {
		return err
	}
	for _, q := range []string{
		`INSERT INTO chunks SELECT ?2, first_seq, last_seq, first_us, last_us, n, reserved0, allocated0, active0,
			allocs0, alloc_bytes0, frees0, free_bytes0, data FROM chunks WHERE tid = ?1`,
		`INSERT INTO usage_levels SELECT ?2, k, b, n, res_min, res_max, res_last, alloc_min, alloc_max, alloc_last,
			act_min, act_max, act_last FROM usage_levels WHERE tid = ?1`,
		`INSERT INTO checkpoints SELECT ?2, seq, data, stats FROM checkpoints WHERE tid = ?1`,
	} {
		if _, err := tx.Exec(q, tid, to); err != nil {
			return err
		}
	}
	return nil
}

func (db *DB) runIDs() ([]string, error) {
	rows, err := db.r.Query("SELECT id FROM runs")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// BenchmarkRunHeatmap: the answer to a run page of 128 ranks of 1M
// events each, the whole run in 1000 columns: the heatmap read and its
// JSON.
func BenchmarkRunHeatmap(b *testing.B) {
	db, r := benchRunDB(b, 128, 1_000_000)
	defer db.Close()
	t0, t1 := RunWindow(r)
	for b.Loop() {
		r, err := db.Run(r.ID)
		if err != nil {
			b.Fatal(err)
		}
		h, err := db.RunHeatmap(r, t0, t1, 1000, "allocated")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := json.Marshal(h); err != nil {
			b.Fatal(err)
		}
	}
}
