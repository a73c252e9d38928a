package replay

import (
	"fmt"
	"math"
	"strings"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
)

// Stream is a request stream with what its recording says of where it ran:
// the layout it started from, the addresses the driver gave, the settings
// and the device's capacity.
type Stream struct {
	// Initial is the layout before the first request (nil: empty). Its
	// live blocks are known to the requests by ids 1..n (see FromEvents).
	Initial  *gpu.Layout
	Requests []Request
	// Settings are the allocator settings it was recorded under
	// (PYTORCH_CUDA_ALLOC_CONF syntax; empty: the defaults).
	Settings string
	// Ordinal is the device's index: messages name it ("GPU 1").
	Ordinal  int
	Capacity Capacity
	// Limit is the per-process limit the recording implies (Bytes 0:
	// none): every configuration the stream gives carries it.
	Limit Limit
	// Stacks are the stacks the requests and Initial's blocks refer to:
	// StackID i is Stacks[i-1] (nil for an RMM log, which has none).
	Stacks []gpu.Stack
	// Annotations are the recording's steps and phases.
	Annotations []gpu.Annotation
	// Estimated: the stream was estimated on a CPU, not recorded
	// (gpu.Recording's Estimated).
	Estimated bool

	addr addresses
}

// regionKey names an expandable segment: PyTorch keeps one per pool and
// stream.
type regionKey struct {
	stream int64
	pool   gpu.Pool
}

// FromRecording turns a recording into a stream: its requests (with the
// empty_cache() calls its segment releases imply), its starting layout and
// driver addresses, its settings, and its capacity: recorded, else read
// from its first OOM, else bounded by its free-and-retry paths (see
// inferRuns); Capacity.Bytes is 0 when nothing says.
func FromRecording(rec gpu.Recording) Stream {
	s := Stream{Initial: rec.Initial, Settings: rec.Settings, Ordinal: rec.Device, Stacks: rec.Stacks, Annotations: rec.Annotations,
		Estimated: rec.Estimated, addr: recordedAddresses(rec.Initial, rec.Events)}
	ctx := runContext{rules: gpu.DefaultRules(), capacity: rec.Capacity, limit: rec.Capacity, addr: &s.addr}
	cfg, err := caching.ParseConfig(rec.Settings)
	if err == nil {
		ctx.rules = cfg.Rules
		if cfg.MemoryFraction > 0 {
			ctx.limit = uint64(cfg.MemoryFraction * float64(rec.Capacity))
		}
	}
	if err == nil && cfg.GarbageCollectionThreshold > 0 {
		// GC runs only under a memory fraction, which PyTorch's
		// settings do not record (it is set by a call).
		ctx.gc = cfg.MemoryFraction > 0 || rec.Capacity == 0
		ctx.gcAbove = uint64(cfg.GarbageCollectionThreshold * cfg.MemoryFraction * float64(rec.Capacity))
	}
	ev := inferRuns(rec.Initial, rec.Events, ctx)
	s.Requests = fromEvents(rec.Initial, rec.Events, ev.emptyCache, allocPools(rec.Initial, rec.Events, rec.Pools))
	s.Capacity = ev.capacity
	s.Limit = ev.limit
	if rec.Capacity > 0 {
		s.Capacity = Capacity{Bytes: rec.Capacity, Source: CapacityRecorded, PeakReserved: ev.capacity.PeakReserved}
		if rec.Estimated {
			s.Capacity.Source = CapacityEstimated
		}
	}
	// Of the capacities the retries allow, the one closest to what keeps
	// the reservations apart (see sim.Recorded).
	switch most := s.addr.maxTotal; {
	case s.Capacity.Source == CapacityRetries && most > 0:
		s.Capacity.Bytes = max(s.Capacity.Low, min(s.Capacity.High, most))
	case s.Capacity.Bytes == 0 && most > 0:
		s.Capacity = Capacity{Bytes: most, Source: CapacityReservations, PeakReserved: s.Capacity.PeakReserved}
	}
	return s
}

// addresses are the driver's addresses of a recording, in the order a
// replay asks for them (see sim.Recorded).
type addresses struct {
	mallocs, reserves []sim.Span
	// held are the reservations with the events during which they were
	// held: [born, ended), born -1 for those of the starting layout.
	held []heldRegion
	// maxTotal is the most device memory that keeps apart the
	// reservations for expandable segments held at once, each 9/8 of it
	// as PyTorch makes them (0: no bound). A reservation of the starting
	// layout may have begun below its lowest segment, so the device may
	// have had more; a replay on no more keeps the recorded addresses.
	maxTotal uint64
}

// heldRegion is a reservation for an expandable segment and when it was
// held.
type heldRegion struct {
	key         regionKey
	base        uint64
	born, ended int
}

// base returns where the reservation of k held at event i began.
func (ad *addresses) base(k regionKey, i int) (uint64, bool) {
	for _, h := range ad.held {
		if h.key == k && h.born <= i && i < h.ended {
			return h.base, true
		}
	}
	return 0, false
}

// recordedAddresses lists the driver's addresses in the order a replay
// asks for them: the segments of the starting layout in address order
// (their expandable segments by pool and stream, each reservation starting
// at its lowest address), then every segment_alloc, and the first
// segment_map of a pool and stream that has no mapped memory (a fresh
// reservation: its first page is where the driver put it).
func recordedAddresses(initial *gpu.Layout, events []gpu.Event) addresses {
	var ad addresses
	type region struct {
		key         regionKey
		at          int // index in ad.reserves
		page        uint64
		mapped      uint64
		born, ended int // event indexes; ended is len(events) while held
	}
	var regions []*region
	live := map[regionKey]*region{}
	open := func(k regionKey, addr uint64, born int) *region {
		r := &region{key: k, at: len(ad.reserves), page: gpu.LargeBuffer, born: born, ended: len(events)}
		if k.pool == gpu.PoolSmall {
			r.page = gpu.SmallBuffer
		}
		ad.reserves = append(ad.reserves, sim.Span{Addr: addr, Page: r.page})
		live[k] = r
		regions = append(regions, r)
		return r
	}
	grow := func(r *region, addr, size uint64) {
		sp := &ad.reserves[r.at]
		end := max(sp.Addr+sp.Size, addr+size)
		sp.Addr = min(sp.Addr, addr)
		sp.Size = end - sp.Addr
		r.mapped += size
	}
	if initial != nil {
		for i := range initial.Segments {
			s := &initial.Segments[i]
			if !s.Expandable {
				ad.mallocs = append(ad.mallocs, sim.Span{Addr: s.Addr, Size: s.Size})
				continue
			}
			k := regionKey{s.Stream, s.Pool}
			r := live[k]
			if r == nil {
				r = open(k, s.Addr, -1)
			}
			grow(r, s.Addr, s.Size)
		}
	}
	for i := range events {
		e := &events[i]
		switch e.Action {
		case gpu.ActionSegmentAlloc:
			ad.mallocs = append(ad.mallocs, sim.Span{Addr: e.Addr, Size: e.Size})
		case gpu.ActionSegmentMap:
			k := regionKey{e.Stream, gpu.GuessPool(*e)}
			r := live[k]
			if r == nil {
				r = open(k, e.Addr, i)
			}
			grow(r, e.Addr, e.Size)
		case gpu.ActionSegmentUnmap:
			// The region of this stream that holds the address: the one
			// starting highest below it.
			var hold regionKey
			var r *region
			for k, c := range live {
				if k.stream == e.Stream && ad.reserves[c.at].Addr <= e.Addr && (r == nil || ad.reserves[c.at].Addr > ad.reserves[r.at].Addr) {
					hold, r = k, c
				}
			}
			if r == nil {
				continue
			}
			r.mapped -= min(r.mapped, e.Size)
			if r.mapped == 0 {
				r.ended = i
				delete(live, hold)
			}
		}
	}
	// Reservations held at the same time did not overlap: each ended
	// below the next one up, and PyTorch reserves 9/8 of the device's
	// memory for each.
	for _, r := range regions {
		sp := &ad.reserves[r.at]
		ad.held = append(ad.held, heldRegion{r.key, sp.Addr, r.born, r.ended})
		for _, o := range regions {
			ob := ad.reserves[o.at].Addr
			if ob <= sp.Addr || o.born > r.ended || r.born > o.ended {
				continue
			}
			if sp.Below == 0 || ob < sp.Below {
				sp.Below = ob
			}
			room := (ob - sp.Addr) / r.page * r.page
			total := room / 9 * 8
			for total+total/8 > room {
				total--
			}
			if ad.maxTotal == 0 || total < ad.maxTotal {
				ad.maxTotal = total
			}
		}
	}
	return ad
}

// Unplaced is s with no driver addresses: a new run of its requests,
// whose segments the device places as the driver does rather than where
// the recording's were (a prediction at another size is such a run).
func (s Stream) Unplaced() Stream {
	s.addr = addresses{}
	return s
}

// Device returns a simulated device of capacity bytes that hands out the
// stream's recorded addresses (sim.Recorded), or its own when the
// recording has none (an RMM log).
func (s *Stream) Device(capacity uint64) *sim.Device {
	if len(s.addr.mallocs) == 0 && len(s.addr.reserves) == 0 {
		return sim.New(capacity, sim.WithOrdinal(s.Ordinal))
	}
	return sim.New(capacity, sim.WithOrdinal(s.Ordinal), sim.Recorded(s.addr.mallocs, s.addr.reserves))
}

// Config is the stream's recorded settings with the keys of overrides
// (PYTORCH_CUDA_ALLOC_CONF syntax) set on top: "max_split_size_mb:128"
// changes that key only.
func (s *Stream) Config(overrides string) (caching.Config, error) {
	c, err := caching.ParseConfig(s.Settings)
	if err != nil {
		return caching.Config{}, fmt.Errorf("the recorded settings %q: %w", s.Settings, err)
	}
	c.Limit = s.Limit.Bytes
	return Overlay(c, overrides)
}

// Overlay sets the keys of conf (PYTORCH_CUDA_ALLOC_CONF syntax) on base.
// Keys conf does not name keep base's values.
func Overlay(base caching.Config, conf string) (caching.Config, error) {
	if _, err := caching.ParseConfig(conf); err != nil {
		return caching.Config{}, err
	}
	for _, item := range splitConf(conf) {
		v, err := caching.ParseConfig(item)
		if err != nil {
			return caching.Config{}, err
		}
		key, _, _ := strings.Cut(item, ":")
		switch strings.TrimSpace(key) {
		case "max_split_size_mb":
			base.MaxSplitSize = v.MaxSplitSize
		case "max_non_split_rounding_mb":
			base.MaxNonSplitRounding = v.MaxNonSplitRounding
		case "garbage_collection_threshold":
			base.GarbageCollectionThreshold = v.GarbageCollectionThreshold
		case "per_process_memory_fraction":
			base.MemoryFraction = v.MemoryFraction
		case "roundup_power2_divisions":
			base.RoundupDivisions = v.RoundupDivisions
		case "expandable_segments":
			base.Expandable = v.Expandable
		case "release_lock_on_cudamalloc":
			base.ReleaseLockOnCudaMalloc = v.ReleaseLockOnCudaMalloc
		}
	}
	base.Raw = base.String()
	return base, nil
}

// Variant is base with a what-if setting v set on top (Overlay), as it
// would act: PyTorch collects garbage only under a memory fraction, so a
// garbage_collection_threshold on a run without a limit or fraction gets
// per_process_memory_fraction:1 (the whole device, no limit); a run under
// one keeps it. added says a fraction was added.
func Variant(base caching.Config, v string) (c caching.Config, added bool, err error) {
	c, err = Overlay(base, v)
	if err != nil {
		return c, false, err
	}
	if c.GarbageCollectionThreshold > 0 && c.MemoryFraction == 0 && c.Limit == 0 {
		c.MemoryFraction = 1
		c.Raw = c.String()
		added = true
	}
	return c, added, nil
}

// splitConf cuts a settings string into its key:value items; commas
// inside [...] belong to a value.
func splitConf(conf string) []string {
	var items []string
	depth, start := 0, 0
	for i, c := range conf {
		switch c {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				items = append(items, conf[start:i])
				start = i + 1
			}
		}
	}
	if strings.TrimSpace(conf[start:]) != "" {
		items = append(items, conf[start:])
	}
	return items
}

// Start returns a replayer for s on a, a fresh allocator, with the
// starting layout rebuilt (see restore). The device should be s.Device:
// then the rebuilt segments sit at their recorded addresses. Rebuilding
// maps the unmapped pages between expandable segments for a while, so a
// simulated device lends the memory that takes; a layout that does not fit
// the device is an error wrapping gpu.ErrOutOfMemory.
func (s *Stream) Start(a *caching.Allocator) (*Replayer, error) {
	p := NewReplayer(a)
	p.live.reserve(len(s.Requests) + 1) // the ids of a stream's mallocs and starting blocks, mostly
	if s.Initial == nil || len(s.Initial.Segments) == 0 {
		return p, nil
	}
	// The statistics are the stream's, not the rebuilding's: PyTorch's
	// counted what came before the recording, which it does not say.
	defer a.ResetAccumulatedStats()
	defer a.ResetPeakStats()
	dev, lend := a.Device().(*sim.Device)
	if !lend {
		return p, p.restore(s.Initial)
	}
	capacity := dev.Capacity()
	dev.SetCapacity(math.MaxUint64)
	err := p.restore(s.Initial)
	dev.SetCapacity(capacity)
	if err == nil && a.Reserved() > capacity {
		// Under other settings the same calls can take more.
		err = fmt.Errorf("the starting layout (%s reserved under these settings) does not fit on a %s device: %w",
			gpu.FormatBytes(a.Reserved()), gpu.FormatBytes(capacity), gpu.ErrOutOfMemory)
	}
	p.res = Result{}
	p.measure()
	return p, err
}

// Run replays s under cfg on s.Device(capacity) and returns the allocator
// at the end and what the replay found.
func (s *Stream) Run(cfg caching.Config, capacity uint64, opts ...caching.Option) (*caching.Allocator, Result, error) {
	a, err := caching.New(s.Device(capacity), cfg, opts...)
	if err != nil {
		return nil, Result{}, err
	}
	p, err := s.Start(a)
	if err != nil {
		return a, p.Result(), err
	}
	res, err := p.Run(s.Requests)
	return a, res, err
}
