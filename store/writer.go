package store

import (
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"vramscope/gpu"
	"vramscope/gpu/caching"
)

const (
	// flushEvents: a commit every this many events bounds what a crash
	// loses and what one transaction holds.
	flushEvents = 1 << 16
	// flushDelay: how long an event may wait for its commit, so live
	// viewers and crash recovery see slow streams too.
	flushDelay = 200 * time.Millisecond
	// checkpointEvery: a layout checkpoint every this many events, or
	// every as many events as the last checkpoint had blocks when that is
	// more: LayoutAt decodes one and applies at most that many events, so
	// a large layout costs no more than twice its decoding to read, and its
	// checkpoints take room in proportion to the events, not their number
	// times the layout (64k blocks every 8192 events made checkpoints eight
	// times the events' size).
	checkpointEvery = 8192
	// levelMinEvents: usage buckets with fewer events are not stored (their
	// events are decoded instead), which keeps the pyramid to a few percent
	// of the events however sparse or dense the trace is in time.
	levelMinEvents = 64
	numLevels      = 63
	// binSize: allocation records per alloc_bins row.
	binSize = 128

	// initialSeq keys the checkpoint of the layout before the first event.
	initialSeq = -1 << 62
	// beforeUS is the allocation time of blocks live before the trace began.
	beforeUS = gpu.BeforeTraceUS
)

// allocCounts are running counts of allocation intervals begun and ended.
type allocCounts struct {
	allocs, allocBytes, frees, freeBytes int64
}

// chunkBuilder holds the chunk being filled.
type chunkBuilder struct {
	n         int
	firstSeq  int64
	firstUS   int64
	lastSeq   int64
	lastUS    int64
	before    gpu.Totals
	beforeCnt allocCounts
	st        encState
	buf       []byte
}

type chunkRow struct {
	firstSeq, lastSeq, firstUS, lastUS int64
	n                                  int
	before                             gpu.Totals
	beforeCnt                          allocCounts
	data                               []byte
}

func (c *chunkBuilder) row(copyData bool) chunkRow {
	data := c.buf
	if copyData {
		data = append([]byte(nil), c.buf...)
	}
	return chunkRow{c.firstSeq, c.lastSeq, c.firstUS, c.lastUS, c.n, c.before, c.beforeCnt, data}
}

// bin is the open (last) row of one alloc_bins bin.
type bin struct {
	sclass, dclass int
	n              int
	minFree        int64
	firstSeq       int64
	maxFree        int64
	prev           allocRec
	buf            []byte
	dirty          bool
}

type binRow struct {
	sclass, dclass             int
	minFree, firstSeq, maxFree int64
	n                          int
	data                       []byte
}

func (b *bin) row(copyData bool) binRow {
	data := b.buf
	if copyData {
		data = append([]byte(nil), b.buf...)
	}
	return binRow{b.sclass, b.dclass, b.minFree, b.firstSeq, b.maxFree, b.n, data}
}

type binKey struct{ s, d int }

type checkpointRow struct {
	seq   int64
	data  []byte
	stats []byte // the allocator statistics after seq
}

type stackRow struct {
	id     gpu.StackID
	frames string
}

// pending is everything not yet handed to the writer goroutine.
type pending struct {
	stacks      []stackRow
	chunks      []chunkRow
	levels      []levelRow
	checkpoints []checkpointRow
	bins        []binRow
	classes     []binKey
	incidents   []gpu.Incident
	snapshot    snapshotRows
	events      int
}

// Writer appends one trace's events. It is safe for concurrent use; Emit does
// the per-event work (layout, encoding, summaries) in the caller's goroutine
// and hands finished rows to the database's writer goroutine, so producing
// and storing overlap.
type Writer struct {
	db     *DB
	tid    int64
	id     string
	upload string
	// importing: the trace is hidden until Publish (ImportTrace)
	importing bool
	// sealed: an import whose rows are all stored; Publish only shows it
	sealed bool

	mu      sync.Mutex
	closed  bool
	layout  *gpu.Layout
	tot     gpu.Totals
	cnt     allocCounts
	n       int64 // events written
	first   int64
	firstUS int64
	lastSeq int64
	lastUS  int64
	peak    gpu.Totals
	peakSeq int64 // the first event at the peak of allocated bytes
	peakUS  int64
	ooms    int64
	stats   *caching.StatCounter // shares layout
	chunk   chunkBuilder
	pyr     pyramid
	open    map[uint64]allocRec
	bins    map[binKey]*bin
	dirty   []*bin
	stacks  gpu.StackTable
	pend    pending
	timer   *time.Timer
	// dropped: what SetDropped and EmitGap recorded; stored with the
	// next commit once changed (droppedNew), and with the last.
	dropped    *gpu.Dropped
	droppedNew bool
	// sinceCheckpoint counts the events since the last checkpoint, which
	// held checkpointBlocks blocks.
	sinceCheckpoint, checkpointBlocks int

	errMu sync.Mutex
	err   error
}

func newTraceID() string {
	var b [12]byte
	rand.Read(b[:])
	return traceID(b)
}

// traceID encodes 12 random bytes as a trace id. The top bit of the first
// byte is cleared so the id never starts with '-' or '_' (the last two of
// the URL-safe alphabet): a command line would read a leading '-' as a flag.
func traceID(b [12]byte) string {
	b[0] &= 0x7f
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// CreateTrace starts a live trace whose layout before the first event is
// initial (nil: empty under PyTorch's default rules). Its settings must
// parse as PYTORCH_CUDA_ALLOC_CONF (ErrBadSettings).
func (db *DB) CreateTrace(meta gpu.TraceMeta, initial *gpu.Layout) (*Writer, error) {
	return db.createTrace(meta, initial, string(gpu.StatusLive))
}

// ImportTrace starts a trace that no reader sees until Publish shows it:
// an import is all or nothing, even if the process dies while writing it
// (the next Open removes it).
func (db *DB) ImportTrace(meta gpu.TraceMeta, initial *gpu.Layout) (*Writer, error) {
	return db.createTrace(meta, initial, statusImporting)
}

// ErrBadSettings is wrapped by the error of a trace whose allocator
// settings do not parse: the what-if replays could not run under them.
var ErrBadSettings = errors.New("invalid allocator settings")

func (db *DB) createTrace(meta gpu.TraceMeta, initial *gpu.Layout, status string) (*Writer, error) {
	if _, err := caching.ParseConfig(meta.Settings); err != nil {
		return nil, fmt.Errorf("%w %q: %v", ErrBadSettings, meta.Settings, err)
	}
	if initial == nil {
		initial = gpu.NewLayout(gpu.DefaultRules())
	}
	db.be.takeReserve() // a new trace may fill the disk: keep room to delete it
	switch meta.Source {
	case gpu.SourceTrace, gpu.SourceSnapshot, gpu.SourceLive, gpu.SourceReplay, gpu.SourceEstimate:
	default:
		return nil, fmt.Errorf("store: unknown trace source %q", meta.Source)
	}
	rules, err := json.Marshal(initial.Rules)
	if err != nil {
		return nil, err
	}
	w := newWriter(db, initial.Clone())
	w.id = newTraceID()
	w.importing = status == statusImporting
	w.stats = caching.NewStatCounter(w.layout, initial.Rules)
	f := w.layout.Figures()
	w.tot = gpu.Totals{Reserved: f.Reserved, Allocated: f.Allocated, Active: f.Active}
	w.peak = w.tot
	for i := range w.layout.Segments {
		for _, b := range w.layout.Segments[i].Blocks {
			if b.State == gpu.BlockAllocated {
				w.open[b.Addr] = allocRec{addr: b.Addr, size: b.Size, requested: b.Requested, stream: w.layout.Segments[i].Stream,
					allocUS: beforeUS, freeUS: gpu.NeverFreedUS, allocSeq: b.Seq, freeSeq: -1, stack: b.Stack}
				w.cnt.allocs++
				w.cnt.allocBytes += int64(b.Size)
			}
		}
	}
	ck := w.checkpoint(initialSeq)
	openBlob := w.openBlob()
	err = db.write(func(tx *sql.Tx) error {
		// An import's upload is written when it is published.
		if err := uploadExists(tx, meta.Upload); err != nil && status != statusImporting {
			return err
		}
		w.upload = meta.Upload
		err := tx.QueryRow(`INSERT INTO traces (id, name, source, device_ordinal, device_name, capacity, settings, rules, status, owner_pid, created_us,
			peak_reserved, peak_allocated, peak_active, upload, has_time) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) RETURNING tid`,
			w.id, meta.Name, string(meta.Source), meta.DeviceOrdinal, meta.DeviceName, int64(meta.Capacity), meta.Settings, string(rules),
			status, db.owner, time.Now().UnixMicro(), int64(w.peak.Reserved), int64(w.peak.Allocated), int64(w.peak.Active),
			meta.Upload, !meta.NoTime).Scan(&w.tid)
		if err != nil {
			return err
		}
		if _, err := tx.Exec("INSERT INTO checkpoints (tid, seq, data, stats) VALUES (?,?,?,?)", w.tid, ck.seq, ck.data, ck.stats); err != nil {
			return err
		}
		_, err = tx.Exec("INSERT INTO alloc_open (tid, data) VALUES (?,?)", w.tid, openBlob)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: create trace: %w", err)
	}
	w.register()
	return w, nil
}

func newWriter(db *DB, l *gpu.Layout) *Writer {
	return &Writer{db: db, layout: l, first: -1, lastSeq: -1, peakSeq: -1,
		open: map[uint64]allocRec{}, bins: map[binKey]*bin{}}
}

// checkpoint is the layout and the statistics after event seq.
func (w *Writer) checkpoint(seq int64) checkpointRow {
	st, _ := w.stats.Stats().AppendBinary(nil)
	w.sinceCheckpoint, w.checkpointBlocks = 0, 0
	for i := range w.layout.Segments {
		w.checkpointBlocks += len(w.layout.Segments[i].Blocks)
	}
	return checkpointRow{seq, appendLayout(nil, w.layout), st}
}

func (w *Writer) register() {
	liveMu.Lock()
	liveTraces[liveKey(w.db.path, w.tid)] = true
	liveMu.Unlock()
}

func (w *Writer) unregister() { w.db.unregister(w.tid) }

// ID is the trace's public id.
func (w *Writer) ID() string { return w.id }

// Err returns the first error met while storing, if any. After an error,
// Emit drops events; Close reports it.
func (w *Writer) Err() error {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return w.err
}

func (w *Writer) fail(err error) {
	w.errMu.Lock()
	if w.err == nil {
		w.err = fmt.Errorf("store: trace %s: %w", w.id, err)
	}
	w.errMu.Unlock()
}

// Stack interns s and returns its id, the same for equal stacks.
func (w *Writer) Stack(s gpu.Stack) gpu.StackID {
	w.mu.Lock()
	defer w.mu.Unlock()
	id, fresh := w.stacks.Intern(s)
	if fresh {
		b, _ := json.Marshal(s)
		w.pend.stacks = append(w.pend.stacks, stackRow{id, string(b)})
	}
	return id
}

// Emit stores a batch of events (gpu.Sink); the batch is not kept.
func (w *Writer) Emit(batch []gpu.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.Err() != nil {
		return
	}
	for i := range batch {
		if err := w.add(batch[i]); err != nil {
			w.fail(err)
			return
		}
	}
	w.pend.events += len(batch)
	if w.pend.events >= flushEvents {
		w.commit(false)
	} else if w.timer == nil && w.pend.events > 0 {
		w.timer = time.AfterFunc(flushDelay, func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.timer = nil
			if !w.closed && w.Err() == nil {
				w.commit(false)
			}
		})
	}
}

// add takes one event through the layout, the gpu.Totals and every summary.
func (w *Writer) add(e gpu.Event) error {
	if err := encodable(&e); err != nil {
		return err
	}
	if w.n > 0 {
		if e.Seq <= w.lastSeq {
			return fmt.Errorf("event %d: sequence numbers must increase (previous %d)", e.Seq, w.lastSeq)
		}
		// Times that run backwards are stored at the previous time, so
		// time order and sequence order agree.
		e.TimeUS = max(e.TimeUS, w.lastUS)
	}
	if w.chunk.n == 0 {
		w.chunk = chunkBuilder{firstSeq: e.Seq, firstUS: e.TimeUS, before: w.tot, beforeCnt: w.cnt,
			st: encState{seq: e.Seq - 1, us: e.TimeUS}, buf: w.chunk.buf[:0]}
	}
	var blockSize uint64
	ends := false
	if e.Action == gpu.ActionFreeRequested || e.Action == gpu.ActionFreeCompleted {
		if b := w.layout.BlockAt(e.Addr); b != nil && b.Addr == e.Addr {
			blockSize = b.Size
			ends = e.Action == gpu.ActionFreeCompleted && b.State == gpu.BlockAllocated
		}
	}
	if err := w.stats.Step(e, w.layout.Apply); err != nil {
		return err
	}
	if e.Action == gpu.ActionAlloc {
		blockSize = w.layout.BlockAt(e.Addr).Size
	}
	if hasBlock(e.Action) {
		if e.BlockSize != 0 && e.BlockSize != blockSize {
			return fmt.Errorf("event %d (%s at %#x): block size %d, but the layout's block has %d bytes", e.Seq, e.Action, e.Addr, e.BlockSize, blockSize)
		}
		e.BlockSize = blockSize
	}
	w.tot.Apply(&e, ends)
	if w.tot.Allocated > w.peak.Allocated || w.peakSeq < 0 && w.tot.Allocated == w.peak.Allocated {
		w.peakSeq, w.peakUS = e.Seq, e.TimeUS
	}
	w.peak = gpu.Totals{Reserved: max(w.peak.Reserved, w.tot.Reserved), Allocated: max(w.peak.Allocated, w.tot.Allocated), Active: max(w.peak.Active, w.tot.Active)}
	if e.Action == gpu.ActionOOM {
		w.ooms++
		w.pend.incidents = append(w.pend.incidents, gpu.Incident{N: int(w.ooms), Seq: e.Seq, TimeUS: e.TimeUS,
			Size: e.Size, DeviceFree: e.DeviceFree, Stream: e.Stream, Stack: e.Stack})
	}
	if e.Action == gpu.ActionAlloc {
		w.open[e.Addr] = allocRec{addr: e.Addr, size: blockSize, requested: e.Size, stream: e.Stream,
			allocUS: e.TimeUS, freeUS: gpu.NeverFreedUS, allocSeq: e.Seq, freeSeq: -1, stack: e.Stack}
		w.cnt.allocs++
		w.cnt.allocBytes += int64(blockSize)
	} else if endsAllocation(&e, ends) {
		r, ok := w.open[e.Addr]
		if ok {
			delete(w.open, e.Addr)
			r.freeUS, r.freeSeq = e.TimeUS, e.Seq
			w.finish(&r)
		}
		w.cnt.frees++
		w.cnt.freeBytes += int64(blockSize)
	}

	c := &w.chunk
	c.buf = appendEvent(c.buf, &c.st, &e, ends)
	c.n++
	c.lastSeq, c.lastUS = e.Seq, e.TimeUS
	if c.n == chunkSize {
		w.pend.chunks = append(w.pend.chunks, c.row(false))
		*c = chunkBuilder{}
	}
	w.pyr.add(e.TimeUS, w.tot)
	if w.n == 0 {
		w.first, w.firstUS = e.Seq, e.TimeUS
	}
	w.n++
	w.lastSeq, w.lastUS = e.Seq, e.TimeUS
	if w.sinceCheckpoint++; w.sinceCheckpoint >= max(checkpointEvery, w.checkpointBlocks) {
		w.pend.checkpoints = append(w.pend.checkpoints, w.checkpoint(e.Seq))
	}
	return nil
}

// finish files a finished allocation in its bin.
func (w *Writer) finish(r *allocRec) {
	k := binKey{sizeClass(r.size), durClass(r.freeUS - r.allocUS)}
	b := w.bins[k]
	if b == nil {
		b = &bin{sclass: k.s, dclass: k.d}
		w.bins[k] = b
		w.pend.classes = append(w.pend.classes, k)
	}
	if b.n == 0 {
		b.minFree, b.firstSeq = r.freeUS, r.freeSeq
		b.prev = allocRec{freeUS: r.freeUS}
	}
	b.buf = appendAllocRec(b.buf, &b.prev, r)
	b.n++
	b.maxFree = r.freeUS
	if b.n == binSize {
		w.pend.bins = append(w.pend.bins, b.row(false))
		*b = bin{sclass: k.s, dclass: k.d}
		return
	}
	if !b.dirty {
		b.dirty = true
		w.dirty = append(w.dirty, b)
	}
}

// openBlob encodes the live allocations in address order.
func (w *Writer) openBlob() []byte {
	recs := make([]allocRec, 0, len(w.open))
	for _, r := range w.open {
		recs = append(recs, r)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].addr < recs[j].addr })
	buf := []byte{}
	var prev allocRec
	for i := range recs {
		buf = appendAllocRec(buf, &prev, &recs[i])
	}
	return buf
}

// batch is one commit's rows.
type batch struct {
	pending
	partChunk *chunkRow
	openBlob  []byte
	trace     traceCounters
	status    gpu.TraceStatus // set when closing
	dropped   *string         // JSON of gpu.Dropped ("" for none), when it is to be stored
}

type traceCounters struct {
	events, first, last, firstUS, lastUS int64
	peak                                 gpu.Totals
	peakSeq, peakUS                      int64
	ooms                                 int64
}

// take moves the pending rows into a batch, with copies of the open chunk,
// open bins and live allocations, so a commit holds everything up to now.
// An import's commits before its last leave those three out: nobody reads
// the trace until it is published, and its last commit writes them.
func (w *Writer) take() *batch {
	b := &batch{pending: w.pend}
	w.pend = pending{}
	if w.droppedNew {
		b.dropped = w.droppedJSON()
		w.droppedNew = false
	}
	b.levels = append(b.levels, w.pyr.take()...)
	b.trace = w.counters()
	if w.importing && !w.closed {
		return b
	}
	if w.chunk.n > 0 {
		r := w.chunk.row(true)
		b.partChunk = &r
	}
	for _, bn := range w.dirty {
		if bn.dirty && bn.n > 0 {
			b.bins = append(b.bins, bn.row(true))
		}
		bn.dirty = false
	}
	w.dirty = w.dirty[:0]
	b.openBlob = w.openBlob()
	return b
}

// counters are the trace row's figures so far.
func (w *Writer) counters() traceCounters {
	return traceCounters{w.n, w.first, w.lastSeq, w.firstUS, w.lastUS, w.peak, w.peakSeq, w.peakUS, w.ooms}
}

// commit hands everything pending to the writer goroutine; sync waits.
func (w *Writer) commit(sync bool) error {
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	b := w.take()
	fn := func(tx *sql.Tx) error { return w.store(tx, b) }
	if sync {
		return w.db.write(fn)
	}
	return w.db.writeAsync(fn, w.fail)
}

// Flush commits every event emitted so far and waits for it.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.Err(); err != nil {
		return err
	}
	if w.closed {
		return errors.New("store: flush of a closed writer")
	}
	if err := w.commit(true); err != nil {
		w.fail(err)
	}
	return w.Err()
}

// Close finishes the trace with status (complete or failed; live is not a
// final status) and waits for it to be stored. An earlier error is returned
// and the trace is then marked failed.
func (w *Writer) Close(status gpu.TraceStatus) error {
	if status != gpu.StatusComplete && status != gpu.StatusFailed && status != gpu.StatusIncomplete {
		return fmt.Errorf("store: %q is not a final trace status", status)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return errors.New("store: writer already closed")
	}
	defer w.unregister()
	b := w.last(status)
	if err := w.db.write(func(tx *sql.Tx) error { return w.store(tx, b) }); err != nil {
		w.fail(err)
	}
	return w.Err()
}

// last closes the writer and returns its last batch, which sets status
// (failed after an error). The caller holds w.mu.
func (w *Writer) last(status gpu.TraceStatus) *batch {
	w.closed = true
	if w.Err() != nil {
		status = gpu.StatusFailed
	}
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	if w.chunk.n > 0 {
		w.pend.chunks = append(w.pend.chunks, w.chunk.row(false))
		w.chunk = chunkBuilder{}
	}
	w.pyr.closeAll()
	b := w.take()
	b.status, b.dropped = status, w.droppedJSON()
	return b
}

// Seal ends an import (ImportTrace) and stores the rest of its trace, still
// hidden: Publish then only has to show it. Imports of several files seal
// each one as it ends, side by side, so the one transaction that shows
// them all stays short. After an error the writer is to be aborted.
func (w *Writer) Seal() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.importing || w.closed {
		return errors.New("store: seal of a writer that is not an open import")
	}
	if err := w.Err(); err != nil {
		return err
	}
	b := w.last("")
	w.sealed = true
	if err := w.db.write(func(tx *sql.Tx) error { return w.store(tx, b) }); err != nil {
		w.fail(err)
	}
	return w.Err()
}

// SetDropped records the events of the recording left out of the trace,
// stored with the next commit.
func (w *Writer) SetDropped(d gpu.Dropped) {
	w.mu.Lock()
	w.dropped, w.droppedNew = &d, true
	w.mu.Unlock()
}

// EmitGap stores the events that fill a gap of a live trace (they bring
// its state to the job's) with the gap, in one commit: a trace resumed
// after a crash has both or neither, and so numbers its client's events
// as before.
func (w *Writer) EmitGap(g gpu.Gap, fill []gpu.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.Err() != nil {
		return
	}
	for i := range fill {
		if err := w.add(fill[i]); err != nil {
			w.fail(err)
			return
		}
	}
	if w.dropped == nil {
		w.dropped = &gpu.Dropped{}
	}
	w.dropped.AddGap(g)
	w.droppedNew = true
	w.pend.events += len(fill)
	w.commit(false)
}

// Dropped is a copy of what SetDropped and EmitGap recorded (and, for a
// resumed trace, what was stored before); nil for nothing.
func (w *Writer) Dropped() *gpu.Dropped {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dropped == nil {
		return nil
	}
	d := *w.dropped
	d.First = append([]gpu.DroppedEvent(nil), d.First...)
	d.Gaps = append([]gpu.Gap(nil), d.Gaps...)
	return &d
}

// droppedJSON is w.dropped as stored; the caller holds w.mu.
func (w *Writer) droppedJSON() *string {
	s := ""
	if w.dropped != nil {
		b, _ := json.Marshal(w.dropped)
		s = string(b)
	}
	return &s
}

// Layout is a copy of the layout after the last event emitted.
func (w *Writer) Layout() *gpu.Layout {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.layout.Clone()
}

// Publish closes the writers of ImportTrace as complete (storing their
// last rows, unless sealed) and shows their traces, all in one
// transaction: readers see every one of them, whole, or none. After an
// error nothing is shown; Abort them.
func (db *DB) Publish(ws ...*Writer) error { return db.publish(ws, nil) }

// publish is Publish, with also (when not nil) in the transaction.
func (db *DB) publish(ws []*Writer, also func(tx *sql.Tx) error) error {
	var batches []*batch
	for _, w := range ws {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.closed && !w.sealed {
			return errors.New("store: publish of a closed writer")
		}
		if err := w.Err(); err != nil {
			return err
		}
		defer w.unregister()
		if w.sealed {
			batches = append(batches, &batch{trace: w.counters(), status: gpu.StatusComplete, dropped: w.droppedJSON()})
		} else {
			batches = append(batches, w.last(gpu.StatusComplete))
		}
	}
	defer func() {
		for _, w := range ws {
			w.sealed = false // shown: closed like any other
		}
	}()
	return db.write(func(tx *sql.Tx) error {
		for i, w := range ws {
			if err := w.store(tx, batches[i]); err != nil {
				return err
			}
		}
		if also != nil {
			return also(tx)
		}
		return nil
	})
}

// Abort removes the trace and everything stored for it: at once from
// readers, then its rows (see DeleteTrace).
func (w *Writer) Abort() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	w.closed = true
	defer w.unregister()
	err := w.db.roomy(func() error {
		return w.db.write(func(tx *sql.Tx) error {
			_, err := tx.Exec("UPDATE traces SET status = ? WHERE tid = ?", statusDeleting, w.tid)
			return err
		})
	})
	if err != nil {
		return err
	}
	return w.db.remove(w.tid)
}

// traceTables hold a trace's rows, its own row last.
var traceTables = []string{"incidents", "stacks", "chunks", "usage_levels", "checkpoints", "alloc_bins", "alloc_classes", "alloc_open",
	"annotations", "event_extras", "event_extra_runs", "snapshot_segments", "traces"}

// store writes a batch; it runs on the writer goroutine.
func (w *Writer) store(tx *sql.Tx, b *batch) error {
	tid := w.tid
	if len(b.stacks) > 0 {
		st, err := tx.Prepare("INSERT INTO stacks (tid, sid, frames) VALUES (?,?,?)")
		if err != nil {
			return err
		}
		defer st.Close()
		for _, s := range b.stacks {
			if _, err := st.Exec(tid, int64(s.id), s.frames); err != nil {
				return err
			}
		}
	}
	chunks := b.chunks
	if b.partChunk != nil {
		chunks = append(chunks, *b.partChunk)
	}
	if len(chunks) > 0 {
		st, err := tx.Prepare(replaceInto("chunks", "tid, first_seq", `last_seq, first_us, last_us, n, reserved0, allocated0, active0,
			allocs0, alloc_bytes0, frees0, free_bytes0, data`, 1))
		if err != nil {
			return err
		}
		defer st.Close()
		for _, c := range chunks {
			if _, err := st.Exec(tid, c.firstSeq, c.lastSeq, c.firstUS, c.lastUS, c.n,
				int64(c.before.Reserved), int64(c.before.Allocated), int64(c.before.Active),
				c.beforeCnt.allocs, c.beforeCnt.allocBytes, c.beforeCnt.frees, c.beforeCnt.freeBytes, c.data); err != nil {
				return err
			}
		}
	}
	if len(b.levels) > 0 {
		// Many small rows: insert them several to a statement.
		const per = 50
		var st *sql.Stmt
		args := make([]any, 0, per*13)
		for i := 0; i < len(b.levels); i += per {
			rows := b.levels[i:min(i+per, len(b.levels))]
			args = args[:0]
			for _, r := range rows {
				a := &r.acc
				args = append(args, tid, r.k, a.b, a.n,
					int64(a.min.Reserved), int64(a.max.Reserved), int64(a.last.Reserved),
					int64(a.min.Allocated), int64(a.max.Allocated), int64(a.last.Allocated),
					int64(a.min.Active), int64(a.max.Active), int64(a.last.Active))
			}
			q := replaceInto("usage_levels", "tid, k, b", "n, res_min, res_max, res_last, alloc_min, alloc_max, alloc_last, act_min, act_max, act_last", len(rows))
			if len(rows) == per {
				if st == nil {
					var err error
					if st, err = tx.Prepare(q); err != nil {
						return err
					}
					defer st.Close()
				}
				if _, err := st.Exec(args...); err != nil {
					return err
				}
			} else if _, err := tx.Exec(q, args...); err != nil {
				return err
			}
		}
	}
	if err := b.snapshot.store(tx, tid, w.upload); err != nil {
		return err
	}
	for _, in := range b.incidents {
		if _, err := tx.Exec(replaceInto("incidents", "tid, n", "seq, time_us, size, device_free, stream, stack", 1),
			tid, in.N, in.Seq, in.TimeUS, int64(in.Size), int64(in.DeviceFree), in.Stream, int64(in.Stack)); err != nil {
			return err
		}
	}
	for _, c := range b.checkpoints {
		if _, err := tx.Exec(replaceInto("checkpoints", "tid, seq", "data, stats", 1), tid, c.seq, c.data, c.stats); err != nil {
			return err
		}
	}
	for _, k := range b.classes {
		if _, err := tx.Exec("INSERT INTO alloc_classes (tid, sclass, dclass) VALUES (?,?,?) ON CONFLICT DO NOTHING", tid, k.s, k.d); err != nil {
			return err
		}
	}
	if len(b.bins) > 0 {
		st, err := tx.Prepare(replaceInto("alloc_bins", "tid, sclass, dclass, min_free, first_seq", "max_free, n, data", 1))
		if err != nil {
			return err
		}
		defer st.Close()
		for _, r := range b.bins {
			if _, err := st.Exec(tid, r.sclass, r.dclass, r.minFree, r.firstSeq, r.maxFree, r.n, r.data); err != nil {
				return err
			}
		}
	}
	if b.openBlob != nil {
		if _, err := tx.Exec(replaceInto("alloc_open", "tid", "data", 1), tid, b.openBlob); err != nil {
			return err
		}
	}
	t := &b.trace
	q := `UPDATE traces SET event_count = ?, first_seq = ?, last_seq = ?, first_us = ?, last_us = ?,
		peak_reserved = ?, peak_allocated = ?, peak_active = ?, peak_seq = ?, peak_us = ?, oom_count = ?`
	args := []any{t.events, t.first, t.last, t.firstUS, t.lastUS, int64(t.peak.Reserved), int64(t.peak.Allocated), int64(t.peak.Active),
		t.peakSeq, t.peakUS, t.ooms}
	if b.status != "" {
		q += ", status = ?"
		args = append(args, string(b.status))
	}
	if b.dropped != nil {
		q += ", dropped = ?"
		args = append(args, *b.dropped)
	}
	if _, err := tx.Exec(q+" WHERE tid = ?", append(args, tid)...); err != nil {
		return err
	}
	if w.importing {
		return nil // shown by Publish, whole
	}
	status := b.status
	if status == "" {
		status = gpu.StatusLive
	}
	return w.db.be.notify(tx, TraceChange{ID: w.id, Status: status, LastSeq: t.last, Events: t.events, FirstUS: t.firstUS, LastUS: t.lastUS})
}

// replaceInto is an insert of rows rows of the key's and cols' columns
// (comma-separated) that, where a row with the same key is stored, sets
// its cols instead: SQLite's INSERT OR REPLACE in words PostgreSQL
// shares.
func replaceInto(table, key, cols string, rows int) string {
	var set []string
	for _, c := range strings.Split(cols, ",") {
		c = strings.TrimSpace(c)
		set = append(set, c+" = excluded."+c)
	}
	return fmt.Sprintf("INSERT INTO %s (%s, %s) VALUES %s ON CONFLICT (%s) DO UPDATE SET %s",
		table, key, cols, placeholders(rows, strings.Count(key+","+cols, ",")+1), key, strings.Join(set, ", "))
}

func placeholders(rows, cols int) string {
	one := make([]byte, 0, 2*cols+1)
	one = append(one, '(')
	for i := range cols {
		if i > 0 {
			one = append(one, ',')
		}
		one = append(one, '?')
	}
	one = append(one, ')')
	out := make([]byte, 0, rows*(len(one)+1))
	for i := range rows {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, one...)
	}
	return string(out)
}
