package caching

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestBlockSetAgainstSortedSlice drives the set and a sorted slice with the
// same random operations, deep enough for multi-level splits and unlinks.
func TestBlockSetAgainstSortedSlice(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	s := &blockSet{bySize: true}
	var ref []*Block
	cmp := func(a, b *Block) int {
		switch {
		case a.k.less(b.k):
			return -1
		case b.k.less(a.k):
			return 1
		}
		return 0
	}
	addr := uint64(0)
	for step := 0; step < 60000; step++ {
		grow := step < 30000 && r.IntN(3) > 0 || step >= 30000 && r.IntN(3) == 0
		if grow || len(ref) == 0 {
			addr += 512
			b := &Block{stream: int64(r.IntN(3)), size: uint64(1+r.IntN(50)) * 512, addr: addr}
			s.insert(b)
			i, _ := slices.BinarySearchFunc(ref, b, cmp)
			ref = slices.Insert(ref, i, b)
		} else {
			i := r.IntN(len(ref))
			s.remove(ref[i])
			ref = slices.Delete(ref, i, i+1)
		}
		if s.len != len(ref) {
			t.Fatalf("step %d: len %d, want %d", step, s.len, len(ref))
		}
		if step%997 == 0 {
			if got := s.all(); !slices.Equal(got, ref) {
				t.Fatalf("step %d: all() differs (%d vs %d)", step, len(got), len(ref))
			}
		}
		k := blockKey{uint64(r.IntN(4)), uint64(r.IntN(52)) * 512, uint64(r.IntN(int(addr) + 1))}
		i, _ := slices.BinarySearchFunc(ref, k, func(b *Block, k blockKey) int {
			if b.k.less(k) {
				return -1
			}
			if k.less(b.k) {
				return 1
			}
			return 0
		})
		var want, wantBefore *Block
		if i < len(ref) {
			want = ref[i]
		}
		if i > 0 {
			wantBefore = ref[i-1]
		}
		if got := s.lowerBound(k); got != want {
			t.Fatalf("step %d: lowerBound(%v) wrong", step, k)
		}
		if got := s.before(k); got != wantBefore {
			t.Fatalf("step %d: before(%v) wrong", step, k)
		}
		if want != nil {
			var wantNext *Block
			if i+1 < len(ref) {
				wantNext = ref[i+1]
			}
			if got := s.next(want); got != wantNext {
				t.Fatalf("step %d: next wrong", step)
			}
		}
	}
	for len(ref) > 0 {
		s.remove(ref[0])
		ref = ref[1:]
	}
	if !s.root.leaf || s.root.n != 0 || s.len != 0 {
		t.Fatal("an emptied set should be one empty leaf")
	}
}
