package gpu_test

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
)

func TestFrameKinds(t *testing.T) {
	for _, c := range []struct {
		f    gpu.Frame
		want gpu.FrameKind
	}{
		{gpu.Frame{Name: "torch::unwind::unwind()", Filename: "??"}, gpu.FrameRecorder},
		{gpu.Frame{Name: "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)", Filename: "CUDACachingAllocator.cpp"}, gpu.FrameRecorder},
		{gpu.Frame{Name: "_PyEval_EvalFrameDefault", Filename: "??"}, gpu.FrameNative},
		{gpu.Frame{Name: "std::vector<at::Tensor, std::allocator<at::Tensor> >::~vector()", Filename: ""}, gpu.FrameRecorder},
		// std:: in the arguments says nothing of the function.
		{gpu.Frame{Name: "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&)", Filename: "??"}, gpu.FrameNative},
		{gpu.Frame{Name: "torch::cuda::broadcast_coalesced(...)", Filename: ""}, gpu.FrameNative},
		{gpu.Frame{Name: "_call_impl", Filename: "/env/lib/python3.11/site-packages/torch/nn/modules/module.py"}, gpu.FrameLibrary},
		{gpu.Frame{Name: "run", Filename: "/env/lib/python3.11/threading.py"}, gpu.FrameLibrary},
		{gpu.Frame{Name: "forward", Filename: `D:\Dev\a2\.venv\Lib\site-packages\torch\nn\functional.py`}, gpu.FrameLibrary},
		{gpu.Frame{Name: "_call_with_frames_removed", Filename: "<frozen importlib._bootstrap>"}, gpu.FrameLibrary},
		{gpu.Frame{Name: "train", Filename: "/mnt/project/src/train/trainers.py", Line: 444}, gpu.FrameUser},
		{gpu.Frame{Name: "forward", Filename: `D:\Dev\a2\cs336_systems\model.py`}, gpu.FrameUser},
	} {
		if got := gpu.KindOf(c.f); got != c.want {
			t.Errorf("%q in %q: %v, want %v", c.f.Name, c.f.Filename, got, c.want)
		}
	}
	if l := gpu.Label(gpu.Frame{Name: "main", Filename: "/a/b/train.py", Line: 1<<64 - 1}); l != "train.py:? main" {
		t.Errorf("label %q", l)
	}
	if l := gpu.Label(gpu.Frame{Name: "torch::autograd::Engine::thread_main(std::shared_ptr<X> const&)", Filename: "??"}); l != "torch::autograd::Engine::thread_main" {
		t.Errorf("label %q", l)
	}
	// The unwinder's own frame, in an anonymous namespace: its name is
	// not cut at that parenthesis.
	gather := gpu.Frame{Name: "torch::cuda::(anonymous namespace)::gather_with_cpp()", Filename: "memory_snapshot.cpp"}
	if k, l := gpu.KindOf(gather), gpu.Label(gather); k != gpu.FrameRecorder || l != "torch::cuda::(anonymous namespace)::gather_with_cpp" {
		t.Errorf("%s: %v, label %q", gather.Name, k, l)
	}
	if f := gpu.Function("(*)()"); f != "(*)()" {
		t.Errorf("function of %q: %q", "(*)()", f)
	}
	if _, ok := gpu.FirstUserFrame(nil); ok || gpu.StackLabel(nil) != "" {
		t.Error("an empty stack has a first user frame")
	}
}

// On every real snapshot every allocation is labelled by code its author
// wrote where the stack has any: never by the unwinder or the allocator.
// In the 2.11 recordings the author's code is known, the recording script
// (/job/record.py, PROVENANCE.md): a stack through it is labelled by its
// innermost frame there, and one not through it by no user frame.
func TestFirstUserFrameOfRealStacks(t *testing.T) {
	const script = "/job/record.py"
	for _, path := range append(testkit.RealFiles(t, "pytorch"), testkit.RealFiles(t, "pytorch-2.11")...) {
		file := filepath.Base(path)
		recorded := strings.Contains(path, "pytorch-2.11")
		ts, err := pytorch.DecodeFile(path)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		users, stacks, scripted := 0, 0, 0
		for _, tr := range ts {
			for _, st := range tr.Stacks {
				stacks++
				f, ok := gpu.FirstUserFrame(st)
				if recorded {
					i := slices.IndexFunc(st, func(g gpu.Frame) bool { return g.Filename == script })
					if i >= 0 {
						scripted++
					}
					if i >= 0 && (!ok || f != st[i]) || i < 0 && ok && gpu.KindOf(f) == gpu.FrameUser {
						t.Fatalf("%s: labelled by %q (%v), want the innermost frame of %s (index %d) in %v", file, gpu.Label(f), ok, script, i, st)
					}
				}
				if !ok {
					continue
				}
				k := gpu.KindOf(f)
				if k == gpu.FrameRecorder {
					t.Fatalf("%s: a stack is labelled by the recorder frame %q", file, gpu.Label(f))
				}
				hasUser := false
				for _, g := range st {
					hasUser = hasUser || gpu.KindOf(g) == gpu.FrameUser
				}
				if hasUser != (k == gpu.FrameUser) {
					t.Fatalf("%s: label %q (%v) though the stack has user frames: %v", file, gpu.Label(f), k, hasUser)
				}
				if k == gpu.FrameUser {
					users++
				}
			}
		}
		if stacks > 0 && users == 0 {
			t.Errorf("%s: none of %d stacks has a user frame", file, stacks)
		}
		if recorded && scripted == 0 {
			t.Errorf("%s: no stack runs through %s", file, script)
		}
		t.Logf("%s: %d of %d stacks labelled by a user frame", file, users, stacks)
	}
}

// A recording with C++ frames (PyTorch 2.11, stacks="all"): every stack
// without a Python frame (the autograd engine's thread) is named by its
// autograd node and operator, never by a helper that only made the
// output (create_out, empty, _to_copy, zeros).
func TestOperatorNamesOfBackwardStacks(t *testing.T) {
	ts, err := pytorch.DecodeFile(testkit.SnapshotOf(t, "pytorch-2.11", "train_stacks_all.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]int{}
	native := 0
	for _, tr := range ts {
		for _, st := range tr.Stacks {
			python := false
			for _, f := range st {
				k := gpu.KindOf(f)
				python = python || k == gpu.FrameUser || k == gpu.FrameLibrary
			}
			name, named := gpu.OperatorName(st)
			if python {
				if name != "" {
					t.Errorf("a stack with Python frames is named %q", name)
				}
				continue
			}
			native++
			if name == "" || len(named) == 0 {
				t.Errorf("a stack without Python frames has no name; label %q", gpu.StackLabel(st))
				continue
			}
			if label := gpu.StackLabel(st); label != name {
				t.Errorf("label %q, name %q", label, name)
			}
			for _, h := range []string{"create_out", "empty", "zeros", "_to_copy", "set_output"} {
				if strings.Contains(name, h) {
					t.Errorf("%q is named by the helper %s", name, h)
				}
			}
			for _, i := range named {
				if gpu.HelperFrame(st[i]) {
					t.Errorf("%q: frame %d (%s) that named it is a helper", name, i, st[i].Name)
				}
			}
			names[name]++
		}
	}
	t.Logf("%d stacks without Python frames: %v", native, names)
	for _, want := range []string{"LogSoftmaxBackward0 · _log_softmax_backward_data", "NllLossBackward0 · nll_loss_backward", "MmBackward0 · mm",
		"ToCopyBackward0", "EmbeddingBackward0 · embedding_backward", "NativeLayerNormBackward0 · native_layer_norm_backward"} {
		if names[want] == 0 {
			t.Errorf("no stack named %q", want)
		}
	}
}
