package attrib

import (
	"strings"

	"vramscope/gpu"
)

// Categories: what an allocation holds, from an ordered rule table over
// its frames, combined with what the allocator and the trace say of it
// (its stream, its lifetime across steps and optimizer steps, the
// annotated region it was made in, the user_metadata of its alloc event).
// The first rule that matches decides; what no rule matches is Unknown,
// which views always show.
//
//	 #  rule                  matches                                         category
//	 1  user_metadata         the alloc event's user_metadata names one:      that category (high)
//	                          param, optim, grad, activation, temp|workspace,
//	                          comm|nccl
//	 2  communication         frames of torch/distributed/, deepspeed/comm/,  communication (high on a
//	                          c10d::, ProcessGroupNCCL, nccl*, all_reduce,    side stream, else medium;
//	                          all_gather, reduce_scatter, all_to_all, or      medium by a region alone)
//	                          made inside a process group's region
//	                          (gloo:all_reduce, nccl:..., c10d::...) but
//	                          not by the autograd thread (rule 5)
//	 3  workspace frames      a function named *workspace* (cuBLAS, cuDNN)    temporaries (medium)
//	 3b workspace size        made without frames on the autograd thread      temporaries (low)
//	                          (rule 5), never freed, and exactly the size of
//	                          cuBLAS's default workspace (32 MiB from Hopper
//	                          on, 8,519,680 B before): the workspace of the
//	                          engine thread's own cuBLAS handle
//	 4  optimizer             a frame in torch/optim/ (the step wrapper,      optimizer state when made by
//	                          adam.py...), a step() in a file named *optim*,  _init_group, or alive when its
//	                          or made inside an Optimizer.step region, and    optimizer step ended, when the
//	                          no forward or autograd frame (rules 5, 7)       next one began, across a step
//	                          nearer the allocation (not a step(closure))     or at the end; temporaries
//	                                                                          when freed before
//	 5  autograd              the autograd engine (torch::autograd::Engine,   activations when nn.Module
//	                          torch::autograd::generated::, AccumulateGrad),  frames are there too (recomputed);
//	                          torch/autograd/ or Tensor.backward frames,      gradients when alive when the
//	                          made inside a backward region, or made          next optimizer step began, or
//	                          without frames (while other allocations have    across a step; temporaries when
//	                          them: a thread without Python, the autograd     freed before it; gradients (low)
//	                          engine's) between a step's start (or the last   when the trace has no later
//	                          optimizer step) and its optimizer step          optimizer step; one sign less
//	                                                                          when only its place says backward
//	 6  parameter frames      nn.Module construction (__init__ in torch/nn/,  parameters (high when also
//	                          reset_parameters), Module.to/cuda/_apply,       persistent, see 8)
//	                          load_state_dict, from_pretrained, or a user
//	                          __init__ when persistent
//	 7  forward frames        nn.Module calls (_call_impl), torch.nn.         activations (medium)
//	                          functional, a function named forward, or made
//	                          inside a forward region
//	 8  lifetime              persistent: made before the first step (or      persistent state (low):
//	                          before the trace) and alive across a step       parameters or optimizer state
//	                          boundary, or never freed
//	 9  stream                on a side stream (not the one holding most of   side stream (low): a stream
//	                          the live bytes)                                 alone is no sign of
//	                                                                          communication
//	10  otherwise                                                             unknown
//
// Sureness: high when two independent signs agree (a frame and the
// allocation's lifetime or region) or the user said so; medium for one
// sign; low for allocator facts alone.

// Category is what an allocation holds.
type Category string

const (
	Parameters     Category = "parameters"
	OptimizerState Category = "optimizer state"
	Gradients      Category = "gradients"
	Activations    Category = "activations"
	Temporaries    Category = "temporaries"
	Communication  Category = "communication"
	// SideStream is what was made on a side stream and nothing else names.
	SideStream Category = "side stream"
	// Persistent is what lives across training steps and no frame names:
	// parameters or optimizer state.
	Persistent Category = "persistent state"
	Unknown    Category = "unknown"
)

// AllCategories lists the categories in the order views show them.
var AllCategories = []Category{Parameters, OptimizerState, Gradients, Activations, Temporaries, Communication, Persistent, SideStream, Unknown}

// Verdict is a block's category, how sure it is, and the rule that gave it.
type Verdict struct {
	Category Category `json:"category"`
	Sure     Sureness `json:"sure"`
	Rule     string   `json:"rule"`
	// Made names, for an allocation without frames, where it was made
	// (Facts.Made): the views' groups say it beside "no stack".
	Made string `json:"made,omitempty"`
}

// Sureness says how much a verdict rests on.
type Sureness string

const (
	High   Sureness = "high"   // the user said so, or two independent signs agree
	Medium Sureness = "medium" // one sign: a frame rule, or an annotated region
	Low    Sureness = "low"    // allocator facts alone
)

// Facts are what a rule may ask of one allocation.
type Facts struct {
	Stack    gpu.Stack
	Metadata string
	Stream   int64
	Size     uint64 // the size asked for
	// SideStream: the allocation is not on the stream holding most live bytes.
	SideStream bool
	// Phases are the phases of the annotated regions its alloc event fell in.
	Phases []Phase
	// AutogradThread: made without frames in a trace whose other
	// allocations have them (a thread without Python: the autograd
	// engine's) between a step's start, or the end of the optimizer step
	// before, and an optimizer step: the backward, by its place alone.
	AutogradThread bool
	// Made names where an allocation without frames was made: the
	// backward, an annotated region, before the recording.
	Made string
	// BeforeFirstStep: made before the first step began (or before the
	// trace); false when the trace marks no steps.
	BeforeFirstStep bool
	// BeforeTrace: made before the trace began (its history was not
	// recorded).
	BeforeTrace bool
	// AcrossStep: alive at the start of a step after the one it was made in.
	AcrossStep bool
	// NeverFreed: still allocated when the trace ends.
	NeverFreed bool
	// AliveAtOptimizer: alive when the first optimizer step after its
	// alloc began. OutlivesOptimizer: made inside an optimizer step and
	// alive when that step ended. Unsure when the trace does not tell.
	AliveAtOptimizer  Tri
	OutlivesOptimizer Tri

	signs frameSigns // what the frame rules find in Stack, once read
}

// Tri is yes, no, or the trace does not tell.
type Tri int8

const (
	Unsure Tri = iota
	Yes
	No
)

func (f *Facts) in(p Phase) bool {
	for _, x := range f.Phases {
		if x == p {
			return true
		}
	}
	return false
}

// frameSigns are what the frame rules find in a stack: reading them once
// per stack, rather than once per rule and allocation, is most of what
// sorting a large live set costs otherwise.
type frameSigns uint16

const (
	signComm frameSigns = 1 << iota
	signWorkspace
	signOptimizer
	signOptimizerState
	signAutograd
	signForward
	signParameter
	signUserInit
	// signInClosure: a forward or autograd frame lies nearer the
	// allocation (the stack is innermost first) than any optimizer frame:
	// work an optimizer's step(closure) runs for its caller (LBFGS,
	// Lightning's automatic optimization).
	signInClosure
	signsRead
)

var frameRules = []struct {
	sign  frameSigns
	match func(name, file string) bool
}{
	{signComm, commFrame}, {signWorkspace, workspaceFrame}, {signOptimizer, optimizerFrame},
	{signOptimizerState, optimizerStateFrame}, {signAutograd, autogradFrame}, {signForward, forwardFrame},
	{signParameter, parameterFrame}, {signUserInit, userInitFrame},
}

func signsOf(s gpu.Stack) frameSigns {
	signs := signsRead
	closureKnown := false
	for _, fr := range s {
		name, file := fr.Name, strings.ReplaceAll(fr.Filename, `\`, "/")
		var here frameSigns
		for _, r := range frameRules {
			if r.match(name, file) {
				here |= r.sign
			}
		}
		if !closureKnown && here&(signForward|signAutograd|signOptimizer) != 0 {
			closureKnown = true
			if here&(signForward|signAutograd) != 0 {
				here |= signInClosure
			}
		}
		signs |= here
	}
	return signs
}

// has reports whether a frame of the stack gives sign.
func (f *Facts) has(sign frameSigns) bool {
	if f.signs&signsRead == 0 {
		f.signs = signsOf(f.Stack)
	}
	return f.signs&sign != 0
}

func containsAny(s string, subs ...string) bool {
	for _, x := range subs {
		if strings.Contains(s, x) {
			return true
		}
	}
	return false
}

// metadataWords map words in user_metadata to categories (rule 1).
var metadataWords = []struct {
	words []string
	cat   Category
}{
	{[]string{"optim"}, OptimizerState},
	{[]string{"grad"}, Gradients},
	{[]string{"param", "weight"}, Parameters},
	{[]string{"activation"}, Activations},
	{[]string{"temp", "workspace", "scratch"}, Temporaries},
	{[]string{"comm", "nccl"}, Communication},
}

func commFrame(name, file string) bool {
	return containsAny(file, "torch/distributed/", "deepspeed/comm/") ||
		containsAny(gpu.Function(name), "c10d::", "ProcessGroupNCCL", "nccl", "all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "all_to_all")
}

func workspaceFrame(name, _ string) bool {
	return strings.Contains(strings.ToLower(gpu.Function(name)), "workspace")
}

func optimizerFrame(name, file string) bool {
	if strings.Contains(file, "torch/optim/") {
		return true
	}
	base := file[strings.LastIndexByte(file, '/')+1:]
	return name == "step" && strings.Contains(strings.ToLower(base), "optim")
}

func optimizerStateFrame(name, _ string) bool {
	return name == "_init_group" || name == "_init_state"
}

func autogradFrame(name, file string) bool {
	fn := gpu.Function(name)
	return containsAny(fn, "torch::autograd::Engine", "torch::autograd::generated::", "AccumulateGrad", "_engine_run_backward") ||
		strings.Contains(file, "torch/autograd/") || fn == "backward" && strings.HasSuffix(file, "torch/_tensor.py")
}

func torchNNFrame(file string) bool { return strings.Contains(file, "torch/nn/") }

func parameterFrame(name, file string) bool {
	switch name {
	case "reset_parameters", "load_state_dict", "_load_from_state_dict", "from_pretrained", "_apply":
		return true
	case "__init__", "to", "cuda", "convert":
		return torchNNFrame(file)
	}
	return false
}

func userInitFrame(name, file string) bool { return name == "__init__" && !torchNNFrame(file) }

func forwardFrame(name, file string) bool {
	return name == "forward" || (name == "_call_impl" || name == "_wrapped_call_impl") && torchNNFrame(file) ||
		strings.HasSuffix(file, "torch/nn/functional.py")
}

// sure is high when a second sign agrees, else medium.
func sure(agree bool) Sureness {
	if agree {
		return High
	}
	return Medium
}

// Categorize applies the rule table to one allocation.
func Categorize(f *Facts) Verdict {
	v := categorize(f)
	v.Made = f.Made
	return v
}

func verdict(c Category, s Sureness, rule string) Verdict {
	return Verdict{Category: c, Sure: s, Rule: rule}
}

func categorize(f *Facts) Verdict {
	if m := strings.ToLower(f.Metadata); m != "" {
		for _, w := range metadataWords {
			if containsAny(m, w.words...) {
				return verdict(w.cat, High, "user_metadata")
			}
		}
	}
	if f.has(signComm) {
		return verdict(Communication, sure(f.SideStream), "communication frames")
	}
	// A region is process-wide: what the autograd thread makes while
	// another thread runs a collective is not the collective's.
	if f.in(PhaseCommunication) && !f.AutogradThread {
		return verdict(Communication, Medium, "communication region")
	}
	if f.has(signWorkspace) {
		return verdict(Temporaries, Medium, "workspace frames")
	}
	if f.AutogradThread && f.NeverFreed && (f.Size == 32<<20 || f.Size == 8519680) {
		return verdict(Temporaries, Low, "workspace size")
	}
	// What a closure makes under the optimizer's step is the forward's or
	// the backward's: rules 5 and 7 decide it.
	inClosure := f.has(signInClosure)
	if inOpt, byFrame := f.in(PhaseOptimizer), f.has(signOptimizer); (inOpt || byFrame) && !inClosure {
		init := f.has(signOptimizerState)
		lasts := f.OutlivesOptimizer == Yes || f.AliveAtOptimizer == Yes || f.AcrossStep || f.NeverFreed
		switch {
		case init || lasts:
			return verdict(OptimizerState, sure(byFrame && inOpt || (init || byFrame) && lasts), "optimizer")
		case f.OutlivesOptimizer == No || f.OutlivesOptimizer == Unsure && f.AliveAtOptimizer == No:
			return verdict(Temporaries, sure(byFrame), "optimizer")
		}
		return verdict(OptimizerState, Low, "optimizer")
	}
	if inBwd, byFrame := f.in(PhaseBackward), f.has(signAutograd); inBwd || byFrame || f.AutogradThread {
		switch {
		case f.has(signForward):
			return verdict(Activations, Medium, "autograd") // recomputed (activation checkpointing)
		case f.AliveAtOptimizer == Yes || f.AcrossStep:
			return verdict(Gradients, sure(byFrame || inBwd), "autograd")
		case f.AliveAtOptimizer == No:
			return verdict(Temporaries, sure(byFrame && inBwd), "autograd")
		}
		return verdict(Gradients, Low, "autograd")
	}
	persistent := (f.BeforeFirstStep || f.BeforeTrace) && (f.AcrossStep || f.NeverFreed)
	if f.has(signParameter) {
		return verdict(Parameters, sure(persistent), "parameter frames")
	}
	if persistent && f.has(signUserInit) {
		return verdict(Parameters, High, "parameter frames")
	}
	if f.in(PhaseForward) || f.has(signForward) {
		return verdict(Activations, Medium, "forward frames")
	}
	if persistent {
		return verdict(Persistent, Low, "lifetime")
	}
	if f.SideStream {
		return verdict(SideStream, Low, "stream")
	}
	return verdict(Unknown, Low, "none")
}
