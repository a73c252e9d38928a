package incident

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/replay"
)

// OOMAt is a request that failed: its place in the stream and its size.
type OOMAt struct {
	Index int    `json:"index"`
	Size  uint64 `json:"size"`
}

// WhatIf is the stream replayed under one setting.
type WhatIf struct {
	AllocConf string `json:"alloc_conf"`
	// Variant is what was set on top of the recorded settings ("" for
	// the original row).
	Variant string  `json:"-"`
	OOMs    []OOMAt `json:"ooms"`
	// Avoided are the indexes of the original OOMs this replay served;
	// NewOOMs those of its OOMs the original did not have.
	Avoided []int `json:"avoided"`
	NewOOMs []int `json:"new_ooms"`
	// CapacityNeeded is the smallest device (2 MiB steps) on which the
	// whole stream runs without an OOM under this setting; 0 when none up
	// to replay.MaxCapacityNeeded does.
	CapacityNeeded uint64 `json:"capacity_needed"`
	// LowestThatRuns, when less than CapacityNeeded, is a lower limit
	// that runs too, with one between (FailsAt) that does not: the
	// allocator is not monotone there (replay.Needed).
	LowestThatRuns uint64 `json:"lowest_that_runs,omitempty"`
	FailsAt        uint64 `json:"fails_at,omitempty"`
	PeakReserved   uint64 `json:"peak_reserved"`
	// FragmentationAtOOM is measured right after each original OOM's
	// request (the layout an incident page shows), in their order.
	FragmentationAtOOM []float64 `json:"fragmentation_at_oom"`
	Err                string    `json:"error"`
}

// Serves reports whether this replay served the original OOM at index.
func (w WhatIf) Serves(index int) bool { return slices.Contains(w.Avoided, index) }

// Variants are the settings tried besides the original, each applied on top
// of it: the usual cures for fragmentation.
var Variants = []string{
	"expandable_segments:True",
	"max_split_size_mb:32",
	"max_split_size_mb:128",
	"max_split_size_mb:512",
	"garbage_collection_threshold:0.6,per_process_memory_fraction:1",
	"roundup_power2_divisions:4",
}

// DefaultsVariant names the row of PyTorch's default settings, which a
// recording under other settings gets.
const DefaultsVariant = "the default settings"

// Table is the what-if answer for a request stream.
type Table struct {
	Capacity uint64 `json:"capacity_bytes"`
	// CapacityFrom says where the capacity came from ("inferred from 39 retries").
	CapacityFrom string `json:"capacity_from"`
	Requests     int    `json:"requests"`
	// Limit is the per-process limit the recording ran under, inferred
	// (nil when none): every row replays under it, and memory needed is
	// that limit's smallest value that works.
	Limit *replay.Limit `json:"limit,omitempty"`
	// LimitFrom says the limit and the evidence for it (replay.Limit's
	// String); empty without one.
	LimitFrom string `json:"limit_from,omitempty"`
	// OOMs are the original OOMs: the recorded ones, else (an RMM log)
	// those of the replay under the original settings.
	OOMs []OOMAt  `json:"original_ooms"`
	Rows []WhatIf `json:"rows"`
	// Contradiction, when not empty, says plainly that the replay under
	// the recorded settings does not reproduce the recorded OOMs: no
	// capacity or limit found explains them, so the other rows are not
	// to be read against the recording.
	Contradiction string `json:"contradiction,omitempty"`
	// EndsAtOOM: the recording asks for nothing after its last OOM (a
	// snapshot dumped then), so what the job would have asked next is not
	// in it, and the memory needed covers only the requests it holds.
	EndsAtOOM bool `json:"ends_at_oom,omitempty"`
}

// Answer replays s under its own settings and under each of Variants on a
// simulated device of s.Capacity, and searches the memory each needs, the
// replays spread over the cores.
func Answer(s replay.Stream) (Table, error) { return answer(s, nil) }

// answer is Answer, handing the recorded settings' row to onOriginal as
// soon as it is done, before the variants' replays end.
func answer(s replay.Stream, onOriginal func(WhatIf)) (Table, error) {
	ooms, rows, err := whatIfs(s, Variants, runtime.GOMAXPROCS(0), onOriginal)
	if err != nil {
		return Table{}, err
	}
	t := Table{Capacity: s.Capacity.Bytes, CapacityFrom: s.Capacity.From(), Requests: len(s.Requests), OOMs: ooms, Rows: rows}
	if s.Limit.Bytes > 0 {
		t.Limit, t.LimitFrom = &s.Limit, s.Limit.String()
	}
	t.Contradiction = contradiction(ooms, rows[0])
	t.EndsAtOOM = endsAtOOM(s.Requests)
	return t, nil
}

// endsAtOOM says whether reqs hold a recorded OOM and no malloc after the
// last one.
func endsAtOOM(reqs []replay.Request) bool {
	for i := len(reqs) - 1; i >= 0; i-- {
		switch {
		case reqs[i].OOM:
			return true
		case reqs[i].Op == replay.OpMalloc:
			return false
		}
	}
	return false
}

// contradiction says where the replay under the recorded settings, orig,
// does not reproduce the recorded OOMs; empty when it does.
func contradiction(recorded []OOMAt, orig WhatIf) string {
	if orig.Err != "" || slices.Equal(recorded, orig.OOMs) || len(recorded) == 0 {
		return ""
	}
	return fmt.Sprintf("The replay under the recorded settings does not reproduce the recording: it ran out of memory at %s where the recording did at %s. "+
		"Nothing in the recording explains its OOMs (memory another process held, or a limit it does not say); "+
		"read the other settings' rows as replays on this device, not as what the run would have done.", oomList(orig.OOMs), oomList(recorded))
}

func oomList(ooms []OOMAt) string {
	if len(ooms) == 0 {
		return "no request"
	}
	var at []string
	for _, o := range ooms {
		at = append(at, fmt.Sprint(o.Index))
	}
	if len(ooms) == 1 {
		return "request " + at[0]
	}
	return "requests " + strings.Join(at, ", ")
}

// WhatIfs replays s on a simulated device of s.Capacity.Bytes under its
// recorded settings and under each variant set on top of them, on up to
// workers goroutines, and returns the original OOMs and one row per
// setting, the original first.
func WhatIfs(s replay.Stream, variants []string, workers int) ([]OOMAt, []WhatIf, error) {
	return whatIfs(s, variants, workers, nil)
}

func whatIfs(s replay.Stream, variants []string, workers int, onOriginal func(WhatIf)) ([]OOMAt, []WhatIf, error) {
	orig, err := s.Config("")
	if err != nil {
		return nil, nil, err
	}
	// One row per distinct setting: a variant the recording already had
	// is left out, and a recording under other settings gets a row for
	// PyTorch's defaults first.
	cfgs := []caching.Config{orig}
	var labels []string
	seen := map[string]bool{orig.String(): true}
	add := func(label string, c caching.Config) {
		if !seen[c.String()] {
			seen[c.String()] = true
			cfgs, labels = append(cfgs, c), append(labels, label)
		}
	}
	def := caching.DefaultConfig()
	def.Limit = orig.Limit
	add(DefaultsVariant, def)
	for _, v := range variants {
		c, err := replay.Overlay(orig, v)
		if err != nil {
			return nil, nil, fmt.Errorf("variant %q: %w", v, err)
		}
		add(v, c)
	}
	var recorded []OOMAt
	for i, r := range s.Requests {
		if r.OOM {
			recorded = append(recorded, OOMAt{i, r.Size})
		}
	}
	rows := make([]WhatIf, len(cfgs))
	results := make([]replay.Result, len(cfgs))
	original := recorded
	first := 0
	if recorded == nil {
		// An RMM log: the original OOMs are those of its replay, which
		// the other rows measure at.
		rows[0], results[0], _ = replayOne(s, orig, nil, true)
		original = append([]OOMAt{}, rows[0].OOMs...)
		first = 1
	}
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range max(1, workers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				var err error
				if i >= first {
					// Under other settings a run departs from the
					// recording: the driver places its segments anew.
					rs := s
					if i > 0 {
						rs = s.Unplaced()
					}
					rows[i], results[i], err = replayOne(rs, cfgs[i], original, false)
				}
				at := s.Allowed()
				switch {
				case errors.Is(err, gpu.ErrOutOfMemory):
					at = 0 // the starting layout does not fit: search from nothing
				case err != nil:
					continue
				}
				need, err := s.CapacityNeeded(cfgs[i], results[i], at)
				if err != nil {
					rows[i].Err = err.Error()
				}
				rows[i].CapacityNeeded = need.Steady
				if need.Lowest < need.Steady {
					rows[i].LowestThatRuns, rows[i].FailsAt = need.Lowest, need.FailsAt
				}
				if i == 0 && onOriginal != nil {
					row := rows[0]
					row.AllocConf = cfgs[0].String()
					onOriginal(row)
				}
			}
		}()
	}
	for i := range cfgs {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if original == nil {
		original = []OOMAt{}
	}
	for i := range rows {
		rows[i].AllocConf = cfgs[i].String()
		if i > 0 {
			rows[i].Variant = labels[i-1]
		}
		rows[i].Avoided, rows[i].NewOOMs = compare(original, rows[i].OOMs, rows[i].Err == "")
	}
	return original, rows, nil
}

// compare returns the original OOMs a replay served and its OOMs the
// original did not have; a failed replay served nothing.
func compare(original, ooms []OOMAt, complete bool) (avoided, fresh []int) {
	avoided, fresh = []int{}, []int{}
	at := map[int]bool{}
	for _, o := range ooms {
		at[o.Index] = true
	}
	was := map[int]bool{}
	for _, o := range original {
		was[o.Index] = true
		if complete && !at[o.Index] {
			avoided = append(avoided, o.Index)
		}
	}
	for _, o := range ooms {
		if !was[o.Index] {
			fresh = append(fresh, o.Index)
		}
	}
	return avoided, fresh
}

// replayOne replays s under cfg and measures the fragmentation right
// after the requests of the original OOMs, or after its own (own). The
// error, also in the row, is what stopped the replay.
func replayOne(s replay.Stream, cfg caching.Config, original []OOMAt, own bool) (WhatIf, replay.Result, error) {
	w := WhatIf{OOMs: []OOMAt{}, FragmentationAtOOM: []float64{}}
	a, err := caching.New(s.Device(s.Capacity.Bytes), cfg)
	if err != nil {
		w.Err = err.Error()
		return w, replay.Result{}, err
	}
	p, err := s.Start(a)
	if err != nil {
		w.Err = err.Error()
		return w, p.Result(), err
	}
	next := 0
	for i, r := range s.Requests {
		before := len(p.OOMs())
		if err = p.Step(i, r); err != nil {
			w.Err = err.Error()
			break
		}
		if own && len(p.OOMs()) > before || next < len(original) && original[next].Index == i {
			w.FragmentationAtOOM = append(w.FragmentationAtOOM, a.Layout().Figures().Fragmentation)
			next++
		}
	}
	res := p.Result()
	for _, o := range res.OOMs {
		w.OOMs = append(w.OOMs, OOMAt{o.Index, o.Size})
	}
	w.PeakReserved = res.PeakReserved
	return w, res, err
}

// ForOOM is the table read for original OOM k (from 0): what each setting
// did with that request, in sentences an incident page shows.
type ForOOM struct {
	Index int    `json:"index"`
	Size  uint64 `json:"size"`
	// ServedBy are the variants that served the request.
	ServedBy []string `json:"served_by"`
	// Sentences say it: "expandable_segments:True would have served this
	// request.", then what the run needs (Table.Needed).
	Sentences []string `json:"sentences"`
}

// ForOOM reads the table for original OOM k; ok is false when there is
// no such OOM.
func (t Table) ForOOM(k int) (f ForOOM, ok bool) {
	if k < 0 || k >= len(t.OOMs) {
		return f, false
	}
	f = ForOOM{Index: t.OOMs[k].Index, Size: t.OOMs[k].Size, ServedBy: []string{}}
	for _, r := range t.Rows[1:] {
		if r.Serves(f.Index) {
			f.ServedBy = append(f.ServedBy, r.Variant)
			f.Sentences = append(f.Sentences, r.Variant+" would have served this request.")
		}
	}
	if len(f.ServedBy) == 0 {
		f.Sentences = append(f.Sentences, "None of the settings tried would have served this request.")
	}
	if n := t.Needed(); n != "" {
		f.Sentences = append(f.Sentences, n)
	}
	return f, true
}

// Needed says what device the whole run needs without an OOM: under the
// recorded settings, and under the variant that needs the least when it
// needs less: "Needs 63.40 GiB with the recorded settings, 58.10 GiB with
// expandable_segments:True." Empty when the table has no rows.
func (t Table) Needed() string {
	if len(t.Rows) == 0 {
		return ""
	}
	orig := t.Rows[0]
	s := "Needs " + needed(orig) + " with the recorded settings"
	best := -1
	for i, r := range t.Rows[1:] {
		if r.Err == "" && r.CapacityNeeded > 0 && (orig.CapacityNeeded == 0 || r.CapacityNeeded < orig.CapacityNeeded) &&
			(best < 0 || r.CapacityNeeded < t.Rows[best].CapacityNeeded) {
			best = i + 1
		}
	}
	if best > 0 {
		s += ", " + needed(t.Rows[best]) + " with " + t.Rows[best].Variant
	} else {
		s += "; no setting tried needs less"
	}
	s += " (" + t.device() + ")."
	if t.EndsAtOOM {
		s += fmt.Sprintf(" The recording ends at its OOM: these figures cover the %d requests it holds, not what the job would have asked after it.", t.Requests)
	}
	return s
}

// device says what the recording ran on: the device, and the per-process
// limit under it when there was one.
func (t Table) device() string {
	if t.Limit != nil {
		return "as a per-process limit; the recording ran under one of " + gpu.FormatBytes(t.Limit.Bytes) + ", on a device of " + gpu.FormatBytes(t.Capacity)
	}
	return "the device has " + gpu.FormatBytes(t.Capacity)
}

// NeededFirst is what Needed says while only the recorded settings' row,
// orig, is done.
func NeededFirst(orig WhatIf, capacity uint64) string {
	return "Needs " + needed(orig) + " with the recorded settings (the device has " + gpu.FormatBytes(capacity) + "); the replays under other settings are still running."
}

// needed is the memory row r needs, in words.
func needed(r WhatIf) string {
	if r.CapacityNeeded == 0 {
		return "more than " + gpu.FormatBytes(replay.MaxCapacityNeeded)
	}
	if r.LowestThatRuns > 0 {
		// The edges are a step or two apart: in MiB, which limits are
		// whole multiples of, they read apart.
		mib := func(n uint64) string { return fmt.Sprintf("%d MiB", n>>20) }
		why := "under a lower limit the allocator gives its cached segments back sooner"
		if strings.Contains(r.AllocConf, "expandable_segments:True") {
			why = "the allocator asks a limit for whole segments"
		}
		return mib(r.CapacityNeeded) + " (it also runs under " + mib(r.LowestThatRuns) +
			" but not under " + mib(r.FailsAt) + ": " + why + ")"
	}
	return gpu.FormatBytes(r.CapacityNeeded)
}
