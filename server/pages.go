package server

import (
	"errors"
	"net/http"
	"strings"

	"github.com/a-h/templ"
	"github.com/go-chi/chi/v5"

	"vramscope/attrib"
	"vramscope/gpu"
	"vramscope/pytorch"
	"vramscope/static"
	"vramscope/store"
	"vramscope/web"
)

func page(title string) web.Page { return web.Page{Title: title, Assets: static.Prefix()} }

// pageOf is page(title) for a page of the traces ts: each estimate among
// them says above the figures that it was estimated on a CPU, and what
// it could not see. labels name the traces when there are several.
func (s *Server) pageOf(title string, ts []gpu.Trace, labels ...string) web.Page {
	p := page(title)
	for i, t := range ts {
		if t.Source != gpu.SourceEstimate {
			continue
		}
		prefix := ""
		if i < len(labels) {
			prefix = labels[i] + ": "
		}
		e := s.estimateOf(t)
		if e == nil {
			p.Notes = append(p.Notes, prefix+"Estimated on a CPU, not recorded.")
			continue
		}
		sum := e.Summary()
		p.Notes = append(p.Notes, prefix+strings.ToUpper(sum[:1])+sum[1:]+".")
		if b := e.Beyond(); b != "" {
			p.Notes = append(p.Notes, prefix+b+".")
		}
	}
	return p
}

// estimateOf reads what an estimate's snapshot said of itself; nil when
// it cannot be read.
func (s *Server) estimateOf(t gpu.Trace) *pytorch.Estimate {
	u, err := s.opt.DB.Upload(t.Upload)
	if err != nil {
		return nil
	}
	top, err := pytorch.ParseTop(u.Top)
	if err != nil {
		return nil
	}
	return top.Estimate()
}

func render(w http.ResponseWriter, r *http.Request, status int, c templ.Component) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	c.Render(r.Context(), w)
}

// listPer is how many traces a page of the list shows.
const listPer = 50

// pageList is the trace list, a page at a time (?page=N), sorted and
// filtered as apiTraces is, each run one row.
func (s *Server) pageList(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	q := listQuery(p)
	n := int(p.intIn("page", 1, 1, 1<<30))
	if p.err != nil {
		render(w, r, http.StatusBadRequest, web.NotFound(page("Bad request"), p.err.Error()))
		return
	}
	q.Limit, q.Offset, q.GroupRuns = listPer, (n-1)*listPer, true
	ts, total, err := s.opt.DB.TraceList(q)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	runs, err := s.runRows(ts)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	render(w, r, http.StatusOK, web.TraceList(page("Traces"), web.Listing{Traces: ts, Runs: runs, Same: web.SameRecording(ts), Total: total, Page: n, Per: listPer,
		Name: q.Name, Source: string(q.Source), Status: string(q.Status), Sort: q.Sort, Asc: q.Asc}))
}

// runRows sums up the runs of the traces listed, by the trace listed.
func (s *Server) runRows(ts []gpu.Trace) (map[string]web.RunRow, error) {
	rows := map[string]web.RunRow{}
	for _, t := range ts {
		of, ok, err := s.opt.DB.RunOf(t.Upload)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		run, err := s.opt.DB.Run(of.ID)
		if err != nil {
			return nil, err
		}
		rows[t.ID] = web.NewRunRow(run, t)
	}
	return rows, nil
}

// pageTrace is the trace view: a frame that view.js fills from the API.
func (s *Server) pageTrace(w http.ResponseWriter, r *http.Request) {
	if t, ok := s.traceOfPage(w, r); ok {
		render(w, r, http.StatusOK, web.TraceView(s.pageOf(t.Title(), []gpu.Trace{t}), t, s.opening(t)))
	}
}

// opening is where a trace's page opens when its URL names no window
// (attrib.Opening): the steady steps, or where the events are; the whole
// trace when that cannot be read, and while it streams (the page follows
// it from its first event).
func (s *Server) opening(t gpu.Trace) attrib.Opening {
	whole := attrib.Opening{T0: t.FirstUS, T1: t.LastUS, E0: max(0, t.FirstSeq), E1: t.LastSeq + 1}
	if t.Status == gpu.StatusLive {
		return whole
	}
	c, err := s.cats.Categorizer(s.opt.DB, t.ID)
	if err != nil {
		return whole
	}
	o, err := c.Opening()
	if err != nil {
		s.log.Warn("opening window", "trace", t.ID, "err", err)
		return whole
	}
	return o
}

// traceOfPage reads the trace a page is about; ok is false after answering
// with a not-found page or an error.
func (s *Server) traceOfPage(w http.ResponseWriter, r *http.Request) (gpu.Trace, bool) {
	t, err := s.opt.DB.Trace(chi.URLParam(r, "id"))
	if errors.Is(err, store.ErrNotFound) {
		render(w, r, http.StatusNotFound, web.NotFound(page("Not found"), "There is no trace "+chi.URLParam(r, "id")+"."))
		return t, false
	}
	if err != nil {
		s.storeError(w, r, err)
		return t, false
	}
	return t, true
}

// notFound answers JSON under /api and a page elsewhere.
func (s *Server) notFound(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/api/") {
		writeError(w, http.StatusNotFound, "no such endpoint: %s", r.URL.Path)
		return
	}
	render(w, r, http.StatusNotFound, web.NotFound(page("Not found"), "There is no page at "+r.URL.Path+"."))
}

// static serves the embedded files.
func (s *Server) static(w http.ResponseWriter, r *http.Request) {
	if name := chi.URLParam(r, "name"); !static.Serve(w, r, chi.URLParam(r, "version"), name) {
		writeError(w, http.StatusNotFound, "no static file %q", name)
	}
}
