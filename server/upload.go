package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strings"

	"vramscope/gpu"
	"vramscope/ingest"
	"vramscope/pytorch"
	"vramscope/server/guard"
	"vramscope/store"
)

type uploadJSON struct {
	Traces []gpu.Trace `json:"traces"`
	URL    string      `json:"url"`
}

// errUploadTime is the cause of an upload that ran out of its time budget.
var errUploadTime = errors.New("the upload took longer than the server's time budget")

// storeRatio is about how many bytes of database a snapshot byte becomes,
// rounded up: an upload is refused at once when the disk clearly has not
// that room.
const storeRatio = 2

// apiUpload takes a snapshot as the raw body (name from ?name= or the
// X-Filename header) or as the first file of a multipart form (curl -F).
// Decoding and storing it run within the decompressed-bytes cap and the
// time budget, and stop when the client goes away.
func (s *Server) apiUpload(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength > s.opt.MaxUploadBytes {
		writeError(w, http.StatusRequestEntityTooLarge, "the upload (%d bytes) is larger than this server accepts (%d bytes)", r.ContentLength, s.opt.MaxUploadBytes)
		return
	}
	if free, err := s.opt.DB.FreeSpace(); err == nil && (free < minFreeSpace || r.ContentLength > 0 && uint64(r.ContentLength)*storeRatio > free) {
		writeError(w, http.StatusInsufficientStorage, "the disk holding the database has %d bytes free, too few to store this upload: delete traces or free space", free)
		return
	}
	ctx, cancel := context.WithTimeoutCause(r.Context(), s.opt.UploadTimeout, errUploadTime)
	defer cancel()
	body := guard.ReadAhead(ctx, http.MaxBytesReader(w, r.Body, s.opt.MaxUploadBytes))
	defer body.Stop(http.NewResponseController(w))
	q := r.URL.Query()
	name := q.Get("name")
	if name == "" {
		name = r.Header.Get("X-Filename")
	}
	opt := pytorch.Options{Context: ctx, MaxBytes: s.opt.MaxDecompressedBytes}
	run := q.Get("run")
	var in io.Reader = body
	var mr *multipart.Reader
	if mt, mp, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err == nil && strings.HasPrefix(mt, "multipart/") {
		mr = multipart.NewReader(body, mp["boundary"])
		if run != "" {
			s.uploadRun(w, r, ctx, run, &formSource{mr: mr}, opt)
			return
		}
		part, err := firstFile(mr)
		if err != nil {
			s.uploadError(w, r, ctx, err, notASnapshot)
			return
		}
		if name == "" {
			name = part.FileName()
		}
		in = part
	} else {
		br := bufio.NewReaderSize(body, 64<<10)
		isTar, err := ingest.IsTar(br)
		switch {
		case err != nil:
			s.uploadError(w, r, ctx, err, notASnapshot)
			return
		case isTar:
			if run == "" {
				run = strings.TrimSuffix(strings.TrimSuffix(cleanName(name, "run"), ".gz"), ".tar")
			}
			s.uploadRun(w, r, ctx, run, ingest.Tar(br, opt), opt)
			return
		case run != "":
			s.uploadRun(w, r, ctx, run, ingest.One(cleanName(name, "snapshot"), br), opt)
			return
		}
		in = br
	}
	name, err := gpu.CheckName(cleanName(name, "snapshot"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "name: %v", err)
		return
	}
	if name == "" {
		name = "snapshot"
	}
	traces, err := ingest.Decode(in, opt)
	if err == nil && mr != nil {
		err = soleFile(mr, name)
	}
	var ids []string
	if err == nil {
		ids, err = ingest.Store(ctx, s.opt.DB, traces, name)
	}
	if err != nil {
		s.uploadError(w, r, ctx, err, notASnapshot)
		return
	}
	guard.ExtendWrite(w, s.opt.Timeouts.Write)
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

// cleanName is an uploaded file's name without its folders, or def.
func cleanName(name, def string) string {
	name = path.Base(strings.ReplaceAll(name, `\`, "/"))
	if name == "." || name == "/" || name == "" {
		return def
	}
	return name
}

// runUploadJSON answers the upload of a run.
type runUploadJSON struct {
	Run    string      `json:"run"`
	URL    string      `json:"url"`
	Ranks  []rankJSON  `json:"ranks"`
	Traces []gpu.Trace `json:"traces"`
}

type rankJSON struct {
	Rank   int      `json:"rank"`
	File   string   `json:"file"`
	Traces []string `json:"traces"`
}

// uploadRun stores the files of src as the ranks of a new run named name
// (?ranks=0,1,... gives their ranks in order) and answers with the run.
func (s *Server) uploadRun(w http.ResponseWriter, r *http.Request, ctx context.Context, name string, src ingest.RunSource, opt pytorch.Options) {
	if list := r.URL.Query().Get("ranks"); list != "" {
		ranks, err := ingest.ParseRanks(list)
		if err != nil {
			writeError(w, http.StatusBadRequest, "ranks: %v", err)
			return
		}
		src = ingest.WithRanks(src, ranks)
	}
	run, ranks, err := ingest.Run(ctx, s.opt.DB, name, src, opt)
	if err != nil {
		s.uploadError(w, r, ctx, err, "the run was refused")
		return
	}
	guard.ExtendWrite(w, s.opt.Timeouts.Write)
	out := runUploadJSON{Run: run, URL: "/runs/" + run, Ranks: []rankJSON{}, Traces: []gpu.Trace{}}
	for _, rk := range ranks {
		out.Ranks = append(out.Ranks, rankJSON{rk.Rank, rk.Name, rk.Traces})
		for _, id := range rk.Traces {
			t, err := s.opt.DB.Trace(id)
			if err != nil {
				s.storeError(w, r, err)
				return
			}
			out.Traces = append(out.Traces, t)
		}
	}
	writeJSON(w, http.StatusCreated, out)
}

// formSource is a RunSource of the files of a multipart form, in order.
// A file's name is the one the form gives, folders and all (a browser
// sends a folder's files as rank3/snapshot.pickle): it only ever names a
// rank and a trace, never a path here.
type formSource struct{ mr *multipart.Reader }

func (f *formSource) Concurrent() bool { return false }

func (f *formSource) Next() (ingest.RunFile, error) {
	p, err := firstFile(f.mr)
	if err != nil {
		var ie *ingest.InputError
		if errors.As(err, &ie) && ie.Err == errNoFile {
			return ingest.RunFile{}, io.EOF
		}
		return ingest.RunFile{}, err
	}
	name := p.FileName()
	if _, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition")); err == nil && params["filename"] != "" {
		name = params["filename"]
	}
	return ingest.RunFile{Name: name, R: p, Rank: -1}, nil
}

// minFreeSpace: below this, uploads are refused at once.
const minFreeSpace = 64 << 20

var errNoFile = errors.New("the form holds no file")

// firstFile returns the next file of a form; a form that does not parse
// is the client's mistake.
func firstFile(mr *multipart.Reader) (*multipart.Part, error) {
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			return nil, &ingest.InputError{Err: errNoFile}
		}
		var mbe *http.MaxBytesError
		var slow *guard.SlowBodyError
		if errors.As(err, &mbe) || errors.As(err, &slow) {
			return nil, err
		}
		if err != nil {
			return nil, &ingest.InputError{Err: fmt.Errorf("the multipart form does not parse (is its boundary the one its Content-Type names?): %w", err)}
		}
		if p.FileName() != "" {
			return p, nil
		}
	}
}

// soleFile refuses a form that holds a file after the one named first:
// several files are the ranks of a run (?run=NAME), never the first alone.
func soleFile(mr *multipart.Reader, first string) error {
	p, err := firstFile(mr)
	var ie *ingest.InputError
	if errors.As(err, &ie) && ie.Err == errNoFile {
		return nil
	}
	if err != nil {
		return err
	}
	return &ingest.InputError{Err: fmt.Errorf("the form holds more than one file (%q, then %q): send one, or add ?run=NAME to upload them as the ranks of a run", first, cleanName(p.FileName(), "?"))}
}

// notASnapshot heads the 400 of an upload refused for what it holds.
const notASnapshot = "not a usable PyTorch memory snapshot"

// uploadError answers an upload that failed with its status: 413 for
// every limit (size on the wire or decompressed, memory, time), 408 for a
// body too slow, 400 headed by refused for what the upload holds, 507 for
// a full disk; a client gone gets nothing.
func (s *Server) uploadError(w http.ResponseWriter, r *http.Request, ctx context.Context, err error, refused string) {
	guard.ExtendWrite(w, s.opt.Timeouts.Write)
	var mbe *http.MaxBytesError
	var le *pytorch.LimitError
	var ie *ingest.InputError
	var slow *guard.SlowBodyError
	switch {
	case errors.As(err, &mbe):
		writeError(w, http.StatusRequestEntityTooLarge, "the upload is larger than this server accepts (%d bytes)", mbe.Limit)
	case errors.As(err, &le):
		writeError(w, http.StatusRequestEntityTooLarge, "the snapshot is larger than this server takes: %v", err)
	case errors.As(err, &slow):
		writeError(w, http.StatusRequestTimeout, "%v", slow)
	case errors.Is(context.Cause(ctx), errUploadTime):
		writeError(w, http.StatusRequestEntityTooLarge, "the snapshot is larger than this server takes: decoding and storing it took longer than %s", s.opt.UploadTimeout)
	case r.Context().Err() != nil:
		s.log.Info("upload: the client went away", "err", err)
	case errors.As(err, &ie):
		writeError(w, http.StatusBadRequest, "%s: %v", refused, err)
	case errors.Is(err, store.ErrDiskFull):
		writeError(w, http.StatusInsufficientStorage, "storing the snapshot: %v: delete traces or free space", err)
	case store.Unavailable(err):
		unavailable(w, fmt.Errorf("storing the snapshot, nothing of which was kept: %w", err))
	default:
		s.log.Error("upload", "err", err)
		writeError(w, http.StatusInternalServerError, "storing the snapshot: %v", err)
	}
}
