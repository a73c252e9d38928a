package store

import (
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"vramscope/gpu"
)

// Incidents returns a trace's OOM incidents in order.
func (db *DB) Incidents(id string) ([]gpu.Incident, error) {
	tid, _, err := lookup(db.r, id)
	if err != nil {
		return nil, err
	}
	rows, err := db.r.Query("SELECT n, seq, time_us, size, device_free, stream, stack FROM incidents WHERE tid = ? ORDER BY n", tid)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []gpu.Incident
	for rows.Next() {
		var in gpu.Incident
		var size, free, stack int64
		if err := rows.Scan(&in.N, &in.Seq, &in.TimeUS, &size, &free, &in.Stream, &stack); err != nil {
			return nil, err
		}
		in.Size, in.DeviceFree, in.Stack = uint64(size), uint64(free), gpu.StackID(stack)
		out = append(out, in)
	}
	return out, rows.Err()
}

// IncidentN returns incident n (from 1) of a trace.
func (db *DB) IncidentN(id string, n int) (gpu.Incident, error) {
	all, err := db.Incidents(id)
	if err != nil {
		return gpu.Incident{}, err
	}
	if n < 1 || n > len(all) {
		return gpu.Incident{}, fmt.Errorf("trace %q has no incident %d: %w", id, n, ErrNotFound)
	}
	return all[n-1], nil
}

// Permalink is a stored view: the state the page restores, as JSON.
type Permalink struct {
	Token   string          `json:"token"`
	TraceID string          `json:"trace_id"`
	State   json.RawMessage `json:"state"`
	Created time.Time       `json:"created"`
}

// CreatePermalink stores state (a JSON object) for a trace under a new
// token of at least 128 random bits (crypto/rand.Text: 26 base32 letters).
func (db *DB) CreatePermalink(traceID string, state json.RawMessage) (string, error) {
	if !json.Valid(state) {
		return "", errors.New("permalink state is not valid JSON")
	}
	if _, _, err := lookup(db.r, traceID); err != nil {
		return "", err
	}
	token := rand.Text()
	err := db.write(func(tx *sql.Tx) error {
		_, err := tx.Exec("INSERT INTO permalinks (token, trace_id, state, created_us) VALUES (?,?,?,?)",
			token, traceID, string(state), time.Now().UnixMicro())
		return err
	})
	if err != nil {
		return "", fmt.Errorf("store permalink: %w", err)
	}
	return token, nil
}

// Permalink returns the view stored under token.
func (db *DB) Permalink(token string) (Permalink, error) {
	var p Permalink
	var state string
	var created int64
	err := db.r.QueryRow("SELECT token, trace_id, state, created_us FROM permalinks WHERE token = ?", token).
		Scan(&p.Token, &p.TraceID, &state, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return p, fmt.Errorf("permalink %q: %w", token, ErrNotFound)
	}
	p.State, p.Created = json.RawMessage(state), time.UnixMicro(created)
	return p, err
}
