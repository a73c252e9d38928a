package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/go-chi/chi/v5"

	"vramscope/store"
	"vramscope/web"
)

// maxPermalinkBody caps a POST /api/permalinks body; a view's URL is short.
const maxPermalinkBody = 8 << 10

// viewPath is the pages a permalink may restore: a trace view or one of
// its incidents.
var viewPath = regexp.MustCompile(`^/traces/([A-Za-z0-9_-]+)(/incidents/[1-9][0-9]{0,8})?$`)

// permalinkState is what a permalink stores. The URL holds the whole view
// (window, cursor, selection, panel), so restoring it is opening the URL.
type permalinkState struct {
	V     int    `json:"v"`
	Trace string `json:"trace"`
	URL   string `json:"url"`
}

// localView checks that raw is a page of trace id on this server and
// returns it rebuilt from its parsed path and query.
func localView(raw, id string) (string, error) {
	if strings.ContainsAny(raw, "\\\r\n\t") || strings.HasPrefix(raw, "//") {
		return "", fmt.Errorf("url %q is not a local path", raw)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("url: %v", err)
	}
	if u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" {
		return "", fmt.Errorf("url %q is not a local path", raw)
	}
	m := viewPath.FindStringSubmatch(u.Path)
	if m == nil {
		return "", fmt.Errorf("url %q is not a trace view or incident page", raw)
	}
	if m[1] != id {
		return "", fmt.Errorf("url %q is a view of trace %s, not of %s", raw, m[1], id)
	}
	if _, err := url.ParseQuery(u.RawQuery); err != nil {
		return "", fmt.Errorf("url %q: query: %v", raw, err)
	}
	out := u.Path
	if u.RawQuery != "" {
		out += "?" + u.RawQuery
	}
	return out, nil
}

// apiCreatePermalink stores the view in the body under a new token. It
// writes to the database, so it needs the token where writes do, and a
// client may make only so many a minute; the JSON content type keeps
// other sites' forms from posting one.
func (s *Server) apiCreatePermalink(w http.ResponseWriter, r *http.Request) {
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "send the view as application/json: {\"trace\": ID, \"url\": \"/traces/ID?...\"}")
		return
	}
	var in struct {
		Trace string `json:"trace"`
		URL   string `json:"url"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxPermalinkBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		writeError(w, http.StatusBadRequest, "body: %v", err)
		return
	}
	if err := dec.Decode(&struct{}{}); err != io.EOF {
		writeError(w, http.StatusBadRequest, "body: one JSON object expected")
		return
	}
	if in.Trace == "" || in.URL == "" {
		writeError(w, http.StatusBadRequest, "body: trace and url are both required")
		return
	}
	view, err := localView(in.URL, in.Trace)
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	state, _ := json.Marshal(permalinkState{V: 1, Trace: in.Trace, URL: view})
	token, err := s.opt.DB.CreatePermalink(in.Trace, state)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]string{"token": token, "url": "/p/" + token, "view": view})
}

// pagePermalink opens a stored view. Answers are pages, not JSON: these
// links are opened in browsers.
func (s *Server) pagePermalink(w http.ResponseWriter, r *http.Request) {
	token := chi.URLParam(r, "token")
	notFound := func(msg string) {
		render(w, r, http.StatusNotFound, web.NotFound(page("Link not found"), msg))
	}
	p, err := s.opt.DB.Permalink(token)
	if errors.Is(err, store.ErrNotFound) {
		notFound("This link (" + token + ") is unknown: it was mistyped, its trace was deleted (links go with their trace), or it was made on another vramscope server.")
		return
	}
	if err != nil {
		s.log.Error("store", "path", r.URL.Path, "err", err)
		render(w, r, http.StatusInternalServerError, web.NotFound(page("Error"), "Reading the link failed: "+err.Error()))
		return
	}
	var st permalinkState
	if err := json.Unmarshal(p.State, &st); err != nil || st.URL == "" {
		notFound("This link's stored view cannot be read.")
		return
	}
	view, err := localView(st.URL, p.TraceID)
	if err != nil {
		notFound("This link's stored view is not a page of its trace: " + err.Error())
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, view, http.StatusSeeOther)
}
