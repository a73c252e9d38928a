package incident

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
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
	// RoomAtOOM is, for each original OOM in order, the room this replay
	// had for the request when it refused it too (Need 0 when it served
	// it): the one rule, Room.Kind, reads it as the verdict does.
	RoomAtOOM []Room `json:"room_at_oom"`
	Err       string `json:"error"`
	// What says what the setting does, in words; NeededText the memory
	// needed as the page and the CLI print it.
	What       string `json:"what"`
	NeededText string `json:"needed_text"`
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
	// Under a memory fraction only (replay.Variant adds one where the run
	// had none).
	"garbage_collection_threshold:0.6",
	"roundup_power2_divisions:4",
}

// DefaultsVariant names the row of PyTorch's default settings, which a
// recording under other settings gets.
const DefaultsVariant = "the default settings"

// Table is the what-if answer for a request stream.
type Table struct {
	Capacity uint64 `json:"capacity_bytes"`
	// CapacityFrom says where the capacity came from ("inferred from 39
	// retries"), CapacitySource in a word.
	CapacityFrom   string                `json:"capacity_from"`
	CapacitySource replay.CapacitySource `json:"capacity_source"`
	Requests       int                   `json:"requests"`
	// Limit is the per-process limit the recording ran under, inferred
	// (nil when none): every row replays under it, and memory needed is
	// that limit's smallest value that works.
	Limit *replay.Limit `json:"limit,omitempty"`
	// LimitFrom says the limit and the evidence for it (replay.Limit's
	// String); empty without one.
	LimitFrom string `json:"limit_from,omitempty"`
	// LimitBytes is the per-process limit the recording ran under, the
	// inferred one (Limit) or the memory fraction its settings record of
	// its recorded device; 0: none.
	LimitBytes    uint64 `json:"limit_bytes,omitempty"`
	LimitInferred bool   `json:"limit_inferred,omitempty"`
	// DeviceText says the device the rows replayed on and where its size
	// came from, as the page prints it.
	DeviceText string `json:"device_text"`
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
	t := Table{Capacity: s.Capacity.Bytes, CapacityFrom: s.Capacity.From(), CapacitySource: s.Capacity.Source, Requests: len(s.Requests), OOMs: ooms, Rows: rows}
	if s.Limit.Bytes > 0 {
		t.Limit, t.LimitFrom = &s.Limit, s.Limit.String()
	}
	t.LimitBytes, t.LimitInferred = s.LimitBytes()
	t.DeviceText = deviceText(s.Capacity)
	for i := range t.Rows {
		t.Rows[i].NeededText = neededText(t.Rows[i], gpu.FormatBytes)
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
	whats := []string{"the settings the recording ran under"}
	seen := map[string]bool{orig.String(): true}
	add := func(label string, c caching.Config, what string) {
		if !seen[c.String()] {
			seen[c.String()] = true
			cfgs, labels, whats = append(cfgs, c), append(labels, label), append(whats, what)
		}
	}
	def := caching.DefaultConfig()
	def.Limit = orig.Limit
	if orig.MemoryFraction > 0 {
		// The run's limit, not a setting of the allocator's to undo.
		def.MemoryFraction = orig.MemoryFraction
	}
	add(DefaultsVariant, def, "PyTorch's defaults, under the same limit")
	for _, v := range variants {
		c, added, err := replay.Variant(orig, v)
		if err != nil {
			return nil, nil, fmt.Errorf("variant %q: %w", v, err)
		}
		add(v, c, does(v, c, added))
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
		rows[i].What = whats[i]
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
	w := WhatIf{OOMs: []OOMAt{}, FragmentationAtOOM: []float64{}, RoomAtOOM: []Room{}}
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
			l := a.Layout()
			w.FragmentationAtOOM = append(w.FragmentationAtOOM, l.Figures().Fragmentation)
			var room Room
			if ooms := p.OOMs(); len(ooms) > before && ooms[len(ooms)-1].Err != nil {
				e := ooms[len(ooms)-1].Err
				var low uint64
				if s.Limit.Bytes > 0 && e.Allowed == s.Limit.Bytes {
					low = s.Limit.Low // inferred: known only between the two
				}
				room = RoomOf(l, e.Rounded, e.DeviceFree, e.Allowed, low)
			}
			w.RoomAtOOM = append(w.RoomAtOOM, room)
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
	// Kind is Room.Kind of the replay under the recorded settings at this
	// request, the rule the verdict applies to the recording ("" when that
	// replay served it).
	Kind string `json:"kind"`
	// ServedBy are the variants that served the request.
	ServedBy []string `json:"served_by"`
	// Fix names the setting that served the request and needs the least
	// memory, with that memory against the limit or device the run had;
	// else says that none did.
	Fix string `json:"fix"`
	// Sentences say the rest: "expandable_segments:True would have
	// served this request.", then what the run needs (Table.Needed).
	Sentences []string `json:"sentences"`
}

// ForOOM reads the table for original OOM k; ok is false when there is
// no such OOM.
func (t Table) ForOOM(k int) (f ForOOM, ok bool) {
	if k < 0 || k >= len(t.OOMs) {
		return f, false
	}
	f = ForOOM{Index: t.OOMs[k].Index, Size: t.OOMs[k].Size, ServedBy: []string{}}
	if rooms := t.Rows[0].RoomAtOOM; k < len(rooms) && rooms[k].Need > 0 {
		f.Kind = rooms[k].Kind()
	}
	best := -1
	for i, r := range t.Rows[1:] {
		if r.Serves(f.Index) {
			f.ServedBy = append(f.ServedBy, r.Variant)
			f.Sentences = append(f.Sentences, r.Variant+" would have served this request.")
			if r.CapacityNeeded > 0 && (best < 0 || r.CapacityNeeded < t.Rows[best].CapacityNeeded) {
				best = i + 1
			}
		}
	}
	switch {
	case best > 0:
		f.Fix = t.fix(t.Rows[best])
	case len(f.ServedBy) > 0:
		f.Fix = "Each setting that serves this request runs out of memory later, on every device tried."
	case f.Kind == KindShortage:
		f.Fix = "No setting serves this request: less must be allocated by then (a smaller batch, activation checkpointing), or more memory allowed"
		if orig := t.Rows[0]; orig.CapacityNeeded > 0 && orig.LowestThatRuns == 0 {
			allowed, what := t.allowed()
			need, has := gpu.FormatApart(gpu.FormatBytes, orig.CapacityNeeded, allowed)
			f.Fix += "; the whole run needs " + need + " with the recorded settings, against the " + has + " " + what
		}
		f.Fix += "."
	default:
		f.Fix = "None of the settings tried would have served this request."
	}
	if len(f.ServedBy) == 0 {
		f.Sentences = append(f.Sentences, "None of the settings tried would have served this request.")
	}
	if n := t.Needed(); n != "" {
		f.Sentences = append(f.Sentences, n)
	}
	return f, true
}

// fix names row r's setting and the memory the run needs with it, against
// what the recording allowed: "Set PYTORCH_CUDA_ALLOC_CONF=
// expandable_segments:True: it serves this request, and the whole run
// needs 5.51 GiB with it, less than the 6.26 GiB limit it ran under."
func (t Table) fix(r WhatIf) string {
	set := "Set PYTORCH_CUDA_ALLOC_CONF=" + r.AllocConf
	if r.AllocConf == "" {
		set = "Run with PyTorch's default settings"
	}
	format := gpu.FormatBytes
	if r.LowestThatRuns > 0 {
		format = gpu.FormatMiB
	}
	s := set + ": it serves this request, and the whole run needs "
	edge := ""
	if r.LowestThatRuns > 0 {
		edge = " (it also runs under " + gpu.FormatMiB(r.LowestThatRuns) + " but not under " + gpu.FormatMiB(r.FailsAt) + ")"
	}
	if t.LimitInferred && t.Limit != nil {
		// Only bounds are known: say where the memory needed falls.
		low, high := t.Limit.Low, t.LimitBytes
		need, hi := gpu.FormatApart(format, r.CapacityNeeded, high)
		lo := format(low)
		switch {
		case r.CapacityNeeded <= low:
			s += need + " with it" + edge + ": less than the limit can have been (it was between " + lo + " and " + hi + ", inferred)"
		case r.CapacityNeeded > high:
			s += need + " with it" + edge + ", more than the limit can have been (under " + hi + "), so it fails later unless less is allocated or more allowed"
		default:
			s += need + " with it" + edge + ": it runs if your limit is at least that (the recording's was between " + lo + " and " + hi + ", inferred)"
		}
	} else {
		allowed, what := t.allowed()
		need, has := gpu.FormatApart(format, r.CapacityNeeded, allowed)
		s += need + " with it" + edge
		if r.CapacityNeeded <= allowed {
			s += ", less than the " + has + " " + what
		} else {
			s += ", more than the " + has + " " + what + ", so it fails later unless less is allocated or more allowed"
		}
	}
	if t.EndsAtOOM {
		s += ", as far as the recording goes"
	}
	return s + "."
}

// allowed is what the recording's allocator could reserve, and what that
// is in words: its per-process limit, else its device, else what it could
// have had at its OOM.
func (t Table) allowed() (uint64, string) {
	switch {
	case t.LimitBytes > 0 && t.LimitInferred:
		return t.LimitBytes, "limit it ran under (inferred)"
	case t.LimitBytes > 0:
		return t.LimitBytes, "limit it ran under"
	case t.CapacitySource == replay.CapacityRecorded:
		return t.Capacity, "device"
	case t.CapacitySource == replay.CapacityOOM:
		return t.Capacity, "this allocator could have had at the OOM (reserved plus free)"
	}
	return t.Capacity, "device it replayed on"
}

// Needed says what the whole run needs without an OOM: under the recorded
// settings, and under the variant that needs the least when it needs less,
// in one unit; then what the recording ran under: "Needs 63.40 GiB with
// the recorded settings, 58.10 GiB with expandable_segments:True (as a
// per-process limit). The device has 80.00 GiB." Empty when the table has
// no rows.
func (t Table) Needed() string {
	if len(t.Rows) == 0 {
		return ""
	}
	orig := t.Rows[0]
	best := -1
	for i, r := range t.Rows[1:] {
		if r.Err == "" && r.CapacityNeeded > 0 && (orig.CapacityNeeded == 0 || r.CapacityNeeded < orig.CapacityNeeded) &&
			(best < 0 || r.CapacityNeeded < t.Rows[best].CapacityNeeded) {
			best = i + 1
		}
	}
	// One unit in a sentence: MiB when an edge two MiB wide is in it.
	format := gpu.FormatBytes
	if orig.LowestThatRuns > 0 || best > 0 && t.Rows[best].LowestThatRuns > 0 {
		format = gpu.FormatMiB
	}
	s := "Needs " + neededText(orig, format) + " with the recorded settings"
	if best > 0 {
		a, b := orig.CapacityNeeded, t.Rows[best].CapacityNeeded
		if orig.LowestThatRuns == 0 && t.Rows[best].LowestThatRuns == 0 && a > 0 {
			// The two figures apart where they would print alike.
			fa, fb := gpu.FormatApart(format, a, b)
			s = "Needs " + fa + " with the recorded settings, " + fb + " with " + t.Rows[best].Variant
		} else {
			s += ", " + neededText(t.Rows[best], format) + " with " + t.Rows[best].Variant
		}
	} else {
		s += "; no setting tried needs less"
	}
	s += " (as a per-process limit)."
	if t.LimitBytes > 0 && orig.CapacityNeeded > 0 {
		need, limit := gpu.FormatApart(format, orig.CapacityNeeded, t.LimitBytes)
		inferred := ""
		if t.LimitInferred {
			inferred = " (inferred)"
		}
		rel := "more than the "
		switch {
		case orig.CapacityNeeded < t.LimitBytes:
			rel = "less than the "
		case orig.CapacityNeeded == t.LimitBytes:
			rel = "exactly the "
		}
		s += " The recording ran under a per-process limit of " + limit + inferred + ": the recorded settings need " + need + ", " + rel + "limit."
	}
	if t.DeviceText != "" {
		s += " Replayed on " + t.DeviceText + "."
	}
	if t.EndsAtOOM {
		s += fmt.Sprintf(" The recording ends at its OOM: these figures cover the %d requests it holds, not what the job would have asked after it.", t.Requests)
	}
	return s
}

// deviceText says the device a stream replays on: "a simulated device of
// 21.01 GiB, inferred from 39 retries (…)", or the recorded one.
func deviceText(c replay.Capacity) string {
	if c.Source == replay.CapacityRecorded {
		return "the recorded device of " + gpu.FormatBytes(c.Bytes)
	}
	return "a simulated device of " + gpu.FormatBytes(c.Bytes) + ", " + c.From()
}

// NeededFirst is what Needed says while only the recorded settings' row,
// orig, is done.
func NeededFirst(orig WhatIf, device string) string {
	return "Needs " + neededText(orig, gpu.FormatBytes) + " with the recorded settings (as a per-process limit), replayed on " + device +
		"; the replays under other settings are still running."
}

// neededText is the memory row r needs, in words, in format's unit; an
// edge two MiB wide always in MiB.
func neededText(r WhatIf, format func(uint64) string) string {
	if r.CapacityNeeded == 0 {
		return "more than " + format(replay.MaxCapacityNeeded)
	}
	if r.LowestThatRuns > 0 {
		why := "under a lower limit the allocator gives its cached segments back sooner"
		if strings.Contains(r.AllocConf, "expandable_segments:True") {
			why = "the allocator asks a limit for whole segments"
		}
		return gpu.FormatMiB(r.CapacityNeeded) + " (it also runs under " + gpu.FormatMiB(r.LowestThatRuns) +
			" but not under " + gpu.FormatMiB(r.FailsAt) + ": " + why + ")"
	}
	return format(r.CapacityNeeded)
}

// does says what what-if setting v does, set as c (added: replay.Variant
// added a memory fraction for it), in words.
func does(v string, c caching.Config, added bool) string {
	var says []string
	for _, item := range strings.Split(v, ",") {
		key, _, _ := strings.Cut(strings.TrimSpace(item), ":")
		switch key {
		case "expandable_segments":
			if c.Expandable {
				says = append(says, "segments grow in place, so freed and never reserved memory join into one piece")
			}
		case "max_split_size_mb":
			says = append(says, "blocks over "+gpu.FormatMiB(c.MaxSplitSize)+" are never split, so large free blocks stay whole")
		case "garbage_collection_threshold":
			pct := strconv.FormatFloat(100*c.GarbageCollectionThreshold, 'f', -1, 64) + " %"
			if added {
				says = append(says, "garbage collection: cached blocks are given back once "+pct+" of the device is reserved "+
					"(per_process_memory_fraction:1 only turns it on, as PyTorch collects only under a fraction; it sets no limit)")
			} else {
				says = append(says, "garbage collection: cached blocks are given back once "+pct+" of the limit is reserved")
			}
		case "roundup_power2_divisions":
			says = append(says, "sizes round up to one of a few steps between powers of two, so freed blocks fit later requests")
		}
	}
	return strings.Join(says, "; ")
}
