// Package ingest stores what comes from outside the process: PyTorch
// snapshots, decoded by package pytorch, become stored traces, all or
// nothing. The server's uploads and `vramscope import` both go through it.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/pytorch"
	"vramscope/store"
)

// InputError is an input refused for what it holds (the uploader's fault,
// a 400 over HTTP), as opposed to a failure to store it.
type InputError struct{ Err error }

func (e *InputError) Error() string { return e.Err.Error() }
func (e *InputError) Unwrap() error { return e.Err }

// Snapshot decodes a PyTorch memory snapshot within opt's bounds and
// stores one trace per device that has segments or events, named name.
// Nothing is kept when any device fails. Errors of the reader (a size
// limit such as http.MaxBytesError), pytorch.LimitError and the context's
// end are returned as they are, wrapped; other decode errors are
// InputErrors.
func Snapshot(db *store.DB, r io.Reader, name string, opt pytorch.Options) ([]string, error) {
	keep, err := Decode(r, opt)
	if err != nil {
		return nil, err
	}
	ctx := opt.Context
	if ctx == nil {
		ctx = context.Background()
	}
	return Store(ctx, db, keep, name)
}

// Decode is the first half of Snapshot: it decodes a snapshot and returns
// the traces of the devices Snapshot would store, with Snapshot's errors,
// storing nothing.
func Decode(r io.Reader, opt pytorch.Options) ([]*pytorch.Trace, error) {
	traces, err := pytorch.DecodeWith(r, opt)
	if err != nil {
		var mbe *http.MaxBytesError
		var le *pytorch.LimitError
		if errors.As(err, &mbe) || errors.As(err, &le) || opt.Context != nil && opt.Context.Err() != nil {
			return nil, err
		}
		return nil, &InputError{err}
	}
	keep, err := pytorch.Devices(traces, -1)
	if err != nil {
		return nil, &InputError{err}
	}
	return keep, Check(keep)
}

// Check refuses, before anything is written, what Store would refuse
// for the file's sake: settings that do not parse as
// PYTORCH_CUDA_ALLOC_CONF (the what-if replays could not run under them).
func Check(traces []*pytorch.Trace) error {
	for _, t := range traces {
		if _, err := caching.ParseConfig(t.Settings.Conf); err != nil {
			return &InputError{fmt.Errorf("allocator_settings: PYTORCH_CUDA_ALLOC_CONF: %w %q: %v", store.ErrBadSettings, t.Settings.Conf, err)}
		}
	}
	return nil
}

// Store stores decoded snapshot traces as one upload, one trace per
// device, named name (plus the device when there are several): events,
// stacks, and what the file says beyond them (its top level, settings and
// annotations, the trace entries' extras, its segments as written). It is
// all or nothing: readers see none of it until the last row is written,
// then all at once; on an error, or when ctx ends, nothing is kept.
func Store(ctx context.Context, db *store.DB, traces []*pytorch.Trace, name string) ([]string, error) {
	s, err := stage(ctx, db, traces, name)
	if err != nil {
		return nil, err
	}
	if err := db.PublishUpload(s.ID, s.Upload, s.Annotations, s.Writers...); err != nil {
		return nil, s.fail(err)
	}
	return s.traceIDs(), nil
}

// staged is a snapshot written but not shown until it is published.
type staged store.StagedUpload

// stage writes decoded snapshot traces as Store does, without showing
// them; on an error nothing is kept.
func stage(ctx context.Context, db *store.DB, traces []*pytorch.Trace, name string) (*staged, error) {
	up, err := uploadOf(traces, name)
	if err != nil {
		return nil, &InputError{err}
	}
	anns, err := annotationsOf(traces[0].Snapshot)
	if err != nil {
		return nil, err
	}
	s := &staged{ID: store.NewUploadID(), Upload: up, Annotations: anns}
	for _, t := range traces {
		meta := gpu.TraceMeta{Name: name, Source: gpu.SourceSnapshot, DeviceOrdinal: t.Device,
			DeviceName: fmt.Sprintf("cuda:%d", t.Device), Settings: t.Settings.Conf, Upload: s.ID, NoTime: !t.HasTime}
		if e := t.Estimate(); e != nil {
			// the device it was estimated for, as far as the allocator has it
			meta.Source, meta.Capacity = gpu.SourceEstimate, e.Capacity()
			if e.DeviceName != "" {
				meta.DeviceName = e.DeviceName
			}
		}
		if len(traces) > 1 {
			meta.Name = fmt.Sprintf("%s (cuda:%d)", name, t.Device)
		}
		w, err := db.ImportTrace(meta, t.Initial)
		if err != nil {
			return nil, s.fail(fmt.Errorf("device %d: %w", t.Device, err))
		}
		s.Writers = append(s.Writers, w)
		if len(t.Dropped) > 0 {
			w.SetDropped(gpu.Dropped{Count: len(t.Dropped), First: t.Dropped[:min(len(t.Dropped), gpu.MaxDroppedShown)]})
		}
		if err := emit(ctx, w, t); err != nil {
			return nil, s.fail(fmt.Errorf("device %d: %w", t.Device, err))
		}
		// stored whole now, on this file's core, so that publishing a run
		// of many files is one short transaction
		if err := w.Seal(); err != nil {
			return nil, s.fail(fmt.Errorf("device %d: %w", t.Device, err))
		}
	}
	return s, nil
}

// fail aborts what was written and returns err, an InputError when the
// file is at fault.
func (s *staged) fail(err error) error {
	s.abort()
	var me *gpu.MismatchError
	if errors.As(err, &me) || errors.Is(err, store.ErrBadSettings) { // the file's fault, not ours
		return &InputError{err}
	}
	return err
}

// abort removes what was written.
func (s *staged) abort() {
	for _, w := range s.Writers {
		w.Abort()
	}
}

func (s *staged) traceIDs() []string {
	var out []string
	for _, w := range s.Writers {
		out = append(out, w.ID())
	}
	return out
}

// emit writes one device's stacks, events, the extras of its events and
// its segments as the file wrote them, stopping when ctx ends.
func emit(ctx context.Context, w *store.Writer, t *pytorch.Trace) error {
	ids := make([]gpu.StackID, len(t.Stacks)+1)
	for i, st := range t.Stacks {
		ids[i+1] = w.Stack(st)
	}
	stack := func(id gpu.StackID) gpu.StackID {
		if int(id) < len(ids) {
			return ids[id]
		}
		return 0
	}
	// t.Stacks are distinct, so the writer numbers them 1..n as the
	// snapshot does and the initial layout's stack ids stay right.
	const batch = 4096
	buf := make([]gpu.Event, 0, batch)
	for _, e := range t.Events {
		e.Stack = stack(e.Stack)
		buf = append(buf, e)
		if len(buf) == batch {
			w.Emit(buf)
			buf = buf[:0]
			if err := ctx.Err(); err != nil {
				return context.Cause(ctx)
			}
		}
	}
	w.Emit(buf)
	extras, runs, err := extrasOf(t)
	if err != nil {
		return err
	}
	w.EventExtras(extras, runs)
	segs, err := segmentsOf(t, stack)
	if err != nil {
		return err
	}
	w.SnapshotSegments(segs)
	return w.Err()
}
