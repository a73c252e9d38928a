package gpu

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Stacks for people. A PyTorch stack (stacks="all") starts with a dozen
// frames that every allocation shares (the unwinder that recorded it, the
// caching allocator, the tensor-allocation path through the dispatcher)
// and interleaves CPython's own C frames with the Python ones. FrameKind
// sorts frames so that views hide what a Python user did not write and
// label each allocation by the first frame of the user's own code.
//
// The rules, first match wins:
//
//  1. Recorder: the unwinder (torch::unwind, torch::CapturedTraceback,
//     gather_with_cpp), the caching allocator (CUDACachingAllocator,
//     c10::StorageImpl, c10::TensorImpl), the tensor-allocation path
//     (at::detail::empty*, at::empty*, at::native::empty*, *new_empty*,
//     resize_output, at::TensorIteratorBase) and the dispatcher between
//     them (at::_ops::, c10::impl::, c10::Dispatcher, the generated
//     wrapper_* kernels and torch::autograd::VariableType), and the C++
//     standard library (std::).
//  2. Native: any other frame whose file is not Python source (the file
//     does not end in ".py" and is not a "<...>" pseudo-file): C++ kernels
//     and bindings, CPython's interpreter (_PyEval_*, method_vectorcall...),
//     pybind11, libc and threads.
//  3. Library: Python frames of installed packages and the standard library
//     (paths under site-packages, dist-packages, lib/pythonX.Y, Lib\, or
//     "<frozen ...>" and other "<...>" generated code).
//  4. User: every other Python frame.
//
// Recorder and native frames are hidden by default; a toggle shows them.
//
// A stack without Python frames (stacks="all" on the autograd engine's
// thread, or a C++ thread) is named by what it ran instead (OperatorName):
//
//  5. Autograd node: the innermost torch::autograd::generated::X::apply
//     (or X's release_variables), or another torch::autograd::X::apply
//     (AccumulateGrad, CopySlices), names X ("LogSoftmaxBackward0");
//     without one, the innermost frame of the engine's own work
//     (torch::autograd::..., not its Node or VariableType) names it
//     ("autograd validate_outputs_impl", "autograd engine").
//  6. Operator: the outermost at::_ops::X (call or redispatch) inside the
//     node (or in the whole stack without one) that is not an allocation
//     helper (rule 7): "_log_softmax_backward_data"; a helper only when
//     there is no node.
//  7. Helpers: operators and functions that only make the output of
//     another (empty*, zeros*, ones*, full*, new_*, resize_*, _to_copy,
//     to, to_dtype*, copy_*) and the structured kernels' plumbing
//     (create_out, set_output_*, at::meta::). They never name a stack;
//     the label is "node · operator", or either alone.

// FrameKind is what a frame belongs to (see the rules above).
type FrameKind uint8

const (
	FrameUser FrameKind = iota
	FrameLibrary
	FrameNative
	FrameRecorder
)

var frameKinds = [...]string{"user", "library", "native", "recorder"}

func (k FrameKind) String() string { return frameKinds[k] }

// MarshalText writes the kind's name (JSON answers carry it as a string).
func (k FrameKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads a kind's name.
func (k *FrameKind) UnmarshalText(b []byte) error {
	for i, n := range frameKinds {
		if string(b) == n {
			*k = FrameKind(i)
			return nil
		}
	}
	return fmt.Errorf("unknown frame kind %q", b)
}

// Hidden reports whether views hide frames of kind k by default.
func (k FrameKind) Hidden() bool { return k >= FrameNative }

// recorderNames are substrings of the function names of rule 1.
var recorderNames = []string{
	"torch::unwind::", "unwind::unwind", "torch::CapturedTraceback::", "gather_with_cpp",
	"CUDACachingAllocator", "c10::StorageImpl", "c10::TensorImpl",
	"at::detail::empty", "at::detail::_empty", "at::empty", "at::native::empty", "new_empty",
	"resize_output", "at::TensorIteratorBase",
	"at::_ops::", "c10::impl::", "c10::Dispatcher", "wrapper_", "torch::autograd::VariableType::",
	"std::",
}

// libraryPaths are substrings of the file names of rule 3 (with / or \).
var libraryPaths = []string{"site-packages", "dist-packages", "/lib/python", `\lib\python`, `\Lib\`}

// Function is a C++ frame's name without its argument list (whose types
// would match anything), or a Python frame's name. The parenthesis of
// "(anonymous namespace)" is part of the name, not its arguments.
func Function(name string) string {
	const anon = "(anonymous namespace)"
	for at := 0; ; {
		i := strings.IndexByte(name[at:], '(')
		if i < 0 {
			return name
		}
		if strings.HasPrefix(name[at+i:], anon) {
			at += i + len(anon)
			continue
		}
		if at+i == 0 {
			return name
		}
		return name[:at+i]
	}
}

// KindOf sorts one frame by the rules above; the names of rule 1 are
// matched against the function's name without its arguments.
func KindOf(f Frame) FrameKind {
	fn := Function(f.Name)
	for _, s := range recorderNames {
		if strings.Contains(fn, s) {
			return FrameRecorder
		}
	}
	file := f.Filename
	generated := strings.HasPrefix(file, "<")
	if !generated && !strings.HasSuffix(file, ".py") {
		return FrameNative
	}
	if generated {
		return FrameLibrary
	}
	for _, p := range libraryPaths {
		if strings.Contains(file, p) {
			return FrameLibrary
		}
	}
	return FrameUser
}

// FirstUserFrame is the frame that labels an allocation: the first user
// frame, else the first library frame, else the first native one that is
// not a helper (rule 7), else the first native one, else the first frame;
// false for an empty stack.
func FirstUserFrame(s Stack) (Frame, bool) {
	if len(s) == 0 {
		return Frame{}, false
	}
	rank := func(f Frame) int {
		k := KindOf(f)
		if k == FrameNative && !HelperFrame(f) {
			return 2*int(k) - 1
		}
		return 2 * int(k)
	}
	best, bestRank := 0, rank(s[0])
	for i := 1; i < len(s) && bestRank != 0; i++ {
		if r := rank(s[i]); r < bestRank {
			best, bestRank = i, r
		}
	}
	return s[best], true
}

// helperOps are the operators of rule 7 (at::_ops::NAME): by prefix, and
// by name.
var (
	helperOpPrefixes = []string{"empty", "zeros", "ones", "full", "new_", "resize", "_copy_from"}
	helperOpNames    = []string{"_to_copy", "to", "to_dtype", "to_dtype_layout", "to_device", "to_other", "copy_"}
)

// helperNames are substrings of the native functions of rule 7, and
// helperFuncs whole names.
var (
	helperNames = []string{"create_out", "set_output_", "at::meta::", "at::native::empty", "at::native::zeros", "at::native::_to_copy",
		"at::native::resize", "at::native::copy_", "at::native::full", "at::native::ones"}
	helperFuncs = []string{"at::native::to", "at::native::_to_copy"}
)

// HelperFrame reports whether f only makes another operator's output
// (rule 7): such a frame never labels an allocation.
func HelperFrame(f Frame) bool {
	if op, ok := operator(f); ok {
		return helperOp(op)
	}
	fn := Function(f.Name)
	for _, h := range helperNames {
		if strings.Contains(fn, h) {
			return true
		}
	}
	return slices.Contains(helperFuncs, fn)
}

func helperOp(op string) bool {
	for _, h := range helperOpPrefixes {
		if strings.HasPrefix(op, h) {
			return true
		}
	}
	return slices.Contains(helperOpNames, op)
}

// operator is X of an at::_ops::X::call or ::redispatch frame.
func operator(f Frame) (string, bool) {
	fn := Function(f.Name)
	i := strings.Index(fn, "at::_ops::")
	if i < 0 {
		return "", false
	}
	rest := fn[i+len("at::_ops::"):]
	op, how, ok := strings.Cut(rest, "::")
	if !ok || how != "call" && how != "redispatch" {
		return "", false
	}
	return op, true
}

// autogradNode is X of a torch::autograd::generated::X::method frame
// (apply, release_variables) or a torch::autograd::X::apply frame.
func autogradNode(f Frame) (string, bool) {
	fn := Function(f.Name)
	if rest, ok := strings.CutPrefix(fn, "torch::autograd::generated::"); ok {
		if node, _, ok := strings.Cut(rest, "::"); ok && node != "details" {
			return node, true
		}
		return "", false
	}
	fn, ok := strings.CutSuffix(fn, "::apply")
	if !ok || !strings.HasPrefix(fn, "torch::autograd::") {
		return "", false
	}
	node := fn[strings.LastIndex(fn, "::")+2:]
	if node == "Node" || node == "" {
		return "", false
	}
	return node, true
}

// engineStep is the function of a frame of the autograd engine's own
// work between nodes (validate_outputs_impl, InputMetadata::reduce_grad).
func engineStep(f Frame) (string, bool) {
	fn := strings.TrimPrefix(Function(f.Name), "void ")
	if i := strings.IndexByte(fn, '<'); i >= 0 {
		fn = fn[:i]
	}
	rest, ok := strings.CutPrefix(fn, "torch::autograd::")
	if !ok || strings.HasPrefix(rest, "Engine::") || strings.HasPrefix(rest, "Node::") ||
		strings.HasPrefix(rest, "VariableType::") || strings.HasPrefix(rest, "python::") || strings.HasPrefix(rest, "generated::") {
		return "", false
	}
	if i := strings.LastIndex(rest, "::"); i >= 0 {
		rest = rest[i+2:]
	}
	return rest, true
}

// OperatorName names a stack without Python frames by its autograd node
// and operator (rules 5 to 7): "LogSoftmaxBackward0 · _log_softmax_backward_data";
// named are the indexes of the frames the name comes from (innermost
// first). It is "" for a stack with a Python frame or none of these.
func OperatorName(s Stack) (name string, named []int) {
	node, at := "", len(s)
	for i, f := range s {
		if k := KindOf(f); k == FrameUser || k == FrameLibrary {
			return "", nil
		}
		if node == "" {
			if n, ok := autogradNode(f); ok {
				node, at = n, i
			}
		}
	}
	for i, f := range s {
		if node != "" {
			break
		}
		if n, ok := engineStep(f); ok {
			node, at = "autograd "+n, i
		} else if strings.HasPrefix(Function(f.Name), "torch::autograd::Engine::") {
			node, at = "autograd engine", i
		}
	}
	// The outermost operator inside the node: the one it called.
	op, opAt, helper, helperAt := "", -1, "", -1
	for i := at - 1; i >= 0; i-- {
		o, ok := operator(s[i])
		if !ok {
			continue
		}
		if !helperOp(o) {
			op, opAt = o, i
			break
		}
		if helper == "" {
			helper, helperAt = o, i
		}
	}
	if op == "" && node == "" { // a helper names what has nothing else
		op, opAt = helper, helperAt
	}
	if op == "" && node == "" {
		return "", nil
	}
	if node != "" {
		named = append(named, at)
	}
	if op != "" {
		named = append(named, opAt)
	}
	switch {
	case node == "":
		return op, named
	case op == "":
		return node, named
	}
	return node + " · " + op, named
}

// Label is "file:line function" for f, with the file's last path element
// ("?" for PyTorch's unknown line 2^64-1), or the function alone, without
// its arguments, when the frame has no file or line (most C++ frames).
func Label(f Frame) string {
	file := f.Filename
	if i := strings.LastIndexAny(file, `/\`); i >= 0 && i < len(file)-1 {
		file = file[i+1:]
	}
	if file == "" || file == "??" || f.Line == 0 {
		return Function(f.Name)
	}
	line := "?"
	if f.Line < 1<<63 {
		line = strconv.FormatUint(f.Line, 10)
	}
	return file + ":" + line + " " + f.Name
}

// StackLabel is the label of s's first user frame, or for a stack without
// Python frames its OperatorName when it has one; "" for an empty stack.
func StackLabel(s Stack) string {
	if name, _ := OperatorName(s); name != "" {
		return name
	}
	f, ok := FirstUserFrame(s)
	if !ok {
		return ""
	}
	return Label(f)
}
