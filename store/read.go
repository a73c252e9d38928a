package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"vramscope/gpu"
)

const traceCols = `tid, id, name, source, device_ordinal, device_name, capacity, settings, rules, status, event_count,
	first_seq, last_seq, first_us, last_us, peak_reserved, peak_allocated, peak_active, oom_count, created_us,
	upload, has_time, peak_seq, peak_us, dropped`

type scanner interface{ Scan(...any) error }

func scanTrace(s scanner) (int64, gpu.Trace, error) {
	var t gpu.Trace
	var tid, capacity, pr, pa, pc, created int64
	var rules, source, status, dropped string
	var hasTime bool
	err := s.Scan(&tid, &t.ID, &t.Name, &source, &t.DeviceOrdinal, &t.DeviceName, &capacity, &t.Settings, &rules, &status,
		&t.Events, &t.FirstSeq, &t.LastSeq, &t.FirstUS, &t.LastUS, &pr, &pa, &pc, &t.OOMs, &created,
		&t.Upload, &hasTime, &t.PeakSeq, &t.PeakUS, &dropped)
	if err != nil {
		return 0, t, err
	}
	t.NoTime = !hasTime
	if dropped != "" {
		t.Dropped = &gpu.Dropped{}
		if err := json.Unmarshal([]byte(dropped), t.Dropped); err != nil {
			return 0, t, fmt.Errorf("trace %s: dropped events: %w", t.ID, err)
		}
	}
	t.Source, t.Status = gpu.TraceSource(source), gpu.TraceStatus(status)
	t.Capacity, t.PeakReserved, t.PeakAllocated, t.PeakActive = uint64(capacity), uint64(pr), uint64(pa), uint64(pc)
	t.Created = time.UnixMicro(created).UTC()
	if err := json.Unmarshal([]byte(rules), &t.Rules); err != nil {
		return 0, t, fmt.Errorf("trace %s: allocator rules: %w", t.ID, err)
	}
	return tid, t, nil
}

// Traces lists every trace, newest first.
func (db *DB) Traces() ([]gpu.Trace, error) {
	ts, _, err := db.TraceList(ListQuery{})
	return ts, err
}

// ListQuery picks and orders a page of the trace list.
type ListQuery struct {
	Name   string          // part of the name, any case; "" for any
	Source gpu.TraceSource // "" for any
	Status gpu.TraceStatus // "" for any
	Sort   string          // a ListSorts key; "" for created
	Asc    bool            // ascending; the default is descending
	Offset int
	Limit  int // 0: no limit
	// GroupRuns lists each run once, as the trace of its rank that peaked
	// highest (reserved, then allocated), and matches Name on run names too.
	GroupRuns bool
}

// ListSorts are the orders of the trace list, by the column they sort.
var ListSorts = map[string]string{
	"created": "created_us", "name": "lower(name)", "source": "source", "status": "status",
	"events": "event_count", "peak": "peak_reserved", "ooms": "oom_count", "duration": "last_us - first_us",
}

// worstOfRun keeps a trace unless it is a rank of a run with a trace that
// peaked higher (reserved, then allocated): a run's one row in a grouped
// list.
const worstOfRun = `(upload NOT IN (SELECT id FROM uploads WHERE run != '') OR tid = (
	SELECT t2.tid FROM traces t2 JOIN uploads u2 ON u2.id = t2.upload
	WHERE u2.run = (SELECT run FROM uploads WHERE id = traces.upload) AND t2.` + hidden + `
	ORDER BY t2.peak_reserved DESC, t2.peak_allocated DESC, t2.tid LIMIT 1))`

// TraceList returns one page of the traces q picks, in q's order, and how
// many it picks in all.
func (db *DB) TraceList(q ListQuery) ([]gpu.Trace, int, error) {
	where := []string{hidden}
	var args []any
	if q.Name != "" {
		like := "%" + strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`).Replace(strings.ToLower(q.Name)) + "%"
		if q.GroupRuns {
			where = append(where, `(lower(name) LIKE ?1 ESCAPE '\' OR upload IN (SELECT u.id FROM uploads u JOIN runs r ON r.id = u.run WHERE lower(r.name) LIKE ?1 ESCAPE '\'))`)
		} else {
			where = append(where, "lower(name) LIKE ?1 ESCAPE '\\'")
		}
		args = append(args, like)
	}
	if q.GroupRuns {
		where = append(where, worstOfRun)
	}
	if q.Source != "" {
		where = append(where, "source = ?")
		args = append(args, string(q.Source))
	}
	if q.Status != "" {
		where = append(where, "status = ?")
		args = append(args, string(q.Status))
	}
	cond := "WHERE " + strings.Join(where, " AND ")
	var total int
	if err := db.r.QueryRow("SELECT count(*) FROM traces "+cond, args...).Scan(&total); err != nil {
		return nil, 0, err
	}
	col, ok := ListSorts[q.Sort]
	if !ok {
		col = ListSorts["created"]
	}
	dir := " DESC"
	if q.Asc {
		dir = " ASC"
	}
	clause := cond + " ORDER BY " + col + dir + ", tid" + dir
	if q.Limit > 0 {
		clause += fmt.Sprintf(" LIMIT %d OFFSET %d", q.Limit, max(q.Offset, 0))
	}
	out, err := db.queryTraces(clause, args...)
	return out, total, err
}

// UploadTraces lists the traces of one upload (the devices of a snapshot),
// by device.
func (db *DB) UploadTraces(upload string) ([]gpu.Trace, error) {
	if upload == "" {
		return nil, nil
	}
	return db.queryTraces("WHERE upload = ? AND "+hidden+" ORDER BY device_ordinal, tid", upload)
}

// queryTraces lists the traces a WHERE / ORDER BY clause selects.
func (db *DB) queryTraces(clause string, args ...any) ([]gpu.Trace, error) {
	rows, err := db.r.Query("SELECT "+traceCols+" FROM traces "+clause, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []gpu.Trace
	for rows.Next() {
		_, t, err := scanTrace(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// Trace returns one trace.
func (db *DB) Trace(id string) (gpu.Trace, error) {
	_, t, err := lookup(db.r, id)
	return t, err
}

type querier interface {
	QueryRow(string, ...any) *sql.Row
	Query(string, ...any) (*sql.Rows, error)
}

func lookup(q querier, id string) (int64, gpu.Trace, error) {
	tid, t, err := scanTrace(q.QueryRow("SELECT "+traceCols+" FROM traces WHERE id = ? AND "+hidden, id))
	if errors.Is(err, sql.ErrNoRows) {
		return 0, t, fmt.Errorf("trace %q: %w", id, ErrNotFound)
	}
	return tid, t, err
}

// DeleteTrace removes a trace and everything stored for it. A trace still
// being written is refused (ErrBusy). The trace disappears from readers
// at once; its rows go in small transactions, then their space goes back
// to the file system. On a full disk it gives up the reserve; when even
// that is not enough it returns ErrDiskFull, and the rows still there go
// at the next Open.
func (db *DB) DeleteTrace(id string) error {
	var tid int64
	err := db.roomy(func() error {
		return db.write(func(tx *sql.Tx) error {
			var pid int64
			var status string
			err := tx.QueryRow("SELECT tid, owner_pid, status FROM traces WHERE id = ? AND "+hidden, id).Scan(&tid, &pid, &status)
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("trace %q: %w", id, ErrNotFound)
			}
			if err != nil {
				return err
			}
			if gpu.TraceStatus(status) == gpu.StatusLive && db.alive(tid, pid) {
				return fmt.Errorf("trace %q is being written; stop its writer first: %w", id, ErrBusy)
			}
			_, err = tx.Exec("UPDATE traces SET status = ? WHERE tid = ?", statusDeleting, tid)
			return err
		})
	})
	if err != nil {
		return err
	}
	return db.remove(tid)
}

// ErrBusy is wrapped by the error of a delete of a trace being written.
var ErrBusy = errors.New("busy")

// reader is one read transaction: every query of one answer sees the same
// committed state, even while the writer commits.
type reader struct {
	tx    *sql.Tx
	bins  *sql.Stmt // binScan's query, prepared once per reader
	tid   int64
	trace gpu.Trace
}

func (db *DB) begin(id string) (*reader, error) {
	tx, err := db.r.BeginTx(context.Background(), db.be.readOptions())
	if err != nil {
		return nil, err
	}
	tid, t, err := lookup(tx, id)
	if err != nil {
		tx.Rollback()
		return nil, err
	}
	return &reader{tx: tx, tid: tid, trace: t}, nil
}

func (r *reader) close() {
	if r.bins != nil {
		r.bins.Close()
	}
	r.tx.Rollback()
}

// chunk is one stored chunk of events.
type chunk struct {
	firstSeq, lastSeq, firstUS, lastUS int64
	before                             gpu.Totals
	cnt                                allocCounts
	data                               []byte
}

const chunkCols = "first_seq, last_seq, first_us, last_us, reserved0, allocated0, active0, allocs0, alloc_bytes0, frees0, free_bytes0, data"

// scanChunk scans the chunkCols of a row, after the columns lead scans
// into.
func scanChunk(s scanner, lead ...any) (*chunk, error) {
	c := &chunk{}
	var r, a, ac int64
	err := s.Scan(append(lead, &c.firstSeq, &c.lastSeq, &c.firstUS, &c.lastUS, &r, &a, &ac, &c.cnt.allocs, &c.cnt.allocBytes, &c.cnt.frees, &c.cnt.freeBytes, &c.data)...)
	c.before = gpu.Totals{Reserved: uint64(r), Allocated: uint64(a), Active: uint64(ac)}
	return c, err
}

// oneChunk returns the chunk a query selects, or nil.
func (r *reader) oneChunk(where string, args ...any) (*chunk, error) {
	c, err := scanChunk(r.tx.QueryRow("SELECT "+chunkCols+" FROM chunks WHERE tid = ? AND "+where, append([]any{r.tid}, args...)...))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	return c, err
}

// walk decodes c's events in order, with the gpu.Totals and counts after each;
// fn returns false to stop.
func (c *chunk) walk(fn func(e *gpu.Event, ends bool, t gpu.Totals, n allocCounts) bool) error {
	d := newDecoder(c.data, c.firstSeq, c.firstUS)
	t, n := c.before, c.cnt
	var e gpu.Event
	for {
		ends, ok := d.next(&e)
		if !ok {
			break
		}
		t.Apply(&e, ends)
		if e.Action == gpu.ActionAlloc {
			n.allocs++
			n.allocBytes += int64(e.BlockSize)
		} else if endsAllocation(&e, ends) {
			n.frees++
			n.freeBytes += int64(e.BlockSize)
		}
		if !fn(&e, ends, t, n) {
			return nil
		}
	}
	if d.err != nil {
		return fmt.Errorf("chunk at seq %d: %w", c.firstSeq, d.err)
	}
	return nil
}

// stateAt is the state after the last event with time <= t (inclusive) or
// time < t (!inclusive): its seq (-1 if none), gpu.Totals and allocation counts.
func (r *reader) stateAt(t int64, inclusive bool) (seq int64, tot gpu.Totals, cnt allocCounts, err error) {
	op := "<"
	if inclusive {
		op = "<="
	}
	c, err := r.oneChunk("first_us "+op+" ? ORDER BY first_us DESC, first_seq DESC LIMIT 1", t)
	if err != nil {
		return 0, tot, cnt, err
	}
	if c == nil {
		tot, cnt, err := r.initial()
		return -1, tot, cnt, err
	}
	return c.stateAt(t, inclusive)
}

// stateAt is reader.stateAt within c: the state after its last event
// with time <= t (inclusive) or time < t, else before its first.
func (c *chunk) stateAt(t int64, inclusive bool) (seq int64, tot gpu.Totals, cnt allocCounts, err error) {
	seq, tot, cnt = c.firstSeq-1, c.before, c.cnt
	err = c.walk(func(e *gpu.Event, _ bool, at gpu.Totals, n allocCounts) bool {
		if e.TimeUS > t || !inclusive && e.TimeUS == t {
			return false
		}
		seq, tot, cnt = e.Seq, at, n
		return true
	})
	return seq, tot, cnt, err
}

// initial is the state before the first event.
func (r *reader) initial() (gpu.Totals, allocCounts, error) {
	// The first chunk's totals, without its events.
	var v [7]int64
	err := r.tx.QueryRow("SELECT reserved0, allocated0, active0, allocs0, alloc_bytes0, frees0, free_bytes0 FROM chunks WHERE tid = ? ORDER BY first_seq LIMIT 1", r.tid).
		Scan(&v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6])
	if err == nil {
		return gpu.Totals{Reserved: uint64(v[0]), Allocated: uint64(v[1]), Active: uint64(v[2])}, allocCounts{v[3], v[4], v[5], v[6]}, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return gpu.Totals{}, allocCounts{}, err
	}
	l, err := r.checkpoint(initialSeq)
	if err != nil {
		return gpu.Totals{}, allocCounts{}, err
	}
	f := l.Figures()
	var cnt allocCounts
	for i := range l.Segments {
		for _, b := range l.Segments[i].Blocks {
			if b.State == gpu.BlockAllocated {
				cnt.allocs++
				cnt.allocBytes += int64(b.Size)
			}
		}
	}
	return gpu.Totals{Reserved: f.Reserved, Allocated: f.Allocated, Active: f.Active}, cnt, nil
}

func (r *reader) checkpoint(seq int64) (*gpu.Layout, error) {
	var data []byte
	if err := r.tx.QueryRow("SELECT data FROM checkpoints WHERE tid = ? AND seq = ?", r.tid, seq).Scan(&data); err != nil {
		return nil, err
	}
	return decodeLayout(data, r.trace.Rules)
}

// events calls fn for the events with from <= seq < to, in order.
func (r *reader) events(from, to int64, fn func(e *gpu.Event) bool) error {
	return r.eventsWithEnds(from, to, func(e *gpu.Event, _ bool) bool { return fn(e) })
}

// eventsWithEnds is events, also telling fn whether a free_completed ends
// its allocation (see extEnds).
func (r *reader) eventsWithEnds(from, to int64, fn func(e *gpu.Event, ends bool) bool) error {
	return r.eventsTotals(from, to, func(e *gpu.Event, ends bool, _ gpu.Totals) bool { return fn(e, ends) })
}

// eventsTotals is eventsWithEnds, also giving fn the totals right after
// each event.
func (r *reader) eventsTotals(from, to int64, fn func(e *gpu.Event, ends bool, t gpu.Totals) bool) error {
	start := from
	var first sql.NullInt64
	if err := r.tx.QueryRow("SELECT max(first_seq) FROM chunks WHERE tid = ? AND first_seq <= ?", r.tid, from).Scan(&first); err != nil {
		return err
	}
	if first.Valid {
		start = first.Int64
	}
	// A page of chunks at a time, read whole before fn sees an event: fn
	// may query the same transaction, which PostgreSQL cannot while a
	// query's rows are still coming.
	for {
		page, err := r.chunkPage(start, to)
		if err != nil || len(page) == 0 {
			return err
		}
		for _, c := range page {
			more := true
			err = c.walk(func(e *gpu.Event, ends bool, t gpu.Totals, _ allocCounts) bool {
				if e.Seq >= to {
					more = false
					return false
				}
				if e.Seq >= from {
					more = fn(e, ends, t)
				}
				return more
			})
			if err != nil || !more {
				return err
			}
		}
		start = page[len(page)-1].firstSeq + 1
	}
}

// chunkPageSize: chunks read by one query of a walk over events.
const chunkPageSize = 32

// chunkPage reads the chunks from first_seq start up to to, a page of them.
func (r *reader) chunkPage(start, to int64) ([]*chunk, error) {
	rows, err := r.tx.Query("SELECT "+chunkCols+" FROM chunks WHERE tid = ? AND first_seq >= ? AND first_seq < ? ORDER BY first_seq LIMIT ?",
		r.tid, start, to, chunkPageSize)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var page []*chunk
	for rows.Next() {
		c, err := scanChunk(rows)
		if err != nil {
			return nil, err
		}
		page = append(page, c)
	}
	return page, rows.Err()
}

// Events returns the events with from <= Seq < to. BlockSize is filled in
// for alloc and free_* events, and times never decrease.
func (db *DB) Events(id string, from, to int64) ([]gpu.Event, error) {
	r, err := db.begin(id)
	if err != nil {
		return nil, err
	}
	defer r.close()
	var out []gpu.Event
	err = r.events(from, to, func(e *gpu.Event) bool { out = append(out, *e); return true })
	return out, err
}

// Recording reads a whole trace back for a replay: the layout before its
// first event, every event, its allocator settings and its capacity.
func (db *DB) Recording(id string) (gpu.Recording, error) {
	r, err := db.begin(id)
	if err != nil {
		return gpu.Recording{}, err
	}
	defer r.close()
	initial, _, err := r.layoutAtSeq(-1)
	if err != nil {
		return gpu.Recording{}, err
	}
	rec := gpu.Recording{Initial: initial, Settings: r.trace.Settings, Device: r.trace.DeviceOrdinal, Capacity: r.trace.Capacity,
		Events: make([]gpu.Event, 0, r.trace.Events), Estimated: r.trace.Source == gpu.SourceEstimate}
	err = r.events(0, r.trace.LastSeq+1, func(e *gpu.Event) bool { rec.Events = append(rec.Events, *e); return true })
	if err != nil {
		return rec, err
	}
	if rec.Stacks, err = r.stacks(); err != nil {
		return rec, err
	}
	if rec.Annotations, err = db.Annotations(id); err != nil {
		return rec, err
	}
	// The private pools of an upload's segments, which a replay routes
	// its requests to.
	segs, err := db.PrivatePoolSegments(id)
	for _, s := range segs {
		if rec.Pools == nil {
			rec.Pools = map[uint64][2]int64{}
		}
		rec.Pools[s.Segment.Addr] = s.PoolID
	}
	return rec, err
}

// stacks are every stack of the trace: a writer numbers them 1..n, so
// StackID i is the i-th.
func (r *reader) stacks() ([]gpu.Stack, error) {
	rows, err := r.tx.Query("SELECT sid, frames FROM stacks WHERE tid = ? ORDER BY sid", r.tid)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []gpu.Stack
	for rows.Next() {
		var sid int64
		var frames string
		if err := rows.Scan(&sid, &frames); err != nil {
			return nil, err
		}
		if sid != int64(len(out))+1 {
			return nil, fmt.Errorf("trace %s: stack %d follows stack %d", r.trace.ID, sid, len(out))
		}
		var s gpu.Stack
		if err := json.Unmarshal([]byte(frames), &s); err != nil {
			return nil, fmt.Errorf("trace %s: stack %d: %w", r.trace.ID, sid, err)
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// freeScan bounds how far past a free_requested the matching
// free_completed is looked for.
const freeScan = 1 << 14

// AllocationEvents returns the events that made and ended allocation a:
// its alloc, and its free_requested and free_completed when it has them.
func (db *DB) AllocationEvents(id string, a gpu.Allocation) ([]gpu.Event, error) {
	var out []gpu.Event
	if a.Seq >= 0 {
		evs, err := db.Events(id, a.Seq, a.Seq+1)
		if err != nil {
			return nil, err
		}
		out = append(out, evs...)
	}
	if a.FreeSeq < 0 {
		return out, nil
	}
	evs, err := db.Events(id, a.FreeSeq, a.FreeSeq+freeScan)
	if err != nil {
		return nil, err
	}
	for i, e := range evs {
		if i == 0 || e.Addr == a.Addr && e.Action == gpu.ActionFreeCompleted {
			out = append(out, e)
			if i > 0 || e.Action == gpu.ActionFreeCompleted {
				break
			}
		}
	}
	return out, nil
}

// Stack returns an interned stack of a trace.
func (db *DB) Stack(id string, sid gpu.StackID) (gpu.Stack, error) {
	var frames string
	err := db.r.QueryRow("SELECT s.frames FROM stacks s JOIN traces t ON t.tid = s.tid WHERE t.id = ? AND s.sid = ?", id, int64(sid)).Scan(&frames)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("trace %q stack %d: %w", id, sid, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	var s gpu.Stack
	return s, json.Unmarshal([]byte(frames), &s)
}

// StacksOf returns the stacks of sids that trace id has (unknown ids and 0
// are left out).
func (db *DB) StacksOf(id string, sids []gpu.StackID) (map[gpu.StackID]gpu.Stack, error) {
	r, err := db.begin(id)
	if err != nil {
		return nil, err
	}
	defer r.close()
	out := make(map[gpu.StackID]gpu.Stack, len(sids))
	return out, r.stacksOf(sids, out)
}

// stacksOf adds to out the stacks of sids it does not hold yet.
func (r *reader) stacksOf(sids []gpu.StackID, out map[gpu.StackID]gpu.Stack) error {
	st, err := r.tx.Prepare("SELECT frames FROM stacks WHERE tid = ? AND sid = ?")
	if err != nil {
		return err
	}
	defer st.Close()
	for _, sid := range sids {
		if _, done := out[sid]; done || sid == 0 {
			continue
		}
		var frames string
		err := st.QueryRow(r.tid, int64(sid)).Scan(&frames)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return err
		}
		var s gpu.Stack
		if err := json.Unmarshal([]byte(frames), &s); err != nil {
			return fmt.Errorf("trace %s: stack %d: %w", r.trace.ID, sid, err)
		}
		out[sid] = s
	}
	return nil
}

// LayoutAtSeq returns the layout after every event with Seq <= seq, and the
// seq of the last of them (-1 when there is none).
func (db *DB) LayoutAtSeq(id string, seq int64) (*gpu.Layout, int64, error) {
	r, err := db.begin(id)
	if err != nil {
		return nil, 0, err
	}
	defer r.close()
	return r.layoutAtSeq(seq)
}

func (r *reader) layoutAtSeq(seq int64) (*gpu.Layout, int64, error) {
	var ck int64
	var data []byte
	if err := r.tx.QueryRow("SELECT seq, data FROM checkpoints WHERE tid = ? AND seq <= ? ORDER BY seq DESC LIMIT 1", r.tid, seq).Scan(&ck, &data); err != nil {
		return nil, 0, fmt.Errorf("trace %s: layout checkpoint: %w", r.trace.ID, err)
	}
	l, err := decodeLayout(data, r.trace.Rules)
	if err != nil {
		return nil, 0, fmt.Errorf("trace %s: checkpoint %d: %w", r.trace.ID, ck, err)
	}
	last := ck
	if ck == initialSeq {
		last = -1
	}
	var applyErr error
	err = r.events(ck+1, seq+1, func(e *gpu.Event) bool {
		applyErr = l.Apply(*e)
		last = e.Seq
		return applyErr == nil
	})
	if err == nil {
		err = applyErr
	}
	if err != nil {
		return nil, 0, fmt.Errorf("trace %s: layout at seq %d: %w", r.trace.ID, seq, err)
	}
	return l, last, nil
}

// LayoutAt returns the layout after every event with TimeUS <= t, and the
// seq of the last of them (-1 when there is none).
func (db *DB) LayoutAt(id string, t int64) (*gpu.Layout, int64, error) {
	r, err := db.begin(id)
	if err != nil {
		return nil, 0, err
	}
	defer r.close()
	return Read{r}.LayoutAt(t)
}

// Read is one read of a trace, as consistent as a transaction, handed to
// a function that reads it further while it lasts (LiveAtEach).
type Read struct{ r *reader }

// LayoutAt is DB.LayoutAt within the read.
func (rd Read) LayoutAt(t int64) (*gpu.Layout, int64, error) {
	seq, _, _, err := rd.r.stateAt(t, true)
	if err != nil {
		return nil, 0, err
	}
	return rd.r.layoutOrInitial(seq)
}

// Describe fills in the alloc times, stacks and user_metadata of the
// blocks of ls: a live set of LiveAtEach, or a part of one.
func (rd Read) Describe(ls *LiveSet) error { return rd.r.describe(ls) }

// Events calls fn for the events with from <= seq < to, in order, until
// it returns false.
func (rd Read) Events(from, to int64, fn func(e *gpu.Event) bool) error {
	return rd.r.events(from, to, fn)
}

func (a *allocRec) allocation() gpu.Allocation {
	return gpu.Allocation{Seq: a.allocSeq, FreeSeq: a.freeSeq, Addr: a.addr, Size: a.size, Requested: a.requested,
		Stream: a.stream, AllocUS: a.allocUS, FreeUS: a.freeUS, Stack: a.stack}
}

// Allocations is the answer to a window query.
type Allocations struct {
	Allocations []gpu.Allocation `json:"allocations"`
	// Total and TotalBytes count every allocation alive in the window;
	// Omitted and OmittedBytes those left out (too small or past the limit).
	Total        int64  `json:"total"`
	TotalBytes   uint64 `json:"total_bytes"`
	Omitted      int64  `json:"omitted"`
	OmittedBytes uint64 `json:"omitted_bytes"`
}

// Allocations returns the allocations alive at some time in [t0, t1]
// (allocated at or before t1, not freed at or before t0) of at least minBytes,
// largest first (then by seq and address), at most limit of them (0: no
// limit).
func (db *DB) Allocations(id string, t0, t1 int64, minBytes uint64, limit int) (Allocations, error) {
	var out Allocations
	if t1 < t0 {
		return out, fmt.Errorf("store: allocations need t0 <= t1 (got [%d, %d])", t0, t1)
	}
	t0, t1 = max(t0, -1<<60), min(t1, 1<<60)
	r, err := db.begin(id)
	if err != nil {
		return out, err
	}
	defer r.close()

	// How many are alive in the window: begun by t1, minus ended by t0.
	_, _, after1, err := r.stateAt(t1, true)
	if err != nil {
		return out, err
	}
	_, _, after0, err := r.stateAt(t0, true)
	if err != nil {
		return out, err
	}
	out.Total = after1.allocs - after0.frees
	out.TotalBytes = uint64(after1.allocBytes - after0.freeBytes)

	alive := func(a *allocRec) bool { return a.allocUS <= t1 && a.freeUS > t0 && a.size >= minBytes }
	bySize := map[int][]allocRec{} // the live allocations that qualify, by size class
	openRecs, err := r.openAllocs()
	if err != nil {
		return out, err
	}
	for _, a := range openRecs {
		if alive(&a) {
			c := sizeClass(a.size)
			bySize[c] = append(bySize[c], a)
		}
	}
	classes := map[int][]int{}
	rows, err := r.tx.Query("SELECT sclass, dclass FROM alloc_classes WHERE tid = ? AND sclass >= ?", r.tid, sizeClass(minBytes))
	if err != nil {
		return out, err
	}
	for rows.Next() {
		var s, d int
		if err := rows.Scan(&s, &d); err != nil {
			rows.Close()
			return out, err
		}
		classes[s] = append(classes[s], d)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return out, err
	}
	var order []int
	for s := range classes {
		order = append(order, s)
	}
	for s := range bySize {
		if classes[s] == nil {
			order = append(order, s)
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(order)))

	var found []allocRec
	for _, s := range order {
		if limit > 0 && len(found) >= limit {
			break
		}
		found = append(found, bySize[s]...)
		for _, d := range classes[s] {
			err := r.binScan(s, d, t0, t1, func(a *allocRec) {
				if alive(a) {
					found = append(found, *a)
				}
			})
			if err != nil {
				return out, err
			}
		}
	}
	sort.Slice(found, func(i, j int) bool {
		if found[i].size != found[j].size {
			return found[i].size > found[j].size
		}
		if found[i].allocSeq != found[j].allocSeq {
			return found[i].allocSeq < found[j].allocSeq
		}
		return found[i].addr < found[j].addr
	})
	if limit > 0 && len(found) > limit {
		found = found[:limit]
	}
	out.Allocations = make([]gpu.Allocation, len(found))
	var bytes uint64
	for i := range found {
		out.Allocations[i] = found[i].allocation()
		bytes += found[i].size
	}
	out.Omitted = out.Total - int64(len(found))
	out.OmittedBytes = out.TotalBytes - bytes
	return out, nil
}

// binScan calls fn for the records of bin (s, d) that may be alive in
// [t0, t1]: rows whose frees fall in (t0, t1 + 2^d).
func (r *reader) binScan(s, d int, t0, t1 int64, fn func(a *allocRec)) error {
	hi := t1 + 1<<min(d, 61)
	if r.bins == nil {
		st, err := r.tx.Prepare("SELECT min_free, max_free, data FROM alloc_bins WHERE tid = ? AND sclass = ? AND dclass = ? AND min_free < ? ORDER BY min_free DESC, first_seq DESC")
		if err != nil {
			return err
		}
		r.bins = st
	}
	rows, err := r.bins.Query(r.tid, s, d, hi)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var minFree, maxFree int64
		var data []byte
		if err := rows.Scan(&minFree, &maxFree, &data); err != nil {
			return err
		}
		if maxFree <= t0 {
			break // rows are in free order: every earlier one ended by t0
		}
		if err := eachAllocRec(minFree, data, fn); err != nil {
			return fmt.Errorf("trace %s: allocation bin (%d, %d): %w", r.trace.ID, s, d, err)
		}
	}
	return rows.Err()
}

// eachAllocRec calls fn for the records of one alloc_bins row. The record
// fn gets is only valid during the call (one is reused: a bin holds
// thousands, and a record per call would be a heap allocation each).
func eachAllocRec(minFree int64, data []byte, fn func(a *allocRec)) error {
	dec := &decoder{buf: data}
	prev := allocRec{freeUS: minFree}
	a := new(allocRec)
	for {
		var ok bool
		if *a, ok = dec.allocRec(&prev); !ok {
			return dec.err
		}
		fn(a)
	}
}

func (r *reader) openAllocs() ([]allocRec, error) {
	var data []byte
	if err := r.tx.QueryRow("SELECT data FROM alloc_open WHERE tid = ?", r.tid).Scan(&data); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, err
	}
	return decodeAllocs(data)
}

func decodeAllocs(data []byte) ([]allocRec, error) {
	var out []allocRec
	dec := &decoder{buf: data}
	var prev allocRec
	for {
		a, ok := dec.allocRec(&prev)
		if !ok {
			break
		}
		out = append(out, a)
	}
	return out, dec.err
}

// Allocation returns the allocation made by the alloc event seq, and its
// stack (nil when none was recorded).
func (db *DB) Allocation(id string, seq int64) (gpu.Allocation, gpu.Stack, error) {
	r, err := db.begin(id)
	if err != nil {
		return gpu.Allocation{}, nil, err
	}
	var ev *gpu.Event
	err = r.events(seq, seq+1, func(e *gpu.Event) bool { c := *e; ev = &c; return false })
	if err == nil && (ev == nil || ev.Action != gpu.ActionAlloc) {
		err = fmt.Errorf("trace %s: no alloc event %d: %w", id, seq, ErrNotFound)
	}
	var found *allocRec
	if err == nil {
		found, err = r.findAllocation(ev)
	}
	r.close()
	if err != nil {
		return gpu.Allocation{}, nil, err
	}
	a := found.allocation()
	if a.Stack == 0 {
		return a, nil, nil
	}
	st, err := db.Stack(id, a.Stack)
	return a, st, err
}

func (r *reader) findAllocation(ev *gpu.Event) (*allocRec, error) {
	open, err := r.openAllocs()
	if err != nil {
		return nil, err
	}
	for i := range open {
		if open[i].allocSeq == ev.Seq {
			return &open[i], nil
		}
	}
	s := sizeClass(ev.BlockSize)
	rows, err := r.tx.Query("SELECT dclass FROM alloc_classes WHERE tid = ? AND sclass = ?", r.tid, s)
	if err != nil {
		return nil, err
	}
	var ds []int
	for rows.Next() {
		var d int
		if err := rows.Scan(&d); err != nil {
			rows.Close()
			return nil, err
		}
		ds = append(ds, d)
	}
	rows.Close()
	var found *allocRec
	for _, d := range ds {
		err := r.binScan(s, d, ev.TimeUS-1, ev.TimeUS, func(a *allocRec) {
			if a.allocSeq == ev.Seq {
				c := *a
				found = &c
			}
		})
		if err != nil || found != nil {
			return found, err
		}
	}
	return nil, fmt.Errorf("trace %s: allocation %d is not stored (its writer stopped before committing it): %w", r.trace.ID, ev.Seq, ErrNotFound)
}
