package server

import (
	"net/http"
	"strconv"
	"sync"

	"github.com/go-chi/chi/v5"

	"vramscope/gpu"
	"vramscope/gpu/caching"
)

// memory_summary() at a time t. The current column is exact: it is read
// from the layout at t. Peak, Tot Alloc and Tot Freed are counted by
// replaying the trace's events from its start to t through a layout, with
// the counting rules of PyTorch's allocator (allocated and requested bytes
// drop at free_requested, active bytes at free_completed, reserved bytes at
// segment_free and segment_unmap). Blocks that were live before the trace
// began count as allocated once at its start. Non-releasable (inactive
// split) memory changes are counted as the net change of the segment an
// event touches, so its current and peak are right but its cumulative
// columns undercount when one event both splits and merges.

// summaryPage is how many events are decoded at a time.
const summaryPage = 1 << 16

type summaryKey struct {
	id  string
	seq int64
}

// summaryCache keeps recent answers: the replay costs O(events before t).
type summaryCache struct {
	mu   sync.Mutex
	max  int
	m    map[summaryKey]string
	keys []summaryKey
}

func newSummaryCache(n int) *summaryCache { return &summaryCache{max: n, m: map[summaryKey]string{}} }

func (c *summaryCache) get(k summaryKey) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[k]
	return v, ok
}

func (c *summaryCache) put(k summaryKey, v string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; ok {
		return
	}
	if len(c.keys) >= c.max {
		delete(c.m, c.keys[0])
		c.keys = c.keys[1:]
	}
	c.keys = append(c.keys, k)
	c.m[k] = v
}

func (c *summaryCache) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	keep := c.keys[:0]
	for _, k := range c.keys {
		if k.id == id {
			delete(c.m, k)
		} else {
			keep = append(keep, k)
		}
	}
	c.keys = keep
}

func (s *Server) apiSummary(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	t := p.required("t")
	abbrev := r.URL.Query().Get("abbreviated")
	if abbrev != "" && abbrev != "0" && abbrev != "1" && abbrev != "true" && abbrev != "false" {
		p.fail("abbreviated", "%q is not a boolean (use 1 or 0)", abbrev)
	}
	if !p.check(w) {
		return
	}
	st, seq, dev, err := s.statsAt(chi.URLParam(r, "id"), t)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	text := st.Summary(dev, abbrev == "1" || abbrev == "true")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Seq", strconv.FormatInt(seq, 10))
	w.Write([]byte(text))
}

// statsAt returns the allocator's statistics after the last event at or
// before t.
func (s *Server) statsAt(id string, t int64) (*caching.Stats, int64, int, error) {
	tr, err := s.opt.DB.Trace(id)
	if err != nil {
		return nil, 0, 0, err
	}
	_, seq, err := s.opt.DB.LayoutAt(id, t)
	if err != nil {
		return nil, 0, 0, err
	}
	l, _, err := s.opt.DB.LayoutAtSeq(id, tr.FirstSeq-1)
	if err != nil {
		return nil, 0, 0, err
	}
	c := newStatCounter(l, tr.Rules)
	for from := tr.FirstSeq; from >= 0 && from <= seq; from += summaryPage {
		evs, err := s.opt.DB.Events(id, from, min(seq+1, from+summaryPage))
		if err != nil {
			return nil, 0, 0, err
		}
		for _, e := range evs {
			c.apply(e)
		}
	}
	return &c.st, seq, tr.DeviceOrdinal, nil
}

const (
	poolAll = iota
	poolSmall
	poolLarge
)

type statCounter struct {
	st    caching.Stats
	l     *gpu.Layout
	rules gpu.Rules
}

func up(a *caching.StatArray, pool int, n int64) {
	for _, i := range []int{poolAll, pool} {
		s := &a[i]
		s.Current += n
		s.Allocated += n
		s.Peak = max(s.Peak, s.Current)
	}
}

func down(a *caching.StatArray, pool int, n int64) {
	for _, i := range []int{poolAll, pool} {
		a[i].Current -= n
		a[i].Freed += n
	}
}

func change(a *caching.StatArray, pool int, n int64) {
	if n > 0 {
		up(a, pool, n)
	} else if n < 0 {
		down(a, pool, -n)
	}
}

func poolIndex(s *gpu.Segment) int {
	p := s.Pool
	if p == gpu.PoolUnknown && len(s.Blocks) > 0 {
		p = gpu.PoolFor(s.Size)
		if s.Size == gpu.SmallBuffer {
			p = gpu.PoolSmall
		}
	}
	if p == gpu.PoolSmall {
		return poolSmall
	}
	return poolLarge
}

// inactiveSplit is a segment's free blocks that are split off others.
func inactiveSplit(s *gpu.Segment) (n, bytes int64) {
	if s == nil || len(s.Blocks) < 2 {
		return 0, 0
	}
	for _, b := range s.Blocks {
		if b.State == gpu.BlockFree {
			n++
			bytes += int64(b.Size)
		}
	}
	return n, bytes
}

func newStatCounter(l *gpu.Layout, rules gpu.Rules) *statCounter {
	c := &statCounter{l: l, rules: rules}
	c.st.MaxSplitSize = -1
	if rules.MaxSplitSize != gpu.Unlimited && rules.MaxSplitSize != 0 {
		c.st.MaxSplitSize = int64(rules.MaxSplitSize)
	}
	for i := range l.Segments {
		sg := &l.Segments[i]
		p := poolIndex(sg)
		up(&c.st.Segment, p, 1)
		up(&c.st.ReservedBytes, p, int64(sg.Size))
		n, b := inactiveSplit(sg)
		up(&c.st.InactiveSplit, p, n)
		up(&c.st.InactiveSplitBytes, p, b)
		for _, b := range sg.Blocks {
			if b.State == gpu.BlockFree {
				continue
			}
			up(&c.st.Active, p, 1)
			up(&c.st.ActiveBytes, p, int64(b.Size))
			if b.State == gpu.BlockAllocated {
				up(&c.st.Allocation, p, 1)
				up(&c.st.AllocatedBytes, p, int64(b.Size))
				up(&c.st.RequestedBytes, p, int64(b.Requested))
			}
		}
	}
	return c
}

func (c *statCounter) oversize(size uint64) bool {
	return c.st.MaxSplitSize >= 0 && size >= uint64(c.st.MaxSplitSize)
}

// apply counts one event and moves the layout past it.
func (c *statCounter) apply(e gpu.Event) {
	st := &c.st
	seg := c.l.SegmentAt(e.Addr)
	pool := poolLarge
	if seg != nil {
		pool = poolIndex(seg)
	} else if e.Pool == gpu.PoolSmall {
		pool = poolSmall
	}
	n0, b0 := inactiveSplit(seg)
	// A free_completed with no free_requested before it ends the allocation too.
	unrequested := false
	if b := c.l.BlockAt(e.Addr); e.Action == gpu.ActionFreeCompleted && b != nil && b.Addr == e.Addr && b.State == gpu.BlockAllocated {
		unrequested = true
	}
	segs0 := len(c.l.Segments)
	if err := c.l.Apply(e); err != nil {
		return // a stored trace replays; a mismatch leaves the counts as they are
	}
	seg = c.l.SegmentAt(e.Addr)
	if seg != nil {
		pool = poolIndex(seg)
	}
	n1, b1 := inactiveSplit(seg)
	change(&st.InactiveSplit, pool, n1-n0)
	change(&st.InactiveSplitBytes, pool, b1-b0)
	switch e.Action {
	case gpu.ActionAlloc:
		size := int64(e.BlockSize)
		if b := c.l.BlockAt(e.Addr); b != nil {
			size = int64(b.Size)
		}
		up(&st.Allocation, pool, 1)
		up(&st.AllocatedBytes, pool, size)
		up(&st.RequestedBytes, pool, int64(e.Size))
		up(&st.Active, pool, 1)
		up(&st.ActiveBytes, pool, size)
		if c.oversize(uint64(size)) {
			st.OversizeAllocations.Current++
			st.OversizeAllocations.Allocated++
			st.OversizeAllocations.Peak = max(st.OversizeAllocations.Peak, st.OversizeAllocations.Current)
		}
	case gpu.ActionFreeRequested, gpu.ActionFreeCompleted:
		if e.Action == gpu.ActionFreeCompleted {
			down(&st.Active, pool, 1)
			down(&st.ActiveBytes, pool, int64(e.BlockSize))
			if !unrequested {
				break
			}
		}
		down(&st.Allocation, pool, 1)
		down(&st.AllocatedBytes, pool, int64(e.BlockSize))
		down(&st.RequestedBytes, pool, int64(e.Size))
		if c.oversize(e.BlockSize) {
			st.OversizeAllocations.Current--
			st.OversizeAllocations.Freed++
		}
	case gpu.ActionSegmentAlloc, gpu.ActionSegmentMap:
		up(&st.ReservedBytes, pool, int64(e.Size))
		change(&st.Segment, pool, int64(len(c.l.Segments)-segs0))
		st.NumDeviceAlloc++
		if e.Action == gpu.ActionSegmentAlloc && c.oversize(e.Size) {
			st.OversizeSegments.Current++
			st.OversizeSegments.Allocated++
			st.OversizeSegments.Peak = max(st.OversizeSegments.Peak, st.OversizeSegments.Current)
		}
	case gpu.ActionSegmentFree, gpu.ActionSegmentUnmap:
		down(&st.ReservedBytes, pool, int64(e.Size))
		change(&st.Segment, pool, int64(len(c.l.Segments)-segs0))
		st.NumDeviceFree++
		if e.Action == gpu.ActionSegmentFree && c.oversize(e.Size) {
			st.OversizeSegments.Current--
			st.OversizeSegments.Freed++
		}
	case gpu.ActionOOM:
		st.NumOOMs++
	}
}
