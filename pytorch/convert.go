package pytorch

import (
	"fmt"
	"slices"
	"sort"
	"unsafe"

	"vramscope/gpu"
	"vramscope/gpu/caching"
)

const (
	blockSize      = int(unsafe.Sizeof(gpu.Block{}))
	segmentSize    = int(unsafe.Sizeof(gpu.Segment{}))
	rawSegmentSize = int(unsafe.Sizeof(rawSegment{}))
)

// converter turns the decoded top-level value into one Trace per device.
type converter struct {
	d *decoder
}

// StructureError is a snapshot that decodes but does not have the shape
// PyTorch writes; Where is a path such as segments[3].blocks[0].
type StructureError struct {
	Where string
	Msg   string
}

func (e *StructureError) Error() string { return "snapshot: " + e.Where + ": " + e.Msg }

func bad(where, format string, args ...any) error {
	return &StructureError{Where: where, Msg: fmt.Sprintf(format, args...)}
}

func (c *converter) spend(n int) error {
	if c.d.charge(n * valueSize); c.d.over != nil {
		return c.d.over
	}
	return nil
}

func (c *converter) dict(v Value, where string) (Value, error) {
	v = resolve(v)
	if v.kind != kDict {
		return v, bad(where, "want a dict, found a %s", v.kind)
	}
	return v, nil
}

func (c *converter) list(v Value, where string) ([]Value, error) {
	v = resolve(v)
	if v.kind != kList && v.kind != kTuple {
		return nil, bad(where, "want a list, found a %s", v.kind)
	}
	if v.obj.events != nil {
		return nil, bad(where, "want a list, found trace entries")
	}
	if err := c.spend(len(v.obj.items)); err != nil {
		return nil, err
	}
	return v.obj.items, nil
}

// get returns a key of a dict; required keys that are missing are errors.
func (c *converter) get(dict Value, key uint32, where string, required bool) (Value, bool, error) {
	v, ok := dictGet(dict, key)
	if !ok && required {
		return v, false, bad(where, "missing key %q (keys: %s)", c.d.strs[key], c.d.describeKeys(dict))
	}
	return resolve(v), ok, nil
}

func (c *converter) uint(dict Value, key uint32, where string, required bool) (uint64, bool, error) {
	v, ok, err := c.get(dict, key, where, required)
	if err != nil || !ok {
		return 0, ok, err
	}
	u, exact, okInt := v.uint64()
	if !okInt || !exact {
		return 0, true, bad(where+"."+c.d.strs[key], "want an integer from 0 to 2^64-1, found %s", c.d.describe(v))
	}
	return u, true, nil
}

func (c *converter) int(dict Value, key uint32, where string, required bool) (int64, bool, error) {
	v, ok, err := c.get(dict, key, where, required)
	if err != nil || !ok {
		return 0, ok, err
	}
	if v.kind == kUint {
		return int64(v.bits), true, nil // a handle such as cudaStream_t
	}
	n, okInt := v.int64()
	if !okInt {
		return 0, true, bad(where+"."+c.d.strs[key], "want a 64-bit integer, found %s", c.d.describe(v))
	}
	return n, true, nil
}

func (c *converter) str(dict Value, key uint32, where string, required bool) (string, bool, error) {
	v, ok, err := c.get(dict, key, where, required)
	if err != nil || !ok {
		return "", ok, err
	}
	if v.kind != kStr {
		return "", true, bad(where+"."+c.d.strs[key], "want a string, found %s", c.d.describe(v))
	}
	return c.d.strs[v.bits], true, nil
}

// stack reads an optional frames key.
func (c *converter) stack(dict Value, where string) (gpu.StackID, bool, error) {
	v, ok, _ := c.get(dict, sFrames, where, false)
	if !ok {
		return 0, false, nil
	}
	if v.kind == kList {
		v = c.d.internStack(v)
	}
	if v.kind != kStack {
		return 0, true, bad(where+".frames", "want a list of frames {name, filename, line}, found %s", c.d.describe(v))
	}
	return gpu.StackID(v.bits), true, nil
}

// describe names a value for an error message.
func (d *decoder) describe(v Value) string {
	switch v.kind {
	case kStr:
		return fmt.Sprintf("%q", clip(d.strs[v.bits]))
	case kInt:
		return fmt.Sprint(int64(v.bits))
	case kDict:
		return "a dict with keys " + d.describeKeys(v)
	case kList:
		if len(v.obj.items) > 0 {
			return fmt.Sprintf("a list holding a %s", resolve(v.obj.items[0]).kind)
		}
	}
	return "a " + v.kind.String()
}

type rawSegment struct {
	device int
	seg    gpu.Segment
	info   SegmentInfo
}

// convert builds the traces from the decoded top-level value. Running
// out of the memory budget, or the context ending, wins over any other
// error it causes.
func (c *converter) convert(root Value) ([]*Trace, error) {
	out, err := c.build(root)
	if c.d.over != nil {
		return nil, c.d.over
	}
	if err == nil {
		err = c.d.canceled()
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *converter) build(root Value) ([]*Trace, error) {
	d := c.d
	root = resolve(root)
	var segsV, tracesV, settingsV, annV Value
	snap := &Snapshot{}
	switch root.kind {
	case kList:
		segsV = root // torch.cuda.memory_snapshot(): the segments alone
		snap.List = true
	case kDict:
		items := root.obj.items
		pairs, err := dictPairs(items)
		if err != nil {
			return nil, bad("top level", "%v", err)
		}
		for _, p := range pairs {
			k, v := items[p[0]], resolve(items[p[1]])
			if k.kind != kStr {
				return nil, bad("top level", "a key is a %s, not a string", k.kind)
			}
			snap.Keys = append(snap.Keys, d.strs[k.bits])
			switch k.bits {
			case sSegments:
				segsV = v
			case sDeviceTraces:
				tracesV = v
			case sAllocatorSettings:
				settingsV = v
			case sExternalAnnotations:
				annV = v
			default:
				x, err := d.toAny(v, 1)
				if err != nil {
					return nil, bad(d.strs[k.bits], "%v", err)
				}
				snap.Other = append(snap.Other, KV{d.strs[k.bits], x})
			}
		}
		if segsV.kind == kEmpty {
			return nil, bad("top level", "missing key \"segments\" (keys: %s)", d.describeKeys(root))
		}
	default:
		return nil, bad("top level", "want a dict or a list of segments, found %s", d.describe(root))
	}

	est, err := snap.estimate()
	if err != nil {
		return nil, err
	}
	settings := Settings{Rules: gpu.DefaultRules()}
	if settingsV.kind != kEmpty {
		x, err := d.toAny(settingsV, 1)
		if err != nil {
			return nil, bad("allocator_settings", "%v", err)
		}
		raw, ok := x.(Dict)
		if !ok {
			return nil, bad("allocator_settings", "want a dict, found %s", d.describe(settingsV))
		}
		settings.Raw = raw
		if conf, ok := raw.Get("PYTORCH_CUDA_ALLOC_CONF"); ok {
			settings.Conf, _ = conf.(string)
		}
		settings.Rules = rulesFrom(raw)
		if cfg, err := caching.ParseConfig(settings.Conf); err == nil && est != nil {
			// the estimator writes the settings string alone
			settings.Rules = cfg.Rules
		}
	}

	segs, err := c.segments(segsV)
	if err != nil {
		return nil, err
	}
	lists, err := c.deviceTraces(tracesV)
	if err != nil {
		return nil, err
	}
	snap.DeviceTraces = len(lists)
	if snap.Annotations, err = c.annotations(annV); err != nil {
		return nil, err
	}

	devices := map[int]bool{}
	for i := range lists {
		devices[i] = true
	}
	for _, s := range segs {
		devices[s.device] = true
	}
	var order []int
	for dev := range devices {
		order = append(order, dev)
	}
	sort.Ints(order)

	var warnings []string
	if d.wideLines > 0 {
		warnings = append(warnings, fmt.Sprintf("%d frame lines outside 0..2^64-1 were clamped", d.wideLines))
	}
	var out []*Trace
	for _, dev := range order {
		if err := d.canceled(); err != nil {
			return nil, err
		}
		t := &Trace{Device: dev, Settings: settings, Final: gpu.NewLayout(settings.Rules), Warnings: warnings, Snapshot: snap}
		for _, s := range segs {
			if s.device == dev {
				t.Final.Segments = append(t.Final.Segments, s.seg)
				t.Segments = append(t.Segments, s.info)
			}
		}
		if dev < len(lists) && lists[dev] != nil {
			el := lists[dev]
			t.Events, t.ExtraOf = el.all(), el.extra
			t.HasTime = el.timed > 0
			c.fixTimes(t, el)
		}
		if est != nil && requestsOnly(t) && len(t.Events) > 0 {
			if err := c.materialize(t, est); err != nil {
				return nil, err
			}
		}
		if err := c.finishLayout(t); err != nil {
			return nil, err
		}
		// The final layout is held three times (final, initial, the one
		// replayed).
		blocks := 0
		for _, s := range t.Final.Segments {
			blocks += len(s.Blocks)
		}
		if err := c.spend(512 + 3*(blocks*blockSize+len(t.Final.Segments)*segmentSize)/valueSize); err != nil {
			return nil, err
		}
		c.compact(t)
		if err := t.deriveInitial(d.canceled); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// fixTimes numbers events without time_us: by index when no entry has a
// time, else with the previous entry's time, saying so.
func (c *converter) fixTimes(t *Trace, el *eventList) {
	prev := int64(0)
	for i := range t.Events {
		e := &t.Events[i]
		if e.TimeUS >= 0 {
			prev = e.TimeUS
			continue
		}
		if !t.HasTime {
			e.TimeUS = int64(i)
			continue
		}
		e.TimeUS = prev
		t.Mismatches = append(t.Mismatches, gpu.MismatchError{Event: *e, Reason: "no time_us; took the previous entry's"})
	}
}

// finishLayout sorts the segments by address and checks they do not overlap.
func (c *converter) finishLayout(t *Trace) error {
	idx := make([]int, len(t.Final.Segments))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return t.Final.Segments[idx[a]].Addr < t.Final.Segments[idx[b]].Addr })
	segs := make([]gpu.Segment, len(idx))
	infos := make([]SegmentInfo, len(idx))
	for i, j := range idx {
		segs[i], infos[i] = t.Final.Segments[j], t.Segments[j]
	}
	t.Final.Segments, t.Segments = segs, infos
	for i := 1; i < len(segs); i++ {
		if segs[i].Addr < segs[i-1].End() {
			return bad(fmt.Sprintf("segments (device %d)", t.Device), "segments at %#x and %#x overlap", segs[i-1].Addr, segs[i].Addr)
		}
	}
	return nil
}

// compact gives the trace its own stack and extras tables, numbered in
// the order they are first used (segments by address, then events), so
// the numbering does not depend on the other devices in the file.
func (c *converter) compact(t *Trace) {
	d := c.d
	remap := make([]gpu.StackID, len(d.stacks)+1)
	use := func(id gpu.StackID) gpu.StackID {
		if id == 0 {
			return 0
		}
		if remap[id] == 0 {
			t.Stacks = append(t.Stacks, d.stacks[id-1])
			remap[id] = gpu.StackID(len(t.Stacks))
		}
		return remap[id]
	}
	for i := range t.Final.Segments {
		t.Segments[i].Stack = use(t.Segments[i].Stack)
		for j := range t.Final.Segments[i].Blocks {
			b := &t.Final.Segments[i].Blocks[j]
			b.Stack = use(b.Stack)
		}
	}
	for i := range t.Events {
		t.Events[i].Stack = use(t.Events[i].Stack)
	}
	if t.ExtraOf != nil {
		xmap := make([]uint32, len(d.extras)+1)
		for i, x := range t.ExtraOf {
			if x == 0 {
				continue
			}
			if xmap[x] == 0 {
				t.Extras = append(t.Extras, d.extras[x-1])
				xmap[x] = uint32(len(t.Extras))
			}
			t.ExtraOf[i] = xmap[x]
		}
	}
}

func (c *converter) segments(v Value) ([]rawSegment, error) {
	items, err := c.list(v, "segments")
	if err != nil {
		return nil, err
	}
	if err := c.spend(len(items) * rawSegmentSize / valueSize); err != nil {
		return nil, err
	}
	out := make([]rawSegment, 0, len(items))
	for i, sv := range items {
		if i%checkEvery == 0 {
			if err := c.d.canceled(); err != nil {
				return nil, err
			}
		}
		where := fmt.Sprintf("segments[%d]", i)
		s, err := c.segment(sv, where)
		if err != nil {
			return nil, err
		}
		s.info.Index = i
		out = append(out, s)
	}
	return out, nil
}

func (c *converter) segment(sv Value, where string) (rawSegment, error) {
	var s rawSegment
	sv, err := c.dict(sv, where)
	if err != nil {
		return s, err
	}
	dev, _, err := c.int(sv, sDevice, where, true)
	if err != nil {
		return s, err
	}
	if dev < 0 || dev > 1<<16 {
		return s, bad(where+".device", "device ordinal %d is out of range", dev)
	}
	s.device = int(dev)
	seg := &s.seg
	if seg.Addr, _, err = c.uint(sv, sAddress, where, true); err != nil {
		return s, err
	}
	if seg.Size, _, err = c.uint(sv, sTotalSize, where, true); err != nil {
		return s, err
	}
	if seg.Addr+seg.Size < seg.Addr {
		return s, bad(where, "address + total_size overflows: %#x + %#x is beyond 2^64", seg.Addr, seg.Size)
	}
	if seg.Stream, _, err = c.int(sv, sStream, where, false); err != nil {
		return s, err
	}
	kind, _, err := c.str(sv, sSegmentType, where, false)
	if err != nil {
		return s, err
	}
	switch kind {
	case "small":
		seg.Pool = gpu.PoolSmall
	case "large":
		seg.Pool = gpu.PoolLarge
	}
	if v, ok, _ := c.get(sv, sIsExpandable, where, false); ok {
		if v.kind != kBool {
			return s, bad(where+".is_expandable", "want a bool, found %s", c.d.describe(v))
		}
		seg.Expandable = v.bits != 0
	}
	if v, ok, _ := c.get(sv, sSegmentPoolID, where, false); ok {
		if v.kind != kTuple && v.kind != kList || len(v.obj.items) != 2 {
			return s, bad(where+".segment_pool_id", "want a pair of integers, found %s", c.d.describe(v))
		}
		for k, it := range v.obj.items {
			n, ok := resolve(it).int64()
			if !ok {
				return s, bad(where+".segment_pool_id", "want a pair of integers")
			}
			s.info.PoolID[k] = n
		}
	}
	if s.info.Stack, _, err = c.stack(sv, where); err != nil {
		return s, err
	}
	bv, _, err := c.get(sv, sBlocks, where, true)
	if err != nil {
		return s, err
	}
	blocks, err := c.list(bv, where+".blocks")
	if err != nil {
		return s, err
	}
	at := seg.Addr
	if err := c.spend(len(blocks) * blockSize / valueSize); err != nil {
		return s, err
	}
	seg.Blocks = make([]gpu.Block, 0, len(blocks))
	for j, b := range blocks {
		bw := fmt.Sprintf("%s.blocks[%d]", where, j)
		blk, err := c.block(b, bw, at)
		if err != nil {
			return s, err
		}
		if at+blk.Size < at {
			return s, bad(bw, "address + size overflows: %#x + %#x is beyond 2^64", at, blk.Size)
		}
		seg.Blocks = append(seg.Blocks, blk)
		at += blk.Size
	}
	if at != seg.End() {
		return s, bad(where, "blocks cover %d bytes, total_size says %d", at-seg.Addr, seg.Size)
	}
	for j, b := range blocks {
		bw := func() string { return fmt.Sprintf("%s.blocks[%d]", where, j) }
		f, err := c.formOf(resolve(b), bw, blockKeys, func(key string) (any, bool) {
			return blockValue(key, &seg.Blocks[j])
		})
		if err != nil {
			return s, err
		}
		if f != nil {
			if s.info.Blocks == nil {
				s.info.Blocks = make([]*Form, len(blocks))
			}
			s.info.Blocks[j] = f
		}
	}
	s.info.Form, err = c.formOf(sv, func() string { return where }, defaultSegmentKeys(s.info.Stack), func(key string) (any, bool) {
		return segmentValue(key, s.device, seg, &s.info)
	})
	return s, err
}

// formOf compares how a dict was written with how export writes it: the
// keys std in that order, and the values derive gives. Keys derive does
// not know, and values it would write otherwise, are kept as written.
// It returns nil when the two agree. derive's ok is false for keys it
// does not know; it returns a nil value for known keys written from
// elsewhere (frames, blocks). where names the dict in errors.
func (c *converter) formOf(dict Value, where func() string, std []string, derive func(key string) (any, bool)) (*Form, error) {
	items := dict.obj.items
	pairs, err := dictPairs(items)
	if err != nil {
		return nil, bad(where(), "%v", err)
	}
	keys := make([]string, len(pairs))
	var other Dict
	for i, p := range pairs {
		k := items[p[0]]
		if k.kind != kStr {
			return nil, bad(where(), "a key is a %s, not a string", k.kind)
		}
		key := c.d.strs[k.bits]
		keys[i] = key
		want, known := derive(key)
		if known && (want == nil || c.d.sameValue(items[p[1]], want)) {
			continue
		}
		x, err := c.d.toAny(resolve(items[p[1]]), 1)
		if err != nil {
			return nil, bad(where()+"."+key, "%v", err)
		}
		other = append(other, KV{key, x})
	}
	if other == nil && slices.Equal(keys, std) {
		return nil, nil
	}
	return c.d.internForm(keys, other), nil
}

func (c *converter) block(bv Value, where string, at uint64) (gpu.Block, error) {
	b := gpu.Block{Addr: at, Seq: -1}
	bv, err := c.dict(bv, where)
	if err != nil {
		return b, err
	}
	if b.Size, _, err = c.uint(bv, sSize, where, true); err != nil {
		return b, err
	}
	if b.Size == 0 {
		return b, bad(where+".size", "a block of 0 bytes")
	}
	state, _, err := c.str(bv, sState, where, true)
	if err != nil {
		return b, err
	}
	var ok bool
	if b.State, ok = gpu.ParseBlockState(state); !ok {
		return b, bad(where+".state", "unknown block state %q", state)
	}
	// Blocks tile their segment; memory_viz ignores the address key, and
	// 2.0 files do not have it. Where it is present it must agree.
	if addr, has, err := c.uint(bv, sAddress, where, false); err != nil {
		return b, err
	} else if has && addr != at {
		return b, bad(where+".address", "block at %#x, but the blocks before it end at %#x", addr, at)
	}
	req, hasReq, err := c.uint(bv, sRequestedSize, where, false)
	if err != nil {
		return b, err
	}
	stack, hasFrames, err := c.stack(bv, where)
	if err != nil {
		return b, err
	}
	// 2.0 files: the allocation's stack and size are in history[0].
	if hv, ok, _ := c.get(bv, sHistory, where, false); ok && !hasFrames {
		hist, err := c.list(hv, where+".history")
		if err != nil {
			return b, err
		}
		if len(hist) > 0 {
			hw := where + ".history[0]"
			h0, err := c.dict(hist[0], hw)
			if err != nil {
				return b, err
			}
			if stack, _, err = c.stack(h0, hw); err != nil {
				return b, err
			}
			if req == 0 {
				if req, _, err = c.uint(h0, sRealSize, hw, false); err != nil {
					return b, err
				}
			}
		}
	}
	if !hasReq && req == 0 && b.State != gpu.BlockFree {
		req = b.Size
	}
	b.Requested, b.Stack = req, stack
	return b, nil
}

func (c *converter) deviceTraces(v Value) ([]*eventList, error) {
	if v.kind == kEmpty {
		return nil, nil
	}
	items, err := c.list(v, "device_traces")
	if err != nil {
		return nil, err
	}
	// Each device becomes a trace with its own layouts: charged up front.
	if err := c.spend(len(items) * 64); err != nil {
		return nil, err
	}
	out := make([]*eventList, len(items))
	for i, tv := range items {
		where := fmt.Sprintf("device_traces[%d]", i)
		tv = resolve(tv)
		if tv.kind != kList {
			return nil, bad(where, "want a list of trace entries, found %s", c.d.describe(tv))
		}
		el := tv.obj.events
		if el == nil {
			if len(tv.obj.items) > 0 {
				first := resolve(tv.obj.items[0])
				if first.kind == kDict {
					return nil, bad(where+"[0]", "missing key \"action\" (keys: %s)", c.d.describeKeys(first))
				}
				return nil, bad(where+"[0]", "want a trace entry, found %s", c.d.describe(first))
			}
			el = &eventList{}
		}
		if el.bad != "" {
			return nil, bad(fmt.Sprintf("%s[%d]", where, el.badAt), "%s", el.bad)
		}
		out[i] = el
	}
	return out, nil
}

func (c *converter) annotations(v Value) ([]Annotation, error) {
	if v.kind == kEmpty {
		return nil, nil
	}
	x, err := c.d.toAny(v, 1)
	if err != nil {
		return nil, bad("external_annotations", "%v", err)
	}
	list, ok := x.([]any)
	if !ok {
		return nil, bad("external_annotations", "want a list, found %s", c.d.describe(v))
	}
	out := make([]Annotation, 0, len(list))
	for i, it := range list {
		where := fmt.Sprintf("external_annotations[%d]", i)
		m, ok := it.(Dict)
		if !ok {
			return nil, bad(where, "want a dict")
		}
		var a Annotation
		keys := make([]string, len(m))
		var other Dict
		hasDevice := false
		for j, kv := range m {
			k, ok := kv.Key.(string)
			if !ok {
				return nil, bad(where, "a key is a %T, not a string", kv.Key)
			}
			keys[j] = k
			switch k {
			case "device":
				dev, ok := kv.Value.(int64)
				if !ok || dev != int64(int32(dev)) {
					return nil, bad(where+".device", "want a device ordinal")
				}
				a.Device, hasDevice = int(dev), true
			case "stage", "name":
				s, ok := kv.Value.(string)
				if !ok {
					return nil, bad(where+"."+k, "want a string")
				}
				if k == "stage" {
					a.Stage = s
				} else {
					a.Name = s
				}
			case "time_us":
				t, ok := kv.Value.(int64)
				if !ok {
					return nil, bad(where+".time_us", "want an integer")
				}
				a.TimeUS = t
			default:
				other = append(other, kv)
			}
		}
		if !hasDevice {
			return nil, bad(where, "missing key \"device\"")
		}
		if other != nil || !slices.Equal(keys, annotationKeys) {
			a.Form = c.d.internForm(keys, other)
		}
		out = append(out, a)
	}
	return out, nil
}
