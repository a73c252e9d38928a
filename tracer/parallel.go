package tracer

import (
	"context"
	"fmt"
	"math/rand/v2"

	"vramscope/gpu"
)

// Parallelism modes of a Parallel job.
const (
	DataParallel     = "dp"
	PipelineParallel = "pp"
)

// Parallel is a training job over several ranks, one workload per rank
// (Rank), each on its own device:
//
//   - data parallel: every rank holds the whole model and trains on its
//     own batches, whose sequence lengths vary from step to step and rank
//     to rank; one rank gets a batch of the full length once, and peaks;
//   - pipeline parallel: rank s is stage s of the model (a slice of the
//     layers; the embedding on the first stage, the head on the last),
//     running MicroBatches micro-batches of Batch sequences per step in
//     the 1F1B schedule. Stage s holds the activations of up to Ranks-s
//     micro-batches at once, so the first stage peaks.
//
// Ranks share one clock: a pipeline stage starts a micro-batch when the
// stage before has sent it, and every step starts on every rank together.
type Parallel struct {
	Train
	Ranks        int
	Mode         string // DataParallel or PipelineParallel
	MicroBatches int    // pipeline: micro-batches per step; 0: twice the ranks
}

// Check says what is wrong with p's shape, if anything.
func (p Parallel) Check() error {
	if err := p.Train.Check(); err != nil {
		return err
	}
	switch {
	case p.Ranks < 1:
		return fmt.Errorf("parallel: %d ranks; want at least 1", p.Ranks)
	case p.Mode != DataParallel && p.Mode != PipelineParallel:
		return fmt.Errorf("parallel: unknown mode %q (%s or %s)", p.Mode, DataParallel, PipelineParallel)
	case p.Mode == PipelineParallel && p.Layers < p.Ranks:
		return fmt.Errorf("parallel: %d layers cannot fill %d pipeline stages", p.Layers, p.Ranks)
	case p.MicroBatches < 0:
		return fmt.Errorf("parallel: %d micro-batches", p.MicroBatches)
	}
	return nil
}

// Rank is the workload of rank r.
func (p Parallel) Rank(r int) Workload {
	if p.Mode == PipelineParallel {
		return stage{p, r}
	}
	t := p.Train
	t.Seed += uint64(r)
	rng := rand.New(rand.NewPCG(p.Seed, uint64(r)+1))
	t.SeqLens = make([]int, t.Steps)
	for i := range t.SeqLens {
		t.SeqLens[i] = max(1, t.Seq/2+rng.IntN(t.Seq/4+1))
	}
	if long, step := p.longBatch(); r == long {
		t.SeqLens[step] = t.Seq
	}
	// Every step waits for the slowest rank's (all-reduce): about what a
	// full-length batch takes, with room.
	t.StepUS = p.stepUS()
	return t
}

// stepUS is about how long a data-parallel step of full-length batches
// takes: what its passes advance the clock by, plus room.
func (p Parallel) stepUS() int64 {
	t := p.Train
	B, S, H, V := int64(t.Batch), int64(t.Seq), int64(t.Hidden), int64(t.Vocab)
	heads := max(1, H/128)
	layer := (16*B*S*H+B*heads*S*S)/4096 + 3*B*S*H/1024 + 400
	params := int64(t.Layers)*12*H*H + 2*V*H
	return (int64(t.Layers)*layer + B*S*V/4096 + params*int64(t.DtypeBytes)/65536 + 20_000) * 5 / 4
}

// longBatch is the one data-parallel rank whose batch, at one step, has
// the full sequence length (the others have at most three quarters of
// it), and that step: after the first when there are several, so the
// optimizer's states are there too.
func (p Parallel) longBatch() (rank, step int) {
	rng := rand.New(rand.NewPCG(p.Seed, 0))
	rank = rng.IntN(p.Ranks)
	if p.Steps > 1 {
		step = 1 + rng.IntN(p.Steps-1)
	}
	return rank, step
}

func (p Parallel) microBatches() int {
	if p.MicroBatches > 0 {
		return p.MicroBatches
	}
	return 2 * p.Ranks
}

// stage is one stage of a pipeline-parallel job.
type stage struct {
	p Parallel
	s int
}

// pipeOp is a forward or backward pass of one micro-batch on a stage,
// starting at at µs into the step.
type pipeOp struct {
	backward bool
	mb       int
	at       int64
}

// layers are the stage's layers, [from, to).
func (st stage) layers() (from, to int) {
	n, l := st.p.Ranks, st.p.Layers
	return st.s * l / n, (st.s + 1) * l / n
}

// schedule gives every stage its 1F1B order of passes (warm-up forwards,
// then one forward and one backward in turn, then the last backwards),
// each timed to start once the stage is free and the micro-batch has
// arrived (the previous stage's forward, the next stage's backward), and
// the step's length.
func (p Parallel) schedule(fwdUS []int64) ([][]pipeOp, int64) {
	n, m := p.Ranks, p.microBatches()
	order := make([][]pipeOp, n)
	for s := range n {
		warm := min(n-s-1, m)
		for i := range warm {
			order[s] = append(order[s], pipeOp{mb: i})
		}
		for i := range m - warm {
			order[s] = append(order[s], pipeOp{mb: warm + i}, pipeOp{backward: true, mb: i})
		}
		for i := m - warm; i < m; i++ {
			order[s] = append(order[s], pipeOp{backward: true, mb: i})
		}
	}
	endF, endB := make([][]int64, n), make([][]int64, n)
	for s := range n {
		endF[s], endB[s] = make([]int64, m), make([]int64, m)
		for i := range m {
			endF[s][i], endB[s][i] = -1, -1
		}
	}
	next, free := make([]int, n), make([]int64, n)
	var length int64
	for left := 2 * n * m; left > 0; {
		for s := range n {
			if next[s] == len(order[s]) {
				continue
			}
			op := &order[s][next[s]]
			ready := int64(0)
			switch {
			case !op.backward && s > 0:
				ready = endF[s-1][op.mb]
			case op.backward && s < n-1:
				ready = endB[s+1][op.mb]
			case op.backward:
				ready = endF[s][op.mb]
			}
			if ready < 0 {
				continue
			}
			op.at = max(free[s], ready)
			free[s] = op.at + fwdUS[s]
			if op.backward {
				free[s] = op.at + 2*fwdUS[s]
				endB[s][op.mb] = free[s]
			} else {
				endF[s][op.mb] = free[s]
			}
			length = max(length, free[s])
			next[s]++
			left--
		}
	}
	return order, length
}

// forwardUS is about how long a forward pass of one micro-batch takes on
// each stage: what the passes advance the clock by, plus room.
func (p Parallel) forwardUS() []int64 {
	t := p.Train
	B, S, H, V := int64(t.Batch), int64(t.Seq), int64(t.Hidden), int64(t.Vocab)
	heads := max(1, H/128)
	layer := (16*B*S*H+B*heads*S*S)/4096 + 200
	out := make([]int64, p.Ranks)
	for s := range out {
		from, to := stage{p, s}.layers()
		out[s] = int64(to-from)*layer + 100
		if s == p.Ranks-1 {
			out[s] += B * S * V / 4096
		}
	}
	return out
}

// Every stage starts its first step at pipeStartUS, after building its
// parameters; steps are a schedule's length apart, with room for the
// optimizer.
const pipeStartUS = 200_000

func (st stage) Run(ctx context.Context, env *Env) error {
	p := st.p
	if err := p.Check(); err != nil {
		return err
	}
	if st.s < 0 || st.s >= p.Ranks {
		return fmt.Errorf("parallel: stage %d of %d", st.s, p.Ranks)
	}
	m, err := newModel(p.Train, env)
	if err != nil {
		return err
	}
	first, last := st.s == 0, st.s == p.Ranks-1
	from, to := st.layers()
	if err := m.build(m.params(from, to, first, last)); err != nil {
		return err
	}
	order, length := p.schedule(p.forwardUS())
	stepUS := length + length/4 + 50_000
	recvFrame := func(fn string) gpu.StackID {
		return m.stack([]gpu.Frame{frame(fn, "pipeline_parallel/p2p_communication.py", 310), frame("forward_backward_pipelining", "pipeline_parallel/schedules.py", 1200), m.stepFrame, m.mainFrame})
	}
	adam := tensors{}
	inFlight := 0
	for step := range p.Steps {
		if err := env.pace(ctx); err != nil {
			return err
		}
		env.Clock.US = max(env.Clock.US, pipeStartUS+int64(step)*stepUS)
		start := env.Clock.US
		env.begin(fmt.Sprintf("ProfilerStep#%d", step))
		saved := map[int][]tensors{}
		heads := map[int][2]uint64{} // the last stage's logits and loss per micro-batch
		grads := tensors{}
		for _, op := range order[st.s] {
			env.Clock.US = max(env.Clock.US, start+op.at)
			if !op.backward {
				var x uint64
				if first {
					x, err = m.embed()
				} else {
					x, err = env.malloc(m.B*m.S*m.H*m.D, recvFrame("recv_forward"))
				}
				if err != nil {
					return err
				}
				acts := make([]tensors, to-from)
				for l := from; l < to; l++ {
					if acts[l-from], x, err = m.forwardLayer(l, x); err != nil {
						return err
					}
				}
				saved[op.mb] = acts
				inFlight = max(inFlight, len(saved))
				if last {
					logits, loss, err := m.head()
					if err != nil {
						return err
					}
					heads[op.mb] = [2]uint64{logits, loss}
				}
				// sent on to the next stage (or consumed by the head)
				if err := env.free(x); err != nil {
					return err
				}
				continue
			}
			var dx uint64
			if last {
				dx, err = m.headBackward(heads[op.mb][0], grads)
			} else {
				dx, err = env.malloc(m.B*m.S*m.H*m.D, recvFrame("recv_backward"))
			}
			if err != nil {
				return err
			}
			for l := to - 1; l >= from; l-- {
				if err := m.backwardLayer(l, saved[op.mb][l-from], grads); err != nil {
					return err
				}
			}
			delete(saved, op.mb)
			if first {
				if err := m.grad(grads, "model.embed.weight", m.node("EmbeddingBackward0")); err != nil {
					return err
				}
			}
			// sent back to the stage before (or the end of the pass)
			if err := env.free(dx); err != nil {
				return err
			}
			if last {
				if err := env.free(heads[op.mb][1]); err != nil {
					return err
				}
			}
		}
		env.Clock.US = max(env.Clock.US, start+length)
		if err := m.optimizerStep(m.plist, adam, grads); err != nil {
			return err
		}
		env.end()
	}
	env.metric("micro_batches_in_flight", float64(inFlight))
	env.Notes = append(env.Notes, fmt.Sprintf("pipeline stage %d of %d: layers %d-%d, %d micro-batches of %d x %d tokens in 1F1B, at most %d in flight",
		st.s, p.Ranks, from, to-1, p.microBatches(), p.Batch, p.Seq, inFlight))
	return nil
}
