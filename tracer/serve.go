package tracer

import (
	"context"
	"fmt"
	"math/rand/v2"

	"vramscope/gpu"
)

// KV cache layouts for ServeKV.
const (
	KVContiguous = "contiguous" // one max-length buffer per request
	KVPaged      = "paged"      // fixed-size blocks from a pool allocated at start, as vLLM does
)

// ServeKV is LLM serving: requests with random prompt and output lengths
// arrive over time; each decode step allocates and frees activations for
// the running batch; the KV cache is either a max-length buffer per request
// or a paged pool allocated once.
type ServeKV struct {
	KV           string
	Layers       int
	Hidden       int
	KVHeads      int
	HeadDim      int
	Vocab        int
	DtypeBytes   int
	Requests     int
	MaxBatch     int
	MaxPrompt    int
	MaxOutput    int
	BlockTokens  int     // paged: tokens per KV block (vLLM's default is 16)
	PoolFraction float64 // paged: share of device memory the KV pool takes (gpu_memory_utilization)
	Seed         uint64
}

// DefaultServeKV is a Llama-3-8B-like model serving 64 requests.
func DefaultServeKV() ServeKV {
	return ServeKV{KV: KVPaged, Layers: 32, Hidden: 4096, KVHeads: 8, HeadDim: 128, Vocab: 128256, DtypeBytes: 2,
		Requests: 64, MaxBatch: 16, MaxPrompt: 2048, MaxOutput: 512, BlockTokens: 16, PoolFraction: 0.5, Seed: 1}
}

type serveReq struct {
	id          int
	prompt, out int
	done        int
	kv          uint64 // contiguous buffer
	reserved    int    // tokens of KV memory held
	arrive      int64
}

// Check says what is wrong with s's settings, if anything.
func (s ServeKV) Check() error {
	if s.KV != KVContiguous && s.KV != KVPaged {
		return fmt.Errorf("serve-kv: --kv must be %s or %s, not %q", KVContiguous, KVPaged, s.KV)
	}
	if s.Requests <= 0 || s.MaxBatch <= 0 || s.MaxPrompt <= 0 || s.MaxOutput <= 0 || s.Layers <= 0 || s.Hidden <= 0 {
		return fmt.Errorf("serve-kv: requests, batch, prompt, output, layers and hidden must be positive")
	}
	return nil
}

func (s ServeKV) Run(ctx context.Context, env *Env) error {
	if err := s.Check(); err != nil {
		return err
	}
	r := rand.New(rand.NewPCG(s.Seed, 0x6b76))
	D := uint64(s.DtypeBytes)
	H := uint64(s.Hidden)
	kvPerToken := 2 * uint64(s.Layers) * uint64(s.KVHeads) * uint64(s.HeadDim) * D
	mainFrame := frame("serve", "server.py", 200)
	stack := func(name, fn string, line uint64) gpu.StackID {
		return env.stack(frame(name, "model.py", line), frame(fn, "engine.py", 30+line), mainFrame)
	}

	// Weights, live for the whole run.
	for l := 0; l < s.Layers; l++ {
		for i, size := range []uint64{3 * H * H, H * H, 2 * 7 * H * H, 7 * H * H} { // qkv, o, gate+up, down (llama-style MLP)
			if _, err := env.malloc(size*D, stack(fmt.Sprintf("model.layers.%d.w%d", l, i), "load_weights", 10)); err != nil {
				return err
			}
		}
	}
	if _, err := env.malloc(uint64(s.Vocab)*H*D*2, stack("model.embed_tokens+lm_head", "load_weights", 11)); err != nil {
		return err
	}
	env.Clock.Advance(2_000_000)

	// Paged: the whole KV pool is a few huge tensors allocated at start.
	var poolTokens, freeBlocks int
	if s.KV == KVPaged {
		free, _, err := env.Alloc.Device().MemInfo()
		if err != nil {
			return err
		}
		budget := uint64(float64(free) * s.PoolFraction)
		blockBytes := kvPerToken * uint64(s.BlockTokens)
		freeBlocks = int(budget / blockBytes)
		if freeBlocks == 0 {
			return fmt.Errorf("serve-kv: no room for a paged KV pool (%s free)", gpu.FormatBytes(free))
		}
		perLayer := uint64(freeBlocks) * blockBytes / uint64(s.Layers)
		for l := 0; l < s.Layers; l++ {
			if _, err := env.malloc(perLayer, stack(fmt.Sprintf("kv_cache.layers.%d", l), "allocate_kv_cache", 50)); err != nil {
				return err
			}
		}
		poolTokens = freeBlocks * s.BlockTokens
	}

	// Arrivals: a Poisson stream, 40 requests a second.
	var pending []*serveReq
	t := int64(0)
	for i := 0; i < s.Requests; i++ {
		t += int64(r.ExpFloat64() * 25_000)
		pending = append(pending, &serveReq{id: i, prompt: 16 + r.IntN(s.MaxPrompt), out: 1 + r.IntN(s.MaxOutput), arrive: t})
	}
	start := env.Clock.US
	var running []*serveReq
	var usedTok, heldTok, peakWaste uint64
	var wasteSum float64
	var samples int
	finished := 0
	for finished < s.Requests {
		if err := env.pace(ctx); err != nil {
			return err
		}
		now := env.Clock.US - start
		// Admit arrived requests while the batch and the KV space allow.
		for len(pending) > 0 && pending[0].arrive <= now && len(running) < s.MaxBatch {
			q := pending[0]
			if s.KV == KVPaged {
				need := (q.prompt + s.BlockTokens - 1) / s.BlockTokens
				if need > freeBlocks {
					break
				}
				freeBlocks -= need
				q.reserved = need * s.BlockTokens
			} else {
				q.reserved = s.MaxPrompt + s.MaxOutput
				p, err := env.malloc(uint64(q.reserved)*kvPerToken, stack("kv_cache.request", "allocate_request_kv", 60))
				if err != nil {
					return err
				}
				q.kv = p
			}
			pending = pending[1:]
			running = append(running, q)
			// Prefill: activations for the whole prompt, freed right after.
			act, err := env.malloc(uint64(q.prompt)*H*D*4, stack("model.prefill.activations", "prefill", 70))
			if err != nil {
				return err
			}
			env.Clock.Advance(int64(q.prompt) * 20)
			if err := env.free(act); err != nil {
				return err
			}
			q.done = 0
		}
		if len(running) == 0 {
			if len(pending) > 0 {
				env.Clock.US = start + pending[0].arrive
			}
			continue
		}
		// One decode step for the batch.
		B := uint64(len(running))
		hidden, err := env.malloc(B*H*D, stack("model.decode.hidden", "decode_step", 80))
		if err != nil {
			return err
		}
		mlp, err := env.malloc(B*14*H*D, stack("model.decode.mlp", "decode_step", 81))
		if err != nil {
			return err
		}
		logits, err := env.malloc(B*uint64(s.Vocab)*4, stack("model.lm_head.logits", "decode_step", 82))
		if err != nil {
			return err
		}
		env.Clock.Advance(8_000 + int64(B)*200)
		for _, p := range []uint64{mlp, logits, hidden} {
			if err := env.free(p); err != nil {
				return err
			}
		}
		usedTok, heldTok = 0, 0
		kept := running[:0]
		for i := 0; i < len(running); i++ {
			q := running[i]
			q.done++
			tokens := q.prompt + q.done
			if s.KV == KVPaged && tokens > q.reserved {
				// Out of blocks: preempt the newest other request (vLLM's
				// recompute preemption) until one is free.
				for freeBlocks == 0 && len(running) > i+1 {
					v := running[len(running)-1]
					running = running[:len(running)-1]
					freeBlocks += v.reserved / s.BlockTokens
					v.reserved, v.done = 0, 0
					pending = append([]*serveReq{v}, pending...)
				}
				if freeBlocks == 0 {
					return fmt.Errorf("serve-kv: the KV pool cannot hold one request of %d tokens", tokens)
				}
				freeBlocks--
				q.reserved += s.BlockTokens
			}
			if q.done >= q.out {
				finished++
				if s.KV == KVPaged {
					freeBlocks += q.reserved / s.BlockTokens
				} else if err := env.free(q.kv); err != nil {
					return err
				}
				continue
			}
			usedTok += uint64(tokens)
			heldTok += uint64(q.reserved)
			kept = append(kept, q)
		}
		running = kept
		waste := (heldTok - usedTok) * kvPerToken
		peakWaste = max(peakWaste, waste)
		wasteSum += float64(waste)
		samples++
	}
	mean := uint64(0)
	if samples > 0 {
		mean = uint64(wasteSum / float64(samples))
	}
	note := fmt.Sprintf("serve-kv (%s): %d requests; KV memory held but unused: mean %s, peak %s", s.KV, s.Requests, gpu.FormatBytes(mean), gpu.FormatBytes(peakWaste))
	if s.KV == KVPaged {
		note += fmt.Sprintf("; pool of %d tokens", poolTokens)
	}
	env.Notes = append(env.Notes, note)
	env.metric("kv_waste_mean_bytes", float64(mean))
	env.metric("kv_waste_peak_bytes", float64(peakWaste))
	return nil
}
