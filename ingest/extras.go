package ingest

// What a snapshot says beyond events and layouts, between package
// pytorch's values and the store's records: settings and the top level,
// annotations, trace entries' extras and the segments as the file wrote
// them. Forms and values the store keeps as JSON (pytorch.MarshalValue).

import (
	"fmt"
	"slices"

	"vramscope/gpu"
	"vramscope/pytorch"
)

// uploadOf is the upload record of a decoded snapshot.
func uploadOf(traces []*pytorch.Trace, name string) (gpu.Upload, error) {
	u := gpu.Upload{Name: name}
	if len(traces) == 0 {
		return u, nil
	}
	if raw := traces[0].Settings.Raw; raw != nil {
		s, err := pytorch.MarshalValue(raw)
		if err != nil {
			return u, fmt.Errorf("allocator_settings: %w", err)
		}
		u.Settings = s
	}
	snap := traces[0].Snapshot
	if snap == nil {
		snap = &pytorch.Snapshot{}
	}
	top, err := snap.TopJSON()
	if err != nil {
		return u, fmt.Errorf("top level: %w", err)
	}
	u.Top = top
	return u, nil
}

// RecordedUpload is the upload record of a recorded run or a live
// stream, which its traces (one per device) join through
// TraceMeta.Upload: its allocator settings as PyTorch writes
// allocator_settings, and PyTorch's top level.
func RecordedUpload(name, conf string, rules gpu.Rules) (gpu.Upload, error) {
	settings, err := pytorch.MarshalValue(pytorch.SettingsFromRules(conf, rules).Raw)
	if err != nil {
		return gpu.Upload{}, err
	}
	top, err := (&pytorch.Snapshot{}).TopJSON()
	if err != nil {
		return gpu.Upload{}, err
	}
	return gpu.Upload{Name: name, Settings: settings, Top: top}, nil
}

// formText is a form as the store keeps it: "" for none.
func formText(f *pytorch.Form) (string, error) {
	if f == nil || f.Keys == nil && f.Other == nil {
		return "", nil
	}
	return f.JSON()
}

func annotationsOf(snap *pytorch.Snapshot) ([]gpu.Annotation, error) {
	if snap == nil {
		return nil, nil
	}
	out := make([]gpu.Annotation, len(snap.Annotations))
	for i, a := range snap.Annotations {
		form, err := formText(a.Form)
		if err != nil {
			return nil, fmt.Errorf("external_annotations[%d]: %w", i, err)
		}
		out[i] = gpu.Annotation{Device: a.Device, TimeUS: a.TimeUS, Stage: a.Stage, Name: a.Name, Form: form}
	}
	return out, nil
}

// extrasOf gives a trace's event extras, and runs of events that share
// one.
func extrasOf(t *pytorch.Trace) ([]gpu.EventExtra, []gpu.ExtraRun, error) {
	extras := make([]gpu.EventExtra, len(t.Extras))
	for i := range t.Extras {
		x := &t.Extras[i]
		form, err := formText(&x.Form)
		if err != nil {
			return nil, nil, fmt.Errorf("device %d: trace entry extras: %w", t.Device, err)
		}
		extras[i] = gpu.EventExtra{Action: x.Action, CompileContext: x.CompileContext, UserMetadata: x.UserMetadata, Form: form}
	}
	var runs []gpu.ExtraRun
	last := uint32(0)
	for i, e := range t.Events {
		var x uint32
		if t.ExtraOf != nil {
			x = t.ExtraOf[i]
		}
		if x != last {
			runs = append(runs, gpu.ExtraRun{Seq: e.Seq, Extra: x})
			last = x
		}
	}
	return extras, runs, nil
}

// segmentsOf gives a trace's final segments as the file wrote them, with
// stack ids as stack maps them.
func segmentsOf(t *pytorch.Trace, stack func(gpu.StackID) gpu.StackID) ([]gpu.SnapshotSegment, error) {
	out := make([]gpu.SnapshotSegment, len(t.Final.Segments))
	for i, seg := range t.Final.Segments {
		var info pytorch.SegmentInfo
		if i < len(t.Segments) {
			info = t.Segments[i]
		}
		seg.Blocks = slices.Clone(seg.Blocks)
		for j := range seg.Blocks {
			seg.Blocks[j].Stack = stack(seg.Blocks[j].Stack)
		}
		form, err := formText(info.Form)
		if err != nil {
			return nil, fmt.Errorf("segment at %#x: %w", seg.Addr, err)
		}
		s := gpu.SnapshotSegment{Index: info.Index, Segment: seg, PoolID: info.PoolID, Stack: stack(info.Stack), Form: form}
		if info.Blocks != nil {
			s.BlockForms = make([]string, len(info.Blocks))
			for j, f := range info.Blocks {
				if s.BlockForms[j], err = formText(f); err != nil {
					return nil, fmt.Errorf("segment at %#x, block %d: %w", seg.Addr, j, err)
				}
			}
		}
		out[i] = s
	}
	return out, nil
}
