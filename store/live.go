package store

import (
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sort"

	"vramscope/gpu"
)

// LiveSet is what was allocated at one instant: the allocated blocks of the
// layout right after event Seq (pending-free blocks were freed by their
// owner and are not in it), with what is known of each.
type LiveSet struct {
	Trace  string // the trace's id
	Seq    int64  // the last event in effect; -1: none (the layout before the trace)
	TimeUS int64  // that event's time; the trace's first time when Seq is -1
	// Blocks are in address order.
	Blocks []LiveBlock
	// Stacks holds the stack of every block that has one.
	Stacks map[gpu.StackID]gpu.Stack
}

// LiveBlock is one live allocation: its block (address, size, requested
// size, stack, alloc seq), its segment's stream and pool, when it was
// allocated, and what its alloc event said beyond the event model.
type LiveBlock struct {
	gpu.Block
	Stream     int64    `json:"stream"`
	Pool       gpu.Pool `json:"-"`
	Expandable bool     `json:"-"`
	// AllocUS is the time of the alloc event; gpu.BeforeTraceUS for a
	// block allocated before the trace began (Seq -1).
	AllocUS      int64  `json:"alloc_us"`
	UserMetadata string `json:"user_metadata,omitempty"`
}

// Bytes is the sum of the blocks' sizes: the allocated bytes at the instant.
func (l *LiveSet) Bytes() uint64 {
	var n uint64
	for i := range l.Blocks {
		n += l.Blocks[i].Size
	}
	return n
}

// LiveAt is the live set after the last event at or before time t.
func (db *DB) LiveAt(id string, t int64) (*LiveSet, error) {
	r, err := db.begin(id)
	if err != nil {
		return nil, err
	}
	defer r.close()
	seq, _, _, err := r.stateAt(t, true)
	if err != nil {
		return nil, err
	}
	return r.liveAtSeq(seq)
}

// LiveAtSeq is the live set right after event seq (or the last event
// before it); -1 asks for the layout before the trace.
func (db *DB) LiveAtSeq(id string, seq int64) (*LiveSet, error) {
	r, err := db.begin(id)
	if err != nil {
		return nil, err
	}
	defer r.close()
	return r.liveAtSeq(seq)
}

// liveAtSeq reads the layout from its checkpoint (at most checkpointEvery
// events replayed, or as many as the checkpoint has blocks), then the alloc times of its live blocks from the
// chunks that hold their alloc events, their stacks and their extras: the
// cost follows the live set, not the trace's length.
func (r *reader) liveAtSeq(seq int64) (*LiveSet, error) {
	l, last, us, err := r.layoutTimed(seq)
	if err != nil {
		return nil, err
	}
	out := r.liveBlocks(l, last, us)
	return out, r.describe(out)
}

// layoutOrInitial is layoutAtSeq, or for seq -1 the layout before the trace.
func (r *reader) layoutOrInitial(seq int64) (*gpu.Layout, int64, error) {
	if seq < 0 {
		l, err := r.checkpoint(initialSeq)
		return l, -1, err
	}
	return r.layoutAtSeq(seq)
}

// layoutTimed is layoutOrInitial and the time of its last event (the
// trace's first time when there is none).
func (r *reader) layoutTimed(seq int64) (l *gpu.Layout, last, us int64, err error) {
	if l, last, err = r.layoutOrInitial(seq); err != nil || last < 0 {
		return l, last, r.trace.FirstUS, err
	}
	times, err := r.timesOf([]int64{last})
	return l, last, times[last], err
}

// liveBlocks is the live set of layout l, right after event last (at
// time us), its blocks not yet described.
func (r *reader) liveBlocks(l *gpu.Layout, last, us int64) *LiveSet {
	out := &LiveSet{Trace: r.trace.ID, Seq: last, TimeUS: us, Stacks: map[gpu.StackID]gpu.Stack{}}
	for i := range l.Segments {
		s := &l.Segments[i]
		for _, b := range s.Blocks {
			if b.State == gpu.BlockAllocated {
				out.Blocks = append(out.Blocks, LiveBlock{Block: b, Stream: s.Stream, Pool: s.Pool, Expandable: s.Expandable, AllocUS: gpu.BeforeTraceUS})
			}
		}
	}
	return out
}

// LiveAtEach calls fn with the live set at each time of ts, which must
// not decrease, as LiveAt gives it but with its blocks not described
// (AllocUS, Stacks, UserMetadata). The layout is carried forward through
// the events, each read once, from one time to the next; where the next
// time lies past a checkpoint beyond the one the walk reaches, it is read
// from that checkpoint instead, so far times cost no more than LiveAt. fn
// reads more through rd (Describe the blocks it does not know yet), not
// through db: the read holds one of db's connections.
func (db *DB) LiveAtEach(id string, ts []int64, fn func(ls *LiveSet, rd Read) error) error {
	return db.liveAtEach(id, ts, false, fn)
}

// LiveAfterEach is LiveAtEach at instants named by events: right after
// each event of seqs (which must not decrease; -1: before the first).
func (db *DB) LiveAfterEach(id string, seqs []int64, fn func(ls *LiveSet, rd Read) error) error {
	return db.liveAtEach(id, seqs, true, fn)
}

// liveAtEach is LiveAtEach at times ts, or with bySeq right after events ts.
func (db *DB) liveAtEach(id string, ts []int64, bySeq bool, fn func(ls *LiveSet, rd Read) error) error {
	if len(ts) == 0 {
		return nil
	}
	r, err := db.begin(id)
	if err != nil {
		return err
	}
	defer r.close()
	checkpoints, err := r.checkpointSeqs()
	if err != nil {
		return err
	}
	var l *gpu.Layout
	var last, lastUS int64
	seqOf := func(t int64) (int64, error) { // the last event of instant t
		if bySeq {
			return t, nil
		}
		seq, _, _, err := r.stateAt(t, true)
		return seq, err
	}
	jump := func(t int64) error { // to the layout at t, from its checkpoint
		seq, err := seqOf(t)
		if err == nil {
			l, last, lastUS, err = r.layoutTimed(seq)
		}
		return err
	}
	if err := jump(ts[0]); err != nil {
		return err
	}
	i := 0
	emit := func() error {
		if i > 0 && ts[i] < ts[i-1] {
			return fmt.Errorf("store: live sets at times that decrease (%d after %d)", ts[i], ts[i-1])
		}
		ls := r.liveBlocks(l, last, lastUS)
		i++
		return fn(ls, Read{r})
	}
	passed := int64(-1) // the checkpoint last weighed
	for i < len(ts) {
		var stop error
		paused := false
		err := r.events(last+1, r.trace.LastSeq+1, func(e *gpu.Event) bool {
			for i < len(ts) && (!bySeq && e.TimeUS > ts[i] || bySeq && e.Seq > ts[i]) && stop == nil {
				stop = emit()
			}
			if i == len(ts) || stop != nil {
				return false
			}
			if _, at := slices.BinarySearch(checkpoints, e.Seq); at && e.Seq > passed {
				paused = true // weigh walking on against a later checkpoint
				return false
			}
			if err := l.Apply(*e); err != nil {
				stop = fmt.Errorf("trace %s: layout at seq %d: %w", r.trace.ID, e.Seq, err)
				return false
			}
			last, lastUS = e.Seq, e.TimeUS
			return true
		})
		if err == nil {
			err = stop
		}
		if err != nil {
			return err
		}
		if !paused {
			break // the trace's end
		}
		passed = last + 1
		seq, err := seqOf(ts[i])
		if err != nil {
			return err
		}
		if k := sort.Search(len(checkpoints), func(k int) bool { return checkpoints[k] > seq }); k > 0 && checkpoints[k-1] > passed {
			if err := jump(ts[i]); err != nil {
				return err
			}
		}
	}
	for i < len(ts) {
		if err := emit(); err != nil {
			return err
		}
	}
	return nil
}

// checkpointSeqs lists the events after which a layout is checkpointed.
func (r *reader) checkpointSeqs() ([]int64, error) {
	rows, err := r.tx.Query("SELECT seq FROM checkpoints WHERE tid = ? AND seq >= 0 ORDER BY seq", r.tid)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			return nil, err
		}
		out = append(out, seq)
	}
	return out, rows.Err()
}

// NoInstant is LiveSet.TimeUS of allocations gathered from several
// instants (Describe).
const NoInstant int64 = -1 << 63

// Describe gives allocations of any instants (the bands of a window) what a
// live set has: their alloc times, stacks and user_metadata. Their streams
// are not known (0); the set's Seq is -1 and its TimeUS NoInstant.
func (db *DB) Describe(id string, blocks []gpu.Block) (*LiveSet, error) {
	r, err := db.begin(id)
	if err != nil {
		return nil, err
	}
	defer r.close()
	out := &LiveSet{Trace: id, Seq: -1, TimeUS: NoInstant, Stacks: map[gpu.StackID]gpu.Stack{}, Blocks: make([]LiveBlock, len(blocks))}
	for i, b := range blocks {
		out.Blocks[i] = LiveBlock{Block: b, AllocUS: gpu.BeforeTraceUS}
	}
	return out, r.describe(out)
}

// describe fills in the alloc times, stacks and user_metadata of ls's blocks.
func (r *reader) describe(ls *LiveSet) error {
	seqs := make([]int64, 0, len(ls.Blocks))
	for i := range ls.Blocks {
		if ls.Blocks[i].Seq >= 0 {
			seqs = append(seqs, ls.Blocks[i].Seq)
		}
	}
	times, err := r.timesOf(seqs)
	if err != nil {
		return err
	}
	for i := range ls.Blocks {
		if s := ls.Blocks[i].Seq; s >= 0 {
			ls.Blocks[i].AllocUS = times[s]
		}
	}
	if err := r.liveStacks(ls); err != nil {
		return err
	}
	return r.liveMetadata(ls)
}

// timesOf maps events to their times, decoding each chunk that holds one
// of them up to the last of them.
func (r *reader) timesOf(seqs []int64) (map[int64]int64, error) {
	out := make(map[int64]int64, len(seqs))
	if len(seqs) == 0 {
		return out, nil
	}
	sorted := append([]int64(nil), seqs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	st, err := r.tx.Prepare("SELECT " + chunkCols + " FROM chunks WHERE tid = ? AND first_seq <= ? ORDER BY first_seq DESC LIMIT 1")
	if err != nil {
		return nil, err
	}
	defer st.Close()
	for i := 0; i < len(sorted); {
		c, err := scanChunk(st.QueryRow(r.tid, sorted[i]))
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("trace %s: no event %d: %w", r.trace.ID, sorted[i], ErrNotFound)
		}
		if err != nil {
			return nil, err
		}
		// The events of seqs that this chunk holds: sorted[i:j].
		j := i
		for j < len(sorted) && sorted[j] <= c.lastSeq {
			j++
		}
		want := sorted[i:j]
		k := 0
		err = c.walk(func(e *gpu.Event, _ bool, _ gpu.Totals, _ allocCounts) bool {
			for k < len(want) && want[k] == e.Seq {
				out[e.Seq] = e.TimeUS
				k++
			}
			return k < len(want)
		})
		if err != nil {
			return nil, err
		}
		if k < len(want) {
			return nil, fmt.Errorf("trace %s: no event %d: %w", r.trace.ID, want[k], ErrNotFound)
		}
		i = j
	}
	return out, nil
}

// liveStacks reads the stacks the live blocks name.
func (r *reader) liveStacks(ls *LiveSet) error {
	sids := make([]gpu.StackID, len(ls.Blocks))
	for i := range ls.Blocks {
		sids[i] = ls.Blocks[i].Stack
	}
	return r.stacksOf(sids, ls.Stacks)
}

// liveMetadata fills in the user_metadata of the live blocks' alloc events
// from the runs of event extras between the first and the last of them.
func (r *reader) liveMetadata(ls *LiveSet) error {
	lo, hi := int64(-1), int64(-1)
	for i := range ls.Blocks {
		if s := ls.Blocks[i].Seq; s >= 0 {
			if lo < 0 || s < lo {
				lo = s
			}
			hi = max(hi, s)
		}
	}
	if lo < 0 {
		return nil
	}
	rows, err := r.tx.Query(`SELECT r.first_seq, x.user_metadata FROM event_extra_runs r LEFT JOIN event_extras x ON x.tid = r.tid AND x.xid = r.xid
		WHERE r.tid = ?1 AND r.first_seq <= ?3 AND r.first_seq >= COALESCE((SELECT max(first_seq) FROM event_extra_runs WHERE tid = ?1 AND first_seq <= ?2), 0)
		ORDER BY r.first_seq`, r.tid, lo, hi)
	if err != nil {
		return err
	}
	defer rows.Close()
	type run struct {
		seq  int64
		text string
	}
	var runs []run
	for rows.Next() {
		var x run
		var um sql.NullString
		if err := rows.Scan(&x.seq, &um); err != nil {
			return err
		}
		x.text = um.String
		runs = append(runs, x)
	}
	if err := rows.Err(); err != nil || len(runs) == 0 {
		return err
	}
	for i := range ls.Blocks {
		b := &ls.Blocks[i]
		if b.Seq < 0 {
			continue
		}
		j := sort.Search(len(runs), func(j int) bool { return runs[j].seq > b.Seq }) - 1
		if j >= 0 {
			b.UserMetadata = runs[j].text
		}
	}
	return nil
}

// MetadataChange is where the user_metadata of events changes: from event
// Seq on, at TimeUS, the events say Text ("" for none).
type MetadataChange struct {
	Seq    int64  `json:"seq"`
	TimeUS int64  `json:"time_us"`
	Text   string `json:"user_metadata"`
}

// MetadataChanges lists the first limit places where the user_metadata of
// a trace's events changes (torch.cuda.memory._set_memory_metadata marks
// phases so), and how many there are in all.
func (db *DB) MetadataChanges(id string, limit int) ([]MetadataChange, int, error) {
	r, err := db.begin(id)
	if err != nil {
		return nil, 0, err
	}
	defer r.close()
	rows, err := r.tx.Query(`SELECT r.first_seq, x.user_metadata FROM event_extra_runs r LEFT JOIN event_extras x ON x.tid = r.tid AND x.xid = r.xid
		WHERE r.tid = ? ORDER BY r.first_seq`, r.tid)
	if err != nil {
		return nil, 0, err
	}
	var out []MetadataChange
	total := 0
	prev := ""
	for rows.Next() {
		var c MetadataChange
		var um sql.NullString
		if err := rows.Scan(&c.Seq, &um); err != nil {
			rows.Close()
			return nil, 0, err
		}
		if c.Text = um.String; c.Text == prev || c.Seq > r.trace.LastSeq {
			continue
		}
		prev = c.Text
		total++
		if len(out) < limit {
			out = append(out, c)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	seqs := make([]int64, len(out))
	for i := range out {
		seqs[i] = out[i].Seq
	}
	times, err := r.timesOf(seqs)
	if err != nil {
		return nil, 0, err
	}
	for i := range out {
		out[i].TimeUS = times[out[i].Seq]
	}
	return out, total, nil
}
