// Command vramscope shows where GPU memory goes: it traces workloads through
// a PyTorch-exact caching allocator, imports PyTorch memory snapshots, and
// serves a web UI over the SQLite store. Run without arguments it serves.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// command is one subcommand. Each lives in its own file and registers
// itself in init, so main stays wiring only.
type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
	// rawStdout: the command may write bytes to stdout (a pickle, a
	// profile) that pass as they are, not through a termWriter.
	rawStdout bool
}

var commands = map[string]command{}

func register(name, summary string, run func(args []string, stdout, stderr io.Writer) error) {
	commands[name] = command{summary: summary, run: run}
}

// registerRaw registers a command whose stdout may be bytes, not text.
func registerRaw(name, summary string, run func(args []string, stdout, stderr io.Writer) error) {
	commands[name] = command{summary: summary, run: run, rawStdout: true}
}

// usageError makes main print the message and exit with status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

func init() {
	register("version", "print the version", func(args []string, stdout, stderr io.Writer) error {
		fs := newFlags("version", stderr)
		fs.Usage = func() { fmt.Fprintln(stderr, "usage: vramscope version") }
		pos, err := parseArgs(fs, args)
		if err != nil {
			return err
		}
		if len(pos) > 0 {
			return usagef("version takes no arguments, got %q", pos)
		}
		fmt.Fprintln(stdout, "vramscope", version)
		return nil
	})
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	name := "serve"
	if len(args) > 0 && (!strings.HasPrefix(args[0], "-") || args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		name, args = args[0], args[1:]
	}
	if name == "help" || name == "-h" || name == "-help" || name == "--help" {
		printUsage(stdout)
		return 0
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "vramscope: unknown command %q\n\n", name)
		printUsage(stderr)
		return 2
	}
	// What a command writes may hold text from an uploaded file: it
	// reaches a terminal escaped.
	stderr = termWriter{stderr}
	if !cmd.rawStdout {
		stdout = termWriter{stdout}
	}
	err := cmd.run(args, stdout, stderr)
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "vramscope %s: %v\n", name, err)
		return 2
	default:
		fmt.Fprintf(stderr, "vramscope %s: %v\n", name, err)
		var ex exitCoder
		if errors.As(err, &ex) {
			return ex.ExitCode()
		}
		return 1
	}
}

// exitCoder lets an error choose the exit status (2 for bad input).
type exitCoder interface{ ExitCode() int }

// inputError is bad input from the user's file: exit status 2.
type inputError struct{ err error }

func (e inputError) Error() string { return e.err.Error() }
func (e inputError) Unwrap() error { return e.err }
func (e inputError) ExitCode() int { return 2 }

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: vramscope [command] [flags]   (no command: serve)")
	fmt.Fprintln(w)
	for _, n := range slices.Sorted(maps.Keys(commands)) {
		fmt.Fprintf(w, "  %-9s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "vramscope COMMAND -h lists a command's flags (vramscope serve -h: the server's).")
}

// newFlags returns a flag set that reports errors instead of exiting.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("vramscope "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseArgs parses flags that may come before or after positional
// arguments (vramscope import FILE --name x) and returns the positionals.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	if err := dashedTraceID(fs, args); err != nil {
		return nil, err
	}
	var pos []string
	for {
		if err := parse(fs, args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageError{err.Error()}
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// parse is fs.Parse printing the usage but not the error, which main
// prints once, last.
func parse(fs *flag.FlagSet, args []string) error {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.Usage = usage
	fs.SetOutput(out)
	if err != nil {
		fs.Usage()
	}
	return err
}

// traceIDShape is a trace id (16 letters of the URL-safe base64 alphabet)
// that starts with '-', as ids made before they were kept from doing so can.
var traceIDShape = regexp.MustCompile(`^-[A-Za-z0-9_-]{15}$`)

// dashedTraceID refuses, with a way out, an argument the flag parser would
// take for an unknown flag but that is a trace id.
func dashedTraceID(fs *flag.FlagSet, args []string) error {
	for i, a := range args {
		if a == "--" {
			return nil
		}
		if !traceIDShape.MatchString(a) || fs.Lookup(strings.TrimLeft(a, "-")) != nil || i > 0 && takesValue(fs, args[i-1]) {
			continue
		}
		return usagef("%s looks like a trace id: put it after -- (%s [flags] -- %s) or give it as --trace %s", a, fs.Name(), a, a)
	}
	return nil
}

// takesValue says whether arg is a flag that reads the next argument.
func takesValue(fs *flag.FlagSet, arg string) bool {
	name := strings.TrimLeft(arg, "-")
	if !strings.HasPrefix(arg, "-") || strings.Contains(name, "=") {
		return false
	}
	f := fs.Lookup(name)
	if f == nil {
		return false
	}
	b, isBool := f.Value.(interface{ IsBoolFlag() bool })
	return !isBool || !b.IsBoolFlag()
}

// parseTraceArgs is parseArgs for commands that take a stored trace: it
// adds --trace ID, which names a trace however its id begins, and puts its
// value first among the positionals.
func parseTraceArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	id := fs.String("trace", "", "a stored trace `ID` (the same as giving it as an argument after --)")
	pos, err := parseArgs(fs, args)
	if err != nil || *id == "" {
		return pos, err
	}
	return append([]string{*id}, pos...), nil
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
