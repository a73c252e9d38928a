package main

import (
	"context"
	"fmt"
	"io"

	"vramscope/store"
	"vramscope/tracer"
)

// demoRecordings are the traces an empty database starts with, so a
// newcomer sees something at once: a training run, the fragmentation OOM
// and the same run with expandable segments, and KV-cache serving both ways.
func demoRecordings() []recording {
	train := tracer.DefaultTrain()
	train.Steps = 6
	serveSmall := func(kv string) tracer.ServeKV {
		w := tracer.DefaultServeKV()
		w.KV = kv
		return w
	}
	return []recording{
		{Name: "demo: training (GPT-2 XL size, 6 steps)", Workload: train, Device: "sim", Capacity: 80 << 30},
		{Name: "demo: fragmentation OOM", Workload: tracer.DefaultFrag(), Device: "sim", Capacity: 16 << 30},
		{Name: "demo: fragmentation, expandable segments", Workload: tracer.DefaultFrag(), Device: "sim", Capacity: 16 << 30, Conf: "expandable_segments:True"},
		{Name: "demo: KV-cache serving, paged", Workload: serveSmall(tracer.KVPaged), Device: "sim", Capacity: 80 << 30},
		{Name: "demo: KV-cache serving, contiguous", Workload: serveSmall(tracer.KVContiguous), Device: "sim", Capacity: 80 << 30},
	}
}

// demoRun is the demo's multi-GPU job: a 4-stage pipeline whose first
// stage holds the most micro-batches, so its run page has a rank to find.
func demoRun() (recording, tracer.Parallel) {
	return recording{Name: "demo: pipeline-parallel job", Device: "sim", Capacity: 80 << 30},
		tracer.Parallel{Train: tracer.DefaultTrain(), Ranks: 4, Mode: tracer.PipelineParallel}
}

// seedDemo fills an empty database with the demo traces and the demo run.
func seedDemo(db *store.DB) error {
	traces, err := db.Traces()
	if err != nil || len(traces) > 0 {
		return err
	}
	for _, rec := range demoRecordings() {
		res, err := record(context.Background(), db, rec, nil)
		if err != nil {
			return fmt.Errorf("demo trace %q: %w", rec.Name, err)
		}
		if res.Err != nil {
			return fmt.Errorf("demo trace %q: %w", rec.Name, res.Err)
		}
	}
	rec, job := demoRun()
	if err := recordRun(context.Background(), db, rec, job, "", "", io.Discard); err != nil {
		return fmt.Errorf("demo run: %w", err)
	}
	return nil
}
