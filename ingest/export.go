package ingest

import (
	"fmt"
	"slices"
	"sort"

	"vramscope/gpu"
	"vramscope/pytorch"
	"vramscope/store"
)

// Traces reads stored traces back as a snapshot's traces, for
// pytorch.Export: the traces of every device of the upload that trace id
// came from (the trace alone when it came from none), or only the one of
// device when device >= 0. A snapshot comes back as the file was written;
// a recorded run as PyTorch would write it, with its annotations and
// settings.
func Traces(db *store.DB, id string, device int) ([]*pytorch.Trace, error) {
	tr, err := db.Trace(id)
	if err != nil {
		return nil, err
	}
	group := []gpu.Trace{tr}
	var snap *pytorch.Snapshot
	var settings pytorch.Dict
	var anns []gpu.Annotation
	if tr.Upload != "" {
		if group, err = db.UploadTraces(tr.Upload); err != nil {
			return nil, err
		}
		up, err := db.Upload(tr.Upload)
		if err != nil {
			return nil, err
		}
		if snap, err = pytorch.ParseTop(up.Top); err != nil {
			return nil, err
		}
		if up.Settings != "" {
			v, err := pytorch.UnmarshalValue(up.Settings)
			if err != nil {
				return nil, fmt.Errorf("upload %s: allocator settings: %w", up.ID, err)
			}
			if settings, _ = v.(pytorch.Dict); settings == nil {
				return nil, fmt.Errorf("upload %s: allocator settings are a %T", up.ID, v)
			}
		}
		anns, err = db.UploadAnnotations(tr.Upload)
		if err != nil {
			return nil, err
		}
	} else {
		snap = &pytorch.Snapshot{}
		if anns, err = db.Annotations(id); err != nil {
			return nil, err
		}
	}
	if device >= 0 {
		group = slices.DeleteFunc(group, func(t gpu.Trace) bool { return t.DeviceOrdinal != device })
		if len(group) == 0 {
			return nil, fmt.Errorf("trace %s: its upload has no device %d: %w", id, device, store.ErrNotFound)
		}
		anns = slices.DeleteFunc(anns, func(a gpu.Annotation) bool { return a.Device != device })
	}
	vals := newValueCache()
	for _, a := range anns {
		form, err := vals.form(a.Form)
		if err != nil {
			return nil, fmt.Errorf("trace %s: annotation: %w", id, err)
		}
		snap.Annotations = append(snap.Annotations, pytorch.Annotation{Stage: a.Stage, Name: a.Name, Device: a.Device, TimeUS: a.TimeUS, Form: form})
	}
	var out []*pytorch.Trace
	for _, g := range group {
		t, err := readTrace(db, g, vals)
		if err != nil {
			return nil, err
		}
		t.Snapshot = snap
		if settings != nil {
			t.Settings.Raw = settings
		} else if g.Upload == "" || g.Source != gpu.SourceSnapshot && g.Source != gpu.SourceEstimate {
			// Stored before uploads kept settings: as PyTorch would write them.
			t.Settings = pytorch.SettingsFromRules(g.Settings, g.Rules)
		}
		out = append(out, t)
	}
	return out, nil
}

// readTrace reads one stored trace: its segments as the snapshot wrote
// them (else its final layout), its events with their extras, and every
// stack it has.
func readTrace(db *store.DB, tr gpu.Trace, vals *valueCache) (*pytorch.Trace, error) {
	t := &pytorch.Trace{Device: tr.DeviceOrdinal, HasTime: true,
		Settings: pytorch.Settings{Conf: tr.Settings, Rules: tr.Rules}}
	var err error
	if t.Stacks, err = db.Stacks(tr.ID); err != nil {
		return nil, err
	}
	if t.Events, err = db.Events(tr.ID, 0, tr.LastSeq+1); err != nil {
		return nil, err
	}
	extras, runs, err := db.EventExtras(tr.ID)
	if err != nil {
		return nil, err
	}
	for _, x := range extras {
		form, err := vals.form(x.Form)
		if err != nil {
			return nil, fmt.Errorf("trace %s: event extra: %w", tr.ID, err)
		}
		px := pytorch.EventExtra{Action: x.Action, CompileContext: x.CompileContext, UserMetadata: x.UserMetadata}
		if form != nil {
			px.Form = *form
		}
		t.Extras = append(t.Extras, px)
	}
	if len(runs) > 0 {
		t.ExtraOf = make([]uint32, len(t.Events))
		r := 0
		for i, e := range t.Events {
			for r < len(runs) && runs[r].Seq <= e.Seq {
				r++
			}
			if r > 0 {
				t.ExtraOf[i] = runs[r-1].Extra
			}
		}
	}
	segs, err := db.SnapshotSegments(tr.ID)
	if err != nil {
		return nil, err
	}
	if len(segs) == 0 {
		if t.Final, _, err = db.LayoutAtSeq(tr.ID, tr.LastSeq); err != nil {
			return nil, err
		}
		return t, nil
	}
	sort.SliceStable(segs, func(i, j int) bool { return segs[i].Segment.Addr < segs[j].Segment.Addr })
	t.Final = gpu.NewLayout(tr.Rules)
	for _, s := range segs {
		info := pytorch.SegmentInfo{PoolID: s.PoolID, Stack: s.Stack, Index: s.Index}
		if info.Form, err = vals.form(s.Form); err != nil {
			return nil, fmt.Errorf("trace %s: segment at %#x: %w", tr.ID, s.Segment.Addr, err)
		}
		if s.BlockForms != nil {
			info.Blocks = make([]*pytorch.Form, len(s.BlockForms))
			for j, f := range s.BlockForms {
				if info.Blocks[j], err = vals.form(f); err != nil {
					return nil, fmt.Errorf("trace %s: segment at %#x: block %d: %w", tr.ID, s.Segment.Addr, j, err)
				}
			}
		}
		t.Final.Segments = append(t.Final.Segments, s.Segment)
		t.Segments = append(t.Segments, info)
	}
	return t, nil
}

// valueCache reads each distinct stored form once, and shares the values
// equal forms hold: a value that many entries share in the file is shared
// again (the store keeps it once per distinct extra), so export writes it
// once.
type valueCache struct {
	forms  map[string]*pytorch.Form
	values map[string]any
}

func newValueCache() *valueCache {
	return &valueCache{forms: map[string]*pytorch.Form{}, values: map[string]any{}}
}

func (c *valueCache) form(text string) (*pytorch.Form, error) {
	if text == "" {
		return nil, nil
	}
	if f, ok := c.forms[text]; ok {
		return f, nil
	}
	f, err := pytorch.ParseForm(text)
	if err != nil {
		return nil, err
	}
	for i, kv := range f.Other {
		key, err := pytorch.MarshalValue(kv.Value)
		if err != nil {
			return nil, err
		}
		if v, ok := c.values[key]; ok {
			f.Other[i].Value = v
		} else {
			c.values[key] = kv.Value
		}
	}
	c.forms[text] = f
	return f, nil
}
