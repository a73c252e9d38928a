package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/cuda"
	"vramscope/gpu/sim"
	"vramscope/live"
	"vramscope/store"
	"vramscope/tracer"
)

// recording is one workload run written to the store.
type recording struct {
	Name     string
	Workload tracer.Workload
	Device   string // sim or cuda
	Capacity uint64 // sim only
	Conf     string
	Source   gpu.TraceSource
	Live     string // also stream to the server at this URL (live watching)
	Token    string // the server's token, for Live
}

type recorded struct {
	Trace gpu.Trace
	OOMs  []*caching.OutOfMemoryError
	Notes []string
	Err   error // the run's own error, other than an OOM
}

// counter is a sink that forwards to the store and keeps running figures
// for the progress line; the allocator calls it from one goroutine, the
// progress printer reads it from another.
type counter struct {
	next   gpu.Sink
	mu     sync.Mutex
	events int64
	tot    gpu.Totals
}

func (c *counter) Emit(batch []gpu.Event) {
	c.mu.Lock()
	for i := range batch {
		c.tot.Apply(&batch[i], false)
	}
	c.events += int64(len(batch))
	c.mu.Unlock()
	c.next.Emit(batch)
}

// figures returns the events counted and the totals after them.
func (c *counter) figures() (int64, gpu.Totals) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.events, c.tot
}

func openDevice(kind string, capacity uint64) (gpu.Device, func(addr, size uint64) error, func(), error) {
	switch kind {
	case "sim":
		return sim.New(capacity), nil, func() {}, nil
	case "cuda":
		d, err := cuda.Open(0)
		if err != nil {
			return nil, nil, nil, err
		}
		return d, d.Touch, func() { d.Close() }, nil
	}
	return nil, nil, nil, usagef("--device must be sim or cuda, not %q", kind)
}

// record runs rec and stores its events; progress, when not nil, gets a
// line every half second.
func record(ctx context.Context, db *store.DB, rec recording, progress io.Writer) (recorded, error) {
	var out recorded
	cfg, err := caching.ParseConfig(rec.Conf)
	if err != nil {
		return out, usagef("--alloc-conf: %v", err)
	}
	dev, touch, closeDev, err := openDevice(rec.Device, rec.Capacity)
	if err != nil {
		return out, err
	}
	defer closeDev()
	_, total, err := dev.MemInfo()
	if err != nil {
		return out, err
	}
	source := rec.Source
	if source == "" {
		source = gpu.SourceTrace
	}
	meta := gpu.TraceMeta{Name: rec.Name, Source: source, DeviceOrdinal: dev.Ordinal(),
		DeviceName: dev.Name(), Capacity: total, Settings: cfg.String()}
	w, err := db.CreateTrace(meta, gpu.NewLayout(cfg.Rules))
	if err != nil {
		return out, err
	}
	var local gpu.Recorder = w
	var stream *live.Client
	if rec.Live != "" {
		if stream, err = live.Dial(rec.Live, rec.Token, live.ClientOptions{Meta: meta}); err != nil {
			w.Abort()
			return out, err
		}
		out.Notes = append(out.Notes, fmt.Sprintf("live: %s/traces/%s", strings.TrimRight(rec.Live, "/"), stream.TraceID()))
		local = stream.Tee(w)
	}
	sink := &counter{next: local}
	clk := &tracer.Clock{}
	now := clk.Now
	if rec.Device == "cuda" {
		start := time.Now()
		now = func() int64 { return time.Since(start).Microseconds() }
	}
	a, err := caching.New(dev, cfg, caching.WithSink(sink), caching.WithClock(now))
	if err != nil {
		w.Abort()
		return out, err
	}
	env := &tracer.Env{Alloc: a, Clock: clk, Stacks: local, Touch: touch}

	done := make(chan struct{})
	if progress != nil {
		go func() {
			t := time.NewTicker(500 * time.Millisecond)
			defer t.Stop()
			last := int64(0)
			for {
				select {
				case <-done:
					return
				case <-t.C:
					n, tot := sink.figures()
					fmt.Fprintf(progress, "%s: %d events (%.0f/s), reserved %s, allocated %s\n", rec.Name, n,
						float64(n-last)/0.5, gpu.FormatBytes(tot.Reserved), gpu.FormatBytes(tot.Allocated))
					last = n
				}
			}
		}()
	}
	runErr := tracer.Run(ctx, rec.Workload, env)
	close(done)
	var oom *caching.OutOfMemoryError
	status := gpu.StatusComplete
	switch {
	case errors.As(runErr, &oom):
		out.OOMs = append(out.OOMs, oom)
	case errors.Is(runErr, context.Canceled):
		out.Err = runErr
		status = gpu.StatusIncomplete
	case runErr != nil:
		out.Err = runErr
		status = gpu.StatusFailed
	}
	if stream != nil {
		// Every event reaches the server before the trace ends there.
		if err := stream.Close(status); err != nil {
			out.Notes = append(out.Notes, fmt.Sprintf("live stream: %v", err))
		}
	}
	if err := w.Close(status); err != nil {
		return out, err
	}
	out.Notes = append(out.Notes, env.Notes...)
	out.Trace, err = db.Trace(w.ID())
	return out, err
}
