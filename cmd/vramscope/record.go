package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/cuda"
	"vramscope/gpu/sim"
	"vramscope/ingest"
	"vramscope/live"
	"vramscope/replay"
	"vramscope/store"
	"vramscope/tracer"
)

// recording is one workload run written to the store.
type recording struct {
	Name     string
	Workload tracer.Workload
	// Replay, instead of Workload, replays a stream from its starting
	// layout (the trace starts there), with its recorded addresses on the
	// simulated device, under its settings with Conf set on top.
	Replay   *replay.Stream
	Device   string // sim or cuda
	Capacity uint64 // sim only
	Conf     string
	Source   gpu.TraceSource
	Live     string // also stream to the server at this URL (live watching)
	Token    string // the server's token, for Live
	// Announce, when set, is told the page of the live trace as soon as
	// the stream opens, so that a person can watch it run.
	Announce func(link string)
	// StepTime paces the workload for a person watching (tracer.Env).
	StepTime time.Duration
	// Run, when set, makes the recording rank Rank of that stored run
	// (and, with Live, of the run named RunName on the server).
	Run     string
	Rank    int
	RunName string
	World   int
}

type recorded struct {
	Trace gpu.Trace
	OOMs  []*caching.OutOfMemoryError
	Notes []string
	Err   error // the run's own error, other than an OOM
	// Live is the page of the trace on the live server (rec.Live), if any.
	Live string
	// Took is how long the workload ran; Driver, on a real GPU, the
	// driver calls made meanwhile, the longest first.
	Took   time.Duration
	Driver []cuda.Call
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

// gate is the allocator's sink: it drops the events of rebuilding a
// replay's starting layout (the trace starts from that layout), then
// passes the rest on, numbered from 0.
type gate struct {
	next   gpu.Sink
	offset int64
	buf    []gpu.Event
}

// open starts passing events on to next; offset is the number of events
// dropped.
func (g *gate) open(next gpu.Sink, offset int64) { g.next, g.offset = next, offset }

func (g *gate) Emit(batch []gpu.Event) {
	if g.next == nil {
		return
	}
	if g.offset == 0 {
		g.next.Emit(batch)
		return
	}
	g.buf = append(g.buf[:0], batch...)
	for i := range g.buf {
		g.buf[i].Seq -= g.offset
	}
	g.next.Emit(g.buf)
}

// startReplay rebuilds the starting layout of s on a, whose events the
// gate drops, and returns it and the workload that replays the requests.
// The first OOM ends the run, as it ended the recorded job.
func startReplay(a *caching.Allocator, s *replay.Stream) (*gpu.Layout, tracer.Workload, error) {
	p, err := s.Start(a)
	if err != nil {
		return nil, nil, err
	}
	a.Flush()
	l := a.Layout()
	for i := range l.Segments {
		for j := range l.Segments[i].Blocks {
			l.Segments[i].Blocks[j].Seq = -1 // made before the trace began, not by its events
		}
	}
	return l, tracer.WorkloadFunc(func(ctx context.Context, env *tracer.Env) error {
		p.SetTime = func(t int64) { env.Clock.US = t }
		res, err := p.Run(s.Requests)
		if err == nil && len(res.OOMs) > 0 {
			return res.OOMs[0].Err
		}
		return err
	}), nil
}

// openDevice opens the device a recording runs on; a replay's simulated
// device hands out its recorded addresses.
func openDevice(kind string, capacity uint64, rs *replay.Stream) (gpu.Device, func(addr, size uint64) error, func(), error) {
	switch kind {
	case "sim":
		if rs != nil {
			return rs.Device(capacity), nil, func() {}, nil
		}
		return sim.New(capacity), nil, func() {}, nil
	case "cuda":
		d, err := cuda.Open(0)
		if err != nil {
			return nil, nil, nil, err
		}
		return d, d.Touch, func() { d.Close() }, nil
	}
	return nil, nil, nil, deviceKindError(kind)
}

func deviceKindError(kind string) error {
	return usagef("--device must be sim or cuda (or, with --workload replay, a snapshot's device number), not %q", kind)
}

// record runs rec and stores its events; progress, when not nil, gets a
// line every half second.
func record(ctx context.Context, db *store.DB, rec recording, progress io.Writer) (recorded, error) {
	var out recorded
	cfg, err := caching.ParseConfig(rec.Conf)
	if err == nil && rec.Replay != nil {
		cfg, err = rec.Replay.Config(rec.Conf)
	}
	if err != nil {
		return out, usagef("--alloc-conf: %v", err)
	}
	dev, touch, closeDev, err := openDevice(rec.Device, rec.Capacity, rec.Replay)
	if err != nil {
		return out, err
	}
	defer closeDev()
	_, total, err := dev.MemInfo()
	if err != nil {
		return out, err
	}
	clk := &tracer.Clock{}
	now := clk.Now
	if rec.Device == "cuda" {
		start := time.Now()
		now = func() int64 { return time.Since(start).Microseconds() }
	}
	gate := &gate{}
	a, err := caching.New(dev, cfg, caching.WithSink(gate), caching.WithClock(now))
	if err != nil {
		return out, err
	}
	initial, workload := gpu.NewLayout(cfg.Rules), rec.Workload
	if rec.Replay != nil {
		if initial, workload, err = startReplay(a, rec.Replay); err != nil {
			return out, err
		}
	}
	source := rec.Source
	if source == "" {
		source = gpu.SourceTrace
	}
	up, err := ingest.RecordedUpload(rec.Name, cfg.String(), cfg.Rules)
	if err != nil {
		return out, err
	}
	up.Run, up.Rank = rec.Run, rec.Rank
	upload, err := db.CreateUpload(up)
	if err != nil {
		return out, err
	}
	meta := gpu.TraceMeta{Name: rec.Name, Source: source, DeviceOrdinal: dev.Ordinal(),
		DeviceName: dev.Name(), Capacity: total, Settings: cfg.String(), Upload: upload}
	w, err := db.CreateTrace(meta, initial)
	if err != nil {
		db.DeleteUpload(upload)
		return out, err
	}
	var local gpu.Recorder = w
	var annotations gpu.Annotator = w
	var stream *live.Client
	if rec.Live != "" {
		opt := live.ClientOptions{Meta: meta}
		opt.Meta.Upload = "" // the upload is this database's
		if rec.Run != "" {
			opt.Run = &live.RunJoin{Name: rec.RunName, Rank: rec.Rank, WorldSize: rec.World}
		}
		if len(initial.Segments) > 0 {
			var stacks []gpu.Stack
			if rec.Replay != nil {
				stacks = rec.Replay.Stacks
			}
			if opt.Snapshot, err = json.Marshal(map[string]any{"segments": segmentsJSON(meta.DeviceOrdinal, initial.Segments, stacks)}); err != nil {
				w.Abort()
				return out, err
			}
		}
		if stream, err = live.Dial(rec.Live, rec.Token, opt); err != nil {
			w.Abort()
			return out, err
		}
		out.Live = pageURL(rec.Live, "/traces/"+stream.TraceID())
		if rec.Announce != nil {
			rec.Announce(out.Live)
		}
		tee := stream.Tee(w)
		local, annotations = tee, tee
	}
	if rec.Replay != nil {
		// A new trace numbers distinct stacks 1..n in order, as the
		// stream does, so its requests' and starting blocks' ids stay right.
		for i, st := range rec.Replay.Stacks {
			if id := local.Stack(st); id != gpu.StackID(i+1) {
				if stream != nil {
					stream.Close(gpu.StatusFailed)
				}
				w.Abort()
				return out, fmt.Errorf("replay: stack %d of the stream became stack %d", i+1, id)
			}
		}
		// The replay keeps the recorded times, so the recording's steps
		// and phases hold for it, on its device.
		anns := slices.Clone(rec.Replay.Annotations)
		for i := range anns {
			anns[i].Device = meta.DeviceOrdinal
		}
		annotations.Annotate(anns...)
	}
	f := initial.Figures()
	sink := &counter{next: local, tot: gpu.Totals{Reserved: f.Reserved, Allocated: f.Allocated, Active: f.Active}}
	gate.open(sink, a.Seq())
	env := &tracer.Env{Alloc: a, Clock: clk, Stacks: local, Touch: touch, Annotations: annotations, StepTime: rec.StepTime}

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
	gpuDev, _ := dev.(*cuda.Device)
	if gpuDev != nil {
		gpuDev.ResetCalls()
	}
	start := time.Now()
	runErr := tracer.Run(ctx, workload, env)
	out.Took = time.Since(start)
	if gpuDev != nil {
		out.Driver = gpuDev.Calls()
	}
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

// pageURL is the page at path of the server at base, given as http(s) or
// ws(s), as a browser opens it.
func pageURL(base, path string) string {
	base = strings.TrimRight(base, "/")
	if rest, ok := strings.CutPrefix(base, "ws://"); ok {
		base = "http://" + rest
	} else if rest, ok := strings.CutPrefix(base, "wss://"); ok {
		base = "https://" + rest
	}
	return base + path
}
