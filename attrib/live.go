package attrib

import (
	"cmp"
	"errors"
	"math"
	"sort"
	"strconv"
	"sync"

	"vramscope/gpu"
	"vramscope/store"
)

// Instant names a moment of a trace: right after event Seq when BySeq,
// else after the last event at or before TimeUS.
type Instant struct {
	BySeq  bool
	Seq    int64
	TimeUS int64
}

// AfterEvent names the instant right after event seq: "right after event
// N", or for -1 "before the first event" (all a trace of a snapshot without
// trace entries has).
func AfterEvent(seq int64) string {
	if seq < 0 {
		return "before the first event"
	}
	return "right after event " + strconv.FormatInt(seq, 10)
}

// Live is the live set at an instant with each block's category.
type Live struct {
	*store.LiveSet
	Verdicts []Verdict // one per block
	Regions  []Region  // the trace's annotated regions (steps, phases)
}

// At reads the live set of trace id at an instant and sorts its blocks
// into categories.
func At(db *store.DB, id string, at Instant) (*Live, error) {
	c, err := NewCategorizer(db, id)
	if err != nil {
		return nil, err
	}
	return c.At(at)
}

// Categorizer sorts the live sets of one trace into categories; it reads
// the trace's regions once and keeps the layouts at the step and optimizer
// boundaries it looked at, so that many instants of a trace cost little
// more than their live sets.
type Categorizer struct {
	db      *store.DB
	trace   gpu.Trace
	regions []Region
	// steps are the starts of the training steps, in order.
	steps []int64
	// phases are the time ranges of each phase; optimizer has each
	// optimizer step separately (they are not merged across steps).
	phases    map[Phase]spans
	optimizer []Region
	// backward are the spans where an allocation without frames is the
	// autograd engine's (Facts.AutogradThread): from a step's start, or
	// the end of the optimizer step before, to an optimizer step; none
	// when the trace has no stacks at all (nothing then tells threads
	// apart).
	backward spans
	stacks   bool // the trace has stacks

	mu        sync.Mutex                  // guards alive, signs and stepPeaks: a categorizer serves concurrent requests
	alive     map[int64]map[blockKey]bool // the allocations live at boundaries looked at
	signs     map[gpu.StackID]frameSigns  // guarded by mu
	stepPeaks map[[2]int]StepsAnswer      // by (from, limit); guarded by mu
	// ended holds the peaks of the steps that had ended when they were
	// read, shared by the categorizers of one trace as it grows (Cache).
	ended *endedPeaks
	// walkLimit: past this many events, reading the layout at a later
	// time from its checkpoint costs less than walking the events up to it.
	walkLimit int64
}

// maxAlive bounds the layouts a categorizer keeps.
const maxAlive = 64

// NewCategorizer reads what categories need of trace id: its regions.
func NewCategorizer(db *store.DB, id string) (*Categorizer, error) {
	t, err := db.Trace(id)
	if err != nil {
		return nil, err
	}
	anns, err := db.Marks(id)
	if err != nil {
		return nil, err
	}
	c := &Categorizer{db: db, trace: t, regions: Regions(anns, t.LastUS+1), phases: map[Phase]spans{},
		alive: map[int64]map[blockKey]bool{}, signs: map[gpu.StackID]frameSigns{}, stepPeaks: map[[2]int]StepsAnswer{}, walkLimit: 8192,
		ended: &endedPeaks{peaks: map[store.Span]store.Peak{}}}
	for _, r := range c.regions {
		if r.Step >= 0 {
			c.steps = append(c.steps, r.StartUS)
		}
		if r.Phase == PhaseOptimizer {
			c.optimizer = append(c.optimizer, r)
		}
	}
	for _, p := range []Phase{PhaseForward, PhaseBackward, PhaseOptimizer, PhaseZeroGrad, PhaseCommunication} {
		c.phases[p] = spansOf(c.regions, func(r *Region) bool { return r.Phase == p })
	}
	if _, err := db.Stack(id, 1); err == nil { // stacks are numbered from 1: the trace has some
		c.stacks, c.backward = true, backwardSpans(c.steps, c.optimizer)
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	return c, nil
}

// backwardSpans are the spans from each optimizer step back to the start
// of its training step or the end of the optimizer step before, whichever
// is later.
func backwardSpans(steps []int64, opt []Region) spans {
	var out spans
	prevEnd := int64(math.MinInt64)
	for _, o := range opt {
		lo := prevEnd
		if i := sort.Search(len(steps), func(i int) bool { return steps[i] > o.StartUS }); i > 0 {
			lo = max(lo, steps[i-1])
		}
		if lo < o.StartUS {
			out = append(out, [2]int64{lo, o.StartUS})
		}
		prevEnd = max(prevEnd, o.EndUS)
	}
	return out
}

// madeAt names where an allocation without frames made at t was: the
// backward (by its place), else the innermost annotated region holding t.
func (c *Categorizer) madeAt(t int64, before bool) (string, bool) {
	switch {
	case before:
		return "before the recording", false
	case !c.stacks:
		return "no stacks recorded", false
	}
	if c.backward.at(t) >= 0 {
		return "backward (autograd thread)", true
	}
	in := -1
	for i := range c.regions {
		r := &c.regions[i]
		if r.StartUS > t {
			break
		}
		if t < r.EndUS && (in < 0 || r.Depth >= c.regions[in].Depth) {
			in = i
		}
	}
	if in >= 0 {
		return "in " + c.regions[in].Name, false
	}
	return "a thread without Python frames", false
}

// Made names where allocation a, one without frames, was made (see
// madeAt): what views put beside "no stack" in its stead.
func (c *Categorizer) Made(a gpu.Allocation) string {
	made, _ := c.madeAt(a.AllocUS, a.Seq < 0)
	return made
}

// Regions are the trace's annotated regions, in order of start.
func (c *Categorizer) Regions() []Region { return c.regions }

// At reads the live set at an instant and sorts its blocks.
func (c *Categorizer) At(at Instant) (*Live, error) {
	var ls *store.LiveSet
	var err error
	if at.BySeq {
		ls, err = c.db.LiveAtSeq(c.trace.ID, at.Seq)
	} else {
		ls, err = c.db.LiveAt(c.trace.ID, at.TimeUS)
	}
	if err != nil {
		return nil, err
	}
	v, err := c.Verdicts(ls)
	if err != nil {
		return nil, err
	}
	return &Live{LiveSet: ls, Verdicts: v, Regions: c.regions}, nil
}

// blockKey names an allocation: its alloc seq, or for one made before the
// trace its address with the top bit set.
type blockKey uint64

func keyOf(b *gpu.Block) blockKey {
	if b.Seq < 0 {
		return blockKey(1<<63 | b.Addr)
	}
	return blockKey(b.Seq)
}

// reads are what sorting a live set reads of its trace beyond it: the
// events after it and layouts at later times. A store.Read is one; dbReads
// reads the database afresh each time.
type reads interface {
	Events(from, to int64, fn func(e *gpu.Event) bool) error
	LayoutAt(t int64) (*gpu.Layout, int64, error)
}

type dbReads struct {
	db *store.DB
	id string
}

func (d dbReads) Events(from, to int64, fn func(e *gpu.Event) bool) error {
	evs, err := d.db.Events(d.id, from, to)
	for i := range evs {
		if !fn(&evs[i]) {
			break
		}
	}
	return err
}

func (d dbReads) LayoutAt(t int64) (*gpu.Layout, int64, error) { return d.db.LayoutAt(d.id, t) }

// aliveAt is the set of allocations live after the events at or before t.
func (c *Categorizer) aliveAt(t int64, rd reads) (map[blockKey]bool, error) {
	c.mu.Lock()
	s, ok := c.alive[t]
	c.mu.Unlock()
	if ok {
		return s, nil
	}
	l, _, err := rd.LayoutAt(t)
	if err != nil {
		return nil, err
	}
	s = map[blockKey]bool{}
	for i := range l.Segments {
		for j := range l.Segments[i].Blocks {
			if b := &l.Segments[i].Blocks[j]; b.State == gpu.BlockAllocated {
				s[keyOf(b)] = true
			}
		}
	}
	c.mu.Lock()
	if len(c.alive) >= maxAlive {
		clear(c.alive)
	}
	c.alive[t] = s
	c.mu.Unlock()
	return s, nil
}

// later says whether the allocations of one live set were still live at
// later times (the step and optimizer boundaries after it): by the frees
// of the events up to then when they are few, else by the layout then.
type later struct {
	c     *Categorizer
	ls    *store.LiveSet
	rd    reads
	freed map[int64]map[uint64]bool // by time: addresses freed since ls
}

// alive says whether b, live in the set, was still live at u. Before the
// set's instant it is known: b was live at u if it was made before.
func (l *later) alive(b *store.LiveBlock, u int64) (bool, error) {
	if u <= l.ls.TimeUS {
		return b.AllocUS < u, nil
	}
	if freed, ok := l.freed[u]; ok {
		return !freed[b.Addr], nil
	}
	if l.ls.TimeUS != store.NoInstant && !l.c.read(u) {
		freed, ok, err := l.walk(u)
		if err != nil || ok {
			return !freed[b.Addr], err
		}
	}
	// Allocations of many instants (a window's bands) were not all live at
	// one to walk on from; a boundary read for an earlier set is kept; one
	// past the walk limit is read: the layout at u says.
	s, err := l.c.aliveAt(u, l.rd)
	return s[keyOf(&b.Block)], err
}

// walk gathers the addresses freed after the set up to u, when that is
// within the walk limit (ok).
func (l *later) walk(u int64) (freed map[uint64]bool, ok bool, err error) {
	freed = map[uint64]bool{}
	n, past := int64(0), false
	err = l.rd.Events(l.ls.Seq+1, l.ls.Seq+1+l.c.walkLimit, func(e *gpu.Event) bool {
		if past = e.TimeUS > u; past {
			return false
		}
		if e.Action == gpu.ActionFreeRequested || e.Action == gpu.ActionFreeCompleted {
			freed[e.Addr] = true // the first free at an address live in the set ends that block
		}
		n++
		return true
	})
	if err != nil || !past && n == l.c.walkLimit {
		return nil, false, err
	}
	if l.freed == nil {
		l.freed = map[int64]map[uint64]bool{}
	}
	l.freed[u] = freed
	return freed, true, nil
}

// read says whether the layout at t has been read and kept.
func (c *Categorizer) read(t int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.alive[t]
	return ok
}

// signsOf is what the frame rules find in stack s, read once per stack.
func (c *Categorizer) signsOf(id gpu.StackID, s gpu.Stack) frameSigns {
	c.mu.Lock()
	defer c.mu.Unlock()
	signs, ok := c.signs[id]
	if !ok {
		signs = signsOf(s)
		c.signs[id] = signs
	}
	return signs
}

// Verdicts sorts the blocks of a live set of this trace.
func (c *Categorizer) Verdicts(ls *store.LiveSet) ([]Verdict, error) {
	return c.verdicts(ls, nil, dbReads{c.db, c.trace.ID})
}

// memoKey names an allocation and whether it was on a side stream, the one
// fact that depends on the instant it is seen at.
type memoKey struct {
	block blockKey
	side  bool
}

// verdicts sorts the blocks of ls, reusing and filling memo when given.
func (c *Categorizer) verdicts(ls *store.LiveSet, memo map[memoKey]Verdict, rd reads) ([]Verdict, error) {
	main := mainStream(ls)
	then := &later{c: c, ls: ls, rd: rd}
	out := make([]Verdict, len(ls.Blocks))
	for i := range ls.Blocks {
		b := &ls.Blocks[i]
		k := memoKey{keyOf(&b.Block), b.Stream != main}
		if v, ok := memo[k]; ok {
			out[i] = v
			continue
		}
		f, err := c.facts(b, main, then)
		if err != nil {
			return nil, err
		}
		f.Stack = ls.Stacks[b.Stack]
		if len(f.Stack) == 0 {
			f.Made, f.AutogradThread = c.madeAt(b.AllocUS, b.Seq < 0)
		}
		f.signs = c.signsOf(b.Stack, f.Stack)
		out[i] = Categorize(f)
		if memo != nil {
			memo[k] = out[i]
		}
	}
	return out, nil
}

// Areas are the live bytes of each category at instants of a window.
type Areas struct {
	Categories []Category `json:"categories"`
	T          []int64    `json:"t"`     // the instants' times, in order
	Seq        []int64    `json:"seq"`   // the event each is right after
	Bytes      [][]uint64 `json:"bytes"` // per instant, per category
}

// Areas samples the live set of n columns of a window (q's T0, T1 and
// Events), each at its peak of allocated bytes (store.DB.PeakSeqs), and
// sums each category's bytes: the timeline's stacked areas, which so show
// the make-up of every peak the envelope shows. The live sets come from
// one walk through the events (store.DB.LiveAfterEach); an allocation seen
// at several instants is described and sorted once.
func (c *Categorizer) Areas(q store.BandsQuery) (*Areas, error) {
	out := &Areas{Categories: AllCategories}
	index := map[Category]int{}
	for i, cat := range AllCategories {
		index[cat] = i
	}
	memo := map[memoKey]Verdict{}
	stacks := map[gpu.StackID]gpu.Stack{} // read once for every sample
	last := int64(-2)
	seqs, err := c.db.PeakSeqs(c.trace.ID, q)
	if err != nil {
		return nil, err
	}
	err = c.db.LiveAfterEach(c.trace.ID, seqs, func(ls *store.LiveSet, rd store.Read) error {
		sums := make([]uint64, len(AllCategories))
		if ls.Seq == last && len(out.Bytes) > 0 {
			copy(sums, out.Bytes[len(out.Bytes)-1]) // no event since the last sample
		} else {
			ls.Stacks = stacks
			if err := describeFresh(ls, memo, rd); err != nil {
				return err
			}
			vs, err := c.verdicts(ls, memo, rd)
			if err != nil {
				return err
			}
			for j, v := range vs {
				sums[index[v.Category]] += ls.Blocks[j].Size
			}
		}
		last = ls.Seq
		out.T, out.Seq, out.Bytes = append(out.T, ls.TimeUS), append(out.Seq, ls.Seq), append(out.Bytes, sums)
		return nil
	})
	return out, err
}

// describeFresh describes the blocks of ls that memo has no verdict for,
// adding to ls.Stacks the stacks it lacks: most blocks live at one sample
// are live at the next, and many of the others share stacks with them;
// reading them again would be most of the work.
func describeFresh(ls *store.LiveSet, memo map[memoKey]Verdict, rd store.Read) error {
	main := mainStream(ls)
	var fresh []int
	for i := range ls.Blocks {
		if _, ok := memo[memoKey{keyOf(&ls.Blocks[i].Block), ls.Blocks[i].Stream != main}]; !ok {
			fresh = append(fresh, i)
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	part := &store.LiveSet{Trace: ls.Trace, Seq: ls.Seq, TimeUS: ls.TimeUS, Stacks: ls.Stacks, Blocks: make([]store.LiveBlock, len(fresh))}
	for j, i := range fresh {
		part.Blocks[j] = ls.Blocks[i]
	}
	if err := rd.Describe(part); err != nil {
		return err
	}
	for j, i := range fresh {
		ls.Blocks[i] = part.Blocks[j]
	}
	return nil
}

// mainStream is the stream holding most live bytes.
func mainStream(ls *store.LiveSet) int64 {
	by := map[int64]uint64{}
	var best int64
	for i := range ls.Blocks {
		b := &ls.Blocks[i]
		by[b.Stream] += b.Size
		if by[b.Stream] > by[best] || by[b.Stream] == by[best] && b.Stream < best {
			best = b.Stream
		}
	}
	return best
}

// facts gathers what the rules ask of block b, live in then's set.
func (c *Categorizer) facts(b *store.LiveBlock, main int64, then *later) (*Facts, error) {
	f := &Facts{Metadata: b.UserMetadata, Stream: b.Stream, Size: cmp.Or(b.Requested, b.Size), SideStream: b.Stream != main, BeforeTrace: b.Seq < 0}
	end, err := c.aliveAt(c.trace.LastUS, then.rd)
	if err != nil {
		return nil, err
	}
	f.NeverFreed = end[keyOf(&b.Block)]
	made := b.AllocUS
	if b.Seq >= 0 {
		for _, p := range []Phase{PhaseForward, PhaseBackward, PhaseOptimizer, PhaseZeroGrad, PhaseCommunication} {
			if c.phases[p].at(made) >= 0 {
				f.Phases = append(f.Phases, p)
			}
		}
	}
	if len(c.steps) > 0 {
		f.BeforeFirstStep = made < c.steps[0]
		// The first step to start after it was made.
		if i := sort.Search(len(c.steps), func(i int) bool { return c.steps[i] > made }); i < len(c.steps) {
			alive, err := then.alive(b, c.steps[i])
			if err != nil {
				return nil, err
			}
			f.AcrossStep = alive
		}
	}
	opt := c.optimizer
	i := sort.Search(len(opt), func(i int) bool { return opt[i].StartUS > made })
	if i < len(opt) {
		alive, err := then.alive(b, opt[i].StartUS)
		if err != nil {
			return nil, err
		}
		f.AliveAtOptimizer = tri(alive)
	}
	// The optimizer step it was made in: the last to start at or before it.
	if i > 0 && made < opt[i-1].EndUS {
		alive, err := then.alive(b, opt[i-1].EndUS)
		if err != nil {
			return nil, err
		}
		f.OutlivesOptimizer = tri(alive)
	}
	return f, nil
}

func tri(b bool) Tri {
	if b {
		return Yes
	}
	return No
}

// Cache keeps the categorizers of the traces last asked about, so that a
// trace's regions are read once while it does not change (a trace being
// written gets a new one as it grows). It is safe for concurrent use.
type Cache struct {
	mu      sync.Mutex
	max     int
	entries []cached // most recent last
}

type cached struct {
	key cacheKey
	c   *Categorizer
}

type cacheKey struct {
	id             string
	lastSeq, count int64
	status         gpu.TraceStatus
}

// NewCache keeps the categorizers of up to n traces.
func NewCache(n int) *Cache { return &Cache{max: max(1, n)} }

// Categorizer returns trace id's categorizer, made anew when the trace
// changed since.
func (k *Cache) Categorizer(db *store.DB, id string) (*Categorizer, error) {
	t, err := db.Trace(id)
	if err != nil {
		return nil, err
	}
	key := cacheKey{id, t.LastSeq, t.Events, t.Status}
	k.mu.Lock()
	for i, e := range k.entries {
		if e.key == key {
			k.entries = append(append(k.entries[:i:i], k.entries[i+1:]...), e)
			k.mu.Unlock()
			return e.c, nil
		}
	}
	k.mu.Unlock()
	c, err := NewCategorizer(db, id)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	kept := k.entries[:0]
	for _, e := range k.entries {
		if e.key.id != id {
			kept = append(kept, e)
		} else if e.key.lastSeq <= key.lastSeq && e.key.count <= key.count {
			c.ended = e.c.ended // the trace grew: the steps that had ended keep their peaks
		}
	}
	if len(kept) >= k.max {
		kept = kept[1:]
	}
	k.entries = append(kept, cached{key, c})
	return c, nil
}
