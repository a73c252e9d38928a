package server

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strings"

	"vramscope/gpu"
	"vramscope/pytorch"
	"vramscope/store"
)

// ImportFunc stores the snapshot read from r under name and returns the
// ids of the traces it made (one per device with memory data).
type ImportFunc func(db *store.DB, r io.Reader, name string) ([]string, error)

// InputError is an upload the server refuses for what it holds (400).
type InputError struct{ Err error }

func (e *InputError) Error() string { return e.Err.Error() }
func (e *InputError) Unwrap() error { return e.Err }

// ImportSnapshot decodes a PyTorch memory snapshot and stores one trace per
// device that has segments or events. Nothing is kept when any device fails.
func ImportSnapshot(db *store.DB, r io.Reader, name string) ([]string, error) {
	traces, err := pytorch.Decode(r)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, err
		}
		return nil, &InputError{err}
	}
	var keep []*pytorch.Trace
	for _, t := range traces {
		if len(t.Events) > 0 || (t.Final != nil && len(t.Final.Segments) > 0) {
			keep = append(keep, t)
		}
	}
	if len(keep) == 0 {
		return nil, &InputError{errors.New("the snapshot holds no segments and no trace events on any device")}
	}
	return StoreSnapshot(db, keep, name)
}

// StoreSnapshot stores decoded snapshot traces, one trace per device, named
// name (plus the device when there are several). Nothing is kept when any
// of them fails.
func StoreSnapshot(db *store.DB, keep []*pytorch.Trace, name string) ([]string, error) {
	var ws []*store.Writer
	abort := func() {
		for _, w := range ws {
			w.Abort()
		}
	}
	for _, t := range keep {
		meta := gpu.TraceMeta{Name: name, Source: gpu.SourceSnapshot, DeviceOrdinal: t.Device,
			DeviceName: fmt.Sprintf("cuda:%d", t.Device), Settings: t.Settings.Conf}
		if len(keep) > 1 {
			meta.Name = fmt.Sprintf("%s (cuda:%d)", name, t.Device)
		}
		w, err := db.CreateTrace(meta, t.Initial)
		if err != nil {
			abort()
			return nil, err
		}
		ws = append(ws, w)
		ids := make([]gpu.StackID, len(t.Stacks)+1)
		for i, st := range t.Stacks {
			ids[i+1] = w.Stack(st)
		}
		// t.Stacks are distinct, so the writer numbers them 1..n as the
		// snapshot does and the initial layout's stack ids stay right.
		const batch = 4096
		buf := make([]gpu.Event, 0, batch)
		for _, e := range t.Events {
			if int(e.Stack) < len(ids) {
				e.Stack = ids[e.Stack]
			} else {
				e.Stack = 0
			}
			buf = append(buf, e)
			if len(buf) == batch {
				w.Emit(buf)
				buf = buf[:0]
			}
		}
		w.Emit(buf)
		if err := w.Err(); err != nil {
			abort()
			var me *gpu.MismatchError
			if errors.As(err, &me) { // the file contradicts itself: its fault, not ours
				return nil, &InputError{fmt.Errorf("device %d: %w", t.Device, err)}
			}
			return nil, err
		}
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

type uploadJSON struct {
	Traces []gpu.Trace `json:"traces"`
	URL    string      `json:"url"`
}

// apiUpload takes a snapshot as the raw body (name from ?name= or the
// X-Filename header) or as the first file of a multipart form (curl -F).
func (s *Server) apiUpload(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength > s.opt.MaxUploadBytes {
		writeError(w, http.StatusRequestEntityTooLarge, "the upload (%d bytes) is larger than this server accepts (%d bytes)", r.ContentLength, s.opt.MaxUploadBytes)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, s.opt.MaxUploadBytes)
	name := r.URL.Query().Get("name")
	if name == "" {
		name = r.Header.Get("X-Filename")
	}
	var body io.Reader = r.Body
	if mt, mp, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err == nil && strings.HasPrefix(mt, "multipart/") {
		part, err := firstFile(multipart.NewReader(r.Body, mp["boundary"]))
		if err != nil {
			s.uploadError(w, r, err)
			return
		}
		if name == "" {
			name = part.FileName()
		}
		body = part
	}
	name = path.Base(strings.ReplaceAll(name, `\`, "/"))
	if name == "." || name == "/" {
		name = "snapshot"
	}
	ids, err := s.opt.Import(s.opt.DB, body, name)
	if err != nil {
		s.uploadError(w, r, err)
		return
	}
	out := uploadJSON{Traces: []gpu.Trace{}}
	for _, id := range ids {
		t, err := s.opt.DB.Trace(id)
		if err != nil {
			s.storeError(w, r, err)
			return
		}
		out.Traces = append(out.Traces, t)
	}
	if len(ids) > 0 {
		out.URL = "/traces/" + ids[0]
	}
	writeJSON(w, http.StatusCreated, out)
}

func firstFile(mr *multipart.Reader) (*multipart.Part, error) {
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			return nil, &InputError{errors.New("the form holds no file")}
		}
		if err != nil {
			return nil, err
		}
		if p.FileName() != "" {
			return p, nil
		}
	}
}

// ErrNotImplemented marks an import path that does not exist yet (501).
var ErrNotImplemented = errors.New("not implemented")

func (s *Server) uploadError(w http.ResponseWriter, r *http.Request, err error) {
	var mbe *http.MaxBytesError
	var ie *InputError
	switch {
	case errors.As(err, &mbe):
		writeError(w, http.StatusRequestEntityTooLarge, "the upload is larger than this server accepts (%d bytes)", mbe.Limit)
	case errors.Is(err, ErrNotImplemented):
		writeError(w, http.StatusNotImplemented, "%v", err)
	case errors.As(err, &ie):
		writeError(w, http.StatusBadRequest, "not a usable PyTorch memory snapshot: %v", err)
	default:
		s.log.Error("upload", "err", err)
		writeError(w, http.StatusInternalServerError, "storing the snapshot: %v", err)
	}
}
