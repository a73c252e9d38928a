package gpu_test

import (
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

// On real snapshots every allocation is labelled by code its author wrote
// where the stack has any: never by the unwinder or the allocator.
func TestFirstUserFrameOfRealStacks(t *testing.T) {
	for _, file := range []string{"expandable_oom_multigpu.pickle", "training_22k_user_metadata.pickle", "cs336_ctx128_forward.pickle"} {
		ts, err := pytorch.DecodeFile(testkit.Snapshot(t, file))
		if err != nil {
			t.Fatal(err)
		}
		users, stacks := 0, 0
		for _, tr := range ts {
			for _, st := range tr.Stacks {
				stacks++
				f, ok := gpu.FirstUserFrame(st)
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
		if users == 0 {
			t.Errorf("%s: none of %d stacks has a user frame", file, stacks)
		}
		t.Logf("%s: %d of %d stacks labelled by a user frame", file, users, stacks)
	}
}
