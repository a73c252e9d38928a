package attrib

import (
	"regexp"
	"sort"
	"strconv"
	"strings"

	"vramscope/gpu"
)

// Region is a span of a trace that START and END annotations mark: a
// record_function or profiler region of PyTorch (ProfilerStep#N,
// Optimizer.step#AdamW.step, a dynamo frame), or a workload's step or
// phase.
type Region struct {
	Name    string `json:"name"`
	StartUS int64  `json:"start_us"`
	EndUS   int64  `json:"end_us"`
	// Open says that no END came: the region runs to the trace's end.
	Open  bool `json:"open,omitempty"`
	Depth int  `json:"depth"` // regions open around it when it began
	// Step is N for a training step ("ProfilerStep#N", "step N"), -1 for
	// other regions.
	Step  int   `json:"step"`
	Phase Phase `json:"phase,omitempty"`
}

// Phase is the part of a training step a region is, read from its name.
type Phase string

const (
	PhaseForward   Phase = "forward"
	PhaseBackward  Phase = "backward"
	PhaseOptimizer Phase = "optimizer" // Optimizer.step#...: PyTorch's optimizers name it so
	PhaseZeroGrad  Phase = "zero_grad"
	// PhaseCommunication: a process group's collective (gloo:all_reduce,
	// nccl:all_gather, c10d::broadcast_).
	PhaseCommunication Phase = "communication"
)

// stepName reads a step number from a region's name: PyTorch profiler's
// ProfilerStep#N, or "step N" / "train_step#N" and the like.
var stepName = regexp.MustCompile(`(?i)^(?:ProfilerStep#|(?:train[_ ]?)?step[ _#:-]?)(\d+)$`)

// stepOf is the step a region's name says, or -1.
func stepOf(name string) int {
	if n, ok := strings.CutPrefix(name, "ProfilerStep#"); ok { // the usual name, read without the regexp
		if v, err := strconv.Atoi(n); err == nil && v >= 0 {
			return v
		}
	}
	if m := stepName.FindStringSubmatch(name); m != nil {
		if v, err := strconv.Atoi(m[1]); err == nil {
			return v
		}
	}
	return -1
}

func phaseOf(name string) Phase {
	n := strings.ToLower(name)
	switch {
	case strings.HasPrefix(n, "gloo:") || strings.HasPrefix(n, "nccl:") || strings.HasPrefix(n, "c10d::") || strings.HasPrefix(n, "mpi:") ||
		containsAny(n, "all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "all_to_all", "broadcast"):
		return PhaseCommunication
	case strings.Contains(n, "zero_grad"):
		return PhaseZeroGrad
	case strings.HasPrefix(n, "optimizer.step") || strings.Contains(n, "optimizer"):
		return PhaseOptimizer
	case strings.Contains(n, "backward"):
		return PhaseBackward
	case strings.Contains(n, "forward"):
		return PhaseForward
	}
	return ""
}

// Regions pairs a trace's START and END annotations (by name, the last
// START with the first END after it) into regions, in order of start; a
// START without its END is open: it runs to endUS, or, in a trace being
// written whose events have not caught up with the step it began, ends
// where it starts. An END without a START is dropped.
func Regions(anns []gpu.Annotation, endUS int64) []Region {
	sorted := anns
	if !sort.SliceIsSorted(anns, func(i, j int) bool { return anns[i].TimeUS < anns[j].TimeUS }) {
		sorted = append([]gpu.Annotation(nil), anns...)
		sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].TimeUS < sorted[j].TimeUS })
	}
	type kind struct {
		step  int
		phase Phase
	}
	kinds := map[string]kind{} // names repeat every step: read each once
	out := make([]Region, 0, len(sorted)/2)
	open := map[string][]int{} // by name, indexes into out
	depth := 0
	for _, a := range sorted {
		switch a.Stage {
		case "START":
			k, ok := kinds[a.Name]
			if !ok {
				k = kind{step: stepOf(a.Name), phase: phaseOf(a.Name)}
				kinds[a.Name] = k
			}
			open[a.Name] = append(open[a.Name], len(out))
			out = append(out, Region{Name: a.Name, StartUS: a.TimeUS, EndUS: max(endUS, a.TimeUS), Open: true, Depth: depth, Step: k.step, Phase: k.phase})
			depth++
		case "END":
			st := open[a.Name]
			if len(st) == 0 {
				continue
			}
			i := st[len(st)-1]
			open[a.Name] = st[:len(st)-1]
			out[i].EndUS, out[i].Open = max(a.TimeUS, out[i].StartUS), false
			depth = max(0, depth-1)
		}
	}
	return out
}

// Steps are the regions that are training steps, in order of start.
func Steps(regions []Region) []Region {
	var out []Region
	for _, r := range regions {
		if r.Step >= 0 {
			out = append(out, r)
		}
	}
	return out
}

// spans is a sorted list of disjoint [start, end) time ranges.
type spans [][2]int64

// spansOf unites the ranges of the regions keep selects.
func spansOf(regions []Region, keep func(*Region) bool) spans {
	var s spans
	for i := range regions {
		if r := &regions[i]; keep(r) {
			s = append(s, [2]int64{r.StartUS, max(r.EndUS, r.StartUS+1)})
		}
	}
	sort.Slice(s, func(i, j int) bool { return s[i][0] < s[j][0] })
	var out spans
	for _, x := range s {
		if n := len(out); n > 0 && x[0] <= out[n-1][1] {
			out[n-1][1] = max(out[n-1][1], x[1])
			continue
		}
		out = append(out, x)
	}
	return out
}

// at is the index of the range holding t, or -1.
func (s spans) at(t int64) int {
	i := sort.Search(len(s), func(i int) bool { return s[i][1] > t })
	if i < len(s) && s[i][0] <= t {
		return i
	}
	return -1
}
