package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"vramscope/gpu"
	"vramscope/gpu/cuda"
)

func init() {
	register("devices", "list the CUDA GPUs with their total and free memory", runDevices)
}

// listDevices is cuda.Devices; tests replace it.
var listDevices = cuda.Devices

func runDevices(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("devices", stderr)
	asJSON := fs.Bool("json", false, "print a JSON array")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: vramscope devices [--json]")
		fs.PrintDefaults()
	}
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	infos, err := listDevices()
	if err == nil && len(infos) == 0 {
		err = fmt.Errorf("the driver sees no GPU")
	}
	if *asJSON {
		if infos == nil {
			infos = []cuda.Info{} // an empty array, not null
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if e := enc.Encode(infos); e != nil {
			return e
		}
	}
	if err != nil {
		return fmt.Errorf("no GPU found: %w", err)
	}
	if *asJSON {
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tNAME\tTOTAL\tFREE")
	for _, in := range infos {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", in.Ordinal, in.Name, gpu.FormatBytes(in.Total), gpu.FormatBytes(in.Free))
	}
	return tw.Flush()
}
