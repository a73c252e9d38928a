package tracer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"

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
		if err := ctx.Err(); err != nil {
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
		if err := m.grad(grads, "model.embed.weight", m.bwd("model.embed", 3)); err != nil {
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
// and optimizer states under the frames a PyTorch job would show.
type model struct {
	t                 Train
	env               *Env
	r                 *rand.Rand
	H, B, S, D, heads uint64
	plist             []param
	mainFrame         gpu.Frame
	stepFrame         gpu.Frame
}

func newModel(t Train, env *Env) (*model, error) {
	if t.Layers <= 0 || t.Hidden <= 0 || t.Batch <= 0 || t.Seq <= 0 || t.Steps <= 0 || t.DtypeBytes <= 0 || t.Vocab <= 0 || slices.ContainsFunc(t.SeqLens, func(n int) bool { return n <= 0 }) {
		return nil, fmt.Errorf("train: layers, hidden, vocab, batch, seq, steps and dtype bytes must be positive")
	}
	m := &model{t: t, env: env, r: rand.New(rand.NewPCG(t.Seed, 0x7472)),
		H: uint64(t.Hidden), B: uint64(t.Batch), S: uint64(t.Seq), D: uint64(t.DtypeBytes),
		mainFrame: frame("main", trainFile, 120), stepFrame: frame("train_step", trainFile, 90)}
	m.heads = max(uint64(1), m.H/128)
	return m, nil
}

func (m *model) st(module, fn string, line uint64, outer ...gpu.Frame) gpu.StackID {
	fr := append([]gpu.Frame{frame(module, "model.py", line), frame(fn, trainFile, 40+line%17)}, outer...)
	return m.env.stack(fr...)
}

func (m *model) fwd(module string, line uint64) gpu.StackID {
	return m.st(module, "forward", line, m.stepFrame, m.mainFrame)
}

func (m *model) bwd(module string, line uint64) gpu.StackID {
	return m.st(module, "backward", line, m.stepFrame, m.mainFrame)
}

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
	for i, p := range plist {
		if _, err := m.env.malloc(p.size, m.st(p.name, "__init__", uint64(i%50), frame("build_model", trainFile, 20), m.mainFrame)); err != nil {
			return err
		}
	}
	return nil
}

// embed is the embedding's output, the first layer's input.
func (m *model) embed() (uint64, error) {
	return m.env.malloc(m.B*m.S*m.H*m.D, m.fwd("model.embed", 3))
}

// forwardLayer runs layer l on x: the activations it saves for backward
// and its output.
func (m *model) forwardLayer(l int, x uint64) (tensors, uint64, error) {
	env, B, S, H, D := m.env, m.B, m.S, m.H, m.D
	p := fmt.Sprintf("model.layers.%d.", l)
	acts := tensors{"input": x}
	steps := []struct {
		name  string
		elems uint64
	}{
		{"ln1", B * S * H}, {"attn.qkv", 3 * B * S * H}, {"attn.scores", B * m.heads * S * S},
		{"attn.probs", B * m.heads * S * S}, {"attn.context", B * S * H}, {"attn.out", B * S * H},
		{"ln2", B * S * H}, {"mlp.up", 4 * B * S * H}, {"mlp.act", 4 * B * S * H}, {"mlp.down", B * S * H},
	}
	for i, s := range steps {
		a, err := env.malloc(s.elems*D, m.fwd(p+s.name, uint64(10+i)))
		if err != nil {
			return nil, 0, err
		}
		acts[s.name] = a
		if s.name == "attn.qkv" || s.name == "mlp.up" {
			// a matmul's workspace, gone right after
			ws, err := env.malloc(uint64(4+m.r.IntN(28))<<20, m.fwd(p+s.name+".workspace", 30))
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
	logits, err = m.env.malloc(m.B*m.S*uint64(m.t.Vocab)*4, m.fwd("model.lm_head", 7))
	if err != nil {
		return 0, 0, err
	}
	m.env.Clock.Advance(int64(m.B * m.S * uint64(m.t.Vocab) / 4096))
	loss, err = m.env.malloc(512, m.fwd("loss", 8))
	return logits, loss, err
}

// grad gives parameter name its gradient the first time backward reaches
// it; later micro-batches accumulate into it.
func (m *model) grad(grads tensors, name string, stack gpu.StackID) error {
	if _, ok := grads[name]; ok {
		return nil
	}
	g, err := m.env.malloc(paramSize(m.plist, name), stack)
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
	dlogits, err := env.malloc(m.B*m.S*uint64(m.t.Vocab)*4, m.bwd("model.lm_head", 7))
	if err != nil {
		return 0, err
	}
	if err := env.free(logits); err != nil {
		return 0, err
	}
	if err := m.grad(grads, "model.lm_head.weight", m.bwd("model.lm_head", 7)); err != nil {
		return 0, err
	}
	dx, err := env.malloc(m.B*m.S*m.H*m.D, m.bwd("model.lm_head", 9))
	if err != nil {
		return 0, err
	}
	if err := env.free(dlogits); err != nil {
		return 0, err
	}
	return dx, m.grad(grads, "model.norm.weight", m.bwd("model.norm", 5))
}

// backwardLayer runs backward through layer l (recomputing its
// activations under checkpointing) and frees what its forward saved.
func (m *model) backwardLayer(l int, acts tensors, grads tensors) error {
	env, B, S, H, D := m.env, m.B, m.S, m.H, m.D
	p := fmt.Sprintf("model.layers.%d.", l)
	if m.t.Checkpointing { // recompute the layer's activations
		for _, s := range []string{"ln1", "attn.qkv", "attn.probs", "attn.context", "attn.out", "ln2", "mlp.up", "mlp.act"} {
			a, err := env.malloc(B*S*H*D*mult(s, m.heads, S, H), m.st(p+s, "recompute", 60, m.stepFrame, m.mainFrame))
			if err != nil {
				return err
			}
			acts[s] = a
		}
	}
	for _, w := range []string{"mlp.down", "mlp.up", "ln2", "attn.out", "attn.qkv", "ln1"} {
		if err := m.grad(grads, p+w+".weight", m.bwd(p+w, 20)); err != nil {
			return err
		}
		tmp, err := env.malloc(B*S*H*D*mult(w, m.heads, S, H), m.bwd(p+w+".grad_input", 21))
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

// optimizerStep is Adam's step over plist (its states created in fp32 on
// the first step) and zero_grad(set_to_none=True).
func (m *model) optimizerStep(plist []param, adam, grads tensors) error {
	env := m.env
	optFrame := frame("step", "torch/optim/adam.py", 166)
	for _, p := range plist {
		if _, ok := adam[p.name+".exp_avg"]; !ok {
			for _, s := range []string{".exp_avg", ".exp_avg_sq"} {
				a, err := env.malloc(p.size/m.D*4, env.stack(frame("_init_group", "torch/optim/adam.py", 120), optFrame, m.stepFrame, m.mainFrame))
				if err != nil {
					return err
				}
				adam[p.name+s] = a
			}
		}
		tmp, err := env.malloc(p.size/m.D*4, env.stack(frame("_multi_tensor_adam", "torch/optim/adam.py", 540), optFrame, m.stepFrame, m.mainFrame))
		if err != nil {
			return err
		}
		env.Clock.Advance(int64(p.size / 65536))
		if err := env.free(tmp); err != nil {
			return err
		}
	}
	return grads.freeAll(env)
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
