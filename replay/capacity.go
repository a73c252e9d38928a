package replay

import (
	"fmt"

	"vramscope/gpu"
)

// CapacitySource says where a stream's device capacity came from.
type CapacitySource string

const (
	CapacityUnknown  CapacitySource = ""
	CapacityRecorded CapacitySource = "recorded" // the trace kept its device's capacity
	// the device a CPU estimate was made for, less what lies outside the allocator
	CapacityEstimated CapacitySource = "estimate"
	CapacityOOM       CapacitySource = "oom"     // reserved + device free at the first oom entry
	CapacityRetries   CapacitySource = "retries" // the bounds the free-and-retry paths imply
	// the most the reservations for expandable segments leave room for
	CapacityReservations CapacitySource = "reservations"
	CapacityGiven        CapacitySource = "given"   // asked for (--capacity)
	CapacityDefault      CapacitySource = "default" // nothing said: a default
)

// DefaultCapacity is the device a replay runs on when nothing says: an
// 80 GiB card such as the A100 or H100.
const DefaultCapacity = 80 << 30

// Capacity is the device memory a stream replays on, and why.
type Capacity struct {
	Bytes  uint64         `json:"bytes"`
	Source CapacitySource `json:"source"`
	// OOMSeq is the oom event the capacity was read from (CapacityOOM).
	OOMSeq int64 `json:"oom_seq,omitempty"`
	// Retries counts the free-and-retry paths, and Low and High are the
	// bounds they and the recording's peak reservation imply
	// (CapacityRetries); Bytes is one of them or between.
	Retries int    `json:"retries,omitempty"`
	Low     uint64 `json:"low,omitempty"`
	High    uint64 `json:"high,omitempty"`
	// Implied is what the recording implies when a given or default
	// capacity replaced it (0 when it implies nothing).
	Implied uint64 `json:"implied,omitempty"`
	// PeakReserved is the most the recording reserved: a device with less
	// cannot replay it as it ran.
	PeakReserved uint64 `json:"peak_reserved,omitempty"`
}

// String says the capacity and where it came from: "capacity 20.97 GiB,
// inferred from 39 retries (between 20.97 GiB and 21.01 GiB)".
func (c Capacity) String() string {
	if c.Source == CapacityUnknown {
		return "capacity unknown"
	}
	return "capacity " + gpu.FormatBytes(c.Bytes) + ", " + c.From()
}

// From says where the capacity came from.
func (c Capacity) From() string {
	var s string
	switch c.Source {
	case CapacityRecorded:
		return "recorded with the trace"
	case CapacityEstimated:
		return "the device the estimate was made for, less the CUDA context"
	case CapacityOOM:
		// Not the card: what the allocator could have had then.
		return fmt.Sprintf("inferred from the OOM at event %d, what this allocator had then: reserved plus free on the device; the recording does not say the device's size", c.OOMSeq)
	case CapacityRetries:
		return fmt.Sprintf("inferred from %d %s (between %s and %s)", c.Retries, plural(c.Retries, "retry", "retries"),
			gpu.FormatBytes(c.Low), gpu.FormatBytes(c.High))
	case CapacityReservations:
		return "the most the address space reserved for expandable segments leaves room for"
	case CapacityGiven:
		s = "as given"
	case CapacityDefault:
		s = "a default: the recording does not say"
	default:
		return "unknown"
	}
	if c.Implied > 0 {
		return s + " (the recording implies " + gpu.FormatBytes(c.Implied) + ")"
	}
	if c.PeakReserved > c.Bytes {
		return s + " (less than the " + gpu.FormatBytes(c.PeakReserved) + " the recording reserved)"
	}
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// Use settles the capacity of s: given (a --capacity flag) when it is not
// 0, else what the recording says or implies, else fallback.
func (s *Stream) Use(given, fallback uint64) {
	c := &s.Capacity
	switch {
	case given > 0:
		*c = Capacity{Bytes: given, Source: CapacityGiven, Implied: c.Bytes, PeakReserved: c.PeakReserved}
	case c.Bytes == 0:
		*c = Capacity{Bytes: fallback, Source: CapacityDefault, PeakReserved: c.PeakReserved}
	}
}

// EstimateCapacity reads a device's capacity from a recording that lacks
// it (PyTorch snapshots do): at the first OOM, what the allocator held plus
// what the driver had free. ok is false without an OOM.
func EstimateCapacity(initial *gpu.Layout, events []gpu.Event) (capacity uint64, ok bool) {
	c := inferRuns(initial, events, runContext{rules: gpu.DefaultRules()}).capacity
	return c.Bytes, c.Source == CapacityOOM
}

// Limit is a per-process limit on what the allocator may reserve
// (torch.cuda.set_per_process_memory_fraction, or the
// per_process_memory_fraction setting) that a recording implies but does
// not record: an OOM while the device itself had the memory asked for.
type Limit struct {
	Bytes uint64 `json:"bytes"` // the limit replayed: High
	// Low is the most the recording reserved (at event LowSeq): the limit
	// allowed it.
	Low    uint64 `json:"low"`
	LowSeq int64  `json:"low_seq"`
	// High is the most the limit can be: the OOM at event HighSeq asked
	// for Asked bytes with Reserved held, and was refused while the
	// device had DeviceFree free; Retries free-and-retry paths may have
	// lowered it further.
	High       uint64 `json:"high"`
	HighSeq    int64  `json:"high_seq"`
	Asked      uint64 `json:"asked"`
	Reserved   uint64 `json:"reserved"`
	DeviceFree uint64 `json:"device_free"`
	Retries    int    `json:"retries,omitempty"`
}

// String says the limit and the evidence for it.
func (l Limit) String() string {
	if l.Bytes == 0 {
		return "no per-process limit"
	}
	at := ""
	if l.LowSeq >= 0 {
		at = fmt.Sprintf(" (event %d)", l.LowSeq)
	}
	s := fmt.Sprintf("a per-process limit of %s, inferred: the recording reserved %s%s, so the limit was at least that; "+
		"the OOM at event %d asked for a %s segment with %s reserved while the device itself had %s free, so the limit was under %s",
		gpu.FormatBytes(l.Bytes), gpu.FormatBytes(l.Low), at, l.HighSeq, gpu.FormatBytes(l.Asked),
		gpu.FormatBytes(l.Reserved), gpu.FormatBytes(l.DeviceFree), gpu.FormatBytes(l.Reserved+l.Asked))
	if l.Retries > 0 {
		s += fmt.Sprintf(" (%d free-and-retry %s bound it further)", l.Retries, plural(l.Retries, "path", "paths"))
	}
	return s
}
