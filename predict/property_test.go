package predict

import (
	"math/rand/v2"
	"slices"
	"testing"

	"vramscope/gpu"
	"vramscope/replay"
)

// program is a synthetic job: mallocs under a few stacks whose sizes are
// polynomials of x, freed in a random order, with an empty_cache() now
// and then.
type program struct {
	ops    []op
	stacks []gpu.Stack
}

type op struct {
	free  int // >0: free the malloc of this op index+1; 0: malloc or empty_cache
	empty bool
	stack gpu.StackID
	coef  [3]int64
}

func randomProgram(r *rand.Rand, degree int) program {
	var p program
	for i := range 1 + r.IntN(8) {
		p.stacks = append(p.stacks, gpu.Stack{{Name: "f", Filename: "model.py", Line: uint64(10 + i)}})
	}
	var live []int
	for range 20 + r.IntN(200) {
		switch n := r.IntN(10); {
		case n < 5 || len(live) == 0:
			o := op{stack: gpu.StackID(1 + r.IntN(len(p.stacks)))}
			o.coef[0] = int64(r.IntN(1 << 20))
			for d := 1; d <= degree; d++ {
				if r.IntN(2) == 0 {
					o.coef[d] = int64(r.IntN(1 << (22 - 6*d)))
				}
			}
			live = append(live, len(p.ops))
			p.ops = append(p.ops, o)
		case n < 9:
			k := r.IntN(len(live))
			p.ops = append(p.ops, op{free: live[k] + 1, stack: p.ops[live[k]].stack})
			live = slices.Delete(live, k, k+1)
		default:
			p.ops = append(p.ops, op{empty: true})
		}
	}
	return p
}

// at is the program's stream at x, its stacks numbered in the order perm
// gives (another recording interns them in another order).
func (p program) at(x int64, perm []int) replay.Stream {
	s := replay.Stream{Stacks: make([]gpu.Stack, len(p.stacks))}
	for i, j := range perm {
		s.Stacks[j] = p.stacks[i]
	}
	id := func(st gpu.StackID) gpu.StackID { return gpu.StackID(perm[st-1] + 1) }
	for i, o := range p.ops {
		switch {
		case o.empty:
			s.Requests = append(s.Requests, replay.Request{Op: replay.OpEmptyCache})
		case o.free > 0:
			s.Requests = append(s.Requests, replay.Request{Op: replay.OpFree, ID: int64(o.free), Stack: id(o.stack)})
		default:
			s.Requests = append(s.Requests, replay.Request{Op: replay.OpMalloc, ID: int64(i + 1), Stack: id(o.stack),
				Size: uint64(o.coef[0] + o.coef[1]*x + o.coef[2]*x*x)})
		}
	}
	return s
}

// Any program recorded at two (three) values predicts itself at every
// other value exactly, whatever order each recording numbered its stacks.
func TestPropertyFitPredictsTheProgram(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 31))
	for trial := range 300 {
		d := Batch
		if trial%2 == 1 {
			d = Seq
		}
		p := randomProgram(r, int(d))
		var recs []Recording
		used := map[int]bool{}
		for len(recs) < d.Recordings() {
			x := 1 + r.IntN(64)
			if used[x] {
				continue
			}
			used[x] = true
			recs = append(recs, Recording{Name: "r", At: x, Stream: p.at(int64(x), r.Perm(len(p.stacks)))})
		}
		m, err := Fit(d, recs)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		if m.Paired != m.Requests || len(m.Unfit) != 0 {
			t.Fatalf("trial %d: %d of %d paired, unfit %+v", trial, m.Paired, m.Requests, m.Unfit)
		}
		for range 5 {
			x := 1 + r.IntN(4096)
			got, guessed := m.Stream(x)
			want := p.at(int64(x), identity(len(p.stacks)))
			if guessed != 0 || len(got.Requests) != len(want.Requests) {
				t.Fatalf("trial %d at %d: %d requests, %d guessed bytes", trial, x, len(got.Requests), guessed)
			}
			for i := range want.Requests {
				g, w := got.Requests[i], want.Requests[i]
				if g.Op != w.Op || g.ID != w.ID || g.Size != w.Size || !slices.Equal(stackOf(got, g.Stack), stackOf(want, w.Stack)) {
					t.Fatalf("trial %d at %d, request %d: %+v, want %+v", trial, x, i, g, w)
				}
			}
		}
	}
}

func identity(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	return p
}

func stackOf(s replay.Stream, id gpu.StackID) gpu.Stack {
	if id == 0 {
		return nil
	}
	return s.Stacks[id-1]
}
