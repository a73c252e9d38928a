package main

import (
	"context"
	"fmt"

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

// seedDemo fills an empty database with the demo traces.
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
	return nil
}
