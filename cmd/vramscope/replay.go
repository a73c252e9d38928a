package main

import (
	"encoding/json"
	"fmt"
	"io"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/replay"
)

func init() {
	register("replay", "replay a recording (RMM log, snapshot or stored trace) through the allocator on the simulated device", runReplay)
}

// defaultCapacity is the simulated device's memory when none is given: an
// 80 GiB card such as the A100 or H100 (replay.DefaultCapacity).
const defaultCapacity = "80GiB"

// deviceHelp is the --device flag's help of the replaying commands.
const deviceHelp = "snapshot device (default: the one that ran out of memory, else the one with the most events)"

// capacityHelp is the --capacity flag's help of the replaying commands.
const capacityHelp = "simulated device memory (default: the trace's device, or what the recording implies: its OOM, its free-and-retry paths; else 80GiB)"

func runReplay(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("replay", stderr)
	conf := fs.String("alloc-conf", "", "allocator settings set on top of the recorded ones, PYTORCH_CUDA_ALLOC_CONF syntax")
	capacity := fs.String("capacity", "", capacityHelp)
	dbPath := dbFlag(fs, "holding TRACE, when replaying a stored trace")
	device := fs.Int("device", -1, deviceHelp)
	asJSON := fs.Bool("json", false, "print stats, OOMs and segments as JSON")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: vramscope replay FILE|TRACE [--alloc-conf STR] [--capacity SIZE] [--device N] [--json]")
		fmt.Fprintln(stderr, "FILE is an RMM logging_resource_adaptor CSV log or a PyTorch memory snapshot; TRACE a stored trace id.")
		fmt.Fprintln(stderr, "A snapshot or trace replays from its starting layout at its recorded addresses, under its recorded settings.")
		fs.PrintDefaults()
	}
	pos, err := parseTraceArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want one FILE, got %d arguments", len(pos))
	}
	if _, err := caching.ParseConfig(*conf); err != nil {
		return usagef("--alloc-conf: %v", err)
	}
	stream, err := openStream(pos[0], *dbPath, *device, *capacity, stderr)
	if err != nil {
		return err
	}
	cfg, err := stream.Config(*conf)
	if err != nil {
		return err
	}
	a, res, err := stream.Run(cfg, stream.Capacity.Bytes)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeReplayJSON(stdout, a, res, stream.Capacity)
	}
	if stream.Estimated {
		fmt.Fprintf(stdout, "the requests were %s\n", gpu.EstimateNote)
	}
	fmt.Fprintf(stdout, "%d requests replayed on a simulated device: %s\n", len(stream.Requests), stream.Capacity)
	fmt.Fprintf(stdout, "settings: %s\n", settingsText(cfg.String(), stream.Settings))
	for _, o := range res.OOMs {
		fmt.Fprintf(stdout, "OOM at request %d (%d bytes): %s\n", o.Index, o.Size, o.Message)
	}
	if res.UnmatchedFrees > 0 {
		fmt.Fprintf(stdout, "%d frees of allocations the log never made (or that failed) were ignored\n", res.UnmatchedFrees)
	}
	st := a.Stats()
	fmt.Fprint(stdout, st.Summary(a.Device().Ordinal(), false))
	return nil
}

// settingsText names the settings a replay ran under and the recorded ones.
func settingsText(used, recorded string) string {
	if used == "" {
		used = "(defaults)"
	}
	if rec, err := caching.ParseConfig(recorded); err == nil && rec.String() != "" {
		return used + " (recorded: " + rec.String() + ")"
	}
	return used
}

type replayJSON struct {
	Capacity replay.Capacity  `json:"capacity"`
	Settings string           `json:"alloc_conf"`
	Stats    map[string]int64 `json:"stats"`
	OOMs     []replay.OOM     `json:"ooms"`
	Segments []segmentJSON    `json:"segments"`
}

type segmentJSON struct {
	Device      int         `json:"device"`
	Address     uint64      `json:"address"`
	TotalSize   uint64      `json:"total_size"`
	Stream      int64       `json:"stream"`
	SegmentType string      `json:"segment_type"`
	Expandable  bool        `json:"is_expandable"`
	Blocks      []blockJSON `json:"blocks"`
}

type blockJSON struct {
	Address   uint64    `json:"address"`
	Size      uint64    `json:"size"`
	Requested uint64    `json:"requested_size"`
	State     string    `json:"state"`
	Frames    gpu.Stack `json:"frames,omitempty"`
}

// segmentsJSON writes segs of device as a snapshot's segments, the
// blocks' frames from stacks (StackID i is stacks[i-1]) when given.
func segmentsJSON(device int, segs []gpu.Segment, stacks []gpu.Stack) []segmentJSON {
	out := make([]segmentJSON, 0, len(segs))
	for _, s := range segs {
		sj := segmentJSON{Device: device, Address: s.Addr, TotalSize: s.Size, Stream: s.Stream, SegmentType: s.Pool.String(), Expandable: s.Expandable}
		for _, b := range s.Blocks {
			bj := blockJSON{Address: b.Addr, Size: b.Size, Requested: b.Requested, State: b.State.String()}
			if b.Stack != 0 && int(b.Stack) <= len(stacks) {
				bj.Frames = stacks[b.Stack-1]
			}
			sj.Blocks = append(sj.Blocks, bj)
		}
		out = append(out, sj)
	}
	return out
}

func writeReplayJSON(w io.Writer, a *caching.Allocator, res replay.Result, capacity replay.Capacity) error {
	st := a.Stats()
	out := replayJSON{Capacity: capacity, Settings: a.Config().String(), Stats: st.Flat(), OOMs: res.OOMs, Segments: segmentsJSON(a.Device().Ordinal(), a.Snapshot(), nil)}
	if out.OOMs == nil {
		out.OOMs = []replay.OOM{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
