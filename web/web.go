// Package web renders vramscope's pages as templ components. The pages are
// frames: the data comes from the JSON API, fetched per viewport by the
// modules in static/.
package web

//go:generate go tool templ generate

import (
	"fmt"
	"strconv"

	"vramscope/gpu"
)

// Bytes renders a size in binary units.
func Bytes(n uint64) string { return gpu.FormatBytes(n) }

// Duration renders microseconds as the largest fitting unit.
func Duration(us int64) string { return gpu.FormatDuration(us) }

// TraceDuration is how long a trace ran. A snapshot without time_us
// counts events instead (its times are event indexes), and one of no
// events ran no time.
func TraceDuration(t gpu.Trace) string {
	switch {
	case t.Events == 0:
		return "–"
	case t.NoTime:
		return fmt.Sprintf("%d %s", t.Events, plural(int(t.Events), "event", "events"))
	}
	return Duration(t.LastUS - t.FirstUS)
}

// DeviceOrdinal is ", cuda:N" after a device name that does not say it.
func DeviceOrdinal(t gpu.Trace) string {
	if o := "cuda:" + itoa(t.DeviceOrdinal); t.DeviceName != o {
		return o
	}
	return ""
}

// oomWhen says where in trace t incident in happened; a trace without
// times has its event alone.
func oomWhen(t gpu.Trace, in gpu.Incident) string {
	s := fmt.Sprintf("out of memory at event %d", in.Seq)
	if !t.NoTime {
		s += ", " + Duration(in.TimeUS-t.FirstUS) + " into the trace"
	}
	return s
}

func itoa(n int) string { return strconv.Itoa(n) }

// plural picks one or many by n.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
func i64(n int64) string  { return strconv.FormatInt(n, 10) }
func u64(n uint64) string { return strconv.FormatUint(n, 10) }

func boolAttr(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// lostSummary is the one line a live trace's lost entries get.
func lostSummary(d *gpu.Dropped) string {
	s := "Entries of the job were lost in " + plural(d.GapCount, "1 gap", strconv.Itoa(d.GapCount)+" gaps")
	if d.Lost > 0 {
		s += ": " + groupDigits(d.Lost) + " known"
	}
	return s + "."
}

// lostCount says how many entries one gap lost.
func lostCount(n int64) string {
	if n < 0 {
		return "entries lost, how many unknown"
	}
	return "about " + groupDigits(n) + " entries lost"
}

// groupDigits writes n with a comma between thousands: 92,081.
func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
