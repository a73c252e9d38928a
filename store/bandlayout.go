package store

import (
	"fmt"
	"math"
	"slices"
	"sort"

	"vramscope/gpu"
)

// bandKey names an allocation: its seq, or for one made before the trace
// (seq -1) its address with the top bit set.
type bandKey uint64

func keyOf(e *liveEntry) bandKey {
	if e.seq < 0 {
		return bandKey(1<<63 | e.addr)
	}
	return bandKey(e.seq)
}

// maxMerges is the most times the folds of a gap are merged pairwise;
// the last time merges all of them into one.
const maxMerges = 6

// bandLayout turns samples of the live set into bands and folds, one
// sample at a time, in column order.
type bandLayout struct {
	out      *Bands
	w        int    // the columns
	minBytes uint64 // the least size of a new band of its own
	row      uint64 // a pixel row: what a fold reaches before another group may start
	quantum  uint64 // a quarter of a pixel row
	merges   int    // how many times the folds of a gap are merged pairwise
	bands    []Band
	bandOf   map[bandKey]int32
	runs     int
	folds    []foldRun
	groups   *foldGroups
	// Where the pace of bands, runs and folds was last reset (see pace).
	coarsened                    int
	paced                        bool
	paceCol, paceBands, paceRuns int
	mergeCol, mergeFolds         int
	// The folds being gathered in the sample (pend, then cur, their
	// groups' bytes in gbytes), and those of the last sample (prev, at
	// column prevCol), whose runs they may carry on.
	pend      piece
	cur, prev []piece
	gbytes    []groupBytes
	prevCol   int
}

// piece is a folded band in one sample: the gap it lies in (below it, the
// band gapSeq, gapAddr; the bottom of the stack: gapSeq math.MinInt64)
// and its place there (ord), its bytes, its largest allocation, the bytes
// of each group in it (gbytes[g0 : g0+gn]), and the fold whose run it is.
type piece struct {
	gapSeq    int64
	gapAddr   uint64
	ord       int32
	off, size uint64
	rep       foldRep
	count     int32
	g0, gn    int32
	major     uint32 // the group holding most of its bytes (the first of them on a tie)
	fold      int32
}

// foldRun is a Fold while the layout is under way: no pointers, half its
// size.
type foldRun struct {
	c0, c1    int32
	count     int32
	group     uint32
	off, size uint64
	rep       foldRep
}

// foldRep is what a fold tells of its largest allocation.
type foldRep struct {
	seq             int64
	addr, size, req uint64
	stack           gpu.StackID
}

type groupBytes struct {
	group uint32
	bytes uint64
}

// before says whether p's place is below q's in the stack.
func (p *piece) before(q *piece) bool {
	if p.gapSeq != q.gapSeq {
		return p.gapSeq < q.gapSeq
	}
	if p.gapAddr != q.gapAddr {
		return p.gapAddr < q.gapAddr
	}
	return p.ord < q.ord
}

// add adds to p n allocations of group g, of bytes in all, rep the
// largest of them. p's groups' bytes are the last of gbytes.
func (l *bandLayout) add(p *piece, rep *liveEntry, g uint32, n int, bytes uint64) {
	if p.count == 0 {
		p.g0, p.gn = int32(len(l.gbytes)), 0
	}
	if p.count == 0 || rep.size > p.rep.size {
		p.rep = foldRep{rep.seq, rep.addr, rep.size, rep.requested, rep.stack}
	}
	p.count += int32(n)
	p.size += bytes
	gs := l.gbytes[p.g0:]
	i := slices.IndexFunc(gs, func(x groupBytes) bool { return x.group == g })
	if i < 0 {
		l.gbytes = append(l.gbytes, groupBytes{g, 0})
		gs, i = l.gbytes[p.g0:], int(p.gn)
		p.gn++
	}
	gs[i].bytes += bytes
	p.major = majority(gs)
}

// majority is the group of gs holding the most bytes, the first of them
// on a tie.
func majority(gs []groupBytes) uint32 {
	best := 0
	for i := range gs {
		if gs[i].bytes > gs[best].bytes {
			best = i
		}
	}
	return gs[best].group
}

// sample records the stack of live right after event at, at column c,
// sampled after the column sampled last. A band in both samples spans the
// columns between them at its offset in the later one: offsets only fall
// while an allocation lives (the allocations below it can only go), so
// the band never rises above where it really is, nor above the allocated
// envelope. A band not in the earlier sample starts at c. The allocations
// too small to be bands, in runs of one group, make a fold until it is a
// pixel row tall and the next run's group is not the one holding most of
// its bytes; a fold carries on the run of the last sample's fold in its
// place (see runFolds).
func (l *bandLayout) sample(live *liveSet, c int, at int64) {
	m0, m1 := l.out.M0, l.out.M1
	var off uint64
	gapSeq, gapAddr, ord := int64(math.MinInt64), uint64(0), int32(0)
	p := &l.pend
	l.cur, l.gbytes = l.cur[:0], l.gbytes[:0]
	flush := func() {
		if p.count > 0 {
			if p.off < m1 && p.off+p.size > m0 {
				p.gapSeq, p.gapAddr, p.ord = gapSeq, gapAddr, ord
				l.cur = append(l.cur, *p)
			} else {
				l.gbytes = l.gbytes[:p.g0]
			}
			ord++
			*p = piece{}
		}
	}
	list := live.list
	// Above m1 nothing is drawn, and no band is there to carry on:
	// offsets only fall, so a band made in the range stays in it or below.
	for i := 0; i < len(list) && off < m1; {
		e := &list[i]
		if !e.visible(at) {
			i++
			continue
		}
		if e.size < l.minBytes && e.band < 0 {
			// The run of this group: the visible small allocations from
			// here on in it (a band made before the bands grew taller
			// stays one).
			g := l.groupOf(e)
			start, n, rep := off, 0, e
			for ; i < len(list) && off < m1; i++ {
				f := &list[i]
				if !f.visible(at) {
					continue
				}
				if f.size >= l.minBytes || f.band >= 0 || l.groupOf(f) != g {
					break
				}
				if f.size > rep.size {
					rep = f
				}
				n++
				off += f.size
			}
			if p.count > 0 && p.size >= l.row && uint32(g) != p.major {
				flush()
			}
			if p.count == 0 {
				p.off = start
			}
			l.add(p, rep, uint32(g), n, off-start)
			continue
		}
		flush()
		gapSeq, gapAddr, ord = e.seq, e.addr, 0
		if e.seq >= 0 {
			gapAddr = 0
		}
		if e.band < 0 && off+e.size > m0 {
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
		off += e.size
		i++
	}
	flush()
	for range l.merges {
		l.mergeGaps(l.merges == maxMerges)
	}
	l.runFolds(c)
	l.pace(c)
}

// pace keeps the answer within its caps as it goes: where the bands (or
// their runs) made so far, at the pace of the columns laid out, would
// pass them by the last column, new bands are twice as tall at least
// from here on (up to maxCoarsen times), and where the folds would, the
// folds of each gap are merged pairwise once more (up to maxMerges). An
// allocation stays drawn as it was first drawn, and every one of at
// least MinBytes (the last threshold) is a band. What still passes the
// caps, finish leaves out. The pace is taken after the first sample,
// which draws all that is live as the window begins.
func (l *bandLayout) pace(c int) {
	if !l.paced {
		l.paced = true
		l.paceCol, l.paceBands, l.paceRuns = c+1, len(l.bands), l.runs
		l.mergeCol, l.mergeFolds = c+1, len(l.folds)
	}
	over := func(now, then, since int, most int) bool {
		if now > most {
			return true
		}
		done := c + 1 - since
		return done >= max(1, l.w/32) && then+(now-then)*(l.w-since)/done > most
	}
	if l.coarsened < maxCoarsen && (over(len(l.bands), l.paceBands, l.paceCol, maxBands) || over(l.runs, l.paceRuns, l.paceCol, maxRuns)) {
		l.minBytes *= 2
		l.coarsened++
		l.paceCol, l.paceBands, l.paceRuns = c+1, len(l.bands), l.runs
	}
	if l.merges < maxMerges && over(len(l.folds), l.mergeFolds, l.mergeCol, maxFoldRuns) {
		l.merges++
		l.mergeCol, l.mergeFolds = c+1, len(l.folds)
	}
}

// groupOf is e's fold group, looked up once.
func (l *bandLayout) groupOf(e *liveEntry) int32 {
	if e.group < 0 {
		e.group = int32(l.groups.of(e.stack))
	}
	return e.group
}

// runFolds lays the sample's folds out in runs: a fold carries on the run
// of the last sample's fold in its place (gap and order) while it keeps
// its group, offset and size (within a quarter of a pixel row). Both
// samples' folds are in stack order, and so are their places.
func (l *bandLayout) runFolds(c int) {
	j := 0
	for i := range l.cur {
		p := &l.cur[i]
		for j < len(l.prev) && l.prev[j].before(p) {
			j++
		}
		if j < len(l.prev) && !p.before(&l.prev[j]) { // the same place
			f := &l.folds[l.prev[j].fold]
			if int(f.c1) == l.prevCol && f.group == p.major && absDiff(f.off, p.off) < l.quantum && absDiff(f.size, p.size) < l.quantum {
				f.c1, p.fold = int32(c), l.prev[j].fold
				continue
			}
		}
		p.fold = int32(len(l.folds))
		l.folds = append(l.folds, foldRun{c0: int32(c), c1: int32(c), count: p.count, group: p.major, off: p.off, size: p.size, rep: p.rep})
	}
	l.prev, l.cur, l.prevCol = l.cur, l.prev, c
}

// mergeGaps merges the sample's folds pairwise within their gaps, or
// (all) each gap's into one.
func (l *bandLayout) mergeGaps(all bool) {
	ps := l.cur
	kept := ps[:0]
	for i := 0; i < len(ps); i++ {
		p := ps[i]
		for i+1 < len(ps) && ps[i+1].gapSeq == p.gapSeq && ps[i+1].gapAddr == p.gapAddr {
			q := &ps[i+1]
			if q.rep.size > p.rep.size {
				p.rep = q.rep
			}
			p.size = q.off + q.size - p.off
			p.count += q.count
			g0 := len(l.gbytes)
			l.gbytes = append(l.gbytes, l.gbytes[p.g0:p.g0+p.gn]...)
			for _, g := range l.gbytes[q.g0 : q.g0+q.gn] {
				gs := l.gbytes[g0:]
				if k := slices.IndexFunc(gs, func(x groupBytes) bool { return x.group == g.group }); k >= 0 {
					gs[k].bytes += g.bytes
				} else {
					l.gbytes = append(l.gbytes, g)
				}
			}
			p.g0, p.gn = int32(g0), int32(len(l.gbytes)-g0)
			p.major = majority(l.gbytes[g0:])
			i++
			if !all {
				break
			}
		}
		p.ord = int32(len(kept))
		kept = append(kept, p)
	}
	l.cur = kept
}

func absDiff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}

// finish keeps the largest bands within the caps.
func (l *bandLayout) finish() {
	l.out.MinBytes = l.minBytes
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
	if len(l.folds) > 0 {
		l.out.Folds = make([]Fold, len(l.folds))
		for i, f := range l.folds {
			l.out.Folds[i] = Fold{C0: int(f.c0), C1: int(f.c1), Offset: f.off, Size: f.size, Group: f.group, Count: int(f.count),
				Rep: Band{Seq: f.rep.seq, Addr: f.rep.addr, Size: f.rep.size, Requested: f.rep.req, Stack: f.rep.stack}}
		}
	}
}

// foldGroups numbers the groups of folded allocations, reading each
// stack's label once per trace (DB.labels keeps them).
type foldGroups struct {
	db    *DB
	r     *reader
	by    FoldBy
	bySID map[gpu.StackID]uint32
	names map[string]uint32
	list  []string
	err   error
}

// of is the group of the allocations of stack sid.
func (g *foldGroups) of(sid gpu.StackID) uint32 {
	if i, ok := g.bySID[sid]; ok {
		return i
	}
	name := ""
	if sid != 0 {
		name = g.db.stackLabel(g.r, sid, &g.err)
	}
	key := name
	if g.by == FoldByStack {
		key = fmt.Sprint(sid)
	}
	i, ok := g.names[key]
	if !ok {
		i = uint32(len(g.list))
		g.names[key] = i
		g.list = append(g.list, name)
	}
	g.bySID[sid] = i
	return i
}
