package incident

import (
	"math/rand/v2"
	"runtime"
	"syscall"
	"testing"
	"time"

	"vramscope/replay"
)

// trainingStream is n requests shaped like a training loop: persistent
// weights, then steps that allocate activations layer by layer (with
// small temporaries freed at once) and free them in reverse, with an
// optimizer state that now and then grows and moves.
func trainingStream(n int, seed uint64) []replay.Request {
	r := rand.New(rand.NewPCG(seed, 7))
	var reqs []replay.Request
	var id int64
	malloc := func(size uint64) int64 {
		id++
		reqs = append(reqs, replay.Request{Op: replay.OpMalloc, ID: id, Size: size})
		return id
	}
	free := func(id int64) { reqs = append(reqs, replay.Request{Op: replay.OpFree, ID: id}) }
	for i := 0; i < 200; i++ {
		malloc(uint64(4+r.IntN(96)) << 20)
	}
	layers := make([]uint64, 48)
	for i := range layers {
		layers[i] = uint64(1+r.IntN(64<<10)) * 512
	}
	var state []int64
	for len(reqs) < n {
		var acts []int64
		for _, size := range layers {
			acts = append(acts, malloc(size+uint64(r.IntN(8))*512))
			for range r.IntN(4) {
				free(malloc(uint64(1 + r.IntN(1<<20))))
			}
		}
		for i := len(acts) - 1; i >= 0; i-- {
			free(acts[i])
			if r.IntN(3) == 0 {
				free(malloc(uint64(1 + r.IntN(4<<20))))
			}
		}
		if r.IntN(5) == 0 {
			state = append(state, malloc(uint64(1+r.IntN(32))<<20))
			if len(state) > 40 {
				free(state[0])
				state = state[1:]
			}
		}
	}
	return reqs[:n]
}

// BenchmarkWhatIf is the whole what-if of a 1M-request stream: the
// original settings and every variant replayed, and the capacity each
// needs searched, the replays spread over the cores.
func BenchmarkWhatIf(b *testing.B) {
	s := replay.Stream{Requests: trainingStream(1_000_000, 1)}
	s.Use(0, 11700<<20)
	cpu0 := cpuTime()
	b.ResetTimer()
	for range b.N {
		t, err := Answer(s)
		if err != nil {
			b.Fatal(err)
		}
		if b.N == 1 {
			for _, r := range t.Rows {
				b.Logf("%-40s %d OOMs, peak %d MiB, needs %d MiB %s", r.AllocConf, len(r.OOMs), r.PeakReserved>>20, r.CapacityNeeded>>20, r.Err)
			}
		}
	}
	// The CPU time says what the machine's other work does not: on idle
	// cores the wall time is near cpu-s/op divided by the cores.
	b.ReportMetric((cpuTime()-cpu0).Seconds()/float64(b.N), "cpu-s/op")
	b.ReportMetric(float64(runtime.GOMAXPROCS(0)), "cores")
}

// cpuTime is the CPU time the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
