package web

import (
	"fmt"
	"net/url"
	"strconv"

	"vramscope/gpu"
)

// Listing is one page of the trace list with the query that picked it:
// filters (name, source, status), order (sort, asc) and page (from 1).
type Listing struct {
	Traces []gpu.Trace
	Runs   map[string]RunRow // by the id of the trace a run is listed as
	// Same names, for a trace listed, the trace stored before it that
	// holds the same recording (SameRecording): one file uploaded twice.
	Same   map[string]string
	Total  int
	Page   int
	Per    int
	Name   string
	Source string
	Status string
	Sort   string // "" for newest first
	Asc    bool
}

// Pages is how many pages the picked traces fill.
func (l Listing) Pages() int { return max(1, (l.Total+l.Per-1)/l.Per) }

// Range says which traces the page shows, as "51–100 of 5,012".
func (l Listing) Range() string {
	if l.Total == 0 {
		return "no traces"
	}
	if len(l.Traces) == 0 {
		return fmt.Sprintf("none of %d", l.Total)
	}
	first := (l.Page-1)*l.Per + 1
	return fmt.Sprintf("%d–%d of %d", first, first+len(l.Traces)-1, l.Total)
}

// url is the list's address with the query changed by set.
func (l Listing) url(set func(url.Values)) string {
	v := url.Values{}
	for k, s := range map[string]string{"name": l.Name, "source": l.Source, "status": l.Status, "sort": l.Sort} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if l.Asc {
		v.Set("order", "asc")
	}
	if l.Page > 1 {
		v.Set("page", strconv.Itoa(l.Page))
	}
	set(v)
	if len(v) == 0 {
		return "/"
	}
	return "/?" + v.Encode()
}

// PageURL is the address of page n.
func (l Listing) PageURL(n int) string {
	return l.url(func(v url.Values) {
		v.Del("page")
		if n > 1 {
			v.Set("page", strconv.Itoa(n))
		}
	})
}

// SortURL is the address sorted by key: the other way round when it is
// the order already, else descending for figures and ascending for words.
func (l Listing) SortURL(key string) string {
	asc := key == "name" || key == "source" || key == "status"
	if l.Sort == key {
		asc = !l.Asc
	}
	return l.url(func(v url.Values) {
		v.Del("page")
		v.Set("sort", key)
		v.Del("order")
		if asc {
			v.Set("order", "asc")
		}
	})
}

// SortMark is the arrow after a column sorted by key.
func (l Listing) SortMark(key string) string {
	switch {
	case l.Sort != key:
		return ""
	case l.Asc:
		return " ▲"
	}
	return " ▼"
}

// AriaSort is the aria-sort of the column sorted by key.
func (l Listing) AriaSort(key string) string {
	switch {
	case l.Sort != key:
		return "none"
	case l.Asc:
		return "ascending"
	}
	return "descending"
}

// Sources and Statuses are the choices of the list's filters.
var (
	Sources  = []gpu.TraceSource{gpu.SourceTrace, gpu.SourceSnapshot, gpu.SourceLive, gpu.SourceReplay, gpu.SourceEstimate}
	Statuses = []gpu.TraceStatus{gpu.StatusLive, gpu.StatusComplete, gpu.StatusIncomplete, gpu.StatusFailed}
)

// RunRow is a run as one row of the list: its ranks folded under it, its
// peaks the highest of any rank's, its OOMs the sum of theirs.
type RunRow struct {
	Run                         gpu.Run
	Worst                       gpu.Trace // the trace listed for it: the one that peaked highest
	WorstRank                   int
	PeakReserved, PeakAllocated uint64
	OOMs                        int64
	FirstOOM                    string // the id of a trace that ran out of memory, "" for none
	Traces                      int
	Live                        bool  // a rank still streams
	Events                      int64 // the events of its ranks' traces
}

// NewRunRow sums up run, listed as its trace worst.
func NewRunRow(run gpu.Run, worst gpu.Trace) RunRow {
	row := RunRow{Run: run, Worst: worst}
	for _, rk := range run.Ranks {
		for _, t := range rk.Traces {
			row.Traces++
			row.PeakReserved = max(row.PeakReserved, t.PeakReserved)
			row.PeakAllocated = max(row.PeakAllocated, t.PeakAllocated)
			row.OOMs += t.OOMs
			row.Events += t.Events
			row.Live = row.Live || t.Status == gpu.StatusLive
			if t.OOMs > 0 && row.FirstOOM == "" {
				row.FirstOOM = t.ID
			}
			if t.ID == worst.ID {
				row.WorstRank = rk.Rank
			}
		}
	}
	return row
}

// SameRecording maps each snapshot's trace of ts that repeats an earlier
// one of ts (the same device, events, first and last times, peaks and
// OOMs: one file uploaded twice) to the id of the earliest stored.
// Recorded workloads are left out: a simulated run repeats itself.
func SameRecording(ts []gpu.Trace) map[string]string {
	type print struct {
		source                      gpu.TraceSource
		device                      int
		events, firstUS, lastUS     int64
		peakAllocated, peakReserved uint64
		ooms                        int64
	}
	key := func(t gpu.Trace) print {
		return print{t.Source, t.DeviceOrdinal, t.Events, t.FirstUS, t.LastUS, t.PeakAllocated, t.PeakReserved, t.OOMs}
	}
	first := map[print]gpu.Trace{}
	for _, t := range ts {
		if f, ok := first[key(t)]; t.Source == gpu.SourceSnapshot && (!ok || t.Created.Before(f.Created)) {
			first[key(t)] = t
		}
	}
	out := map[string]string{}
	for _, t := range ts {
		if f, ok := first[key(t)]; ok && f.ID != t.ID && t.Source == gpu.SourceSnapshot {
			out[t.ID] = f.ID
		}
	}
	return out
}
