// Package tracer drives a caching allocator with workloads (training,
// KV-cache serving, fragmentation stress); every allocator event goes to a
// sink such as the SQLite store. Recorded traffic is replayed by package
// replay.
package tracer

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"vramscope/gpu"
	"vramscope/gpu/caching"
)

// Clock is simulated time in microseconds: workloads advance it by what
// their work would take, so traces are deterministic.
type Clock struct{ US int64 }

// Now returns the current time.
func (c *Clock) Now() int64 { return c.US }

// Advance moves time forward by us microseconds.
func (c *Clock) Advance(us int64) { c.US += us }

// Env is what a workload runs against.
type Env struct {
	Alloc *caching.Allocator
	Clock *Clock
	// Stacks interns the frames stamped on events; nil drops them.
	Stacks gpu.Stacks
	// Touch, when set, writes to allocated memory (a real GPU's memset), so
	// the memory is really taken and touched.
	Touch func(addr, size uint64) error
	// Annotations takes the workload's regions (its steps and phases) as
	// START and END annotations, like PyTorch's record_function; nil
	// drops them.
	Annotations gpu.Annotator
	// Role, when set, is told what each allocation of a workload that
	// knows it is for (the training loop's Role* names): the ground truth
	// tests compare categories with.
	Role func(addr uint64, role string)
	// Notes collects lines the workload wants in the final summary, and
	// Metrics the figures behind them.
	Notes   []string
	Metrics map[string]float64
	// StepTime, when set, paces the workload so that a person can watch
	// it live: each step (a training step, a phase of the fragmentation
	// stress, a decode step of serving) begins no sooner than StepTime
	// after the one before, in wall time; simulated time is unchanged.
	StepTime time.Duration

	regions []string  // open regions, innermost last
	paced   int       // steps begun under StepTime
	pacedAt time.Time // when the first of them began
}

// pace begins a step: under StepTime it first sends the events made so
// far on (so that a live stream shows the step before) and waits for the
// step's turn. It returns ctx's error, at once when ctx ends while it waits.
func (e *Env) pace(ctx context.Context) error {
	if e.StepTime <= 0 || ctx.Err() != nil {
		return ctx.Err()
	}
	if e.paced == 0 {
		e.pacedAt = time.Now()
	} else {
		e.Alloc.Flush()
		wait := time.NewTimer(time.Until(e.pacedAt.Add(time.Duration(e.paced) * e.StepTime)))
		defer wait.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wait.C:
		}
	}
	e.paced++
	return nil
}

// begin opens the region name: a START annotation at the allocator's
// present time. end closes it; Run closes what the workload left open.
func (e *Env) begin(name string) {
	e.regions = append(e.regions, name)
	e.annotate("START", name)
}

// end closes the innermost open region.
func (e *Env) end() {
	if n := len(e.regions); n > 0 {
		e.annotate("END", e.regions[n-1])
		e.regions = e.regions[:n-1]
	}
}

func (e *Env) annotate(stage, name string) {
	if e.Annotations != nil {
		e.Annotations.Annotate(gpu.Annotation{Device: e.Alloc.Device().Ordinal(), TimeUS: e.Alloc.Now(), Stage: stage, Name: name})
	}
}

// ErrStopped reports that a workload ended because an allocation failed.
var ErrStopped = errors.New("workload stopped by an out-of-memory error")

// stack interns frames given innermost first.
func (e *Env) stack(frames ...gpu.Frame) gpu.StackID {
	if e.Stacks == nil {
		return 0
	}
	return e.Stacks.Stack(frames)
}

// malloc allocates size bytes on stream 0 under the given stack, touching
// the memory when the device is real.
func (e *Env) malloc(size uint64, stack gpu.StackID) (uint64, error) {
	e.Clock.Advance(2)
	p, err := e.Alloc.Malloc(size, 0, stack)
	if err != nil {
		return 0, err
	}
	if e.Touch != nil {
		if err := e.Touch(p, size); err != nil {
			return 0, err
		}
	}
	return p, nil
}

func (e *Env) free(p uint64) error {
	e.Clock.Advance(1)
	return e.Alloc.Free(p)
}

func (e *Env) metric(name string, v float64) {
	if e.Metrics == nil {
		e.Metrics = make(map[string]float64)
	}
	e.Metrics[name] = v
}

// Workload is a named program of allocator calls.
type Workload interface {
	Run(ctx context.Context, env *Env) error
}

// WorkloadFunc adapts a function.
type WorkloadFunc func(ctx context.Context, env *Env) error

func (f WorkloadFunc) Run(ctx context.Context, env *Env) error { return f(ctx, env) }

// Run runs w against env. An out-of-memory error ends the run the way it
// ends a real job; it is returned (wrapping *caching.OutOfMemoryError) after
// the events up to it have been flushed, and the regions open then end.
func Run(ctx context.Context, w Workload, env *Env) error {
	err := w.Run(ctx, env)
	for len(env.regions) > 0 {
		env.end()
	}
	env.Alloc.Flush()
	return err
}

// frame is shorthand for a synthetic Python frame.
func frame(name, file string, line uint64) gpu.Frame {
	return gpu.Frame{Name: name, Filename: file, Line: line}
}

// tensors is a named set of live allocations.
type tensors map[string]uint64

func (t tensors) freeAll(env *Env) error {
	for _, n := range slices.Sorted(maps.Keys(t)) {
		if err := env.free(t[n]); err != nil {
			return err
		}
		delete(t, n)
	}
	return nil
}
