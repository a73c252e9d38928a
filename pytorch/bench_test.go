package pytorch

import (
	"fmt"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"vramscope/internal/testkit"
)

// synthetic is the ~100 MB synthetic snapshot (450k trace entries).
func synthetic(b *testing.B) string { return testkit.SyntheticSnapshot(b, 450_000) }

func fileSize(b *testing.B, path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	return st.Size()
}

// BenchmarkUnpickle100MB: the streaming decoder alone (trace entries
// become events, frames lists stacks), reading from the file.
func BenchmarkUnpickle100MB(b *testing.B) {
	path := synthetic(b)
	b.SetBytes(fileSize(b, path))
	for b.Loop() {
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := decodeValue(f, true, Options{}); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

// BenchmarkDecode100MB: decode and convert (layouts, undo, replay).
func BenchmarkDecode100MB(b *testing.B) {
	path := synthetic(b)
	b.SetBytes(fileSize(b, path))
	for b.Loop() {
		traces, err := DecodeFile(path)
		if err != nil {
			b.Fatal(err)
		}
		if n := len(traces[0].Mismatches); n != 0 {
			b.Fatalf("%d mismatches: %v", n, &traces[0].Mismatches[0])
		}
	}
	b.ReportMetric(peakRSS(b, path)/float64(fileSize(b, path)), "peakRSS/filesize")
}

// BenchmarkDecodeSideBySide: the ~100 MB file decoded twice one after
// another (serial-s) and twice side by side (side-by-side-s), in the same
// iteration, with the memory limits vramscope import sets. The two decodes
// share nothing, so their ratio (scaling) is the most any import of
// several files can gain from the cores of this machine.
func BenchmarkDecodeSideBySide(b *testing.B) {
	path := synthetic(b)
	size := fileSize(b, path)
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	decode := func() {
		if _, err := DecodeFile(path); err != nil {
			b.Error(err)
		}
	}
	var serial, side time.Duration
	for b.Loop() {
		debug.SetMemoryLimit(MemoryLimit(size))
		start := time.Now()
		decode()
		decode()
		serial += time.Since(start)
		debug.SetMemoryLimit(MemoryLimit(2 * size))
		start = time.Now()
		var wg sync.WaitGroup
		wg.Go(decode)
		wg.Go(decode)
		wg.Wait()
		side += time.Since(start)
	}
	b.ReportMetric(serial.Seconds()/float64(b.N), "serial-s")
	b.ReportMetric(side.Seconds()/float64(b.N), "side-by-side-s")
	b.ReportMetric(serial.Seconds()/side.Seconds(), "scaling")
}

// BenchmarkCPythonPickleLoad100MB: CPython's C pickle.load on the same
// file, timed inside python3 (start-up excluded), for comparison.
func BenchmarkCPythonPickleLoad100MB(b *testing.B) {
	path := synthetic(b)
	script := `
import pickle, sys, time
total = 0.0
for _ in range(int(sys.argv[2])):
    with open(sys.argv[1], "rb") as f:
        t = time.perf_counter(); pickle.load(f); total += time.perf_counter() - t
print(total)`
	b.StopTimer()
	out, err := exec.Command("python3", "-c", script, path, strconv.Itoa(b.N)).Output()
	if err != nil {
		b.Fatal(err)
	}
	secs, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(secs*1e9/float64(b.N), "ns/op")
}

// peakRSS decodes path in a fresh process and returns its peak RSS.
func peakRSS(b *testing.B, path string) float64 {
	cmd := exec.Command(os.Args[0], "-test.run=^TestPeakRSSChild$")
	cmd.Env = append(os.Environ(), "VRAMSCOPE_PEAK_FILE="+path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("child: %v\n%s", err, out)
	}
	var kb float64
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "maxrss-kb "); ok {
			kb, _ = strconv.ParseFloat(v, 64)
		}
	}
	if kb == 0 {
		b.Fatalf("child printed no maxrss:\n%s", out)
	}
	return kb * 1024
}

// TestPeakRSSChild is the child process of peakRSS; it does nothing in a
// normal test run.
func TestPeakRSSChild(t *testing.T) {
	path := os.Getenv("VRAMSCOPE_PEAK_FILE")
	if path == "" {
		t.Skip("only run by BenchmarkDecode100MB")
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	debug.SetMemoryLimit(MemoryLimit(st.Size())) // as vramscope import sets it
	traces, err := DecodeFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// VmHWM, not getrusage's maxrss: that keeps the parent's peak across
	// fork and exec, and the benchmark that spawns this has decoded too.
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			fmt.Printf("maxrss-kb %s\n", strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
		}
	}
	fmt.Printf("events %d\n", len(traces[0].Events))
}

// BenchmarkExport100MB: the pickler alone, writing the decoded synthetic
// snapshot (450k trace entries sharing a few hundred stacks) to a
// counter; bytes are the bytes written.
func BenchmarkExport100MB(b *testing.B) {
	traces, err := DecodeFile(synthetic(b))
	if err != nil {
		b.Fatal(err)
	}
	var n countingWriter
	if err := Export(&n, traces...); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(n))
	for b.Loop() {
		if err := Export(&n, traces...); err != nil {
			b.Fatal(err)
		}
	}
}

type countingWriter int

func (c *countingWriter) Write(p []byte) (int, error) {
	*c += countingWriter(len(p))
	return len(p), nil
}
