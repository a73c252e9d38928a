package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"vramscope/gpu"
	"vramscope/incident"
	"vramscope/predict"
	"vramscope/replay"
	"vramscope/web"
)

func init() {
	register("fit", "the memory a job needs at any batch size (or sequence length), from recordings of it at two (three)", runFit)
}

func runFit(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("fit", stderr)
	batch := fs.String("batch", "", "the batch size of each recording, in their order: 4,8 (a third checks the model)")
	seq := fs.String("seq", "", "instead of --batch: the sequence length of each recording: 256,512,1024 (a fourth checks the model)")
	atFlag := fs.String("at", "", "the values to predict at: 16,32,64 (default: those recorded and 2, 4 and 8 times the largest)")
	capacity := fs.String("capacity", "", "the device the largest batch must fit (default: the first recording's device, or 80GiB)")
	step := fs.Int("step", 1, "the largest value is looked for among multiples of this (128 for sequence lengths, say)")
	whatif := fs.Bool("whatif", false, "also the memory needed and the largest value under each what-if setting (expandable segments, ...)")
	asJSON := fs.Bool("json", false, "print the fit and the predictions as JSON")
	dbPath := dbFlag(fs, "holding the TRACEs")
	device := fs.Int("device", -1, deviceHelp)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: vramscope fit A B [C] --batch 4,8[,16] [--at 16,32,64] [--capacity 80GiB] [--whatif] [--json]")
		fmt.Fprintln(stderr, "       vramscope fit A B C [D] --seq 256,512,1024[,2048] [--step 128] ...")
		fmt.Fprintln(stderr, "A, B, ... are stored trace ids or PyTorch snapshots of the same job at the batch sizes (sequence lengths) given.")
		fmt.Fprintln(stderr, "Their requests are paired by stack and occurrence, each size fitted as a + b·batch (a + b·s + c·s²), and the")
		fmt.Fprintln(stderr, "job replayed at other values: its peaks, the memory it needs and the largest value that fits the device.")
		fs.PrintDefaults()
	}
	pos, err := parseTraceArgs(fs, args)
	if err != nil {
		return err
	}
	dim, list, flagName := predict.Batch, *batch, "--batch"
	switch {
	case *batch != "" && *seq != "":
		return usagef("give --batch or --seq, not both")
	case *seq != "":
		dim, list, flagName = predict.Seq, *seq, "--seq"
	case *batch == "":
		return usagef("give the batch size of each recording (--batch 4,8) or their sequence lengths (--seq 256,512,1024)")
	}
	values, err := intList(flagName, list)
	if err != nil {
		return err
	}
	if len(values) != len(pos) {
		return usagef("%s gives %d values for %d recordings: one each, in their order", flagName, len(values), len(pos))
	}
	if len(pos) < dim.Recordings() {
		return usagef("a fit along %s takes %d recordings, got %d", dim, dim.Recordings(), len(pos))
	}
	var o predict.Options
	if *atFlag != "" {
		if o.At, err = intList("--at", *atFlag); err != nil {
			return err
		}
	}
	if *capacity != "" {
		if o.Capacity, err = parseCapacity(*capacity); err != nil {
			return err
		}
	}
	if *step < 1 {
		return usagef("--step %d: want at least 1", *step)
	}
	o.Step = *step
	if *whatif {
		o.Variants = incident.Variants
	}
	recs := make([]predict.Recording, len(pos))
	for i, p := range pos {
		s, err := openStream(p, *dbPath, *device, "", stderr)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		recs[i] = predict.Recording{Name: p, At: values[i], Stream: s}
		if s.Estimated && !*asJSON {
			fmt.Fprintf(stdout, "%s: %s\n", oneLine(p), gpu.EstimateNote)
		}
	}
	res, err := predict.Answer(dim, recs, o)
	if errors.Is(err, predict.ErrNotSameProgram) {
		return inputError{err}
	}
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	return printFit(stdout, res)
}

// intList reads "4,8,16": positive integers.
func intList(flagName, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, usagef("%s %s: %q is not a positive whole number", flagName, s, f)
		}
		out = append(out, n)
	}
	return out, nil
}

func printFit(w io.Writer, r *predict.Result) error {
	var names []string
	for _, n := range r.Recordings {
		names = append(names, fmt.Sprintf("%s (%s %d)", oneLine(n.Name), r.Dim, n.At))
	}
	fmt.Fprintf(w, "fit by %s: %s\n", r.Dim, strings.Join(names, ", "))
	fmt.Fprintf(w, "%d of %d requests pair up in every recording fitted (%.1f%%)", r.Paired, r.Requests, 100*float64(r.Paired)/float64(max(r.Requests, 1)))
	if r.UnpairedBytes > 0 {
		fmt.Fprintf(w, "; %s requested by %d kinds of request rest on guesses (below)", gpu.FormatBytes(r.UnpairedBytes), len(r.Unfit))
	}
	fmt.Fprintln(w)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", oneLine(n))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	head := strings.ToUpper(r.Dim.Key()) + "\tPEAK ALLOCATED\tPEAK RESERVED\tMEMORY NEEDED\t"
	whatifs := len(r.Predictions) > 0 && len(r.Predictions[0].WhatIf) > 0
	if whatifs {
		head += "LEAST WITH ANOTHER SETTING\t"
	}
	fmt.Fprintln(tw, head+"GUESSED\t")
	for _, p := range r.Predictions {
		at := strconv.Itoa(p.At)
		for _, n := range r.Recordings[:r.Dim.Recordings()] {
			if n.At == p.At {
				at += " (recorded)"
			}
		}
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t", at, gpu.FormatBytes(p.PeakAllocated), gpu.FormatBytes(p.PeakReserved), neededBytes(p.CapacityNeeded))
		if whatifs {
			line += web.LeastWhatIf(p) + "\t"
		}
		fmt.Fprintf(tw, "%s%s\t\n", line, gpu.FormatBytes(p.Guessed))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "largest %s that fits %s (%s): %s\n", r.Dim, gpu.FormatBytes(r.Capacity), r.CapacityFrom, largestText(r.Largest))
	for _, l := range r.LargestWhatIf {
		if l.Err != "" {
			fmt.Fprintf(w, "  with %s: %s\n", l.Variant, oneLine(l.Err))
			continue
		}
		fmt.Fprintf(w, "  with %s: %s\n", l.Variant, largestText(l.At))
	}
	for _, c := range r.Checks {
		fmt.Fprintf(w, "\ncheck: %s at %s %d, predicted from the others and as recorded (replayed the same way)\n", oneLine(c.Name), r.Dim, c.Recorded.At)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "\tPREDICTED\tRECORDED\t")
		for _, row := range []struct {
			label string
			p, r  uint64
		}{{"peak allocated", c.Predicted.PeakAllocated, c.Recorded.PeakAllocated},
			{"peak reserved", c.Predicted.PeakReserved, c.Recorded.PeakReserved},
			{"memory needed", c.Predicted.CapacityNeeded, c.Recorded.CapacityNeeded}} {
			fmt.Fprintf(tw, "%s\t%s\t%s\t\n", row.label, neededBytes(row.p), neededBytes(row.r))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(r.Unfit) > 0 {
		fmt.Fprintf(w, "\nrequests that rest on guesses (a request only the first recording makes keeps its size; one it lacks is left out; sizes that follow no %s are extrapolated):\n", r.Dim.Formula())
		for i, u := range r.Unfit {
			if i == 10 {
				fmt.Fprintf(w, "  (%d more)\n", len(r.Unfit)-i)
				break
			}
			var sizes []string
			for _, s := range u.Sizes {
				sizes = append(sizes, gpu.FormatBytes(s))
			}
			fmt.Fprintf(w, "  %d× %s: %s (sizes %s) at %s\n", u.Count, gpu.FormatBytes(u.Bytes), u.Why, strings.Join(sizes, ", "), oneLine(web.StackWhere(u.Stack)))
		}
	}
	return nil
}

// neededBytes writes a memory needed (0: more than any device).
func neededBytes(n uint64) string {
	if n == 0 {
		return "> " + gpu.FormatBytes(replay.MaxCapacityNeeded)
	}
	return gpu.FormatBytes(n)
}

func largestText(n int) string {
	switch n {
	case predict.Unbounded:
		return "any (nothing the job asks for grows with it)"
	case 0:
		return "none (not even the smallest)"
	}
	return strconv.Itoa(n)
}
