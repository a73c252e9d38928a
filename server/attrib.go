package server

import (
	"fmt"
	"net/http"

	"github.com/go-chi/chi/v5"

	"vramscope/attrib"
	"vramscope/gpu"
	"vramscope/store"
)

// What was live at an instant and what it was (package attrib): the live
// set grouped as a tree and a table, its pprof profile, the trace's steps
// and phases, and the categories of a window's bands.

// instant reads the instant a request names: seq (right after that event)
// or t (after the last event at or before that time).
func instant(p *params) attrib.Instant {
	if p.r.URL.Query().Has("seq") {
		return attrib.Instant{BySeq: true, Seq: p.intIn("seq", 0, -1, 1<<62)}
	}
	return attrib.Instant{TimeUS: p.required("t")}
}

// liveBlocksJSON are the live blocks in tree order, in columns: a node's
// blocks are [b0, b1) of each column. category and sure index the
// answer's categories and attrib's sureness names (high, medium, low).
type liveBlocksJSON struct {
	Address  []uint64 `json:"address"`
	Size     []uint64 `json:"size"`
	Seq      []int64  `json:"seq"`
	Stack    []uint32 `json:"stack"`
	Category []int    `json:"category"`
	Sure     []int    `json:"sure"`
}

// categoryJSON is one category's share of the live set; every category is
// listed, empty or not, unknown too.
type categoryJSON struct {
	Name  attrib.Category `json:"name"`
	Bytes uint64          `json:"bytes"`
	Count int             `json:"count"`
	// BySure splits the bytes by how sure the verdicts are: high, medium, low.
	BySure [3]uint64 `json:"by_sure"`
}

type liveJSON struct {
	Seq      int64           `json:"seq"`
	TimeUS   int64           `json:"t"`
	Bytes    uint64          `json:"bytes"`
	Count    int             `json:"count"`
	Grouping attrib.Grouping `json:"grouping"`
	Tree     *attrib.Node    `json:"tree"`
	// Rows are the table, largest first: the first limit of RowsTotal.
	Rows       []attrib.Row   `json:"rows"`
	RowsTotal  int            `json:"rows_total"`
	Blocks     liveBlocksJSON `json:"blocks"`
	Categories []categoryJSON `json:"categories"`
	Sureness   []string       `json:"sureness"`
	// Step is the training step the instant falls in, if any.
	Step *attrib.Region `json:"step,omitempty"`
}

var sureIndex = map[attrib.Sureness]int{attrib.High: 0, attrib.Medium: 1, attrib.Low: 2}

// apiLive is the live set at an instant (t or seq), grouped by first user
// frame, by stack or by category (group), with hidden frames when
// frames=all; the table holds the first limit rows.
func (s *Server) apiLive(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	at := instant(p)
	g, err := attrib.ParseGrouping(r.URL.Query().Get("group"))
	if err != nil {
		p.fail("group", "%v", err)
	}
	limit := int(p.intIn("limit", 100, 1, 10000))
	all := frames(p)
	if !p.check(w) {
		return
	}
	l, err := s.liveAt(chi.URLParam(r, "id"), at)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	// Children under a five-thousandth of the live bytes fold: the flame
	// graph could not draw them wider than a fraction of a pixel.
	gr := attrib.Group(l.LiveSet, g, attrib.Options{AllFrames: all, Categories: l.Verdicts, MinBytes: l.Bytes() / 5000})
	out := liveJSON{Seq: l.Seq, TimeUS: l.TimeUS, Bytes: gr.Bytes, Count: gr.Count, Grouping: g, Tree: gr.Tree,
		Rows: gr.Rows[:min(limit, len(gr.Rows))], RowsTotal: len(gr.Rows), Sureness: []string{"high", "medium", "low"}}
	catIndex := map[attrib.Category]int{}
	for i, c := range attrib.AllCategories {
		catIndex[c] = i
		out.Categories = append(out.Categories, categoryJSON{Name: c})
	}
	n := len(gr.Order)
	out.Blocks = liveBlocksJSON{Address: make([]uint64, n), Size: make([]uint64, n), Seq: make([]int64, n),
		Stack: make([]uint32, n), Category: make([]int, n), Sure: make([]int, n)}
	for k, i := range gr.Order {
		b, v := &l.Blocks[i], l.Verdicts[i]
		c := catIndex[v.Category]
		out.Blocks.Address[k], out.Blocks.Size[k], out.Blocks.Seq[k], out.Blocks.Stack[k] = b.Addr, b.Size, b.Seq, uint32(b.Stack)
		out.Blocks.Category[k], out.Blocks.Sure[k] = c, sureIndex[v.Sure]
		cj := &out.Categories[c]
		cj.Bytes += b.Size
		cj.Count++
		cj.BySure[sureIndex[v.Sure]] += b.Size
	}
	if out.Rows == nil {
		out.Rows = []attrib.Row{}
	}
	for _, st := range attrib.Steps(l.Regions) {
		if st.StartUS <= l.TimeUS && l.TimeUS < st.EndUS {
			out.Step = &st
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// liveAt is the live set of trace id at an instant, with its categories.
func (s *Server) liveAt(id string, at attrib.Instant) (*attrib.Live, error) {
	c, err := s.cats.Categorizer(s.opt.DB, id)
	if err != nil {
		return nil, err
	}
	return c.At(at)
}

// frames reads frames: "all" keeps the frames views hide, "" does not.
func frames(p *params) bool {
	switch v := p.r.URL.Query().Get("frames"); v {
	case "":
		return false
	case "all":
		return true
	default:
		p.fail("frames", "%q is not all", v)
		return false
	}
}

// apiLiveProfile is the live set at an instant as a pprof profile
// (vramscope export --format pprof).
func (s *Server) apiLiveProfile(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	at := instant(p)
	all := frames(p)
	if !p.check(w) {
		return
	}
	id := chi.URLParam(r, "id")
	t, err := s.opt.DB.Trace(id)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	l, err := s.liveAt(id, at)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="%s-live-%d.pb.gz"`, t.ID, l.Seq))
	w.Header().Set("Cache-Control", "no-store")
	if err := attrib.WriteProfile(w, l, t, all); err != nil {
		s.log.Error("pprof", "path", r.URL.Path, "err", err)
	}
}

// stepJSON is a training step with its peak of allocated memory.
type stepJSON struct {
	attrib.Region
	Peak store.Peak `json:"peak"`
}

// apiSteps lists the trace's annotated regions (steps and phases), its
// steps with their peaks (from the from-th step on, limit of them: the
// peaks cost the steps' events), and where user_metadata changes.
func (s *Server) apiSteps(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	from := int(p.intIn("from", 0, 0, 1<<31))
	limit := int(p.intIn("limit", 200, 1, 2000))
	if !p.check(w) {
		return
	}
	id := chi.URLParam(r, "id")
	c, err := s.cats.Categorizer(s.opt.DB, id)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	regions := c.Regions()
	steps := attrib.Steps(regions)
	total := len(steps)
	steps = steps[min(from, total):min(from+limit, total)]
	spans := make([]store.Span, len(steps))
	for i, st := range steps {
		spans[i] = store.Span{T0: st.StartUS, T1: st.EndUS}
	}
	peaks, err := s.opt.DB.Peaks(id, spans)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	meta, metaTotal, err := s.opt.DB.MetadataChanges(id, 2000)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	out := struct {
		Regions    []attrib.Region `json:"regions"`
		Steps      []stepJSON      `json:"steps"`
		StepsTotal int             `json:"steps_total"`
		// Metadata: where the events' user_metadata changes (the first 2000).
		Metadata      []store.MetadataChange `json:"metadata"`
		MetadataTotal int                    `json:"metadata_total"`
	}{Regions: regions, Steps: make([]stepJSON, len(steps)), StepsTotal: total, Metadata: meta, MetadataTotal: metaTotal}
	if out.Metadata == nil {
		out.Metadata = []store.MetadataChange{}
	}
	if out.Regions == nil {
		out.Regions = []attrib.Region{}
	}
	for i := range steps {
		out.Steps[i] = stepJSON{steps[i], peaks[i]}
	}
	writeJSON(w, http.StatusOK, out)
}

// apiBandCategories is the category of each band of a window, in the
// order of /bands with the same parameters: the timeline colours bands by
// it and stacks the bytes of each category.
func (s *Server) apiBandCategories(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	q := bandsQuery(p)
	if !p.check(w) {
		return
	}
	id := chi.URLParam(r, "id")
	bands, err := s.opt.DB.Bands(id, q)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	blocks := make([]gpu.Block, len(bands.Bands))
	for i, b := range bands.Bands {
		blocks[i] = gpu.Block{Addr: b.Addr, Size: b.Size, Requested: b.Requested, Stack: b.Stack, Seq: b.Seq, State: gpu.BlockAllocated}
	}
	c, err := s.cats.Categorizer(s.opt.DB, id)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	set, err := s.opt.DB.Describe(id, blocks)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	vs, err := c.Verdicts(set)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	out := struct {
		Categories []attrib.Category `json:"categories"`
		Band       []int             `json:"band"`
		Sure       []int             `json:"sure"`
	}{attrib.AllCategories, make([]int, len(vs)), make([]int, len(vs))}
	for i, v := range vs {
		for k, c := range attrib.AllCategories {
			if c == v.Category {
				out.Band[i] = k
			}
		}
		out.Sure[i] = sureIndex[v.Sure]
	}
	writeJSON(w, http.StatusOK, out)
}

// apiCategoryAreas is the live bytes of each category at n instants of
// [t0, t1]: the timeline's stacked areas by category.
func (s *Server) apiCategoryAreas(w http.ResponseWriter, r *http.Request) {
	p := &params{r: r}
	t0, t1, n := window(p, "n", 100, 400)
	if !p.check(w) {
		return
	}
	c, err := s.cats.Categorizer(s.opt.DB, chi.URLParam(r, "id"))
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	a, err := c.Areas(t0, t1, n)
	if err != nil {
		s.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, a)
}
