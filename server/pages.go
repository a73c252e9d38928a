package server

import (
	"errors"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"

	"github.com/a-h/templ"
	"github.com/go-chi/chi/v5"

	"vramscope/static"
	"vramscope/store"
	"vramscope/web"
)

func page(title string) web.Page { return web.Page{Title: title, Assets: static.Prefix()} }

func render(w http.ResponseWriter, r *http.Request, status int, c templ.Component) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	c.Render(r.Context(), w)
}

func (s *Server) pageList(w http.ResponseWriter, r *http.Request) {
	ts, err := s.opt.DB.Traces()
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	render(w, r, http.StatusOK, web.TraceList(page("Traces"), ts))
}

func (s *Server) pageTrace(w http.ResponseWriter, r *http.Request) {
	t, err := s.opt.DB.Trace(chi.URLParam(r, "id"))
	if errors.Is(err, store.ErrNotFound) {
		render(w, r, http.StatusNotFound, web.NotFound(page("Not found"), "There is no trace "+chi.URLParam(r, "id")+"."))
		return
	}
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	title := t.Name
	if title == "" {
		title = t.ID
	}
	render(w, r, http.StatusOK, web.TraceView(page(title), t))
}

// notFound answers JSON under /api and a page elsewhere.
func (s *Server) notFound(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/api/") {
		writeError(w, http.StatusNotFound, "no such endpoint: %s", r.URL.Path)
		return
	}
	render(w, r, http.StatusNotFound, web.NotFound(page("Not found"), "There is no page at "+r.URL.Path+"."))
}

// static serves the embedded files. The current version's URLs are
// immutable; an old version's still get the current file (with a short
// cache life) so that a page loaded before an upgrade keeps working.
func (s *Server) static(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "name")
	tag, ok := static.ETags[name]
	if !ok || strings.Contains(name, "/") {
		writeError(w, http.StatusNotFound, "no static file %q", name)
		return
	}
	b, err := fs.ReadFile(static.FS, name)
	if err != nil {
		writeError(w, http.StatusNotFound, "no static file %q", name)
		return
	}
	h := w.Header()
	h.Set("ETag", tag)
	if chi.URLParam(r, "version") == static.Version {
		h.Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		h.Set("Cache-Control", "no-cache")
	}
	ct := mime.TypeByExtension(path.Ext(name))
	if path.Ext(name) == ".js" {
		ct = "text/javascript; charset=utf-8"
	}
	h.Set("Content-Type", ct)
	if match := r.Header.Get("If-None-Match"); match != "" && strings.Contains(match, tag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Write(b)
}
