package tracer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"

	"vramscope/gpu"
)

// Train is a transformer training loop: parameters, lazily created Adam
// states, activations saved in forward and freed in reverse in backward,
// gradients freed by zero_grad(set_to_none=True), and cuBLAS-style
// workspaces that come and go.
type Train struct {
	Layers        int
	Hidden        int
	Vocab         int
	Batch         int
	Seq           int
	Steps         int
	DtypeBytes    int  // 2 for bf16
	Checkpointing bool // activation checkpointing: keep layer inputs only, recompute in backward
	Seed          uint64
}

// DefaultTrain is a GPT-2-XL-sized run: about 1.5 B parameters.
func DefaultTrain() Train {
	return Train{Layers: 24, Hidden: 2048, Vocab: 50304, Batch: 8, Seq: 1024, Steps: 4, DtypeBytes: 2, Seed: 1}
}

const trainFile = "train.py"

// Roles of allocations, as the training loop reports them to Env.Role.
const (
	RoleParameter      = "parameter"
	RoleOptimizerState = "optimizer state"
	RoleActivation     = "activation"
	RoleGradient       = "gradient"
	RoleTemporary      = "temporary" // workspaces, backward and optimizer temporaries
)

// The frames PyTorch records for a training loop like this one, innermost
// first: Python frames of the user's model.py and train.py and of torch
// in site-packages, and, in backward, the C++ frames of the autograd
// engine's thread (which has no Python frames).
const torchDir = "/opt/venv/lib/python3.11/site-packages/torch/"

var (
	allocatorFrame = gpu.Frame{Name: "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)",
		Filename: "CUDACachingAllocator.cpp"}
	moduleCall = []gpu.Frame{frame("_call_impl", torchDir+"nn/modules/module.py", 1747), frame("_wrapped_call_impl", torchDir+"nn/modules/module.py", 1736)}
	engine     = []gpu.Frame{cpp("torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
		cpp("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)"),
		cpp("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
		cpp("torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)")}
	linearFwd = frame("forward", torchDir+"nn/modules/linear.py", 125)
	layerNorm = []gpu.Frame{frame("layer_norm", torchDir+"nn/functional.py", 2910), frame("forward", torchDir+"nn/modules/normalization.py", 217)}
)

// cpp is a C++ frame as PyTorch's unwinder writes it.
func cpp(name string) gpu.Frame { return gpu.Frame{Name: name, Filename: "??"} }

// join concatenates frame lists.
func join(parts ...[]gpu.Frame) []gpu.Frame {
	var out []gpu.Frame
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// layerOp is where a layer's forward makes one activation: the frames
// inside its Block.forward call, innermost first.
var layerOps = map[string][]gpu.Frame{
	"ln1":          join(layerNorm, moduleCall, []gpu.Frame{frame("forward", "model.py", 61)}),
	"attn.qkv":     join([]gpu.Frame{linearFwd}, moduleCall, []gpu.Frame{frame("forward", "model.py", 30)}, moduleCall, []gpu.Frame{frame("forward", "model.py", 62)}),
	"attn.scores":  join([]gpu.Frame{frame("forward", "model.py", 33)}, moduleCall, []gpu.Frame{frame("forward", "model.py", 62)}),
	"attn.probs":   join([]gpu.Frame{frame("softmax", torchDir+"nn/functional.py", 2140), frame("forward", "model.py", 34)}, moduleCall, []gpu.Frame{frame("forward", "model.py", 62)}),
	"attn.context": join([]gpu.Frame{frame("forward", "model.py", 35)}, moduleCall, []gpu.Frame{frame("forward", "model.py", 62)}),
	"attn.out":     join([]gpu.Frame{linearFwd}, moduleCall, []gpu.Frame{frame("forward", "model.py", 36)}, moduleCall, []gpu.Frame{frame("forward", "model.py", 62)}),
	"ln2":          join(layerNorm, moduleCall, []gpu.Frame{frame("forward", "model.py", 63)}),
	"mlp.up":       join([]gpu.Frame{linearFwd}, moduleCall, []gpu.Frame{frame("forward", "model.py", 45)}, moduleCall, []gpu.Frame{frame("forward", "model.py", 64)}),
	"mlp.act":      join([]gpu.Frame{frame("gelu", torchDir+"nn/functional.py", 1890), frame("forward", "model.py", 46)}, moduleCall, []gpu.Frame{frame("forward", "model.py", 64)}),
	"mlp.down":     join([]gpu.Frame{linearFwd}, moduleCall, []gpu.Frame{frame("forward", "model.py", 47)}, moduleCall, []gpu.Frame{frame("forward", "model.py", 64)}),
}

// paramInit is where a parameter is made: inside its module's __init__
// (innermost), then the model's.
func paramInit(name string) []gpu.Frame {
	linear := frame("__init__", torchDir+"nn/modules/linear.py", 106)
	norm := frame("__init__", torchDir+"nn/modules/normalization.py", 200)
	switch {
	case strings.HasSuffix(name, "attn.qkv.weight"):
		return []gpu.Frame{linear, frame("__init__", "model.py", 25), frame("__init__", "model.py", 55)}
	case strings.HasSuffix(name, "attn.out.weight"):
		return []gpu.Frame{linear, frame("__init__", "model.py", 26), frame("__init__", "model.py", 55)}
	case strings.HasSuffix(name, "mlp.up.weight"):
		return []gpu.Frame{linear, frame("__init__", "model.py", 41), frame("__init__", "model.py", 57)}
	case strings.HasSuffix(name, "mlp.down.weight"):
		return []gpu.Frame{linear, frame("__init__", "model.py", 42), frame("__init__", "model.py", 57)}
	case strings.HasSuffix(name, "ln1.weight"):
		return []gpu.Frame{norm, frame("__init__", "model.py", 54)}
	case strings.HasSuffix(name, "ln2.weight"):
		return []gpu.Frame{norm, frame("__init__", "model.py", 56)}
	case name == "model.embed.weight":
		return []gpu.Frame{frame("__init__", torchDir+"nn/modules/sparse.py", 167)}
	case name == "model.norm.weight":
		return []gpu.Frame{norm}
	}
	return []gpu.Frame{linear} // lm_head
}

// paramLine is the line of Transformer.__init__ that makes a parameter's module.
func paramLine(name string) uint64 {
	switch name {
	case "model.embed.weight":
		return 87
	case "model.norm.weight":
		return 94
	case "model.lm_head.weight":
		return 95
	}
	return 90 // the layers
}

func (t Train) Run(ctx context.Context, env *Env) error {
	if t.Layers <= 0 || t.Hidden <= 0 || t.Batch <= 0 || t.Seq <= 0 || t.Steps <= 0 || t.DtypeBytes <= 0 || t.Vocab <= 0 {
		return fmt.Errorf("train: layers, hidden, vocab, batch, seq, steps and dtype bytes must be positive")
	}
	r := rand.New(rand.NewPCG(t.Seed, 0x7472))
	H, B, S, D := uint64(t.Hidden), uint64(t.Batch), uint64(t.Seq), uint64(t.DtypeBytes)
	heads := max(uint64(1), H/128)
	mainFrame := frame("main", trainFile, 120)
	st := func(frames ...[]gpu.Frame) gpu.StackID {
		return env.stack(join(append([][]gpu.Frame{{allocatorFrame}}, frames...)...)...)
	}
	malloc := func(size uint64, stack gpu.StackID, role string) (uint64, error) {
		p, err := env.malloc(size, stack)
		if err == nil && env.Role != nil {
			env.Role(p, role)
		}
		return p, err
	}

	// Parameters, in construction order.
	params := tensors{}
	var plist []param
	add := func(name string, elems uint64) { plist = append(plist, param{name, elems * D}) }
	add("model.embed.weight", uint64(t.Vocab)*H)
	for l := 0; l < t.Layers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		add(p+"ln1.weight", H)
		add(p+"attn.qkv.weight", 3*H*H)
		add(p+"attn.out.weight", H*H)
		add(p+"ln2.weight", H)
		add(p+"mlp.up.weight", 4*H*H)
		add(p+"mlp.down.weight", 4*H*H)
	}
	add("model.norm.weight", H)
	add("model.lm_head.weight", uint64(t.Vocab)*H)
	for _, p := range plist {
		a, err := malloc(p.size, st(paramInit(p.name), []gpu.Frame{frame("__init__", "model.py", paramLine(p.name)),
			frame("build_model", trainFile, 20), mainFrame}), RoleParameter)
		if err != nil {
			return err
		}
		params[p.name] = a
	}
	env.Clock.Advance(50_000)

	stepFrame := []gpu.Frame{frame("train_step", trainFile, 88), mainFrame}
	// model.forward's calls: the embedding (line 100), the layers (102),
	// the head (104).
	inModel := func(line uint64, inner ...[]gpu.Frame) gpu.StackID {
		return st(join(inner...), moduleCall, []gpu.Frame{frame("forward", "model.py", line)}, moduleCall, stepFrame)
	}
	layerOp := func(op string) gpu.StackID { return inModel(102, layerOps[op], moduleCall) }
	workspace := func(op string) gpu.StackID {
		return inModel(102, []gpu.Frame{cpp("at::cuda::getCUDABlasLtWorkspace()")}, layerOps[op], moduleCall)
	}
	node := func(name string) gpu.StackID {
		return st([]gpu.Frame{cpp("torch::autograd::generated::" + name + "::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)")}, engine)
	}
	backwardNode := map[string]string{"mlp.down": "MmBackward0", "mlp.up": "MmBackward0", "ln2": "NativeLayerNormBackward0",
		"attn.out": "MmBackward0", "attn.qkv": "MmBackward0", "ln1": "NativeLayerNormBackward0"}
	optStep := []gpu.Frame{frame("step", torchDir+"optim/adam.py", 236), frame("_use_grad", torchDir+"optim/optimizer.py", 79),
		frame("wrapper", torchDir+"optim/optimizer.py", 487), frame("train_step", trainFile, 93), mainFrame}

	adam := tensors{}
	for step := 0; step < t.Steps; step++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		env.begin(fmt.Sprintf("ProfilerStep#%d", step))
		var saved []tensors // per layer, freed in reverse in backward
		x, err := malloc(B*S*H*D, inModel(100, []gpu.Frame{frame("embedding", torchDir+"nn/functional.py", 2551),
			frame("forward", torchDir+"nn/modules/sparse.py", 190)}), RoleActivation)
		if err != nil {
			return err
		}
		for l := 0; l < t.Layers; l++ {
			acts := tensors{"input": x}
			steps := []struct {
				name  string
				elems uint64
			}{
				{"ln1", B * S * H}, {"attn.qkv", 3 * B * S * H}, {"attn.scores", B * heads * S * S},
				{"attn.probs", B * heads * S * S}, {"attn.context", B * S * H}, {"attn.out", B * S * H},
				{"ln2", B * S * H}, {"mlp.up", 4 * B * S * H}, {"mlp.act", 4 * B * S * H}, {"mlp.down", B * S * H},
			}
			for _, s := range steps {
				a, err := malloc(s.elems*D, layerOp(s.name), RoleActivation)
				if err != nil {
					return err
				}
				acts[s.name] = a
				if s.name == "attn.qkv" || s.name == "mlp.up" {
					// a matmul's workspace, gone right after
					ws, err := malloc(uint64(4+r.IntN(28))<<20, workspace(s.name), RoleTemporary)
					if err != nil {
						return err
					}
					env.Clock.Advance(30)
					if err := env.free(ws); err != nil {
						return err
					}
				}
				env.Clock.Advance(int64(s.elems / 4096))
			}
			// scores are consumed by softmax; the residual stream moves on
			if err := env.free(acts["attn.scores"]); err != nil {
				return err
			}
			delete(acts, "attn.scores")
			x = acts["mlp.down"]
			delete(acts, "mlp.down")
			if t.Checkpointing {
				in := acts["input"]
				delete(acts, "input")
				if err := acts.freeAll(env); err != nil {
					return err
				}
				acts["input"] = in
			}
			saved = append(saved, acts)
		}
		logits, err := malloc(B*S*uint64(t.Vocab)*4, inModel(104, []gpu.Frame{linearFwd}), RoleActivation)
		if err != nil {
			return err
		}
		env.Clock.Advance(int64(B * S * uint64(t.Vocab) / 4096))
		loss, err := malloc(512, st([]gpu.Frame{frame("cross_entropy", torchDir+"nn/functional.py", 3479), frame("train_step", trainFile, 89), mainFrame}), RoleActivation)
		if err != nil {
			return err
		}
		if err := env.free(x); err != nil {
			return err
		}

		// Backward: gradients appear as the pass reaches each parameter.
		grads := tensors{}
		gradOf := func(name string, stack gpu.StackID) error {
			g, err := malloc(paramSize(plist, name), stack, RoleGradient)
			if err != nil {
				return err
			}
			grads[name] = g
			return nil
		}
		dlogits, err := malloc(B*S*uint64(t.Vocab)*4, node("LogSoftmaxBackward0"), RoleTemporary)
		if err != nil {
			return err
		}
		if err := env.free(logits); err != nil {
			return err
		}
		if err := gradOf("model.lm_head.weight", node("MmBackward0")); err != nil {
			return err
		}
		dx, err := malloc(B*S*H*D, node("MmBackward0"), RoleTemporary)
		if err != nil {
			return err
		}
		if err := env.free(dlogits); err != nil {
			return err
		}
		if err := gradOf("model.norm.weight", node("NativeLayerNormBackward0")); err != nil {
			return err
		}
		for l := t.Layers - 1; l >= 0; l-- {
			p := fmt.Sprintf("model.layers.%d.", l)
			acts := saved[l]
			if t.Checkpointing { // recompute the layer's activations
				for _, s := range []string{"ln1", "attn.qkv", "attn.probs", "attn.context", "attn.out", "ln2", "mlp.up", "mlp.act"} {
					a, err := malloc(B*S*H*D*mult(s, heads, S, H), st(layerOps[s], moduleCall,
						[]gpu.Frame{frame("recompute_fn", torchDir+"utils/checkpoint.py", 1594)}, engine), RoleActivation)
					if err != nil {
						return err
					}
					acts[s] = a
				}
			}
			for _, w := range []string{"mlp.down", "mlp.up", "ln2", "attn.out", "attn.qkv", "ln1"} {
				if err := gradOf(p+w+".weight", node(backwardNode[w])); err != nil {
					return err
				}
				tmp, err := malloc(B*S*H*D*mult(w, heads, S, H), node(backwardNode[w]), RoleTemporary)
				if err != nil {
					return err
				}
				env.Clock.Advance(int64(B * S * H / 2048))
				if err := env.free(tmp); err != nil {
					return err
				}
			}
			if err := acts.freeAll(env); err != nil {
				return err
			}
		}
		if err := gradOf("model.embed.weight", node("EmbeddingBackward0")); err != nil {
			return err
		}
		if err := env.free(dx); err != nil {
			return err
		}
		if err := env.free(loss); err != nil {
			return err
		}

		// optimizer.step(), as PyTorch's optimizers annotate it: Adam
		// states are created on the first step, in fp32.
		env.begin("Optimizer.step#Adam.step")
		for _, p := range plist {
			if _, ok := adam[p.name+".exp_avg"]; !ok {
				for _, s := range []string{".exp_avg", ".exp_avg_sq"} {
					a, err := malloc(p.size/D*4, st([]gpu.Frame{frame("_init_group", torchDir+"optim/adam.py", 170)}, optStep), RoleOptimizerState)
					if err != nil {
						return err
					}
					adam[p.name+s] = a
				}
			}
			tmp, err := malloc(p.size/D*4, st([]gpu.Frame{frame("_multi_tensor_adam", torchDir+"optim/adam.py", 593),
				frame("adam", torchDir+"optim/adam.py", 935)}, optStep), RoleTemporary)
			if err != nil {
				return err
			}
			env.Clock.Advance(int64(p.size / 65536))
			if err := env.free(tmp); err != nil {
				return err
			}
		}
		env.end()
		env.begin("Optimizer.zero_grad#Adam.zero_grad")
		if err := grads.freeAll(env); err != nil { // set_to_none=True
			return err
		}
		env.end()
		env.Clock.Advance(10_000)
		env.end()
	}
	env.Notes = append(env.Notes, fmt.Sprintf("train: %d layers, hidden %d, batch %d x %d tokens, %d steps, %d parameters, checkpointing %v",
		t.Layers, t.Hidden, t.Batch, t.Seq, t.Steps, paramCount(plist, D), t.Checkpointing))
	return nil
}

// mult is an activation's size in units of batch x seq x hidden.
func mult(name string, heads, seq, hidden uint64) uint64 {
	switch name {
	case "attn.qkv":
		return 3
	case "mlp.up", "mlp.act", "mlp.down":
		return 4
	case "attn.probs", "attn.scores":
		return max(1, heads*seq/hidden)
	}
	return 1
}

// param is a model parameter and its size in bytes.
type param struct {
	name string
	size uint64
}

func paramSize(list []param, name string) uint64 {
	for _, p := range list {
		if p.name == name {
			return p.size
		}
	}
	return 0
}

func paramCount(list []param, dtype uint64) uint64 {
	var n uint64
	for _, p := range list {
		n += p.size / dtype
	}
	return n
}
