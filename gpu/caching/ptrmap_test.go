package caching

import (
	"math/rand/v2"
	"testing"
)

func TestPtrMapAgainstBuiltin(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var m ptrMap
	ref := map[uint64]*Block{}
	for step := 0; step < 200000; step++ {
		k := uint64(1+r.IntN(5000)) * 512
		switch r.IntN(3) {
		case 0, 1:
			b := &Block{addr: k}
			m.put(k, b)
			ref[k] = b
		default:
			m.del(k)
			delete(ref, k)
		}
		if m.n != len(ref) {
			t.Fatalf("step %d: %d entries, want %d", step, m.n, len(ref))
		}
		probe := uint64(1+r.IntN(5000)) * 512
		if m.get(probe) != ref[probe] {
			t.Fatalf("step %d: get(%#x) wrong", step, probe)
		}
	}
	for k, b := range ref {
		if m.get(k) != b {
			t.Fatalf("get(%#x) wrong at the end", k)
		}
	}
}
