package store

import (
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

	"vramscope/gpu"
)

// The stacked "active memory timeline" (memory_viz's), answered per pixel
// column. Every live allocation is a band, stacked in allocation order
// (those live before the trace began at the bottom, by address): each sits
// on the allocations made before it and slides down when one of them is
// freed. That layout does not depend on the zoom, so zooming either axis
// never moves a band; the zoom only decides which bands are sent: those at
// least a pixel tall at the visible memory range [M0, M1) that reach into
// it. What is not sent is covered by the allocated envelope drawn behind
// the bands.
//
// The stack is sampled once per column, at the column's start, by sweeping
// the window's events through the set of live allocations. A window holding
// more than maxSweep events would cost too much to sweep; it is sampled at
// the stored layout checkpoints instead (one every checkpointEvery events
// or more, at most maxSamples of them), each sample standing for the columns up to
// the next one.

const (
	// maxSweep is the most events a bands answer replays.
	maxSweep = 250_000
	// maxSamples caps the checkpoints a dense window is sampled at.
	maxSamples = 400
	// maxBands and maxRuns cap one answer; past them the smallest bands
	// are left to the envelope.
	maxBands = 2000
	maxRuns  = 20_000
)

// BandsQuery is a window of the stacked timeline: [T0, T1] over W pixel
// columns, and the memory range [M0, M1) over H pixel rows. M1 == 0 asks
// for [0, 1.05 × the window's greatest reserved bytes].
type BandsQuery struct {
	T0, T1 int64
	W, H   int
	M0, M1 uint64
}

// Band is one allocation. Runs holds pairs (column, offset): from that
// column on, up to the next pair or past C1, the band spans
// [offset, offset+size) bytes. Offsets are exact at the run's column and
// within a quarter of a pixel row after it.
type Band struct {
	Seq       int64       `json:"seq"` // -1: allocated before the trace began
	Addr      uint64      `json:"address"`
	Size      uint64      `json:"size"`
	Requested uint64      `json:"requested_size"`
	Stack     gpu.StackID `json:"stack,omitempty"`
	C0        int         `json:"c0"`
	C1        int         `json:"c1"`
	Runs      []int64     `json:"runs"`
}

// Bands is the stacked timeline of one window.
type Bands struct {
	T0 int64  `json:"t0"`
	T1 int64  `json:"t1"`
	W  int    `json:"w"`
	M0 uint64 `json:"m0"`
	M1 uint64 `json:"m1"`
	// Allocated is the greatest allocated bytes in each column: the
	// envelope the bands are drawn over.
	Allocated []uint64 `json:"allocated"`
	YMax      uint64   `json:"y_max"` // greatest reserved bytes in the window
	MinBytes  uint64   `json:"min_bytes"`
	// Sampled says how the stack was sampled: "columns" (every column's
	// start) or "checkpoints" (a dense window); Samples how many times.
	Sampled string `json:"sampled"`
	Samples int    `json:"samples"`
	Bands   []Band `json:"bands"`
	// Dropped counts the bands past maxBands or maxRuns, left out.
	Dropped int `json:"dropped"`
}

// Bands lays out the stacked timeline of q's window.
func (db *DB) Bands(id string, q BandsQuery) (*Bands, error) {
	if q.W < 1 || q.H < 1 || q.T1 <= q.T0 || q.M1 != 0 && q.M1 <= q.M0 {
		return nil, fmt.Errorf("store: bands need t0 < t1, m0 < m1, w and h >= 1 (got %+v)", q)
	}
	out := &Bands{T0: q.T0, T1: q.T1, W: q.W, Allocated: make([]uint64, q.W), Bands: []Band{}}
	dt := float64(q.T1-q.T0) / float64(q.W)
	colOf := func(t int64) int { return min(q.W-1, max(0, int(math.Floor(float64(t-q.T0)/dt)))) }

	// The greatest allocated and reserved bytes per column, from the usage pyramid.
	u, err := db.Usage(id, q.T0, q.T1, q.W)
	if err != nil {
		return nil, err
	}
	for _, b := range u.Buckets {
		out.YMax = max(out.YMax, b.Reserved.Max)
		for c := colOf(b.StartUS); c <= colOf(b.StartUS+u.BucketUS-1); c++ {
			out.Allocated[c] = max(out.Allocated[c], b.Allocated.Max)
		}
	}
	out.M0, out.M1 = q.M0, q.M1
	if q.M1 == 0 {
		out.M0, out.M1 = 0, out.YMax+out.YMax/20
	}
	if out.M1 == 0 {
		return out, nil // nothing was ever reserved
	}
	span := out.M1 - out.M0
	out.MinBytes = max(1, (span+uint64(q.H)-1)/uint64(q.H))
	lay := &bandLayout{out: out, minBytes: out.MinBytes, quantum: max(1, span/uint64(4*q.H)), bandOf: map[bandKey]int32{}}

	r, err := db.begin(id)
	if err != nil {
		return nil, err
	}
	defer r.close()
	// A column's sample is the state after the events up to its start.
	startOf := func(c int) int64 { return int64(math.Floor(float64(q.T0) + float64(c)*dt)) }
	seq0, _, _, err := r.stateAt(q.T0, true)
	if err != nil {
		return nil, err
	}
	seqEnd, _, _, err := r.stateAt(startOf(q.W-1), true)
	if err != nil {
		return nil, err
	}
	live := &liveSet{}
	ck, err := r.liveAtCheckpoint(seq0, live, lay)
	if err != nil {
		return nil, err
	}
	if seqEnd-seq0 <= maxSweep {
		out.Sampled = "columns"
		c := 0
		err = r.eventsWithEnds(ck+1, seqEnd+1, func(e *gpu.Event, ends bool) bool {
			for c < q.W && e.TimeUS > startOf(c) {
				lay.sample(live, c)
				c++
			}
			live.apply(e, ends)
			return true
		})
		for ; c < q.W; c++ {
			lay.sample(live, c)
		}
		out.Samples = q.W
	} else {
		out.Sampled = "checkpoints"
		err = r.sampleCheckpoints(live, lay, ck, seq0, seqEnd, colOf)
	}
	if err != nil {
		return nil, err
	}
	lay.finish()
	return out, nil
}

// sampleCheckpoints samples a dense window: the state at its start for the
// columns before the first checkpoint, then each checkpoint's state for the
// columns from its own to the next one's.
func (r *reader) sampleCheckpoints(live *liveSet, lay *bandLayout, ck, seq0, seqEnd int64, colOf func(int64) int) error {
	err := r.eventsWithEnds(ck+1, seq0+1, func(e *gpu.Event, ends bool) bool { live.apply(e, ends); return true })
	if err != nil {
		return err
	}
	// The checkpoints in the window, thinned to maxSamples, and the last
	// of each column.
	var seqs []int64
	rows, err := r.tx.Query("SELECT seq FROM checkpoints WHERE tid = ? AND seq > ? AND seq <= ? ORDER BY seq", r.tid, seq0, seqEnd)
	if err != nil {
		return err
	}
	for rows.Next() {
		var s int64
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return err
		}
		seqs = append(seqs, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	step := max(1, (len(seqs)+maxSamples-1)/maxSamples)
	times, err := r.chunkEnds(seq0, seqEnd)
	if err != nil {
		return err
	}
	type sample struct {
		seq int64
		col int
	}
	var picks []sample
	for i := step - 1; i < len(seqs); i += step {
		t, ok := times[seqs[i]]
		if !ok { // a checkpoint inside a chunk (a resumed trace)
			if t, err = r.timeOf(seqs[i]); err != nil {
				return err
			}
		}
		s := sample{seqs[i], colOf(t)}
		if s.col == 0 {
			continue // column 0 is sampled at the window's start
		}
		if n := len(picks); n > 0 && picks[n-1].col == s.col {
			picks[n-1] = s
		} else {
			picks = append(picks, s)
		}
	}
	if len(picks) == 0 {
		lay.sample(live, 0)
		lay.out.Samples = 1
		return nil
	}
	args := []any{r.tid}
	marks := make([]byte, 0, 2*len(picks))
	for i, p := range picks {
		if i > 0 {
			marks = append(marks, ',')
		}
		marks = append(marks, '?')
		args = append(args, p.seq)
	}
	rows, err = r.tx.Query("SELECT seq, data FROM checkpoints WHERE tid = ? AND seq IN ("+string(marks)+") ORDER BY seq", args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	lay.sample(live, 0) // the window's start
	for _, p := range picks {
		var seq int64
		var data []byte
		if !rows.Next() {
			return errors.Join(rows.Err(), fmt.Errorf("trace %s: checkpoint %d is missing", r.trace.ID, p.seq))
		}
		if err := rows.Scan(&seq, &data); err != nil {
			return err
		}
		if err := lay.load(live, data); err != nil {
			return fmt.Errorf("trace %s: checkpoint %d: %w", r.trace.ID, seq, err)
		}
		lay.sample(live, p.col)
	}
	lay.out.Samples = len(picks) + 1
	return rows.Err()
}

// chunkEnds maps the last seq of each chunk in (seq0, seqEnd] to its time:
// checkpoints fall on chunk ends.
func (r *reader) chunkEnds(seq0, seqEnd int64) (map[int64]int64, error) {
	rows, err := r.tx.Query("SELECT last_seq, last_us FROM chunks WHERE tid = ? AND first_seq > ? AND first_seq <= ?", r.tid, seq0-chunkSize, seqEnd)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[int64]int64{}
	for rows.Next() {
		var s, t int64
		if err := rows.Scan(&s, &t); err != nil {
			return nil, err
		}
		out[s] = t
	}
	return out, rows.Err()
}

// timeOf is the time of event seq.
func (r *reader) timeOf(seq int64) (int64, error) {
	c, err := r.oneChunk("first_seq <= ? ORDER BY first_seq DESC LIMIT 1", seq)
	if err != nil || c == nil {
		return 0, errors.Join(err, fmt.Errorf("trace %s: no event %d: %w", r.trace.ID, seq, ErrNotFound))
	}
	if c.lastSeq == seq {
		return c.lastUS, nil
	}
	t := c.lastUS
	err = c.walk(func(e *gpu.Event, _ bool, _ gpu.Totals, _ allocCounts) bool {
		t = e.TimeUS
		return e.Seq < seq
	})
	return t, err
}

// liveAtCheckpoint fills live with the allocations of the latest checkpoint
// at or before seq, and returns that checkpoint's seq (initialSeq for the
// layout before the trace).
func (r *reader) liveAtCheckpoint(seq int64, live *liveSet, lay *bandLayout) (int64, error) {
	var ck int64
	var data []byte
	err := r.tx.QueryRow("SELECT seq, data FROM checkpoints WHERE tid = ? AND seq <= ? ORDER BY seq DESC LIMIT 1", r.tid, seq).Scan(&ck, &data)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("trace %s: no layout checkpoint at or before %d", r.trace.ID, seq)
	}
	if err != nil {
		return 0, err
	}
	if err := lay.load(live, data); err != nil {
		return 0, fmt.Errorf("trace %s: checkpoint %d: %w", r.trace.ID, ck, err)
	}
	return ck, nil
}

// load fills live from a checkpoint, each allocation with its band.
func (l *bandLayout) load(live *liveSet, data []byte) error {
	if err := live.fromCheckpoint(data); err != nil {
		return err
	}
	for i := range live.list {
		e := &live.list[i]
		if b, ok := l.bandOf[keyOf(e)]; ok {
			e.band = b
		}
	}
	return nil
}

// liveEntry is one live allocation in the stack.
type liveEntry struct {
	seq       int64
	addr      uint64
	size      uint64 // 0: freed, waiting for the list to be compacted
	requested uint64
	stack     gpu.StackID
	band      int32 // index in bandLayout.bands, -1 for none
}

// liveSet is the live allocations in stacking order, with their index by
// address (built when first needed: a checkpoint sample may need none).
type liveSet struct {
	list []liveEntry
	at   map[uint64]int32 // nil until built
	dead int
	// buffers reused by fromCheckpoint
	spare []liveEntry
	keys  []uint64
}

func (s *liveSet) add(e liveEntry) {
	s.at[e.addr] = int32(len(s.list))
	s.list = append(s.list, e)
}

// apply moves the set past one event.
func (s *liveSet) apply(e *gpu.Event, ends bool) {
	if s.at == nil {
		s.at = make(map[uint64]int32, len(s.list))
		for i := range s.list {
			if s.list[i].size != 0 {
				s.at[s.list[i].addr] = int32(i)
			}
		}
	}
	switch {
	case e.Action == gpu.ActionAlloc:
		s.add(liveEntry{seq: e.Seq, addr: e.Addr, size: e.BlockSize, requested: e.Size, stack: e.Stack, band: -1})
	case endsAllocation(e, ends):
		i, ok := s.at[e.Addr]
		if !ok {
			return
		}
		delete(s.at, e.Addr)
		s.list[i].size = 0
		if s.dead++; s.dead > 64 && s.dead > len(s.list)/2 {
			s.compact()
		}
	}
}

func (s *liveSet) compact() {
	kept := s.list[:0]
	for _, e := range s.list {
		if e.size != 0 {
			s.at[e.addr] = int32(len(kept))
			kept = append(kept, e)
		}
	}
	s.list, s.dead = kept, 0
}

// fromCheckpoint replaces the set with the allocated blocks of a stored
// layout (see appendLayout), read without building the layout.
func (s *liveSet) fromCheckpoint(data []byte) error {
	s.list, s.dead, s.at = s.list[:0], 0, nil
	d := &decoder{buf: data}
	n := d.uvarint()
	var prevEnd uint64
	for range n {
		addr := prevEnd + d.uvarint()
		size := d.uvarint()
		d.varint() // stream
		if _, ok := d.byte1(); !ok {
			return errors.New("corrupt layout checkpoint")
		}
		nb := d.uvarint()
		at := addr
		for range nb {
			b := liveEntry{addr: at, size: d.uvarint(), band: -1}
			state, ok := d.byte1()
			if !ok || d.err != nil {
				return errors.New("corrupt layout checkpoint")
			}
			b.requested = b.size - uint64(d.varint())
			b.stack = gpu.StackID(d.uvarint())
			b.seq = d.varint()
			at += b.size
			if gpu.BlockState(state) == gpu.BlockAllocated && b.size > 0 {
				s.list = append(s.list, b)
			}
		}
		prevEnd = addr + size
	}
	if d.err != nil {
		return fmt.Errorf("corrupt layout checkpoint: %w", d.err)
	}
	// Stacking order: by seq, those before the trace (seq -1) first in
	// address order, which is the order they were read in. One key per
	// entry, (seq+1) above its index, sorts faster than the entries.
	if len(s.list) >= 1<<idxBits {
		return fmt.Errorf("%d live blocks", len(s.list))
	}
	keys := s.keys[:0]
	for i := range s.list {
		keys = append(keys, uint64(s.list[i].seq+1)<<idxBits|uint64(i))
	}
	slices.Sort(keys)
	sorted := s.spare[:0]
	for _, k := range keys {
		sorted = append(sorted, s.list[k&(1<<idxBits-1)])
	}
	s.list, s.spare, s.keys = sorted, s.list, keys
	return nil
}

// idxBits is the bits of a sort key that hold the entry's index.
const idxBits = 24

// bandKey names an allocation: its seq, or for one made before the trace
// (seq -1) its address with the top bit set.
type bandKey uint64

func keyOf(e *liveEntry) bandKey {
	if e.seq < 0 {
		return bandKey(1<<63 | e.addr)
	}
	return bandKey(e.seq)
}

// bandLayout turns samples of the live set into bands.
type bandLayout struct {
	out      *Bands
	minBytes uint64
	quantum  uint64 // a quarter of a pixel row
	bands    []Band
	bandOf   map[bandKey]int32
	runs     int
	prev     int // the column last sampled
}

// sample records the stack of live at column c, sampled after column
// l.prev. A band in both samples spans the columns between them at its
// offset in the later one: offsets only fall while an allocation lives (the
// allocations below it can only go), so the band never rises above where
// it really is, nor above the allocated envelope. A band not in the earlier
// sample starts at c.
func (l *bandLayout) sample(live *liveSet, c int) {
	m0, m1 := l.out.M0, l.out.M1
	var off uint64
	for i := range live.list {
		e := &live.list[i]
		if e.size == 0 {
			continue
		}
		if e.size >= l.minBytes {
			if e.band < 0 && off < m1 && off+e.size > m0 {
				e.band = int32(len(l.bands))
				l.bandOf[keyOf(e)] = e.band
				l.bands = append(l.bands, Band{Seq: e.seq, Addr: e.addr, Size: e.size, Requested: e.requested, Stack: e.stack, C0: c, C1: c})
				l.bands[e.band].Runs = append(l.bands[e.band].Runs, int64(c), int64(off))
				l.runs++
			} else if e.band >= 0 {
				b := &l.bands[e.band]
				if n := len(b.Runs); absDiff(uint64(b.Runs[n-1]), off) >= l.quantum {
					b.Runs = append(b.Runs, int64(b.C1+1), int64(off))
					l.runs++
				}
				b.C1 = c
			}
		}
		off += e.size
	}
	l.prev = c
}

func absDiff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}

// finish keeps the largest bands within the caps.
func (l *bandLayout) finish() {
	bands := l.bands
	if len(bands) > maxBands || l.runs > maxRuns {
		bySize := make([]int, len(bands))
		for i := range bySize {
			bySize[i] = i
		}
		sort.SliceStable(bySize, func(i, j int) bool { return bands[bySize[i]].Size > bands[bySize[j]].Size })
		keep := make([]bool, len(bands))
		runs := 0
		for n, i := range bySize {
			if n >= maxBands || runs+len(bands[i].Runs)/2 > maxRuns {
				break
			}
			keep[i] = true
			runs += len(bands[i].Runs) / 2
		}
		kept := bands[:0:0]
		for i := range bands {
			if keep[i] {
				kept = append(kept, bands[i])
			}
		}
		l.out.Dropped = len(bands) - len(kept)
		bands = kept
	}
	if bands != nil {
		l.out.Bands = bands
	}
}
