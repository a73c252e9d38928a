package attrib

import (
	"cmp"
	"fmt"
	"io"
	"strconv"

	"github.com/google/pprof/profile"

	"vramscope/gpu"
)

// Profile is the live set as a pprof profile, which go tool pprof and
// every pprof UI read (JAX's device memory profiles are the same): sample
// types inuse_objects and inuse_space, one sample per live allocation,
// one location per frame. A sample's stack starts where the page's table
// groups the allocation (its first user frame, the autograd node and
// operator of a stack without Python frames, or where one without frames
// was made) and goes out through its callers, hidden kinds left out unless
// all; functions are named by gpu.Label ("model.py:54 forward"), so
// pprof's rows read as the page's. Labels: the allocation's address,
// category and sureness; numeric labels bytes, requested, seq and stream.
func Profile(l *Live, t gpu.Trace, all bool) *profile.Profile {
	p := &profile.Profile{
		SampleType:        []*profile.ValueType{{Type: "inuse_objects", Unit: "count"}, {Type: "inuse_space", Unit: "bytes"}},
		DefaultSampleType: "inuse_space",
		PeriodType:        &profile.ValueType{Type: "space", Unit: "bytes"},
		Comments: []string{fmt.Sprintf("vramscope: trace %s (%s), device %d, the live allocations %s",
			t.ID, t.Title(), t.DeviceOrdinal, AfterEvent(l.Seq))},
	}
	if !t.NoTime && l.Seq >= 0 {
		p.TimeNanos = l.TimeUS * 1000
	}
	locs := map[string]*profile.Location{}
	funcs := map[string]*profile.Function{}
	locOf := func(s step) *profile.Location {
		if loc, ok := locs[s.key]; ok {
			return loc
		}
		fn := funcs[s.key]
		if fn == nil {
			fn = &profile.Function{ID: uint64(len(p.Function) + 1), Name: s.name, SystemName: cmp.Or(s.fn, s.name), Filename: s.file}
			if s.line < 1<<63 {
				fn.StartLine = int64(s.line)
			}
			funcs[s.key] = fn
			p.Function = append(p.Function, fn)
		}
		loc := &profile.Location{ID: uint64(len(p.Location) + 1), Line: []profile.Line{{Function: fn, Line: fn.StartLine}}}
		locs[s.key] = loc
		p.Location = append(p.Location, loc)
		return loc
	}
	type stackKey struct {
		id   gpu.StackID
		made string
	}
	stacks := map[stackKey][]*profile.Location{}
	for i := range l.Blocks {
		b := &l.Blocks[i]
		k := stackKey{id: b.Stack}
		if len(l.Stacks[b.Stack]) == 0 && i < len(l.Verdicts) {
			k.made = l.Verdicts[i].Made
		}
		st, ok := stacks[k]
		if !ok {
			// The page's path of the block (Group, by frame).
			steps := path(l.Stacks[b.Stack], ByFrame, all)
			if k.made != "" {
				steps = unframed(k.made)
			}
			for _, s := range steps {
				st = append(st, locOf(s))
			}
			stacks[k] = st
		}
		v := Verdict{Category: Unknown, Sure: Low}
		if i < len(l.Verdicts) {
			v = l.Verdicts[i]
		}
		p.Sample = append(p.Sample, &profile.Sample{
			Location: st,
			Value:    []int64{1, int64(b.Size)},
			Label:    map[string][]string{"address": {"0x" + strconv.FormatUint(b.Addr, 16)}, "category": {string(v.Category)}, "sure": {string(v.Sure)}},
			NumLabel: map[string][]int64{"bytes": {int64(b.Size)}, "requested": {int64(b.Requested)}, "seq": {b.Seq}, "stream": {b.Stream}},
			NumUnit:  map[string][]string{"bytes": {"bytes"}, "requested": {"bytes"}},
		})
	}
	return p
}

// WriteProfile writes the live set's profile, gzipped as pprof reads it.
func WriteProfile(w io.Writer, l *Live, t gpu.Trace, all bool) error {
	return Profile(l, t, all).Write(w)
}
