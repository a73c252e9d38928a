package predict

import (
	"errors"
	"fmt"
	"slices"

	"vramscope/gpu"
	"vramscope/replay"
)

// SameProgram is the share of each recording's allocations that must pair
// up with the other's, in the same order, for them to count as the same
// program. Frees are paired by the allocations they free and their order
// is not counted: the same program frees in another order from run to run
// (DistributedDataParallel's buckets, on each rank).
const SameProgram = 0.9

// ErrNotSameProgram refuses recordings whose requests do not pair up.
var ErrNotSameProgram = errors.New("not recordings of the same program")

// prepared is a recording's requests as alignment reads them: the live
// blocks of its starting layout first, as mallocs (a prediction starts
// from an empty device), each request's stack in the table every
// recording shares.
type prepared struct {
	reqs    []replay.Request
	stacks  []gpu.StackID // shared stack ids, one per request
	mallocs int
}

// prepare reads s into table's stack ids.
func prepare(s replay.Stream, table *gpu.StackTable) prepared {
	shared := make([]gpu.StackID, len(s.Stacks)+1)
	for i, st := range s.Stacks {
		shared[i+1], _ = table.Intern(st)
	}
	of := func(id gpu.StackID) gpu.StackID {
		if int(id) < len(shared) {
			return shared[id]
		}
		return 0
	}
	var p prepared
	if l := s.Initial; l != nil {
		var id int64
		for i := range l.Segments {
			for _, b := range l.Segments[i].Blocks {
				if b.State == gpu.BlockFree {
					continue
				}
				// The ids the requests know them by: 1, 2, ... in address
				// order (see replay.FromEvents).
				id++
				size := b.Requested
				if size == 0 {
					size = b.Size
				}
				p.reqs = append(p.reqs, replay.Request{Op: replay.OpMalloc, ID: id, Size: size, Stream: l.Segments[i].Stream, Stack: b.Stack})
			}
		}
	}
	if len(p.reqs) == 0 {
		p.reqs = s.Requests
	} else {
		p.reqs = append(p.reqs, s.Requests...)
	}
	p.stacks = make([]gpu.StackID, len(p.reqs))
	for i := range p.reqs {
		p.stacks[i] = of(p.reqs[i].Stack)
		if p.reqs[i].Op == replay.OpMalloc {
			p.mallocs++
		}
	}
	return p
}

// key names a request by what it is, not where it is: its kind, its stack
// and how many requests of that kind and stack came before it.
type key struct {
	what
	n int
}

// what is a request's kind and stack.
type what struct {
	op    replay.Op
	stack gpu.StackID
}

// alignment pairs the requests of other with base's: partner[i] is the
// index in other of base request i's partner, -1 when it has none.
type alignment struct {
	partner []int32
	// pairedMallocs counts the mallocs that pair up; outOfOrder the
	// fewest of the paired calls (mallocs and empty_cache calls) that
	// must be taken away for the rest to come in base's order, of
	// ordered ones.
	pairedMallocs, outOfOrder, ordered int
	// lone are other's mallocs with no partner in base.
	lone []int32
}

// index keys base's mallocs and empty_cache calls, and says which request
// frees each malloc and which completes a deferred free of it (-1: none).
type index struct {
	at             map[key]int32
	freeOf, doneOf []int32 // by request index
}

func indexOf(base prepared) index {
	ix := index{at: make(map[key]int32, base.mallocs), freeOf: make([]int32, len(base.reqs)), doneOf: make([]int32, len(base.reqs))}
	count := map[what]int{}
	malloc := make(map[int64]int32, base.mallocs)
	deferred := map[int64]int32{} // allocation id -> its malloc, freed and not yet completed
	for i, r := range base.reqs {
		ix.freeOf[i], ix.doneOf[i] = -1, -1
		switch r.Op {
		case replay.OpMalloc, replay.OpEmptyCache:
			w := what{r.Op, base.stacks[i]}
			k := key{w, count[w]}
			count[w]++
			ix.at[k] = int32(i)
			if r.Op == replay.OpMalloc {
				malloc[r.ID] = int32(i)
			}
		case replay.OpFree:
			if m, ok := malloc[r.ID]; ok {
				ix.freeOf[m] = int32(i)
				delete(malloc, r.ID)
				if r.Deferred {
					deferred[r.ID] = m
				}
			}
		case replay.OpFreeDone:
			if m, ok := deferred[r.ID]; ok {
				ix.doneOf[m] = int32(i)
				delete(deferred, r.ID)
			}
		}
	}
	return ix
}

// align pairs other's requests with base's: mallocs and empty_cache calls
// by stack and occurrence, frees (and their completions) by the mallocs
// they free.
func align(base prepared, ix index, other prepared) alignment {
	al := alignment{partner: make([]int32, len(base.reqs))}
	for i := range al.partner {
		al.partner[i] = -1
	}
	count := map[what]int{}
	pairOf := make(map[int64]int32, other.mallocs) // other's allocation id -> base's malloc
	deferred := map[int64]int32{}                  // the same, freed and not yet completed
	var calls []int32                              // base's partners of other's calls, in other's order
	pair := func(b, o int32) { al.partner[b] = o }
	for i, r := range other.reqs {
		switch r.Op {
		case replay.OpMalloc, replay.OpEmptyCache:
			w := what{r.Op, other.stacks[i]}
			k := key{w, count[w]}
			count[w]++
			b, ok := ix.at[k]
			if !ok {
				if r.Op == replay.OpMalloc {
					al.lone = append(al.lone, int32(i))
				}
				continue
			}
			pair(b, int32(i))
			calls = append(calls, b)
			if r.Op == replay.OpMalloc {
				al.pairedMallocs++
				pairOf[r.ID] = b
			}
		case replay.OpFree:
			m, ok := pairOf[r.ID]
			if !ok {
				continue
			}
			delete(pairOf, r.ID)
			if r.Deferred {
				deferred[r.ID] = m
			}
			if f := ix.freeOf[m]; f >= 0 {
				pair(f, int32(i))
			}
		case replay.OpFreeDone:
			m, ok := deferred[r.ID]
			if !ok {
				continue
			}
			delete(deferred, r.ID)
			if d := ix.doneOf[m]; d >= 0 {
				pair(d, int32(i))
			}
		}
	}
	al.ordered = len(calls)
	al.outOfOrder = len(calls) - longestIncreasing(calls)
	return al
}

// longestIncreasing is the length of the longest increasing subsequence
// of xs (patience sorting): the calls that came in order.
func longestIncreasing(xs []int32) int {
	var tails []int32
	for _, x := range xs {
		i, _ := slices.BinarySearch(tails, x)
		if i == len(tails) {
			tails = append(tails, x)
		} else {
			tails[i] = x
		}
	}
	return len(tails)
}

// sameProgram says, when they are not, why base and other are not
// recordings of the same program.
func sameProgram(baseName string, base prepared, otherName string, other prepared, al alignment) error {
	switch {
	case base.mallocs == 0:
		return fmt.Errorf("%s has no allocations to predict from", baseName)
	case other.mallocs == 0:
		return fmt.Errorf("%s has no allocations to predict from", otherName)
	}
	ofBase := float64(al.pairedMallocs) / float64(base.mallocs)
	ofOther := float64(al.pairedMallocs) / float64(other.mallocs)
	if ofBase < SameProgram || ofOther < SameProgram {
		return fmt.Errorf("%s and %s are %w: only %d of %s's %d allocations (%.0f%%) and of %s's %d (%.0f%%) pair up by stack and occurrence (%.0f%% needed)",
			baseName, otherName, ErrNotSameProgram, al.pairedMallocs, baseName, base.mallocs, 100*ofBase, otherName, other.mallocs, 100*ofOther, 100*SameProgram)
	}
	if al.outOfOrder > int((1-SameProgram)*float64(al.ordered)) {
		return fmt.Errorf("%s and %s are %w: their allocations pair up by stack and occurrence, but %d of the %d come in another order",
			baseName, otherName, ErrNotSameProgram, al.outOfOrder, al.ordered)
	}
	return nil
}
