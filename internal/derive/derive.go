// Package derive makes, for tests, recordings of what the real files in
// shared/testdata do not hold, from one that does: the same program's
// requests run again through the allocator where the real run did not go
// (under a per-process limit, on a device another library filled), or
// changed as the same job's other rank would make them, written as the
// snapshot PyTorch would have dumped. Nothing outside tests imports it.
package derive

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
	"vramscope/pytorch"
	"vramscope/replay"
	"vramscope/tracer"
)

// Run is where a derived recording runs.
type Run struct {
	// Device is the memory the driver lets the process have: the card,
	// less what other processes and libraries hold.
	Device uint64
	// Limit is a per-process limit (torch.cuda.set_per_process_memory_fraction),
	// 0 for none; a snapshot does not record it.
	Limit uint64
	// Settings are the run's PYTORCH_CUDA_ALLOC_CONF.
	Settings string
}

// Stream reads the requests of the snapshot at path (its first device
// with events).
func Stream(path string) (replay.Stream, error) {
	traces, err := pytorch.DecodeFile(path)
	if err != nil {
		return replay.Stream{}, err
	}
	for _, t := range traces {
		if len(t.Events) > 0 {
			return replay.FromRecording(t.Recording()), nil
		}
	}
	return replay.Stream{}, fmt.Errorf("%s: no device with events", path)
}

// UntilOOM runs the requests of s, which must start from an empty device,
// under run until the first OOM (the job dies there and its snapshot is
// dumped, as record.py's jobs do) or their end, and returns that snapshot:
// the settings of run, not its limit; the OOM's device_free the device's.
func UntilOOM(s replay.Stream, run Run) ([]byte, error) {
	if s.Initial != nil && len(s.Initial.Segments) > 0 {
		return nil, errors.New("derive: the recording does not start from an empty device")
	}
	cfg, err := caching.ParseConfig(run.Settings)
	if err != nil {
		return nil, err
	}
	cfg.Limit = run.Limit
	var events []gpu.Event
	var now int64
	a, err := caching.New(sim.New(run.Device), cfg,
		caching.WithSink(gpu.SinkFunc(func(b []gpu.Event) { events = append(events, b...) })),
		caching.WithClock(func() int64 { return now }))
	if err != nil {
		return nil, err
	}
	p := replay.NewReplayer(a)
	p.SetTime = func(t int64) { now = t }
	if _, err := untilOOM(p, s.Requests); err != nil {
		return nil, err
	}
	p.Result()
	final := gpu.NewLayout(cfg.Rules)
	for i := range events {
		events[i].Seq = int64(i)
		if err := final.Apply(events[i]); err != nil {
			return nil, fmt.Errorf("derive: event %d: %w", i, err)
		}
	}
	return Snapshot(&pytorch.Trace{Final: final, Events: events, HasTime: true, Stacks: s.Stacks,
		Settings: pytorch.SettingsFromRules(run.Settings, cfg.Rules)})
}

// Snapshot writes t as a snapshot pickle.
func Snapshot(t *pytorch.Trace) ([]byte, error) {
	var b bytes.Buffer
	if err := pytorch.Export(&b, t); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Workload is a job that makes the requests of s, which must start from
// an empty device, with their frames, until the first OOM, which ends it:
// the recording a stored trace of it keeps (testkit.Record) has its
// settings and device.
func Workload(s replay.Stream) tracer.Workload {
	return tracer.WorkloadFunc(func(_ context.Context, env *tracer.Env) error {
		if s.Initial != nil && len(s.Initial.Segments) > 0 {
			return errors.New("derive: the recording does not start from an empty device")
		}
		// A new trace numbers distinct stacks 1..n in order, as the
		// stream does: the requests' ids hold.
		for i, st := range s.Stacks {
			if env.Stacks != nil && env.Stacks.Stack(st) != gpu.StackID(i+1) {
				return fmt.Errorf("derive: stack %d of the stream is another in the trace", i+1)
			}
		}
		p := replay.NewReplayer(env.Alloc)
		p.SetTime = func(t int64) { env.Clock.US = t }
		oom, err := untilOOM(p, s.Requests)
		if err == nil && oom != nil {
			return oom
		}
		return err
	})
}

// untilOOM steps p through reqs until the first OOM, and returns it.
func untilOOM(p *replay.Replayer, reqs []replay.Request) (*caching.OutOfMemoryError, error) {
	defer p.Result()
	for i, r := range reqs {
		r.OOM = false
		if err := p.Step(i, r); err != nil {
			return nil, err
		}
		if ooms := p.OOMs(); len(ooms) > 0 {
			return ooms[0].Err, nil
		}
	}
	return nil, nil
}

// Scaled is s with the size of each malloc that keep does not keep
// multiplied by factor: the same program at factor times the batch, for
// the sizes that follow it.
func Scaled(s replay.Stream, factor uint64, keep func(i int, r replay.Request) bool) replay.Stream {
	s.Requests = slices.Clone(s.Requests)
	for i := range s.Requests {
		if r := &s.Requests[i]; r.Op == replay.OpMalloc && !keep(i, *r) {
			r.Size *= factor
		}
	}
	return s
}

// FreesReordered is s with each run of frees that follow one another (no
// other call between them) in the reverse order: the same program freeing
// as another process of it may, its gradient buckets' all-reduces done in
// another order. A deferred free's completion stays after it.
func FreesReordered(s replay.Stream) replay.Stream {
	s.Requests = slices.Clone(s.Requests)
	for i := 0; i < len(s.Requests); {
		j := i
		for j < len(s.Requests) && s.Requests[j].Op == replay.OpFree {
			j++
		}
		if j > i {
			slices.Reverse(s.Requests[i:j])
			i = j
		} else {
			i++
		}
	}
	return s
}
