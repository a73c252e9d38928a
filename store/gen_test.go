package store

import (
	"math/rand/v2"

	"vramscope/gpu"
)

// gen makes a deterministic, valid event stream: allocations of mixed sizes
// placed best-fit into segments (new segments when nothing fits), frees that
// are sometimes completed later (cross-stream), occasional cache emptying and
// OOMs. Its layout follows every event, so BlockSize is always known.
type gen struct {
	rng      *rand.Rand
	l        *gpu.Layout
	seq      int64
	t        int64
	live     []uint64
	pending  []uint64
	nextAddr uint64
	target   int // live allocations to hover around
	stacks   int // stack ids to use, 1..stacks (0: none)
}

func newGen(seed uint64, target int) *gen {
	return &gen{rng: rand.New(rand.NewPCG(seed, 7)), l: gpu.NewLayout(gpu.DefaultRules()),
		nextAddr: 0x7f0000000000, target: target, t: 1_000_000}
}

func (g *gen) emit(out []gpu.Event, e gpu.Event) []gpu.Event {
	e.Seq = g.seq
	g.seq++
	e.TimeUS = g.t
	if err := g.l.Apply(e); err != nil {
		panic(err)
	}
	return append(out, e)
}

func (g *gen) size() uint64 {
	if g.rng.IntN(10) < 6 {
		return 1 + uint64(float64(512)*pow2(g.rng.Float64()*11)) // 512 B .. 1 MiB
	}
	return uint64(float64(1<<20) * pow2(g.rng.Float64()*8)) // 1 .. 256 MiB
}

func pow2(x float64) float64 {
	r := 1.0
	for x >= 1 {
		r *= 2
		x--
	}
	return r * (1 + x*0.6931471805599453*(1+x*0.2402265))
}

// next appends the events of one step to out.
func (g *gen) next(out []gpu.Event) []gpu.Event {
	g.t += int64(g.rng.IntN(3))
	r := g.rng.IntN(1000)
	switch {
	case r < 3 && len(g.live) > 0:
		// An OOM report.
		return g.emit(out, gpu.Event{Action: gpu.ActionOOM, Size: 1 << 34, DeviceFree: 1 << 30, Stream: 0})
	case r < 8:
		return g.emptyCache(out)
	case len(g.pending) > 0 && r < 300:
		a := g.pending[0]
		g.pending = g.pending[1:]
		bs := g.l.BlockAt(a).Size
		return g.emit(out, gpu.Event{Action: gpu.ActionFreeCompleted, Addr: a, Size: g.l.BlockAt(a).Requested, BlockSize: bs, Stream: 1})
	case len(g.live) == 0 || len(g.live) < g.target && r < 650 || len(g.live) < g.target/2:
		return g.alloc(out)
	default:
		i := g.rng.IntN(len(g.live))
		a := g.live[i]
		g.live[i] = g.live[len(g.live)-1]
		g.live = g.live[:len(g.live)-1]
		b := g.l.BlockAt(a)
		req, bs := b.Requested, b.Size
		out = g.emit(out, gpu.Event{Action: gpu.ActionFreeRequested, Addr: a, Size: req, BlockSize: bs})
		if g.rng.IntN(4) == 0 {
			g.pending = append(g.pending, a)
			return out
		}
		return g.emit(out, gpu.Event{Action: gpu.ActionFreeCompleted, Addr: a, Size: req, BlockSize: bs})
	}
}

func (g *gen) alloc(out []gpu.Event) []gpu.Event {
	size := g.size()
	rounded := g.l.Rules.RoundSize(size)
	pool := gpu.PoolFor(rounded)
	var at uint64
	best := uint64(0)
	for i := range g.l.Segments {
		s := &g.l.Segments[i]
		if s.Pool != pool {
			continue
		}
		for _, b := range s.Blocks {
			if b.State == gpu.BlockFree && b.Size >= rounded && (best == 0 || b.Size < best) {
				best, at = b.Size, b.Addr
			}
		}
	}
	if best == 0 {
		seg := gpu.AllocationSize(rounded)
		at = g.nextAddr
		g.nextAddr += seg + 2<<20
		out = g.emit(out, gpu.Event{Action: gpu.ActionSegmentAlloc, Addr: at, Size: seg, Pool: pool})
	}
	var stack gpu.StackID
	if g.stacks > 0 {
		stack = gpu.StackID(1 + g.rng.IntN(g.stacks))
	}
	out = g.emit(out, gpu.Event{Action: gpu.ActionAlloc, Addr: at, Size: size, Stack: stack})
	out[len(out)-1].BlockSize = g.l.BlockAt(at).Size
	g.live = append(g.live, at)
	return out
}

// emptyCache releases every entirely free segment.
func (g *gen) emptyCache(out []gpu.Event) []gpu.Event {
	var free []gpu.Segment
	for _, s := range g.l.Segments {
		if len(s.Blocks) == 1 && s.Blocks[0].State == gpu.BlockFree {
			free = append(free, s)
		}
	}
	for _, s := range free {
		out = g.emit(out, gpu.Event{Action: gpu.ActionSegmentFree, Addr: s.Addr, Size: s.Size, Pool: s.Pool})
	}
	return out
}

// events returns the first n events of a stream.
func (g *gen) events(n int) []gpu.Event {
	var out []gpu.Event
	for len(out) < n {
		out = g.next(out)
	}
	return out[:n]
}
