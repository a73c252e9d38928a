package replay

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
)

const header = "Thread,Time,Action,Pointer,Size,Stream\n"

func TestReadRMM(t *testing.T) {
	log := header +
		"140240231839552,12:34:56.789012,allocate,0x7f3a2c000000,1024,0x0\n" +
		"140240231839552,12:34:56.789100,allocate failure,(nil),99999999999,0x0\n" +
		"140240231839552,12:34:56.790000,allocate,0x7f3a2c000400,2048,0x1a2b\n" +
		"140240231839552,12:34:57.000000,free,0x7f3a2c000000,1024,0x0\n" +
		"140240231839552,12:34:57.000001,allocate,0x7f3a2c000000,512,0\n"
	reqs, err := ReadRMM(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	want := []Request{
		{Op: OpMalloc, ID: 1, Size: 1024, Stream: 0, TimeUS: 0},
		{Op: 0, TimeUS: 88},
		{Op: OpMalloc, ID: 2, Size: 2048, Stream: 0x1a2b, TimeUS: 988},
		{Op: OpFree, ID: 1, Size: 1024, TimeUS: 210988},
		{Op: OpMalloc, ID: 3, Size: 512, TimeUS: 210989},
	}
	if fmt.Sprint(reqs) != fmt.Sprint(want) {
		t.Errorf("got  %v\nwant %v", reqs, want)
	}
}

func TestReadRMMErrors(t *testing.T) {
	cases := map[string]string{
		"":                     "line 1: empty file",
		"Thread,Time,Action\n": "line 1: header has 3 columns",
		"Thread,When,Action,Pointer,Size,Stream\n":                                "line 1, field Time: header column 2",
		header + "1,12:00:00.1,allocate,0x10,12x,0\n":                             "line 2, field Size",
		header + "1,12:00:00.1,allocate,0x10,12,0\n1,25:00:00.1,free,0x10,12,0\n": "line 3, field Time",
		header + "1,12:00:00.1,alloc,0x10,12,0\n":                                 "line 2, field Action: unknown action \"alloc\"",
		header + "1,12:00:00.1,allocate,7f00,12,0\n":                              "line 2, field Pointer",
		header + "1,12:00:00.1,allocate,0x10,12,zz\n":                             "line 2, field Stream",
		header + "1,12:00:00.1,allocate,0x10,12\n":                                "line 2: 5 fields, want 6",
		header + "1,12:00:00.1,allocate,(nil),12,0\n":                             "line 2, field Pointer: allocate of a null pointer",
		header + "1,\"12:00,allocate,0x10,12,0\n":                                 "line 2",
	}
	for in, want := range cases {
		_, err := ReadRMM(strings.NewReader(in))
		var re *RMMError
		if !errors.As(err, &re) || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("ReadRMM(%q) = %v, want prefix %q", in, err, want)
		}
	}
}

// syntheticRMM writes an RMM log of n rows of alloc/free churn.
func syntheticRMM(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	var b bytes.Buffer
	b.WriteString(header)
	var live []uint64
	next := uint64(0x7f0000000000)
	for i := 0; i < n; i++ {
		us := int64(i) * 3
		clock := fmt.Sprintf("%02d:%02d:%02d.%06d", 10+us/3600e6, us/60e6%60, us/1e6%60, us%1e6)
		if len(live) == 0 || (r.IntN(2) == 0 && len(live) < 5000) {
			size := uint64(1 + r.IntN(1<<(10+r.IntN(14))))
			fmt.Fprintf(&b, "7,%s,allocate,%#x,%d,0x0\n", clock, next, size)
			live = append(live, next)
			next += 1 << 24
		} else {
			j := r.IntN(len(live))
			fmt.Fprintf(&b, "7,%s,free,%#x,0,0x0\n", clock, live[j])
			live[j] = live[len(live)-1]
			live = live[:len(live)-1]
		}
	}
	return b.Bytes()
}

func TestReplayRMMMatchesDirectCalls(t *testing.T) {
	reqs, err := ReadRMM(bytes.NewReader(syntheticRMM(20000, 3)))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := caching.New(sim.New(64<<20), caching.DefaultConfig())
	res, err := Replay(a, reqs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.UnmatchedFrees > len(res.OOMs) {
		t.Errorf("%d unmatched frees but only %d OOMs", res.UnmatchedFrees, len(res.OOMs))
	}
	if a.Stats().NumOOMs != int64(len(res.OOMs)) {
		t.Errorf("OOM count %d vs %d recorded", a.Stats().NumOOMs, len(res.OOMs))
	}
	for _, o := range res.OOMs {
		if reqs[o.Index].Op != OpMalloc || reqs[o.Index].Size != o.Size {
			t.Errorf("OOM index %d does not name its request", o.Index)
		}
	}
	if len(res.OOMs) == 0 {
		t.Error("expected the 64 MiB device to run out at least once")
	}
}

func TestFromEventsRoundTrip(t *testing.T) {
	// Replaying the requests recovered from a trace gives the same trace.
	reqs, _ := ReadRMM(bytes.NewReader(syntheticRMM(5000, 4)))
	var first, second []gpu.Event
	run := func(reqs []Request, into *[]gpu.Event) *caching.Allocator {
		a, _ := caching.New(sim.New(8<<30), caching.DefaultConfig(), caching.WithSink(gpu.SinkFunc(func(b []gpu.Event) { *into = append(*into, b...) })))
		if _, err := Replay(a, reqs, nil); err != nil {
			t.Fatal(err)
		}
		return a
	}
	run(reqs, &first)
	run(FromEvents(nil, first), &second)
	if len(first) != len(second) {
		t.Fatalf("%d events, then %d", len(first), len(second))
	}
	for i := range first {
		if first[i] != second[i] {
			t.Fatalf("event %d: %v then %v", i, first[i], second[i])
		}
	}
}

func FuzzReadRMM(f *testing.F) {
	f.Add([]byte(header + "1,12:00:00.000001,allocate,0x7f00,1024,0x0\n1,12:00:00.000002,free,0x7f00,1024,0x0\n"))
	f.Add([]byte(header + "1,23:59:59.999999,allocate,0x10,1,0\n1,00:00:00.000001,allocate failure,(nil),5,0\n"))
	f.Add([]byte("Thread,Time\n"))
	f.Add(syntheticRMM(20, 1))
	f.Fuzz(func(t *testing.T, data []byte) {
		reqs, err := ReadRMM(bytes.NewReader(data))
		if err != nil {
			var re *RMMError
			if !errors.As(err, &re) || re.Line < 1 {
				t.Fatalf("error without a line: %v", err)
			}
			return
		}
		a, _ := caching.New(sim.New(1<<30), caching.DefaultConfig())
		if _, err := Replay(a, reqs, nil); err != nil {
			t.Fatalf("valid log failed to replay: %v", err)
		}
	})
}

// BenchmarkReplayRMM replays a 1M-row RMM log, in RMM's style: ns per event,
// without and with an event sink attached.
func BenchmarkReplayRMM(b *testing.B) {
	reqs, err := ReadRMM(bytes.NewReader(syntheticRMM(1_000_000, 5)))
	if err != nil {
		b.Fatal(err)
	}
	for _, withSink := range []bool{false, true} {
		b.Run(fmt.Sprintf("sink=%v", withSink), func(b *testing.B) {
			events := 0
			for i := 0; i < b.N; i++ {
				var opts []caching.Option
				if withSink {
					opts = append(opts, caching.WithSink(gpu.SinkFunc(func(batch []gpu.Event) { events += len(batch) })))
				}
				a, _ := caching.New(sim.New(80<<30), caching.DefaultConfig(), opts...)
				if _, err := Replay(a, reqs, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(reqs)), "ns/request")
			if withSink {
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
			}
		})
	}
}
