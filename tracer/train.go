package tracer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
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
	// SeqLens, when set, are the steps' sequence lengths (step i has
	// SeqLens[i%len]), as batches of varying length give; else every step
	// has Seq.
	SeqLens []int
	// StepUS, when set, is how far apart steps start, as when data-parallel
	// ranks wait for each other every step.
	StepUS int64
	Seed   uint64
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

// layerOps says where a layer's forward makes each activation: the frames
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
	m, err := newModel(t, env)
	if err != nil {
		return err
	}
	if err := m.build(m.params(0, t.Layers, true, true)); err != nil {
		return err
	}
	env.Clock.Advance(50_000)
	start := env.Clock.US

	adam := tensors{}
	for step := 0; step < t.Steps; step++ {
		if err := env.pace(ctx); err != nil {
			return err
		}
		if t.StepUS > 0 {
			env.Clock.US = max(env.Clock.US, start+int64(step)*t.StepUS)
		}
		env.begin(fmt.Sprintf("ProfilerStep#%d", step))
		if len(t.SeqLens) > 0 {
			m.S = uint64(t.SeqLens[step%len(t.SeqLens)])
		}
		x, err := m.embed()
		if err != nil {
			return err
		}
		saved := make([]tensors, t.Layers) // per layer, freed in reverse in backward
		for l := range t.Layers {
			if saved[l], x, err = m.forwardLayer(l, x); err != nil {
				return err
			}
		}
		logits, loss, err := m.head()
		if err != nil {
			return err
		}
		if err := env.free(x); err != nil {
			return err
		}

		// Backward: gradients appear as the pass reaches each parameter.
		grads := tensors{}
		dx, err := m.headBackward(logits, grads)
		if err != nil {
			return err
		}
		for l := t.Layers - 1; l >= 0; l-- {
			if err := m.backwardLayer(l, saved[l], grads); err != nil {
				return err
			}
		}
		if err := m.grad(grads, "model.embed.weight", m.node("EmbeddingBackward0")); err != nil {
			return err
		}
		if err := env.free(dx); err != nil {
			return err
		}
		if err := env.free(loss); err != nil {
			return err
		}
		if err := m.optimizerStep(m.plist, adam, grads); err != nil {
			return err
		}
		env.Clock.Advance(10_000)
		env.end()
	}
	env.Notes = append(env.Notes, fmt.Sprintf("train: %d layers, hidden %d, batch %d x %d tokens, %d steps, %d parameters, checkpointing %v",
		t.Layers, t.Hidden, t.Batch, t.Seq, t.Steps, paramCount(m.plist, m.D), t.Checkpointing))
	return nil
}

// model is a Train's transformer as workloads run it: its sizes, its
// parameters, and the passes that allocate its activations, gradients
// and optimizer states under the frames PyTorch records for them, each
// reported with its role.
type model struct {
	t                 Train
	env               *Env
	r                 *rand.Rand
	H, B, S, D, heads uint64
	plist             []param
	mainFrame         gpu.Frame
	stepFrame         gpu.Frame // train_step's line calling the model
}

// Check says what is wrong with t's settings, if anything.
func (t Train) Check() error {
	if t.Layers <= 0 || t.Hidden <= 0 || t.Batch <= 0 || t.Seq <= 0 || t.Steps <= 0 || t.DtypeBytes <= 0 || t.Vocab <= 0 || slices.ContainsFunc(t.SeqLens, func(n int) bool { return n <= 0 }) {
		return fmt.Errorf("train: layers, hidden, vocab, batch, seq, steps and dtype bytes must be positive")
	}
	return nil
}

func newModel(t Train, env *Env) (*model, error) {
	if err := t.Check(); err != nil {
		return nil, err
	}
	m := &model{t: t, env: env, r: rand.New(rand.NewPCG(t.Seed, 0x7472)),
		H: uint64(t.Hidden), B: uint64(t.Batch), S: uint64(t.Seq), D: uint64(t.DtypeBytes),
		mainFrame: frame("main", trainFile, 120), stepFrame: frame("train_step", trainFile, 88)}
	m.heads = max(uint64(1), m.H/128)
	return m, nil
}

// stack is the allocator's frame, then frames, innermost first.
func (m *model) stack(frames ...[]gpu.Frame) gpu.StackID {
	return m.env.stack(join(append([][]gpu.Frame{{allocatorFrame}}, frames...)...)...)
}

// malloc allocates size bytes under stack and reports their role.
func (m *model) malloc(size uint64, stack gpu.StackID, role string) (uint64, error) {
	p, err := m.env.malloc(size, stack)
	if err == nil && m.env.Role != nil {
		m.env.Role(p, role)
	}
	return p, err
}

// inModel is a stack inside model.forward's call at line of model.py
// (the embedding at 100, the layers at 102, the head at 104).
func (m *model) inModel(line uint64, inner ...[]gpu.Frame) gpu.StackID {
	return m.stack(join(inner...), moduleCall, []gpu.Frame{frame("forward", "model.py", line)}, moduleCall, []gpu.Frame{m.stepFrame, m.mainFrame})
}

func (m *model) layerOp(op string) gpu.StackID { return m.inModel(102, layerOps[op], moduleCall) }

func (m *model) workspace(op string) gpu.StackID {
	return m.inModel(102, []gpu.Frame{cpp("at::cuda::getCUDABlasLtWorkspace()")}, layerOps[op], moduleCall)
}

// node is a stack in the autograd engine's thread, in backward node name.
func (m *model) node(name string) gpu.StackID {
	return m.stack([]gpu.Frame{cpp("torch::autograd::generated::" + name + "::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)")}, engine)
}

var backwardNode = map[string]string{"mlp.down": "MmBackward0", "mlp.up": "MmBackward0", "ln2": "NativeLayerNormBackward0",
	"attn.out": "MmBackward0", "attn.qkv": "MmBackward0", "ln1": "NativeLayerNormBackward0"}

// params lists the parameters of layers [from, to), with the embedding
// and the head (final norm and lm_head) when asked, in construction
// order.
func (m *model) params(from, to int, embed, head bool) []param {
	var plist []param
	add := func(name string, elems uint64) { plist = append(plist, param{name, elems * m.D}) }
	H := m.H
	if embed {
		add("model.embed.weight", uint64(m.t.Vocab)*H)
	}
	for l := from; l < to; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		add(p+"ln1.weight", H)
		add(p+"attn.qkv.weight", 3*H*H)
		add(p+"attn.out.weight", H*H)
		add(p+"ln2.weight", H)
		add(p+"mlp.up.weight", 4*H*H)
		add(p+"mlp.down.weight", 4*H*H)
	}
	if head {
		add("model.norm.weight", H)
		add("model.lm_head.weight", uint64(m.t.Vocab)*H)
	}
	return plist
}

// build allocates the parameters plist lists (they live as long as the
// job) and makes them the model's.
func (m *model) build(plist []param) error {
	m.plist = plist
	for _, p := range plist {
		if _, err := m.malloc(p.size, m.stack(paramInit(p.name), []gpu.Frame{frame("__init__", "model.py", paramLine(p.name)),
			frame("build_model", trainFile, 20), m.mainFrame}), RoleParameter); err != nil {
			return err
		}
	}
	return nil
}

// embed is the embedding's output, the first layer's input.
func (m *model) embed() (uint64, error) {
	return m.malloc(m.B*m.S*m.H*m.D, m.inModel(100, []gpu.Frame{frame("embedding", torchDir+"nn/functional.py", 2551),
		frame("forward", torchDir+"nn/modules/sparse.py", 190)}), RoleActivation)
}

// forwardLayer runs layer l on x: the activations it saves for backward
// and its output.
func (m *model) forwardLayer(l int, x uint64) (tensors, uint64, error) {
	env, B, S, H, D := m.env, m.B, m.S, m.H, m.D
	acts := tensors{"input": x}
	steps := []struct {
		name  string
		elems uint64
	}{
		{"ln1", B * S * H}, {"attn.qkv", 3 * B * S * H}, {"attn.scores", B * m.heads * S * S},
		{"attn.probs", B * m.heads * S * S}, {"attn.context", B * S * H}, {"attn.out", B * S * H},
		{"ln2", B * S * H}, {"mlp.up", 4 * B * S * H}, {"mlp.act", 4 * B * S * H}, {"mlp.down", B * S * H},
	}
	for _, s := range steps {
		a, err := m.malloc(s.elems*D, m.layerOp(s.name), RoleActivation)
		if err != nil {
			return nil, 0, err
		}
		acts[s.name] = a
		if s.name == "attn.qkv" || s.name == "mlp.up" {
			// a matmul's workspace, gone right after
			ws, err := m.malloc(uint64(4+m.r.IntN(28))<<20, m.workspace(s.name), RoleTemporary)
			if err != nil {
				return nil, 0, err
			}
			env.Clock.Advance(30)
			if err := env.free(ws); err != nil {
				return nil, 0, err
			}
		}
		env.Clock.Advance(int64(s.elems / 4096))
	}
	// scores are consumed by softmax; the residual stream moves on
	if err := env.free(acts["attn.scores"]); err != nil {
		return nil, 0, err
	}
	delete(acts, "attn.scores")
	x = acts["mlp.down"]
	delete(acts, "mlp.down")
	if m.t.Checkpointing {
		in := acts["input"]
		delete(acts, "input")
		if err := acts.freeAll(env); err != nil {
			return nil, 0, err
		}
		acts["input"] = in
	}
	return acts, x, nil
}

// head is the lm_head's logits and the loss.
func (m *model) head() (logits, loss uint64, err error) {
	logits, err = m.malloc(m.B*m.S*uint64(m.t.Vocab)*4, m.inModel(104, []gpu.Frame{linearFwd}), RoleActivation)
	if err != nil {
		return 0, 0, err
	}
	m.env.Clock.Advance(int64(m.B * m.S * uint64(m.t.Vocab) / 4096))
	loss, err = m.malloc(512, m.stack([]gpu.Frame{frame("cross_entropy", torchDir+"nn/functional.py", 3479), frame("train_step", trainFile, 89), m.mainFrame}), RoleActivation)
	return logits, loss, err
}

// grad gives parameter name its gradient the first time backward reaches
// it; later micro-batches accumulate into it.
func (m *model) grad(grads tensors, name string, stack gpu.StackID) error {
	if _, ok := grads[name]; ok {
		return nil
	}
	g, err := m.malloc(paramSize(m.plist, name), stack, RoleGradient)
	if err != nil {
		return err
	}
	grads[name] = g
	return nil
}

// headBackward runs backward through the lm_head and the final norm,
// freeing the logits: the gradient of the last layer's output.
func (m *model) headBackward(logits uint64, grads tensors) (uint64, error) {
	env := m.env
	dlogits, err := m.malloc(m.B*m.S*uint64(m.t.Vocab)*4, m.node("LogSoftmaxBackward0"), RoleTemporary)
	if err != nil {
		return 0, err
	}
	if err := env.free(logits); err != nil {
		return 0, err
	}
	if err := m.grad(grads, "model.lm_head.weight", m.node("MmBackward0")); err != nil {
		return 0, err
	}
	dx, err := m.malloc(m.B*m.S*m.H*m.D, m.node("MmBackward0"), RoleTemporary)
	if err != nil {
		return 0, err
	}
	if err := env.free(dlogits); err != nil {
		return 0, err
	}
	return dx, m.grad(grads, "model.norm.weight", m.node("NativeLayerNormBackward0"))
}

// backwardLayer runs backward through layer l (recomputing its
// activations under checkpointing) and frees what its forward saved.
func (m *model) backwardLayer(l int, acts tensors, grads tensors) error {
	env, B, S, H, D := m.env, m.B, m.S, m.H, m.D
	p := fmt.Sprintf("model.layers.%d.", l)
	if m.t.Checkpointing { // recompute the layer's activations
		for _, s := range []string{"ln1", "attn.qkv", "attn.probs", "attn.context", "attn.out", "ln2", "mlp.up", "mlp.act"} {
			a, err := m.malloc(B*S*H*D*mult(s, m.heads, S, H), m.stack(layerOps[s], moduleCall,
				[]gpu.Frame{frame("recompute_fn", torchDir+"utils/checkpoint.py", 1594)}, engine), RoleActivation)
			if err != nil {
				return err
			}
			acts[s] = a
		}
	}
	for _, w := range []string{"mlp.down", "mlp.up", "ln2", "attn.out", "attn.qkv", "ln1"} {
		if err := m.grad(grads, p+w+".weight", m.node(backwardNode[w])); err != nil {
			return err
		}
		tmp, err := m.malloc(B*S*H*D*mult(w, m.heads, S, H), m.node(backwardNode[w]), RoleTemporary)
		if err != nil {
			return err
		}
		env.Clock.Advance(int64(B * S * H / 2048))
		if err := env.free(tmp); err != nil {
			return err
		}
	}
	return acts.freeAll(env)
}

// optimizerStep is Adam's step over plist, as PyTorch's optimizers
// annotate it (its states created in fp32 on the first step), then
// zero_grad(set_to_none=True).
func (m *model) optimizerStep(plist []param, adam, grads tensors) error {
	env := m.env
	optStep := []gpu.Frame{frame("step", torchDir+"optim/adam.py", 236), frame("_use_grad", torchDir+"optim/optimizer.py", 79),
		frame("wrapper", torchDir+"optim/optimizer.py", 487), frame("train_step", trainFile, 93), m.mainFrame}
	env.begin("Optimizer.step#Adam.step")
	for _, p := range plist {
		if _, ok := adam[p.name+".exp_avg"]; !ok {
			for _, s := range []string{".exp_avg", ".exp_avg_sq"} {
				a, err := m.malloc(p.size/m.D*4, m.stack([]gpu.Frame{frame("_init_group", torchDir+"optim/adam.py", 170)}, optStep), RoleOptimizerState)
				if err != nil {
					return err
				}
				adam[p.name+s] = a
			}
		}
		tmp, err := m.malloc(p.size/m.D*4, m.stack([]gpu.Frame{frame("_multi_tensor_adam", torchDir+"optim/adam.py", 593),
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
	defer env.end()
	return grads.freeAll(env) // set_to_none=True
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
