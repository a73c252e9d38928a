package caching

import (
	"fmt"
	"strings"
)

// Stat is one of PyTorch's counters: current value, its peak, and the
// cumulative increases and decreases.
type Stat struct {
	Current, Peak, Allocated, Freed int64
}

func (s *Stat) increase(n int64) {
	s.Current += n
	s.Allocated += n
	if s.Current > s.Peak {
		s.Peak = s.Current
	}
}

func (s *Stat) decrease(n int64) {
	s.Current -= n
	s.Freed += n
}

// StatArray holds a stat for all pools, the small pool and the large pool.
type StatArray [3]Stat

const (
	statAll = iota
	statSmall
	statLarge
)

func (a *StatArray) increase(pool int, n int64) {
	a[statAll].increase(n)
	a[pool].increase(n)
}

func (a *StatArray) decrease(pool int, n int64) {
	a[statAll].decrease(n)
	a[pool].decrease(n)
}

// change increases or decreases by n's sign.
func (a *StatArray) change(pool int, n int64) {
	if n > 0 {
		a.increase(pool, n)
	} else if n < 0 {
		a.decrease(pool, -n)
	}
}

// Stats is DeviceStats: what torch.cuda.memory_stats() reports.
type Stats struct {
	Allocation         StatArray
	Segment            StatArray
	Active             StatArray
	InactiveSplit      StatArray
	AllocatedBytes     StatArray
	ReservedBytes      StatArray
	ActiveBytes        StatArray
	InactiveSplitBytes StatArray
	RequestedBytes     StatArray

	NumAllocRetries   int64
	NumOOMs           int64
	NumSyncAllStreams int64
	NumDeviceAlloc    int64
	NumDeviceFree     int64

	OversizeAllocations Stat
	OversizeSegments    Stat

	// MaxSplitSize is -1 when unlimited, as PyTorch reports it.
	MaxSplitSize int64
}

// each calls fn with every Stat and its memory_stats() name.
func (s *Stats) each(fn func(name string, st *Stat)) {
	arrays := []struct {
		name string
		a    *StatArray
	}{
		{"allocation", &s.Allocation}, {"segment", &s.Segment}, {"active", &s.Active},
		{"inactive_split", &s.InactiveSplit}, {"allocated_bytes", &s.AllocatedBytes},
		{"reserved_bytes", &s.ReservedBytes}, {"active_bytes", &s.ActiveBytes},
		{"inactive_split_bytes", &s.InactiveSplitBytes}, {"requested_bytes", &s.RequestedBytes},
	}
	for _, arr := range arrays {
		for i, pool := range []string{"all", "small_pool", "large_pool"} {
			fn(arr.name+"."+pool, &arr.a[i])
		}
	}
	fn("oversize_allocations", &s.OversizeAllocations)
	fn("oversize_segments", &s.OversizeSegments)
}

// resetPeaks sets every peak to its current value, as
// torch.cuda.reset_peak_memory_stats() does.
func (s *Stats) resetPeaks() {
	s.each(func(_ string, st *Stat) { st.Peak = st.Current })
}

// resetAccumulated zeroes the cumulative counts (allocated, freed, retries,
// OOMs, device calls), as torch.cuda.reset_accumulated_memory_stats() does.
func (s *Stats) resetAccumulated() {
	s.each(func(_ string, st *Stat) { st.Allocated, st.Freed = 0, 0 })
	s.NumAllocRetries, s.NumOOMs, s.NumSyncAllStreams, s.NumDeviceAlloc, s.NumDeviceFree = 0, 0, 0, 0, 0
}

// Flat returns memory_stats(): the nested stats flattened with "." keys.
func (s *Stats) Flat() map[string]int64 {
	m := make(map[string]int64, 128)
	s.each(func(name string, st *Stat) {
		m[name+".current"] = st.Current
		m[name+".peak"] = st.Peak
		m[name+".allocated"] = st.Allocated
		m[name+".freed"] = st.Freed
	})
	m["num_alloc_retries"] = s.NumAllocRetries
	m["num_ooms"] = s.NumOOMs
	m["max_split_size"] = s.MaxSplitSize
	m["num_sync_all_streams"] = s.NumSyncAllStreams
	m["num_device_alloc"] = s.NumDeviceAlloc
	m["num_device_free"] = s.NumDeviceFree
	return m
}

// FormatSize is PyTorch's format_size, used in OOM messages.
func FormatSize(n uint64) string {
	switch {
	case n <= 1024:
		return fmt.Sprintf("%d bytes", n)
	case n <= 1<<20:
		return fmt.Sprintf("%.2f KiB", float64(n)/1024)
	case n <= 1<<30:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
}

// Summary renders memory_summary(device, abbreviated) exactly as PyTorch's
// torch.cuda.memory_summary lays it out.
func (s *Stats) Summary(device int, abbreviated bool) string {
	var lines []string
	add := func(l string) { lines = append(lines, l) }
	add(strings.Repeat("=", 75))
	add(fmt.Sprintf(" %16s PyTorch CUDA memory summary, device ID %-17d ", "", device))
	add(strings.Repeat("-", 75))
	add(fmt.Sprintf("  %9s CUDA OOMs: %-12d | %6s cudaMalloc retries: %-8d  ", "", s.NumOOMs, "", s.NumAllocRetries))
	add(strings.Repeat("=", 75))
	add("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ")

	type metric struct {
		a      *StatArray
		name   string
		format func(v, ref int64) string
	}
	metrics := []metric{
		{&s.AllocatedBytes, "Allocated memory", formatSizeCell},
		{&s.ActiveBytes, "Active memory", formatSizeCell},
		{&s.RequestedBytes, "Requested memory", formatSizeCell},
		{&s.ReservedBytes, "GPU reserved memory", formatSizeCell},
		{&s.InactiveSplitBytes, "Non-releasable memory", formatSizeCell},
		{&s.Allocation, "Allocations", formatCountCell},
		{&s.Active, "Active allocs", formatCountCell},
		{&s.Segment, "GPU reserved segments", formatCountCell},
		{&s.InactiveSplit, "Non-releasable allocs", formatCountCell},
	}
	row := func(name string, st, ref *Stat, f func(v, ref int64) string) string {
		return fmt.Sprintf(" %-21s | %s | %s | %s | %s ", name,
			f(st.Current, ref.Current), f(st.Peak, ref.Peak), f(st.Allocated, ref.Allocated), f(st.Freed, ref.Freed))
	}
	for _, m := range metrics {
		add(strings.Repeat("-", 75))
		all := &m.a[statAll]
		add(row(m.name, all, all, m.format))
		if !abbreviated {
			add(row("      from large pool", &m.a[statLarge], all, m.format))
			add(row("      from small pool", &m.a[statSmall], all, m.format))
		}
	}
	add(strings.Repeat("-", 75))
	add(row("Oversize allocations", &s.OversizeAllocations, &s.OversizeAllocations, formatCountCell))
	add(strings.Repeat("-", 75))
	add(row("Oversize GPU segments", &s.OversizeSegments, &s.OversizeSegments, formatCountCell))
	add(strings.Repeat("=", 75))
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("|" + l + "|\n")
	}
	return b.String()
}

// formatSizeCell is memory_summary's _format_size: the unit follows the
// reference (the all-pools value of the same column).
func formatSizeCell(v, ref int64) string {
	units := []string{"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"}
	r := float64(ref)
	u := 0
	for ; u < len(units)-1; u++ {
		if r < 768*1024 {
			break
		}
		r /= 1024
		v = floorDiv(v, 1024)
	}
	return fmt.Sprintf("%6d %s", v, units[u])
}

// formatCountCell is memory_summary's _format_count.
func formatCountCell(v, ref int64) string {
	prefixes := []string{" ", "K", "M"}
	r := float64(ref)
	p := 0
	for ; p < len(prefixes)-1; p++ {
		if r < 750*1000 {
			break
		}
		r /= 1000
		v = floorDiv(v, 1000)
	}
	return fmt.Sprintf("%7d %s ", v, prefixes[p])
}

// floorDiv divides as Python's // does.
func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}
