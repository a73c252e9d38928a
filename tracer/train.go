package tracer

import (
	"context"
	"fmt"
	"math/rand/v2"

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

func (t Train) Run(ctx context.Context, env *Env) error {
	if t.Layers <= 0 || t.Hidden <= 0 || t.Batch <= 0 || t.Seq <= 0 || t.Steps <= 0 || t.DtypeBytes <= 0 || t.Vocab <= 0 {
		return fmt.Errorf("train: layers, hidden, vocab, batch, seq, steps and dtype bytes must be positive")
	}
	r := rand.New(rand.NewPCG(t.Seed, 0x7472))
	H, B, S, D := uint64(t.Hidden), uint64(t.Batch), uint64(t.Seq), uint64(t.DtypeBytes)
	heads := max(uint64(1), H/128)
	st := func(module, fn string, line uint64, outer ...gpu.Frame) gpu.StackID {
		fr := append([]gpu.Frame{frame(module, "model.py", line), frame(fn, trainFile, 40+line%17)}, outer...)
		return env.stack(fr...)
	}
	mainFrame := frame("main", trainFile, 120)

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
	for i, p := range plist {
		a, err := env.malloc(p.size, st(p.name, "__init__", uint64(i%50), frame("build_model", trainFile, 20), mainFrame))
		if err != nil {
			return err
		}
		params[p.name] = a
	}
	env.Clock.Advance(50_000)

	adam := tensors{}
	for step := 0; step < t.Steps; step++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		env.begin(fmt.Sprintf("ProfilerStep#%d", step))
		stepFrame := frame("train_step", trainFile, 90)
		fwd := func(module string, line uint64) gpu.StackID { return st(module, "forward", line, stepFrame, mainFrame) }
		bwd := func(module string, line uint64) gpu.StackID {
			return st(module, "backward", line, stepFrame, mainFrame)
		}
		var saved []tensors // per layer, freed in reverse in backward
		x, err := env.malloc(B*S*H*D, fwd("model.embed", 3))
		if err != nil {
			return err
		}
		for l := 0; l < t.Layers; l++ {
			p := fmt.Sprintf("model.layers.%d.", l)
			acts := tensors{"input": x}
			steps := []struct {
				name  string
				elems uint64
			}{
				{"ln1", B * S * H}, {"attn.qkv", 3 * B * S * H}, {"attn.scores", B * heads * S * S},
				{"attn.probs", B * heads * S * S}, {"attn.context", B * S * H}, {"attn.out", B * S * H},
				{"ln2", B * S * H}, {"mlp.up", 4 * B * S * H}, {"mlp.act", 4 * B * S * H}, {"mlp.down", B * S * H},
			}
			for i, s := range steps {
				a, err := env.malloc(s.elems*D, fwd(p+s.name, uint64(10+i)))
				if err != nil {
					return err
				}
				acts[s.name] = a
				if s.name == "attn.qkv" || s.name == "mlp.up" {
					// a matmul's workspace, gone right after
					ws, err := env.malloc(uint64(4+r.IntN(28))<<20, fwd(p+s.name+".workspace", 30))
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
		logits, err := env.malloc(B*S*uint64(t.Vocab)*4, fwd("model.lm_head", 7))
		if err != nil {
			return err
		}
		env.Clock.Advance(int64(B * S * uint64(t.Vocab) / 4096))
		loss, err := env.malloc(512, fwd("loss", 8))
		if err != nil {
			return err
		}
		if err := env.free(x); err != nil {
			return err
		}

		// Backward: gradients appear as the pass reaches each parameter.
		grads := tensors{}
		gradOf := func(name string, stack gpu.StackID) error {
			g, err := env.malloc(paramSize(plist, name), stack)
			if err != nil {
				return err
			}
			grads[name] = g
			return nil
		}
		dlogits, err := env.malloc(B*S*uint64(t.Vocab)*4, bwd("model.lm_head", 7))
		if err != nil {
			return err
		}
		if err := env.free(logits); err != nil {
			return err
		}
		if err := gradOf("model.lm_head.weight", bwd("model.lm_head", 7)); err != nil {
			return err
		}
		dx, err := env.malloc(B*S*H*D, bwd("model.lm_head", 9))
		if err != nil {
			return err
		}
		if err := env.free(dlogits); err != nil {
			return err
		}
		if err := gradOf("model.norm.weight", bwd("model.norm", 5)); err != nil {
			return err
		}
		for l := t.Layers - 1; l >= 0; l-- {
			p := fmt.Sprintf("model.layers.%d.", l)
			acts := saved[l]
			if t.Checkpointing { // recompute the layer's activations
				for _, s := range []string{"ln1", "attn.qkv", "attn.probs", "attn.context", "attn.out", "ln2", "mlp.up", "mlp.act"} {
					a, err := env.malloc(B*S*H*D*mult(s, heads, S, H), st(p+s, "recompute", 60, stepFrame, mainFrame))
					if err != nil {
						return err
					}
					acts[s] = a
				}
			}
			for _, w := range []string{"mlp.down", "mlp.up", "ln2", "attn.out", "attn.qkv", "ln1"} {
				if err := gradOf(p+w+".weight", bwd(p+w, 20)); err != nil {
					return err
				}
				tmp, err := env.malloc(B*S*H*D*mult(w, heads, S, H), bwd(p+w+".grad_input", 21))
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
		if err := gradOf("model.embed.weight", bwd("model.embed", 3)); err != nil {
			return err
		}
		if err := env.free(dx); err != nil {
			return err
		}
		if err := env.free(loss); err != nil {
			return err
		}

		// optimizer.step(): Adam states are created on the first step, in fp32.
		optFrame := frame("step", "torch/optim/adam.py", 166)
		for _, p := range plist {
			if _, ok := adam[p.name+".exp_avg"]; !ok {
				for _, s := range []string{".exp_avg", ".exp_avg_sq"} {
					a, err := env.malloc(p.size/D*4, env.stack(frame("_init_group", "torch/optim/adam.py", 120), optFrame, stepFrame, mainFrame))
					if err != nil {
						return err
					}
					adam[p.name+s] = a
				}
			}
			tmp, err := env.malloc(p.size/D*4, env.stack(frame("_multi_tensor_adam", "torch/optim/adam.py", 540), optFrame, stepFrame, mainFrame))
			if err != nil {
				return err
			}
			env.Clock.Advance(int64(p.size / 65536))
			if err := env.free(tmp); err != nil {
				return err
			}
		}
		// optimizer.zero_grad(set_to_none=True)
		if err := grads.freeAll(env); err != nil {
			return err
		}
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
