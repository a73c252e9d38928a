package caching

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"vramscope/gpu"
	"vramscope/gpu/sim"
)

// BenchmarkCachedMallocFree measures a malloc+free pair served from the
// cache while n blocks are live and about n free blocks of mixed sizes wait
// in the pool, so the best-fit lookup works on a large tree.
func BenchmarkCachedMallocFree(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("live=%d", n), func(b *testing.B) {
			a, err := New(sim.New(1<<40), DefaultConfig())
			if err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			sizes := make([]uint64, 64)
			for i := range sizes {
				sizes[i] = uint64(1+r.IntN(128)) * 512
			}
			ptrs := make([]uint64, 0, 2*n)
			for i := 0; i < 2*n; i++ {
				p, err := a.Malloc(sizes[r.IntN(len(sizes))], 0, 0)
				if err != nil {
					b.Fatal(err)
				}
				ptrs = append(ptrs, p)
			}
			for i := 0; i < len(ptrs); i += 2 {
				if err := a.Free(ptrs[i]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p, err := a.Malloc(sizes[i&63], 0, 0)
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Free(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCachedMallocFreeWithSink is the same pair with an event sink.
func BenchmarkCachedMallocFreeWithSink(b *testing.B) {
	a, err := New(sim.New(1<<40), DefaultConfig(), WithSink(gpu.SinkFunc(func([]gpu.Event) {})))
	if err != nil {
		b.Fatal(err)
	}
	keep, _ := a.Malloc(4096, 0, 0)
	_ = keep
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p, _ := a.Malloc(1<<16, 0, 0)
		_ = a.Free(p)
	}
}
