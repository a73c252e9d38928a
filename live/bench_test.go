package live

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
)

// source makes real allocator events stamped with the wall clock, so an
// event's TimeUS is when it was made.
type source struct {
	a    *caching.Allocator
	rng  *rand.Rand
	live []uint64
	out  []gpu.Event
}

func newSource(b *testing.B) *source {
	s := &source{rng: rand.New(rand.NewPCG(1, 2))}
	a, err := caching.New(sim.New(80<<30), caching.Config{Rules: gpu.DefaultRules()},
		caching.WithClock(func() int64 { return time.Now().UnixMicro() }),
		caching.WithSink(gpu.SinkFunc(func(b []gpu.Event) { s.out = append(s.out, b...) })))
	if err != nil {
		b.Fatal(err)
	}
	s.a = a
	return s
}

// next makes at least n events.
func (s *source) next(n int) []gpu.Event {
	s.out = s.out[:0]
	for len(s.out) < n {
		if len(s.live) < 256 || (len(s.live) < 1024 && s.rng.IntN(2) == 0) {
			size := uint64(512) << s.rng.IntN(16)
			p, err := s.a.Malloc(size+uint64(s.rng.IntN(512)), 0, 0)
			if err == nil {
				s.live = append(s.live, p)
			}
		} else {
			i := s.rng.IntN(len(s.live))
			s.a.Free(s.live[i])
			s.live[i] = s.live[len(s.live)-1]
			s.live = s.live[:len(s.live)-1]
		}
		s.a.Flush()
	}
	return s.out
}

// run streams events for d (at rate events/s; 0: as fast as it goes, up to
// total events) to a fresh server with viewers reading as fast as they can
// and stalled viewers reading nothing. It returns the latencies from an
// event's making to the first viewer message covering it, the ingest rate
// and the peak heap.
func runLive(b *testing.B, rate, total int, d time.Duration, viewers, stalled int) (lat []time.Duration, evps float64, heapMB float64) {
	ts := newTestServer(b, Options{})
	c, err := Dial(ts.srv.URL, "", ClientOptions{})
	if err != nil {
		b.Fatal(err)
	}
	id := c.TraceID()
	created := make([]atomic.Int64, total+1<<16)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < viewers+stalled; i++ {
		conn, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(ts.srv.URL, "http")+"/ws/traces/"+id, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		if i >= viewers {
			continue // stalled: never reads, never asks for more
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			prev := int64(-1)
			for {
				var m Tail
				if conn.ReadJSON(&m) != nil {
					break
				}
				now := time.Now().UnixMicro()
				for s := prev + 1; s <= m.Seq && s < int64(len(created)); s++ {
					mine = append(mine, time.Duration(now-created[s].Load())*time.Microsecond)
				}
				prev = max(prev, m.Seq)
				if m.Status != gpu.StatusLive {
					break
				}
				conn.WriteMessage(websocket.TextMessage, []byte(`{"type":"more"}`))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	for ts.hub.Viewers(id) < viewers+stalled {
		time.Sleep(time.Millisecond)
	}

	var peak atomic.Uint64
	stopMem := make(chan struct{})
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			select {
			case <-stopMem:
				return
			case <-t.C:
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > peak.Load() {
					peak.Store(ms.HeapInuse)
				}
			}
		}
	}()

	src := newSource(b)
	start := time.Now()
	sent := 0
	for sent < total && time.Since(start) < d {
		want := total
		if rate > 0 {
			want = min(total, int(time.Since(start).Seconds()*float64(rate)))
		}
		if want-sent < 256 {
			time.Sleep(time.Millisecond)
			continue
		}
		evs := src.next(min(want-sent, 8192))
		for _, e := range evs {
			if e.Seq < int64(len(created)) {
				created[e.Seq].Store(e.TimeUS)
			}
		}
		c.Emit(evs)
		sent += len(evs)
	}
	if err := c.Close(gpu.StatusComplete); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	close(stopMem)
	wg.Wait()
	return lat, float64(sent) / elapsed.Seconds(), float64(peak.Load()) / (1 << 20)
}

func pct(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return float64(d[min(len(d)-1, int(p*float64(len(d))))].Microseconds()) / 1000
}

// BenchmarkLive200k: 200,000 events/s for 3 s with 20 viewers; reports
// the p50 and p99 latency from an event's making to a viewer's receipt.
// Run with -benchtime=1x -count=5 and take medians.
func BenchmarkLive200k(b *testing.B) {
	for range b.N {
		lat, rate, heap := runLive(b, 200_000, 600_000, 3*time.Second, 20, 0)
		b.ReportMetric(pct(lat, 0.5), "p50-ms")
		b.ReportMetric(pct(lat, 0.99), "p99-ms")
		b.ReportMetric(rate, "events/s")
		b.ReportMetric(heap, "peak-heap-MB")
	}
}

// BenchmarkIngestStalled: ingest as fast as it goes (600,000 events) with
// 20 viewers, without and with one more that reads nothing.
func BenchmarkIngestStalled(b *testing.B) {
	for _, stalled := range []int{0, 1} {
		b.Run(map[int]string{0: "none", 1: "one"}[stalled], func(b *testing.B) {
			for range b.N {
				_, rate, heap := runLive(b, 0, 600_000, time.Minute, 20, stalled)
				b.ReportMetric(rate, "events/s")
				b.ReportMetric(heap, "peak-heap-MB")
			}
		})
	}
}
