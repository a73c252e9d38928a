package gpu

import (
	"fmt"
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
// frame, else the first library frame, else the first native one, else
// the first frame; false for an empty stack.
func FirstUserFrame(s Stack) (Frame, bool) {
	if len(s) == 0 {
		return Frame{}, false
	}
	best, bestKind := 0, KindOf(s[0])
	for i := 1; i < len(s) && bestKind != FrameUser; i++ {
		if k := KindOf(s[i]); k < bestKind {
			best, bestKind = i, k
		}
	}
	return s[best], true
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

// StackLabel is the label of s's first user frame, "" for an empty stack.
func StackLabel(s Stack) string {
	f, ok := FirstUserFrame(s)
	if !ok {
		return ""
	}
	return Label(f)
}
