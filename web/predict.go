package web

import (
	"fmt"
	"strconv"
	"strings"

	"vramscope/gpu"
	"vramscope/predict"
	"vramscope/replay"
)

func recordedMark(r *predict.Result, at int) string {
	for _, n := range r.Recordings {
		if n.At == at {
			return " (recorded)"
		}
	}
	return ""
}

func neededText(n uint64) string {
	if n == 0 {
		return "more than " + gpu.FormatBytes(replay.MaxCapacityNeeded)
	}
	return gpu.FormatBytes(n)
}

// LeastWhatIf is the setting that needs the least, when less than the
// recorded ones.
func LeastWhatIf(p predict.Prediction) string {
	best := -1
	for i, n := range p.WhatIf {
		if n.Err == "" && n.CapacityNeeded > 0 && (p.CapacityNeeded == 0 || n.CapacityNeeded < p.CapacityNeeded) &&
			(best < 0 || n.CapacityNeeded < p.WhatIf[best].CapacityNeeded) {
			best = i
		}
	}
	if best < 0 {
		return "none needs less"
	}
	return gpu.FormatBytes(p.WhatIf[best].CapacityNeeded) + " with " + p.WhatIf[best].Variant
}

func largestSentence(r *predict.Result) string {
	device := gpu.FormatBytes(r.Capacity) + " (" + r.CapacityFrom + ")"
	switch r.Largest {
	case predict.Unbounded:
		return "Any batch size fits " + device + ": nothing the job asks for grows with it."
	case 0:
		return "No batch size fits " + device + ", not even 1."
	}
	return fmt.Sprintf("The largest batch that fits %s: %d.", device, r.Largest)
}

func largestText(l predict.Largest) string {
	switch {
	case l.Err != "":
		return l.Err
	case l.At == predict.Unbounded:
		return "any batch size"
	case l.At == 0:
		return "none"
	}
	return fmt.Sprintf("batch %d", l.At)
}

// StackWhere names a stack by its first frames of Python or named C++.
func StackWhere(s gpu.Stack) string {
	var parts []string
	for _, f := range s {
		if len(parts) == 3 {
			parts = append(parts, "…")
			break
		}
		if f.Filename == "??" || strings.Contains(f.Name, "CUDACachingAllocator") {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %s:%d", f.Name, f.Filename, f.Line))
	}
	if len(parts) == 0 {
		if len(s) == 0 {
			return "(no frames)"
		}
		return s[0].Name
	}
	return strings.Join(parts, " < ")
}

// PredictDefaults fills the Predict form from what the traces' names say
// of their batch sizes ("gpt batch 8").
func PredictDefaults(a, b gpu.Trace) PredictQuery {
	var q PredictQuery
	if n, _, ok := predict.BatchInName(a.Name); ok {
		q.BatchA = strconv.Itoa(n)
	}
	if n, _, ok := predict.BatchInName(b.Name); ok {
		q.BatchB = strconv.Itoa(n)
	}
	return q
}

// devicePlaceholder is the Predict form's hint of the device the largest
// batch fits when none is given: A's as recorded, else what the fit
// takes (what A's OOM implies, or a default), never a size A lacks.
func devicePlaceholder(a gpu.Trace) string {
	if a.Capacity > 0 {
		return "A's: " + gpu.FormatBytes(a.Capacity)
	}
	if a.OOMs > 0 {
		return "what A's OOM implies"
	}
	return "A's unknown: " + gpu.FormatBytes(replay.DefaultCapacity)
}
