package server

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"

	"vramscope/attrib"
	"vramscope/gpu"
	"vramscope/store"
)

// What the trace view asks beyond the timeline and the map: a trace with
// the other devices of its upload, the snapshot's extras, stacks sorted for
// people, and search.

// deviceJSON is one device of an upload that holds data.
type deviceJSON struct {
	Device int    `json:"device"`
	ID     string `json:"id"`
	OOMs   int64  `json:"oom_count"`
}

type traceJSON struct {
	gpu.Trace
	Devices []deviceJSON `json:"devices"`
	// Run is the run the trace's upload is a rank of, when it is one.
	Run *gpu.RunOf `json:"run,omitempty"`
}

// devices lists the devices of t's upload (t alone when it has none).
func (s *Server) devices(t gpu.Trace) ([]deviceJSON, error) {
	ts, err := s.opt.DB.UploadTraces(t.Upload)
	if err != nil {
		return nil, err
	}
	if len(ts) == 0 {
		ts = []gpu.Trace{t}
	}
	out := make([]deviceJSON, len(ts))
	for i, x := range ts {
		out[i] = deviceJSON{x.DeviceOrdinal, x.ID, x.OOMs}
	}
	return out, nil
}

func (s *Server) apiTrace(w http.ResponseWriter, r *http.Request) {
	t, err := s.opt.DB.Trace(chi.URLParam(r, "id"))
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	devs, err := s.devices(t)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	out := traceJSON{Trace: t, Devices: devs}
	if of, ok, err := s.opt.DB.RunOf(t.Upload); err != nil {
		s.storeError(w, r, err)
		return
	} else if ok {
		out.Run = &of
	}
	writeJSON(w, http.StatusOK, out)
}

// apiExtras is what the snapshot recorded beside its events: allocator
// settings (as written), this device's annotations, and the first events
// with user_metadata.
func (s *Server) apiExtras(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	t, err := s.opt.DB.Trace(id)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	settings := json.RawMessage("null")
	if t.Upload != "" {
		u, err := s.opt.DB.Upload(t.Upload)
		if err != nil {
			s.storeError(w, r, err)
			return
		}
		if u.Settings != "" {
			settings = json.RawMessage(u.Settings)
		}
	}
	anns, err := s.opt.DB.Annotations(id)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	md, total, err := s.opt.DB.UserMetadata(t, 0, t.LastSeq+1, 1000)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	if anns == nil {
		anns = []gpu.Annotation{}
	}
	writeJSON(w, http.StatusOK, struct {
		Conf        string               `json:"conf"`
		Settings    json.RawMessage      `json:"settings"`
		Annotations []gpu.Annotation     `json:"annotations"`
		Metadata    []store.UserMetadata `json:"user_metadata"`
		MetaTotal   int64                `json:"user_metadata_total"`
	}{t.Settings, settings, anns, md, total})
}

// frameJSON is a frame with its kind (gpu.KindOf).
type frameJSON struct {
	gpu.Frame
	Kind gpu.FrameKind `json:"kind"`
}

// stackJSON is a stack for people: its frames with their kinds, and the
// label of its first user frame.
type stackJSON struct {
	Frames []frameJSON `json:"frames"`
	Label  string      `json:"label"`
	// Named are the frames that named a stack without Python frames
	// (gpu.OperatorName), by index: pages show them though hidden.
	Named []int `json:"named,omitempty"`
}

func toStackJSON(st gpu.Stack) stackJSON {
	_, named := gpu.OperatorName(st)
	out := stackJSON{Frames: make([]frameJSON, len(st)), Label: gpu.StackLabel(st), Named: named}
	for i, f := range st {
		out.Frames[i] = frameJSON{f, gpu.KindOf(f)}
	}
	return out
}

// maxMatches caps a search answer; the total still counts every match.
const maxMatches = 2000

// matchJSON is an allocation a search found, with its stack's label.
type matchJSON struct {
	gpu.Allocation
	Label string `json:"label,omitempty"`
}

// apiSearch finds allocations by a frame's function or file name, or by an
// address inside them: q is the text, limit caps the matches listed.
func (s *Server) apiSearch(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	q := r.URL.Query().Get("q")
	if strings.TrimSpace(q) == "" {
		p.fail("q", "missing: the text to search the stacks for, or a hex address")
	} else if len(q) > 200 {
		p.fail("q", "longer than 200 bytes")
	}
	limit := p.intIn("limit", 500, 1, maxMatches)
	if !p.check(w) {
		return
	}
	id := chi.URLParam(r, "id")
	res, err := s.opt.DB.Search(id, q, int(limit))
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	sids := make([]gpu.StackID, len(res.Matches))
	for i, m := range res.Matches {
		sids[i] = m.Stack
	}
	labels, err := s.opt.DB.Labels(id, sids)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	out := struct {
		Query   string        `json:"q"`
		Total   int64         `json:"total"`
		Matches []matchJSON   `json:"matches"`
		Stacks  []gpu.StackID `json:"stacks"`
		Address *uint64       `json:"address,omitempty"`
	}{q, res.Total, make([]matchJSON, len(res.Matches)), res.Stacks, res.Address}
	var c *attrib.Categorizer // read when a match has no stack
	for i, m := range res.Matches {
		label := labels[m.Stack]
		if m.Stack == 0 {
			if c == nil {
				if c, err = s.cats.Categorizer(s.opt.DB, id); err != nil {
					s.storeError(w, r, err)
					return
				}
			}
			label = attrib.UnframedName(c.Made(m))
		}
		out.Matches[i] = matchJSON{m, label}
	}
	if out.Stacks == nil {
		out.Stacks = []gpu.StackID{}
	}
	writeJSON(w, http.StatusOK, out)
}
