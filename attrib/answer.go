package attrib

import (
	"slices"
	"sync"

	"vramscope/gpu"
	"vramscope/store"
)

// The answers the web page asks for, whole: the server parses a request,
// asks for one of these and writes it as JSON.

// LiveBlocks are the live blocks in tree order, in columns: a node's
// blocks are [b0, b1) of each column. Category and Sure index
// AllCategories and SurenessNames.
type LiveBlocks struct {
	Address  []uint64 `json:"address"`
	Size     []uint64 `json:"size"`
	Seq      []int64  `json:"seq"`
	Stack    []uint32 `json:"stack"`
	Category []int    `json:"category"`
	Sure     []int    `json:"sure"`
}

// CategoryShare is one category's share of a live set; every category is
// listed, empty or not, unknown too.
type CategoryShare struct {
	Name  Category `json:"name"`
	Bytes uint64   `json:"bytes"`
	Count int      `json:"count"`
	// BySure splits the bytes by how sure the verdicts are: high, medium, low.
	BySure [3]uint64 `json:"by_sure"`
}

// LiveAnswer is the live set at an instant, grouped: its tree, its table
// (the first rows of RowsTotal, largest first), its blocks and its
// categories, and the step it falls in.
type LiveAnswer struct {
	Seq        int64           `json:"seq"`
	TimeUS     int64           `json:"t"`
	Bytes      uint64          `json:"bytes"`
	Count      int             `json:"count"`
	Grouping   Grouping        `json:"grouping"`
	Tree       *Node           `json:"tree"`
	Rows       []Row           `json:"rows"`
	RowsTotal  int             `json:"rows_total"`
	Blocks     LiveBlocks      `json:"blocks"`
	Categories []CategoryShare `json:"categories"`
	Sureness   []string        `json:"sureness"`
	Step       *Region         `json:"step,omitempty"`
}

// SurenessNames are the names of High, Medium and Low, indexed as answers
// index them.
var SurenessNames = []string{"high", "medium", "low"}

var sureIndex = map[Sureness]int{High: 0, Medium: 1, Low: 2}

func categoryIndex(c Category) int {
	for i, a := range AllCategories {
		if a == c {
			return i
		}
	}
	return len(AllCategories) - 1 // unknown
}

// Answer groups l by g (with the frames views hide when all) and keeps
// the first rows of its table. Children under a five-thousandth of the
// live bytes fold: a flame graph could not draw them wider than a
// fraction of a pixel.
func (l *Live) Answer(g Grouping, all bool, rows int) LiveAnswer {
	gr := Group(l.LiveSet, g, Options{AllFrames: all, Categories: l.Verdicts, MinBytes: l.Bytes() / 5000})
	out := LiveAnswer{Seq: l.Seq, TimeUS: l.TimeUS, Bytes: gr.Bytes, Count: gr.Count, Grouping: g, Tree: gr.Tree,
		Rows: gr.Rows[:min(rows, len(gr.Rows))], RowsTotal: len(gr.Rows), Sureness: SurenessNames}
	if out.Rows == nil {
		out.Rows = []Row{}
	}
	for _, c := range AllCategories {
		out.Categories = append(out.Categories, CategoryShare{Name: c})
	}
	n := len(gr.Order)
	out.Blocks = LiveBlocks{Address: make([]uint64, n), Size: make([]uint64, n), Seq: make([]int64, n),
		Stack: make([]uint32, n), Category: make([]int, n), Sure: make([]int, n)}
	for k, i := range gr.Order {
		b, v := &l.Blocks[i], l.Verdicts[i]
		c, s := categoryIndex(v.Category), sureIndex[v.Sure]
		out.Blocks.Address[k], out.Blocks.Size[k], out.Blocks.Seq[k], out.Blocks.Stack[k] = b.Addr, b.Size, b.Seq, uint32(b.Stack)
		out.Blocks.Category[k], out.Blocks.Sure[k] = c, s
		share := &out.Categories[c]
		share.Bytes += b.Size
		share.Count++
		share.BySure[s] += b.Size
	}
	for _, st := range Steps(l.Regions) {
		if st.StartUS <= l.TimeUS && l.TimeUS < st.EndUS {
			out.Step = &st
		}
	}
	return out
}

// StepPeak is a training step with its peak of allocated memory.
// Complete says that it has ended and that no entry the job made in it
// was lost: a live trace that reads a sample of the job's entries has
// them only in its reads whole (gpu.WholeRead).
type StepPeak struct {
	Region
	Peak     store.Peak `json:"peak"`
	Complete bool       `json:"complete"`
}

// StepsAnswer is a trace's annotated regions (steps and phases), a page
// of its steps with their peaks, and where user_metadata changes.
// Sampled says the trace lost entries of the job (a live trace that reads
// a sample of them): its steps are complete only where read whole, and
// Complete counts those of all its steps.
type StepsAnswer struct {
	Regions    []Region   `json:"regions"`
	Steps      []StepPeak `json:"steps"`
	StepsTotal int        `json:"steps_total"`
	Sampled    bool       `json:"sampled"`
	Complete   int        `json:"complete"`
	// Metadata: where the events' user_metadata changes (the first
	// MaxMetadataChanges).
	Metadata      []store.MetadataChange `json:"metadata"`
	MetadataTotal int                    `json:"metadata_total"`
}

// MaxMetadataChanges bounds the user_metadata changes a StepsAnswer lists.
const MaxMetadataChanges = 2000

// StepPeaks answers the regions, the steps from the from-th on (limit of
// them: their peaks cost their events) and the user_metadata changes.
func (c *Categorizer) StepPeaks(from, limit int) (StepsAnswer, error) {
	// Every trace page asks for it as it loads, and on a trace of millions
	// of events it reads most of them: it is kept while the trace is as it
	// was (the Cache makes a new categorizer when it changes).
	key := [2]int{from, limit}
	c.mu.Lock()
	out, ok := c.stepPeaks[key]
	c.mu.Unlock()
	if ok {
		return out, nil
	}
	out, err := c.readStepPeaks(from, limit)
	if err != nil {
		return out, err
	}
	c.mu.Lock()
	if len(c.stepPeaks) >= maxStepPeaks {
		clear(c.stepPeaks)
	}
	c.stepPeaks[key] = out
	c.mu.Unlock()
	return out, nil
}

// maxStepPeaks bounds the pages of step peaks a categorizer keeps, and
// maxEndedPeaks the ended steps' peaks the categorizers of a trace share.
const (
	maxStepPeaks  = 8
	maxEndedPeaks = 100_000
)

// endedPeaks are the peaks of steps that had ended, events after them
// stored, when they were read: a trace being written only grows after
// them, so they stay what they are as it does. Safe for concurrent use.
type endedPeaks struct {
	mu    sync.Mutex
	peaks map[store.Span]store.Peak
}

func (c *Categorizer) readStepPeaks(from, limit int) (StepsAnswer, error) {
	steps := Steps(c.regions)
	total := len(steps)
	steps = steps[min(from, total):min(from+limit, total)]
	// A live trace's page reads its steps again as it grows: only the
	// steps not read to their end before cost their events.
	peaks := make([]store.Peak, len(steps))
	var spans []store.Span
	var asked []int
	c.ended.mu.Lock()
	for i, st := range steps {
		sp := store.Span{T0: st.StartUS, T1: st.EndUS}
		if p, ok := c.ended.peaks[sp]; ok && !st.Open {
			peaks[i] = p
			continue
		}
		spans, asked = append(spans, sp), append(asked, i)
	}
	c.ended.mu.Unlock()
	read, err := c.db.Peaks(c.trace.ID, spans)
	if err != nil {
		return StepsAnswer{}, err
	}
	c.ended.mu.Lock()
	for j, i := range asked {
		peaks[i] = read[j]
		if !steps[i].Open && steps[i].EndUS < c.trace.LastUS && len(c.ended.peaks) < maxEndedPeaks {
			c.ended.peaks[spans[j]] = read[j]
		}
	}
	c.ended.mu.Unlock()
	meta, metaTotal, err := c.db.MetadataChanges(c.trace.ID, MaxMetadataChanges)
	if err != nil {
		return StepsAnswer{}, err
	}
	out := StepsAnswer{Regions: c.regions, Steps: make([]StepPeak, len(steps)), StepsTotal: total, Metadata: meta, MetadataTotal: metaTotal}
	if out.Metadata == nil {
		out.Metadata = []store.MetadataChange{}
	}
	if out.Regions == nil {
		out.Regions = []Region{}
	}
	for i := range steps {
		out.Steps[i] = StepPeak{steps[i], peaks[i], c.complete(&steps[i])}
	}
	out.Sampled = c.trace.Dropped != nil && c.trace.Dropped.GapCount > 0
	for _, st := range Steps(c.regions) {
		if c.complete(&st) {
			out.Complete++
		}
	}
	return out, nil
}

// complete says whether a step has ended with no entry of the job lost in
// it: in a trace that lost none, every ended step; else those within a
// read whole.
func (c *Categorizer) complete(st *Region) bool {
	d := c.trace.Dropped
	if st.Open || d != nil && d.GapCount > 0 && !slices.ContainsFunc(d.Whole, func(r gpu.WholeRead) bool { return r.Holds(st.StartUS, st.EndUS) }) {
		return false
	}
	return true
}

// BandCategories is the category and sureness of each band of a window
// (indexes of Categories and SurenessNames), in the bands' order, and the
// category of each folded band (its largest allocation's).
type BandCategories struct {
	Categories []Category `json:"categories"`
	Band       []int      `json:"band"`
	Sure       []int      `json:"sure"`
	Fold       []int      `json:"fold"`
}

// BandCategories sorts the allocations of bands, and the largest of each
// folded band, into categories.
func (c *Categorizer) BandCategories(b *store.Bands) (BandCategories, error) {
	bands := b.Bands
	blocks := make([]gpu.Block, 0, len(bands)+len(b.Folds))
	for _, b := range bands {
		blocks = append(blocks, gpu.Block{Addr: b.Addr, Size: b.Size, Requested: b.Requested, Stack: b.Stack, Seq: b.Seq, State: gpu.BlockAllocated})
	}
	for _, f := range b.Folds {
		r := f.Rep
		blocks = append(blocks, gpu.Block{Addr: r.Addr, Size: r.Size, Requested: r.Requested, Stack: r.Stack, Seq: r.Seq, State: gpu.BlockAllocated})
	}
	set, err := c.db.Describe(c.trace.ID, blocks)
	if err != nil {
		return BandCategories{}, err
	}
	vs, err := c.Verdicts(set)
	if err != nil {
		return BandCategories{}, err
	}
	out := BandCategories{AllCategories, make([]int, len(bands)), make([]int, len(bands)), make([]int, len(b.Folds))}
	for i, v := range vs {
		if i < len(bands) {
			out.Band[i], out.Sure[i] = categoryIndex(v.Category), sureIndex[v.Sure]
		} else {
			out.Fold[i-len(bands)] = categoryIndex(v.Category)
		}
	}
	return out, nil
}

// VerdictOf sorts one allocation, live or not (the selection's details).
func (c *Categorizer) VerdictOf(a gpu.Allocation) (Verdict, error) {
	set, err := c.db.Describe(c.trace.ID, []gpu.Block{{Addr: a.Addr, Size: a.Size, Requested: a.Requested, Stack: a.Stack, Seq: a.Seq,
		State: gpu.BlockAllocated}})
	if err != nil {
		return Verdict{}, err
	}
	vs, err := c.Verdicts(set)
	if err != nil || len(vs) == 0 {
		return Verdict{Category: Unknown, Sure: Low}, err
	}
	return vs[0], nil
}
