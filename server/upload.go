package server

import (
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strings"

	"vramscope/gpu"
	"vramscope/ingest"
)

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
	ids, err := ingest.Snapshot(s.opt.DB, body, name)
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
	// The page opens on the first device with an OOM, else the first.
	land := 0
	for i, t := range out.Traces {
		if t.OOMs > 0 {
			land = i
			break
		}
	}
	if len(out.Traces) > 0 {
		out.URL = "/traces/" + out.Traces[land].ID
	}
	writeJSON(w, http.StatusCreated, out)
}

func firstFile(mr *multipart.Reader) (*multipart.Part, error) {
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			return nil, &ingest.InputError{Err: errors.New("the form holds no file")}
		}
		if err != nil {
			return nil, err
		}
		if p.FileName() != "" {
			return p, nil
		}
	}
}

func (s *Server) uploadError(w http.ResponseWriter, r *http.Request, err error) {
	var mbe *http.MaxBytesError
	var ie *ingest.InputError
	switch {
	case errors.As(err, &mbe):
		writeError(w, http.StatusRequestEntityTooLarge, "the upload is larger than this server accepts (%d bytes)", mbe.Limit)
	case errors.As(err, &ie):
		writeError(w, http.StatusBadRequest, "not a usable PyTorch memory snapshot: %v", err)
	default:
		s.log.Error("upload", "err", err)
		writeError(w, http.StatusInternalServerError, "storing the snapshot: %v", err)
	}
}
