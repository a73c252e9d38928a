// Package ingest stores what comes from outside the process: PyTorch
// snapshots, decoded by package pytorch, become stored traces, all or
// nothing. The server's uploads and `vramscope import` both go through it.
package ingest

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"vramscope/gpu"
	"vramscope/pytorch"
	"vramscope/store"
)

// InputError is an input refused for what it holds (the uploader's fault,
// a 400 over HTTP), as opposed to a failure to store it.
type InputError struct{ Err error }

func (e *InputError) Error() string { return e.Err.Error() }
func (e *InputError) Unwrap() error { return e.Err }

// Snapshot decodes a PyTorch memory snapshot and stores one trace per
// device that has segments or events, named name. Nothing is kept when any
// device fails. A read cut short by a size limit (http.MaxBytesError) is
// returned as it is.
func Snapshot(db *store.DB, r io.Reader, name string) ([]string, error) {
	traces, err := pytorch.Decode(r)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, err
		}
		return nil, &InputError{err}
	}
	keep, err := pytorch.Devices(traces, -1)
	if err != nil {
		return nil, &InputError{err}
	}
	return Store(db, keep, name)
}

// Store stores decoded snapshot traces as one upload, one trace per
// device, named name (plus the device when there are several): events,
// stacks, and what the file says beyond them (its top level, settings and
// annotations, the trace entries' extras, its segments as written).
// Nothing is kept when any of them fails.
func Store(db *store.DB, traces []*pytorch.Trace, name string) ([]string, error) {
	up, err := uploadOf(traces, name)
	if err != nil {
		return nil, &InputError{err}
	}
	upload, err := db.CreateUpload(up)
	if err != nil {
		return nil, err
	}
	var ws []*store.Writer
	abort := func() {
		for _, w := range ws {
			w.Abort()
		}
		db.DeleteUpload(upload)
	}
	for _, t := range traces {
		meta := gpu.TraceMeta{Name: name, Source: gpu.SourceSnapshot, DeviceOrdinal: t.Device,
			DeviceName: fmt.Sprintf("cuda:%d", t.Device), Settings: t.Settings.Conf, Upload: upload, NoTime: !t.HasTime}
		if len(traces) > 1 {
			meta.Name = fmt.Sprintf("%s (cuda:%d)", name, t.Device)
		}
		w, err := db.CreateTrace(meta, t.Initial)
		if err != nil {
			abort()
			return nil, err
		}
		ws = append(ws, w)
		if err := emit(w, t); err != nil {
			abort()
			var me *gpu.MismatchError
			if errors.As(err, &me) { // the file contradicts itself: its fault, not ours
				return nil, &InputError{fmt.Errorf("device %d: %w", t.Device, err)}
			}
			return nil, err
		}
	}
	anns, err := annotationsOf(traces[0].Snapshot)
	if err == nil {
		err = db.AddAnnotations(upload, anns)
	}
	if err != nil {
		abort()
		return nil, err
	}
	var out []string
	for _, w := range ws {
		if err := w.Close(gpu.StatusComplete); err != nil {
			abort()
			return nil, err
		}
		out = append(out, w.ID())
	}
	return out, nil
}

// emit writes one device's stacks, events, the extras of its events and
// its segments as the file wrote them.
func emit(w *store.Writer, t *pytorch.Trace) error {
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
