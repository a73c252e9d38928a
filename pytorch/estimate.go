package pytorch

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"unsafe"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
)

// EstimateKey is the top-level key of a snapshot that vramscope's
// estimator wrote (python -m vramscope_watch --estimate): a script run on
// a CPU with CUDA stood in for. Its device trace holds the requests alone
// (alloc and free, no segments); decoding runs them through the allocator
// (materialize), so the trace holds what the allocator would have done.
const EstimateKey = "vramscope_estimate"

// Estimate is what an estimate's snapshot says of itself.
type Estimate struct {
	Script string   `json:"script"`
	Args   []string `json:"argv"`
	// StandIn is what stood in for CUDA: "meta" or "fake" (FakeTensorMode).
	StandIn      string `json:"stand_in"`
	Torch        string `json:"torch"`
	DeviceName   string `json:"device_name"`
	DeviceMemory uint64 `json:"device_memory"`
	Capability   [2]int `json:"compute_capability"`
	Steps        int    `json:"steps"`
	StepsWanted  int    `json:"steps_wanted"`
	// Stopped says what ended the script: "steps" (enough optimizer
	// steps), "end" (it ended), "time" (the time limit).
	Stopped           string `json:"stopped"`
	ValuesNotComputed int    `json:"values_not_computed"`
	Checkpoint        string `json:"checkpoint,omitempty"`
	CheckpointedCalls int    `json:"checkpointed_calls,omitempty"`
	// Added are the allocations the stream cannot see that the estimator
	// added as PyTorch makes them (the cuBLAS workspaces); Outside what
	// lies outside the allocator (the CUDA context, NCCL).
	Added   []EstimateItem `json:"added"`
	Outside []EstimateItem `json:"outside_allocator"`
}

// EstimateItem is memory an estimate names: Count of Bytes each.
type EstimateItem struct {
	Name  string `json:"name"`
	Bytes uint64 `json:"bytes"`
	Count int    `json:"count,omitempty"`
	Note  string `json:"note,omitempty"`
}

// OutsideBytes is what the estimate says lies outside the allocator.
func (e *Estimate) OutsideBytes() uint64 {
	var n uint64
	for _, o := range e.Outside {
		n += o.Bytes
	}
	return n
}

// Capacity is what the allocator may take of the estimate's device: its
// memory less what lies outside the allocator.
func (e *Estimate) Capacity() uint64 { return e.DeviceMemory - min(e.OutsideBytes(), e.DeviceMemory) }

// Summary says in one line what the estimate is: "estimated on a CPU, not
// recorded: 3 optimizer steps of train.py --batch 8 for a device of 80.00
// GiB (stand-in meta, PyTorch 1.13.0); 2 values the script read were
// stand-ins, not computed".
func (e *Estimate) Summary() string {
	what := fmt.Sprintf("%d optimizer %s of %s", e.Steps, plural(e.Steps, "step", "steps"), strings.Join(append([]string{e.Script}, e.Args...), " "))
	switch e.Stopped {
	case "end":
		what += " (to its end)"
	case "time":
		what += " (stopped by the time limit)"
	}
	s := fmt.Sprintf("%s: %s for a device of %s (stand-in %s, PyTorch %s)", gpu.EstimateNote, what, gpu.FormatBytes(e.DeviceMemory), e.StandIn, e.Torch)
	if e.Checkpoint != "" {
		s += ", every " + e.Checkpoint + " checkpointed"
	}
	if e.ValuesNotComputed > 0 {
		s += fmt.Sprintf("; %d %s the script read %s stand-ins, not computed", e.ValuesNotComputed,
			plural(e.ValuesNotComputed, "value", "values"), plural(e.ValuesNotComputed, "was a", "were"))
	}
	return s
}

// Beyond says what the requests could not show, with figures: what was
// added as PyTorch allocates it (the cuBLAS workspaces), and what lies
// outside the allocator (the CUDA context, NCCL), which the device's
// memory less it is the allocator's capacity.
func (e *Estimate) Beyond() string {
	var parts []string
	if len(e.Added) > 0 {
		var items []string
		for _, a := range e.Added {
			items = append(items, fmt.Sprintf("%d× %s of %s", max(a.Count, 1), a.Name, gpu.FormatBytes(a.Bytes)))
		}
		parts = append(parts, "Added as PyTorch allocates them: "+strings.Join(items, ", "))
	}
	if len(e.Outside) > 0 {
		var items []string
		for _, o := range e.Outside {
			item := o.Name
			if o.Bytes > 0 {
				item += ", about " + gpu.FormatBytes(o.Bytes)
			}
			if o.Note != "" {
				item += " (" + o.Note + ")"
			}
			items = append(items, item)
		}
		parts = append(parts, "Outside the allocator: "+strings.Join(items, "; "))
	}
	return strings.Join(parts, ". ")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// Estimate returns what the snapshot says of itself when vramscope's
// estimator wrote it, nil otherwise (or when the key does not read).
func (s *Snapshot) Estimate() *Estimate {
	if s == nil {
		return nil
	}
	e, _ := s.estimate()
	return e
}

// estimate reads the EstimateKey entry of the top level; nil when there is
// none, an error saying where when it is not what the estimator writes.
func (s *Snapshot) estimate() (*Estimate, error) {
	v, ok := s.Other.Get(EstimateKey)
	if !ok {
		return nil, nil
	}
	d, ok := v.(Dict)
	if !ok {
		return nil, bad(EstimateKey, "want a dict, found a %T", v)
	}
	e := &Estimate{}
	str := func(k string) string { x, _ := d.Get(k); s, _ := x.(string); return s }
	num := func(k string) (int64, bool) {
		x, ok := d.Get(k)
		if !ok {
			return 0, true
		}
		n, ok := x.(int64)
		return n, ok
	}
	e.Script, e.StandIn, e.Torch, e.DeviceName, e.Stopped, e.Checkpoint = str("script"), str("stand_in"), str("torch"), str("device_name"), str("stopped"), str("checkpoint")
	if args, ok := d.Get("argv"); ok {
		list, _ := args.([]any)
		for _, a := range list {
			if s, ok := a.(string); ok {
				e.Args = append(e.Args, s)
			}
		}
	}
	mem, ok := num("device_memory")
	if !ok || mem <= 0 {
		return nil, bad(EstimateKey+".device_memory", "want the device's memory in bytes, a positive integer")
	}
	e.DeviceMemory = uint64(mem)
	for k, dst := range map[string]*int{"steps": &e.Steps, "steps_wanted": &e.StepsWanted, "values_not_computed": &e.ValuesNotComputed, "checkpointed_calls": &e.CheckpointedCalls} {
		n, ok := num(k)
		if !ok || n < 0 || n > 1<<31 {
			return nil, bad(EstimateKey+"."+k, "want a count")
		}
		*dst = int(n)
	}
	if cc, ok := d.Get("compute_capability"); ok {
		list, _ := cc.([]any)
		for i := 0; i < 2 && i < len(list); i++ {
			n, _ := list[i].(int64)
			e.Capability[i] = int(n)
		}
	}
	var err error
	if e.Added, err = estimateItems(d, "added"); err != nil {
		return nil, err
	}
	if e.Outside, err = estimateItems(d, "outside_allocator"); err != nil {
		return nil, err
	}
	if e.OutsideBytes() >= e.DeviceMemory {
		return nil, bad(EstimateKey+".outside_allocator", "leaves none of the %d bytes of device_memory to the allocator", e.DeviceMemory)
	}
	return e, nil
}

func estimateItems(d Dict, key string) ([]EstimateItem, error) {
	v, ok := d.Get(key)
	if !ok {
		return nil, nil
	}
	list, ok := v.([]any)
	if !ok {
		return nil, bad(EstimateKey+"."+key, "want a list")
	}
	out := make([]EstimateItem, 0, len(list))
	for i, x := range list {
		where := fmt.Sprintf("%s.%s[%d]", EstimateKey, key, i)
		m, ok := x.(Dict)
		if !ok {
			return nil, bad(where, "want a dict")
		}
		var it EstimateItem
		name, _ := m.Get("name")
		it.Name, _ = name.(string)
		note, _ := m.Get("note")
		it.Note, _ = note.(string)
		b, _ := m.Get("bytes")
		n, ok := b.(int64)
		if !ok || n < 0 {
			return nil, bad(where+".bytes", "want a size in bytes")
		}
		it.Bytes = uint64(n)
		if c, ok := m.Get("count"); ok {
			k, ok := c.(int64)
			if !ok || k < 0 || k > 1<<20 {
				return nil, bad(where+".count", "want a count")
			}
			it.Count = int(k)
		}
		out = append(out, it)
	}
	return out, nil
}

// requestsOnly says whether t holds requests alone: no segments, no
// segment events, no oom (what the estimator writes).
func requestsOnly(t *Trace) bool {
	if len(t.Final.Segments) > 0 {
		return false
	}
	for i := range t.Events {
		switch t.Events[i].Action {
		case gpu.ActionAlloc, gpu.ActionFreeRequested, gpu.ActionFreeCompleted:
		default:
			return false
		}
	}
	return true
}

// maxDevice is the device the requests go on with after the first that
// runs out of memory: replay.MaxCapacityNeeded, the largest a search tries.
const maxDevice = 512 << 30

// record runs requests (alloc, free_requested and free_completed events)
// through a new allocator under cfg on a simulated device of capacity
// bytes and returns the events the allocator made, each stamped with its
// request's time, and the layout it ended with. The first request that
// runs out of memory is recorded as the allocator records it (the cache
// released, then the oom) and then served as on a device large enough
// (maxDevice), so that the recording goes on with what the job asks next;
// replay.FromEvents reads the oom and the alloc that serves it as one
// request. A request no device serves is left out, and so is its free.
func record(requests []gpu.Event, cfg caching.Config, capacity uint64, ordinal int) ([]gpu.Event, *gpu.Layout, error) {
	var events []gpu.Event
	var now int64
	dev := sim.New(capacity, sim.WithOrdinal(ordinal))
	keep := gpu.SinkFunc(func(b []gpu.Event) { events = append(events, b...) })
	a, err := caching.New(dev, cfg, caching.WithSink(keep), caching.WithClock(func() int64 { return now }))
	if err != nil {
		return nil, nil, err
	}
	live := make(map[uint64]uint64, 1024) // the request's address -> the allocator's
	grown := false
	for i := range requests {
		r := &requests[i]
		now = r.TimeUS
		switch r.Action {
		case gpu.ActionAlloc:
			ptr, err := a.Malloc(r.Size, r.Stream, r.Stack)
			if errors.Is(err, gpu.ErrOutOfMemory) && !grown {
				grown = true
				dev.SetCapacity(max(capacity, maxDevice))
				ptr, err = a.Malloc(r.Size, r.Stream, r.Stack)
			}
			if errors.Is(err, gpu.ErrOutOfMemory) || r.Size == 0 {
				continue
			}
			if err != nil {
				return nil, nil, fmt.Errorf("request at entry %d: %w", i, err)
			}
			live[r.Addr] = ptr
		case gpu.ActionFreeRequested:
			ptr, ok := live[r.Addr]
			if !ok {
				continue
			}
			delete(live, r.Addr)
			if err := a.FreeFrom(ptr, r.Stack); err != nil {
				return nil, nil, fmt.Errorf("free at entry %d: %w", i, err)
			}
		}
	}
	a.Flush()
	return events, a.Layout(), nil
}

// materialize runs the requests of an estimate through the allocator
// under the snapshot's settings, on the estimate's device less what lies
// outside the allocator (record): t's events and final layout
// become the allocator's. Its times become event indexes (an estimate
// has no real times: the file's are the requests made so far), and the
// annotations move with them: one at time n starts before the first
// event of request n+1.
func (c *converter) materialize(t *Trace, e *Estimate) error {
	cfg, err := caching.ParseConfig(t.Settings.Conf)
	if err != nil {
		return bad("allocator_settings.PYTORCH_CUDA_ALLOC_CONF", "%q: %v", t.Settings.Conf, err)
	}
	events, final, err := record(t.Events, cfg, e.Capacity(), t.Device)
	if err != nil {
		return fmt.Errorf("running the estimate's requests through the allocator: %w", err)
	}
	if err := c.spend(len(events) * int(unsafe.Sizeof(gpu.Event{})) / valueSize); err != nil {
		return err
	}
	requestTime := make([]int64, len(events))
	for i := range events {
		requestTime[i] = events[i].TimeUS
		events[i].Seq, events[i].TimeUS = int64(i), int64(i)
	}
	for i := range t.Snapshot.Annotations {
		if a := &t.Snapshot.Annotations[i]; a.Device == t.Device {
			n := a.TimeUS
			a.TimeUS = int64(sort.Search(len(requestTime), func(k int) bool { return requestTime[k] > n }))
		}
	}
	t.Events, t.ExtraOf, t.Extras = events, nil, nil
	t.HasTime = false
	t.Final = final
	t.Segments = make([]SegmentInfo, len(final.Segments))
	for i := range t.Segments {
		t.Segments[i].Index = i
	}
	return nil
}
