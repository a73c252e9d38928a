package tracer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"

	"vramscope/gpu"
	"vramscope/gpu/caching"
)

// Frag is the fragmentation failure from the field: mixed-size tensors
// come and go, big cached blocks get split by smaller requests and pinned by
// long-lived small tensors, and finally a large request fails although the
// free total is several times larger. With expandable_segments:True the
// allocator unmaps the free pages and maps them again contiguously, and the
// same run succeeds.
type Frag struct {
	Seed uint64
	// Fill is the share of device memory the big tensors take.
	Fill float64
}

// DefaultFrag fills 85 % of the device.
func DefaultFrag() Frag { return Frag{Seed: 1, Fill: 0.85} }

// Check says what is wrong with f's settings, if anything.
func (f Frag) Check() error {
	if f.Fill <= 0 || f.Fill >= 1 {
		return fmt.Errorf("frag: fill must be in (0,1), got %v", f.Fill)
	}
	return nil
}

func (f Frag) Run(ctx context.Context, env *Env) error {
	if err := f.Check(); err != nil {
		return err
	}
	r := rand.New(rand.NewPCG(f.Seed, 0x6672))
	_, capacity, err := env.Alloc.Device().MemInfo()
	if err != nil {
		return err
	}
	unit := max(uint64(2<<20), capacity/256) // tensor sizes scale with the device
	mainFrame := frame("main", "stress.py", 80)
	st := func(fn string, line uint64) gpu.StackID {
		return env.stack(frame(fn, "stress.py", line), mainFrame)
	}

	// 1. Churn: mixed sizes come and go; a few stay as long-lived state.
	if err := env.pace(ctx); err != nil {
		return err
	}
	env.begin("churn")
	var churn []uint64
	for i := 0; i < 400; i++ {
		if len(churn) > 0 && r.IntN(3) == 0 {
			j := r.IntN(len(churn))
			if err := env.free(churn[j]); err != nil {
				return err
			}
			churn = append(churn[:j], churn[j+1:]...)
			continue
		}
		p, err := env.malloc(uint64(1+r.IntN(int(unit/2))), st("make_batch", 12))
		if err != nil {
			return err
		}
		churn = append(churn, p)
		env.Clock.Advance(50)
	}
	for _, p := range churn {
		if err := env.free(p); err != nil {
			return err
		}
	}
	env.end()

	// 2. Big activations fill the device, then are freed: cached, unsplit.
	if err := env.pace(ctx); err != nil {
		return err
	}
	env.begin("fill")
	var big, sizes []uint64
	for env.Alloc.Reserved() < uint64(f.Fill*float64(capacity)) {
		size := unit * uint64(4+r.IntN(6))
		p, err := env.malloc(size, st("forward", 30))
		if err != nil {
			return err
		}
		big = append(big, p)
		sizes = append(sizes, size)
		env.Clock.Advance(200)
	}
	for _, p := range big {
		if err := env.free(p); err != nil {
			return err
		}
	}
	env.Clock.Advance(1000)
	env.end()

	// 3. Slightly smaller tensors reuse the cached blocks (best fit, smallest
	// first), splitting each; a small long-lived tensor (optimizer state, a
	// KV entry) lands in every remainder and pins the block.
	if err := env.pace(ctx); err != nil {
		return err
	}
	env.begin("reuse")
	slices.Sort(sizes)
	var reuse, pins []uint64
	for _, size := range sizes {
		// Larger than any churn block, so best fit puts it in this remainder.
		pin := unit/2 + uint64(1+r.IntN(int(unit>>21)-2))<<20
		p, err := env.malloc(size-pin, st("backward", 44))
		if err != nil {
			return err
		}
		reuse = append(reuse, p)
		q, err := env.malloc(pin, st("register_buffer", 52))
		if err != nil {
			return err
		}
		pins = append(pins, q)
		env.Clock.Advance(150)
	}
	for _, p := range reuse {
		if err := env.free(p); err != nil {
			return err
		}
	}
	env.Clock.Advance(1000)
	env.end()

	// 4. One large tensor, half the device: more than the driver has free,
	// less than what the cache holds in pieces.
	if err := env.pace(ctx); err != nil {
		return err
	}
	env.begin("allocate_output")
	free, _, err := env.Alloc.Device().MemInfo()
	if err != nil {
		return err
	}
	cached := env.Alloc.Reserved() - env.Alloc.Allocated()
	want := uint64(0.5*float64(capacity)) &^ (64<<20 - 1)
	p, err := env.malloc(want, st("allocate_output", 61))
	var oom *caching.OutOfMemoryError
	if errors.As(err, &oom) {
		// Counted after the allocator released the free segments it could
		// and retried, as PyTorch's message counts them.
		free, _, merr := env.Alloc.Device().MemInfo()
		if merr != nil {
			return merr
		}
		cached := env.Alloc.Reserved() - env.Alloc.Allocated()
		env.Notes = append(env.Notes, fmt.Sprintf("frag: %s cached free in split segments and %s on the device, yet %s failed",
			gpu.FormatBytes(cached), gpu.FormatBytes(free), gpu.FormatBytes(want)))
		return err
	}
	if err != nil {
		return err
	}
	env.Notes = append(env.Notes, fmt.Sprintf("frag: the %s tensor fit (%s was cached free, %s on the device)",
		gpu.FormatBytes(want), gpu.FormatBytes(cached), gpu.FormatBytes(free)))
	if err := env.free(p); err != nil {
		return err
	}
	for _, q := range pins {
		if err := env.free(q); err != nil {
			return err
		}
	}
	return nil
}
