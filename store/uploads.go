package store

// Uploads (a snapshot file or a recorded run, one trace per device) and
// what they say beyond their events: allocator settings and top level,
// annotations, trace entries' extras, and a snapshot's segments as the
// file wrote them.

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"vramscope/gpu"
)

// CreateUpload stores an upload's record and returns its id; traces join
// it through TraceMeta.Upload. u.ID and u.Created are set here. An upload
// of a run (u.Run) needs the run to exist and the rank to be free
// (ErrRankTaken).
func (db *DB) CreateUpload(u gpu.Upload) (string, error) {
	id := NewUploadID()
	err := db.write(func(tx *sql.Tx) error { return insertUpload(tx, id, u) })
	if err != nil {
		return "", fmt.Errorf("store: create upload: %w", err)
	}
	return id, nil
}

// NewUploadID is the id of an upload PublishUpload will store: the
// traces of an import name it before it exists.
func NewUploadID() string { return newTraceID() }

func insertUpload(tx *sql.Tx, id string, u gpu.Upload) error {
	if u.Run != "" {
		if err := checkRank(tx, u.Run, u.Rank); err != nil {
			return err
		}
	}
	var settings any
	if u.Settings != "" {
		settings = u.Settings
	}
	_, err := tx.Exec("INSERT INTO uploads (id, name, created_us, settings, top, run, rank) VALUES (?,?,?,?,?,?,?)",
		id, u.Name, time.Now().UnixMicro(), settings, u.Top, u.Run, u.Rank)
	return err
}

// StagedUpload is an import's upload waiting to be published: its id
// (from NewUploadID), record, annotations and import writers.
type StagedUpload struct {
	ID          string
	Upload      gpu.Upload
	Annotations []gpu.Annotation
	Writers     []*Writer
}

// PublishRun stores a new run named name of the staged uploads (each
// Upload.Rank its rank) and shows all their traces, in one transaction,
// and returns the run's id. worldSize is how many ranks the job had (0:
// unknown). After an error nothing is shown; Abort the writers.
func (db *DB) PublishRun(name string, worldSize int, ups []StagedUpload) (string, error) {
	return db.publishRun(name, worldSize, ups, false)
}

// PublishJoinRun is PublishRun into the newest run named name that has none of
// the uploads' ranks yet, made when there is none: the ranks of one job
// imported on several machines, each its share, make one run.
func (db *DB) PublishJoinRun(name string, worldSize int, ups []StagedUpload) (string, error) {
	return db.publishRun(name, worldSize, ups, true)
}

func (db *DB) publishRun(name string, worldSize int, ups []StagedUpload, join bool) (string, error) {
	var run string
	var ws []*Writer
	for _, u := range ups {
		ws = append(ws, u.Writers...)
	}
	err := db.publish(ws, func(tx *sql.Tx) error {
		run = ""
		if join {
			if err := db.be.lockTx(tx, "runs"); err != nil {
				return err
			}
			ranks := make([]string, len(ups))
			for i, u := range ups {
				ranks[i] = strconv.Itoa(u.Upload.Rank)
			}
			err := tx.QueryRow(`SELECT id FROM runs r WHERE name = ? AND NOT EXISTS (SELECT 1 FROM uploads u WHERE u.run = r.id AND u.rank IN (`+
				strings.Join(ranks, ",")+`)) ORDER BY created_us DESC LIMIT 1`, name).Scan(&run)
			if err == nil && worldSize > 0 {
				_, err = tx.Exec("UPDATE runs SET world_size = CASE WHEN world_size > ?1 THEN world_size ELSE ?1 END WHERE id = ?2", worldSize, run)
			}
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return err
			}
		}
		if run == "" {
			run = newTraceID()
			if err := insertRun(tx, run, name, worldSize); err != nil {
				return err
			}
		}
		for _, u := range ups {
			u.Upload.Run = run
			if err := insertUpload(tx, u.ID, u.Upload); err != nil {
				return err
			}
			if err := insertAnnotations(tx, u.ID, u.Annotations); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("store: publish run %q: %w", name, err)
	}
	return run, nil
}

// PublishUpload is Publish for the import writers of one upload: the
// upload's record (id from NewUploadID) and its annotations are stored in
// the same transaction that shows the traces.
func (db *DB) PublishUpload(id string, u gpu.Upload, anns []gpu.Annotation, ws ...*Writer) error {
	return db.publish(ws, func(tx *sql.Tx) error {
		if err := insertUpload(tx, id, u); err != nil {
			return err
		}
		return insertAnnotations(tx, id, anns)
	})
}

// DeleteUpload removes an upload with its traces and annotations: its
// traces at once from readers, then their rows (see DeleteTrace).
func (db *DB) DeleteUpload(id string) error {
	var tids []int64
	err := db.roomy(func() error {
		tids = tids[:0]
		return db.write(func(tx *sql.Tx) error {
			if err := uploadExists(tx, id); err != nil {
				return err
			}
			rows, err := tx.Query("SELECT tid FROM traces WHERE upload = ?", id)
			if err != nil {
				return err
			}
			for rows.Next() {
				var tid int64
				if err := rows.Scan(&tid); err != nil {
					rows.Close()
					return err
				}
				tids = append(tids, tid)
			}
			rows.Close()
			if _, err := tx.Exec("UPDATE traces SET status = ? WHERE upload = ?", statusDeleting, id); err != nil {
				return err
			}
			return dropUpload(tx, id, false)
		})
	})
	for _, tid := range tids {
		if err == nil {
			err = db.remove(tid)
		}
	}
	return err
}

// dropUpload deletes an upload's record and annotations, and its run
// when no other upload of that is left; when orphan, only if no trace of
// the upload is left.
func dropUpload(tx *sql.Tx, id string, orphan bool) error {
	var run string
	if err := tx.QueryRow("SELECT run FROM uploads WHERE id = ?", id).Scan(&run); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	cond := ""
	if orphan {
		cond = " AND NOT EXISTS (SELECT 1 FROM traces WHERE upload = ?)"
	}
	for _, del := range []string{"DELETE FROM annotations WHERE upload = ?", "DELETE FROM uploads WHERE id = ?"} {
		args := []any{id}
		if orphan {
			args = append(args, id)
		}
		if _, err := tx.Exec(del+cond, args...); err != nil {
			return err
		}
	}
	return dropEmptyRun(tx, run)
}

// uploadExists checks that upload id is stored ("" is no upload).
func uploadExists(q querier, id string) error {
	if id == "" {
		return nil
	}
	var n int
	if err := q.QueryRow("SELECT count(*) FROM uploads WHERE id = ?", id).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("upload %q: %w", id, ErrNotFound)
	}
	return nil
}

// Upload returns an upload's record.
func (db *DB) Upload(id string) (gpu.Upload, error) {
	u := gpu.Upload{ID: id}
	var created int64
	var settings sql.NullString
	err := db.r.QueryRow("SELECT name, created_us, settings, top, run, rank FROM uploads WHERE id = ?", id).Scan(&u.Name, &created, &settings, &u.Top, &u.Run, &u.Rank)
	if errors.Is(err, sql.ErrNoRows) {
		return u, fmt.Errorf("upload %q: %w", id, ErrNotFound)
	}
	u.Created, u.Settings = time.UnixMicro(created).UTC(), settings.String
	return u, err
}

// AddAnnotations stores annotations of an upload in the order given, each
// with the upload's trace of its device (none when the upload has no trace
// for that device).
func (db *DB) AddAnnotations(upload string, anns []gpu.Annotation) error {
	return db.write(func(tx *sql.Tx) error {
		if err := uploadExists(tx, upload); err != nil {
			return err
		}
		return insertAnnotations(tx, upload, anns)
	})
}

func insertAnnotations(tx *sql.Tx, upload string, anns []gpu.Annotation) error {
	st, err := tx.Prepare(`INSERT INTO annotations (upload, tid, device, time_us, stage, name, form)
		VALUES (?1, COALESCE((SELECT tid FROM traces WHERE upload = ?1 AND device_ordinal = ?2), 0), ?2, ?3, ?4, ?5, ?6)`)
	if err != nil {
		return err
	}
	defer st.Close()
	for _, a := range anns {
		if _, err := st.Exec(upload, a.Device, a.TimeUS, a.Stage, a.Name, nullable(a.Form)); err != nil {
			return err
		}
	}
	return nil
}

// Annotations returns a trace's annotations in the order written.
func (db *DB) Annotations(id string) ([]gpu.Annotation, error) {
	return db.annotations("SELECT device, time_us, stage, name, form FROM annotations WHERE tid = (SELECT tid FROM traces WHERE id = ? AND "+hidden+") ORDER BY aid", id)
}

// Marks returns a trace's annotations in time order (then as written),
// with their time, stage and name only: what readers of regions need, at
// a fraction of the cost of Annotations.
func (db *DB) Marks(id string) ([]gpu.Annotation, error) {
	tid, _, err := lookup(db.r, id)
	if err != nil {
		return nil, err
	}
	rows, err := db.r.Query("SELECT time_us, stage, name FROM annotations WHERE tid = ? ORDER BY time_us, aid", tid)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []gpu.Annotation
	names := map[string]string{} // names repeat: one string each
	var stage, name sql.RawBytes
	for rows.Next() {
		var a gpu.Annotation
		if err := rows.Scan(&a.TimeUS, &stage, &name); err != nil {
			return nil, err
		}
		a.Stage, a.Name = intern(names, stage), intern(names, name)
		out = append(out, a)
	}
	return out, rows.Err()
}

func intern(m map[string]string, b []byte) string {
	if s, ok := m[string(b)]; ok {
		return s
	}
	s := string(b)
	m[s] = s
	return s
}

// UploadAnnotations returns every annotation of an upload, whatever its
// device, in the order written.
func (db *DB) UploadAnnotations(upload string) ([]gpu.Annotation, error) {
	return db.annotations("SELECT device, time_us, stage, name, form FROM annotations WHERE upload = ? AND upload != '' ORDER BY aid", upload)
}

func (db *DB) annotations(q string, id string) ([]gpu.Annotation, error) {
	rows, err := db.r.Query(q, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []gpu.Annotation
	for rows.Next() {
		var a gpu.Annotation
		var form sql.NullString
		if err := rows.Scan(&a.Device, &a.TimeUS, &a.Stage, &a.Name, &form); err != nil {
			return nil, err
		}
		a.Form = form.String
		out = append(out, a)
	}
	return out, rows.Err()
}

// EventExtras returns what a trace's events said beyond the event model:
// the distinct extras (run.Extra i is extras[i-1]) and which events have
// which.
func (db *DB) EventExtras(id string) ([]gpu.EventExtra, []gpu.ExtraRun, error) {
	tid, _, err := lookup(db.r, id)
	if err != nil {
		return nil, nil, err
	}
	rows, err := db.r.Query("SELECT xid, action, compile_context, user_metadata, form FROM event_extras WHERE tid = ? ORDER BY xid", tid)
	if err != nil {
		return nil, nil, err
	}
	var extras []gpu.EventExtra
	for rows.Next() {
		var xid int
		var action, cc, um, form sql.NullString
		if err := rows.Scan(&xid, &action, &cc, &um, &form); err != nil {
			rows.Close()
			return nil, nil, err
		}
		if xid != len(extras)+1 {
			rows.Close()
			return nil, nil, fmt.Errorf("trace %s: event extra %d follows %d", id, xid, len(extras))
		}
		extras = append(extras, gpu.EventExtra{Action: action.String, CompileContext: cc.String, UserMetadata: um.String, Form: form.String})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	rows, err = db.r.Query("SELECT first_seq, xid FROM event_extra_runs WHERE tid = ? ORDER BY first_seq", tid)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var runs []gpu.ExtraRun
	for rows.Next() {
		var r gpu.ExtraRun
		if err := rows.Scan(&r.Seq, &r.Extra); err != nil {
			return nil, nil, err
		}
		if int(r.Extra) > len(extras) {
			return nil, nil, fmt.Errorf("trace %s: events from %d have event extra %d of %d", id, r.Seq, r.Extra, len(extras))
		}
		runs = append(runs, r)
	}
	return extras, runs, rows.Err()
}

// EventExtra returns the extra of one event; ok is false when it has none.
func (db *DB) EventExtra(id string, seq int64) (x gpu.EventExtra, ok bool, err error) {
	var action, cc, um, form sql.NullString
	err = db.r.QueryRow(`SELECT x.action, x.compile_context, x.user_metadata, x.form FROM traces t
		JOIN event_extra_runs r ON r.tid = t.tid AND r.first_seq = (SELECT max(first_seq) FROM event_extra_runs WHERE tid = t.tid AND first_seq <= ?)
		JOIN event_extras x ON x.tid = t.tid AND x.xid = r.xid WHERE t.id = ? AND t.`+hidden, seq, id).Scan(&action, &cc, &um, &form)
	if errors.Is(err, sql.ErrNoRows) {
		return x, false, nil
	}
	if err != nil {
		return x, false, err
	}
	return gpu.EventExtra{Action: action.String, CompileContext: cc.String, UserMetadata: um.String, Form: form.String}, true, nil
}

// SnapshotSegments returns a snapshot's segments as the file wrote them,
// in file order; none for a trace that is not from a snapshot.
func (db *DB) SnapshotSegments(id string) ([]gpu.SnapshotSegment, error) {
	return db.snapshotSegments(id, "")
}

// PrivatePoolSegments returns those of a snapshot's segments that sit in
// a private pool (a CUDA graph's, a MemPool's), in file order: what the
// segment map and a replay need, without decoding the others.
func (db *DB) PrivatePoolSegments(id string) ([]gpu.SnapshotSegment, error) {
	return db.snapshotSegments(id, " AND (pool_owner <> 0 OR pool_id <> 0)")
}

// PoolSegment is a segment a snapshot dumped in a private pool (a CUDA
// graph's, a MemPool's) and the event that began its life: the last
// segment_alloc or segment_map at its address, -1 when that was before
// the trace. Before that event a segment at its address was another one,
// of whatever pool then had it: a pool is a property of a segment's
// lifetime, not of its address.
type PoolSegment struct {
	Addr, Size uint64
	Pool       [2]int64
	Since      int64
}

// PoolSegments returns the segments a snapshot dumped in private pools,
// each with the event that began its life. Finding those reads the trace's
// events once; the answer is kept while the trace does not change.
func (db *DB) PoolSegments(id string) ([]PoolSegment, error) {
	segs, err := db.PrivatePoolSegments(id)
	if err != nil || len(segs) == 0 {
		return nil, err
	}
	r, err := db.begin(id)
	if err != nil {
		return nil, err
	}
	defer r.close()
	key := poolsKey{id, r.trace.LastSeq, r.trace.Events}
	if v, ok := db.pools.Load(key); ok {
		return v.([]PoolSegment), nil
	}
	out := make([]PoolSegment, len(segs))
	at := map[uint64]int{}
	for i, s := range segs {
		out[i] = PoolSegment{s.Segment.Addr, s.Segment.Size, s.PoolID, -1}
		at[s.Segment.Addr] = i
	}
	err = r.events(0, r.trace.LastSeq+1, func(e *gpu.Event) bool {
		if e.Action == gpu.ActionSegmentAlloc || e.Action == gpu.ActionSegmentMap {
			if i, ok := at[e.Addr]; ok {
				out[i].Since = e.Seq
			}
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	db.pools.Store(key, out)
	return out, nil
}

// poolsKey names a trace as it was when its pools' segments were found.
type poolsKey struct {
	id             string
	lastSeq, count int64
}

// snapshotSegments reads a snapshot's segments that the condition where
// (appended to the query) selects.
func (db *DB) snapshotSegments(id, where string) ([]gpu.SnapshotSegment, error) {
	tid, t, err := lookup(db.r, id)
	if err != nil {
		return nil, err
	}
	rows, err := db.r.Query("SELECT n, pool_owner, pool_id, stack, layout, form, block_forms FROM snapshot_segments WHERE tid = ?"+where+" ORDER BY n", tid)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []gpu.SnapshotSegment
	for rows.Next() {
		var s gpu.SnapshotSegment
		var stack int64
		var layout []byte
		var form, blockForms sql.NullString
		if err := rows.Scan(&s.Index, &s.PoolID[0], &s.PoolID[1], &stack, &layout, &form, &blockForms); err != nil {
			return nil, err
		}
		l, err := decodeLayout(layout, t.Rules)
		if err != nil || len(l.Segments) != 1 {
			return nil, fmt.Errorf("trace %s: snapshot segment %d: corrupt (%v)", id, s.Index, err)
		}
		s.Segment, s.Stack, s.Form = l.Segments[0], gpu.StackID(stack), form.String
		if blockForms.Valid {
			if err := json.Unmarshal([]byte(blockForms.String), &s.BlockForms); err != nil {
				return nil, fmt.Errorf("trace %s: snapshot segment %d: block forms: %w", id, s.Index, err)
			}
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// Stacks returns every stack of a trace: stack id i is out[i-1].
func (db *DB) Stacks(id string) ([]gpu.Stack, error) {
	tid, _, err := lookup(db.r, id)
	if err != nil {
		return nil, err
	}
	rows, err := db.r.Query("SELECT sid, frames FROM stacks WHERE tid = ? ORDER BY sid", tid)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []gpu.Stack
	for rows.Next() {
		var sid int
		var frames string
		if err := rows.Scan(&sid, &frames); err != nil {
			return nil, err
		}
		if sid < 1 || sid > len(out)+(1<<20) {
			return nil, fmt.Errorf("trace %s: stack id %d", id, sid)
		}
		for len(out) < sid {
			out = append(out, nil)
		}
		if err := json.Unmarshal([]byte(frames), &out[sid-1]); err != nil {
			return nil, fmt.Errorf("trace %s: stack %d: %w", id, sid, err)
		}
	}
	return out, rows.Err()
}

// Annotate stores annotations of the trace (gpu.Annotator) with its next
// commit.
func (w *Writer) Annotate(anns ...gpu.Annotation) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pend.snapshot.annotations = append(w.pend.snapshot.annotations, anns...)
}

// EventExtras stores what the trace's events said beyond the event model:
// the distinct extras, numbered from 1, and which events have which.
func (w *Writer) EventExtras(extras []gpu.EventExtra, runs []gpu.ExtraRun) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := &w.pend.snapshot
	p.extras = append(p.extras, extras...)
	p.runs = append(p.runs, runs...)
}

// SnapshotSegments stores the segments of the snapshot the trace came
// from, as the file wrote them.
func (w *Writer) SnapshotSegments(segs []gpu.SnapshotSegment) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pend.snapshot.segments = append(w.pend.snapshot.segments, segs...)
}

// snapshotRows are a writer's pending rows of the tables above.
type snapshotRows struct {
	annotations []gpu.Annotation
	extras      []gpu.EventExtra
	runs        []gpu.ExtraRun
	segments    []gpu.SnapshotSegment
}

func (s *snapshotRows) store(tx *sql.Tx, tid int64, upload string) error {
	for _, a := range s.annotations {
		if _, err := tx.Exec("INSERT INTO annotations (upload, tid, device, time_us, stage, name, form) VALUES (?,?,?,?,?,?,?)",
			upload, tid, a.Device, a.TimeUS, a.Stage, a.Name, nullable(a.Form)); err != nil {
			return err
		}
	}
	if len(s.extras) > 0 {
		var next int
		if err := tx.QueryRow("SELECT COALESCE(max(xid), 0) + 1 FROM event_extras WHERE tid = ?", tid).Scan(&next); err != nil {
			return err
		}
		for _, x := range s.extras {
			if _, err := tx.Exec("INSERT INTO event_extras (tid, xid, action, compile_context, user_metadata, form) VALUES (?,?,?,?,?,?)",
				tid, next, nullable(x.Action), nullable(x.CompileContext), nullable(x.UserMetadata), nullable(x.Form)); err != nil {
				return err
			}
			next++
		}
	}
	if len(s.runs) > 0 {
		st, err := tx.Prepare(replaceInto("event_extra_runs", "tid, first_seq", "xid", 1))
		if err != nil {
			return err
		}
		defer st.Close()
		for _, r := range s.runs {
			if _, err := st.Exec(tid, r.Seq, int64(r.Extra)); err != nil {
				return err
			}
		}
	}
	for _, sg := range s.segments {
		l := gpu.Layout{Segments: []gpu.Segment{sg.Segment}}
		var blockForms any
		if sg.BlockForms != nil {
			b, err := json.Marshal(sg.BlockForms)
			if err != nil {
				return err
			}
			blockForms = string(b)
		}
		if _, err := tx.Exec(`INSERT INTO snapshot_segments (tid, n, address, pool_owner, pool_id, stack, layout, form, block_forms)
			VALUES (?,?,?,?,?,?,?,?,?)`, tid, sg.Index, int64(sg.Segment.Addr), sg.PoolID[0], sg.PoolID[1], int64(sg.Stack),
			appendLayout(nil, &l), nullable(sg.Form), blockForms); err != nil {
			return err
		}
	}
	return nil
}

// nullable stores "" as NULL.
func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// UserMetadata is one event's user_metadata.
type UserMetadata struct {
	Seq  int64  `json:"seq"`
	Text string `json:"user_metadata"`
}

// UserMetadata lists the first limit events of t with from <= seq < to
// that carry user_metadata, and how many there are in that range.
func (db *DB) UserMetadata(t gpu.Trace, from, to int64, limit int) ([]UserMetadata, int64, error) {
	extras, runs, err := db.EventExtras(t.ID)
	if err != nil {
		return nil, 0, err
	}
	out := []UserMetadata{}
	var total int64
	for i, run := range runs {
		end := t.LastSeq + 1
		if i+1 < len(runs) {
			end = runs[i+1].Seq
		}
		if run.Extra == 0 || extras[run.Extra-1].UserMetadata == "" {
			continue
		}
		lo, hi := max(run.Seq, from), min(end, to)
		if lo >= hi {
			continue
		}
		total += hi - lo
		for seq := lo; seq < hi && len(out) < limit; seq++ {
			out = append(out, UserMetadata{seq, extras[run.Extra-1].UserMetadata})
		}
	}
	return out, total, nil
}

// Labels maps stack ids to their labels: each stack's first user frame
// (gpu.StackLabel).
func (db *DB) Labels(id string, sids []gpu.StackID) (map[gpu.StackID]string, error) {
	sts, err := db.StacksOf(id, sids)
	if err != nil {
		return nil, err
	}
	out := make(map[gpu.StackID]string, len(sts))
	for sid, st := range sts {
		out[sid] = gpu.StackLabel(st)
	}
	return out, nil
}
