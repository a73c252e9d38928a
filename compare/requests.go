package compare

import (
	"fmt"

	"vramscope/gpu"
	"vramscope/store"
)

// requests are a trace's allocator requests (alloc and free requests;
// segment events and completed frees are the allocator's answer, not the
// program's asks): for each event, how many requests came up to it, and
// the sizes of its alloc requests in order.
type requests struct {
	upTo  map[int64]int64 // by seq of the events Compare keeps
	sizes []uint64
}

// readRequests counts the requests of trace id up to each of seqs (in
// increasing order), reading its events a batch at a time.
func readRequests(db *store.DB, t gpu.Trace, seqs []int64) (*requests, error) {
	out := &requests{upTo: make(map[int64]int64, len(seqs))}
	const batch = 1 << 16
	n, k := int64(0), 0
	for from := t.FirstSeq; from <= t.LastSeq && k < len(seqs); from += batch {
		evs, err := db.Events(t.ID, from, min(from+batch, t.LastSeq+1))
		if err != nil {
			return nil, err
		}
		for i := range evs {
			e := &evs[i]
			switch e.Action {
			case gpu.ActionAlloc:
				n++
				out.sizes = append(out.sizes, e.Size)
			case gpu.ActionFreeRequested:
				n++
			}
			for k < len(seqs) && seqs[k] <= e.Seq {
				out.upTo[seqs[k]] = n
				k++
			}
		}
		if len(evs) == 0 {
			break
		}
	}
	for ; k < len(seqs); k++ {
		out.upTo[seqs[k]] = n
	}
	return out, nil
}

// sameProgram says whether two request streams are one program's: the
// same alloc sizes in the same order, over the shorter of them (one may
// have stopped early, at an OOM); and if not, where they part.
func sameProgram(a, b []uint64) (bool, string) {
	n := min(len(a), len(b))
	if n == 0 {
		return false, "a trace has no alloc requests"
	}
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return false, fmt.Sprintf("their alloc requests differ from the %s on (%d B in A, %d B in B)", ordinal(i+1), a[i], b[i])
		}
	}
	return true, ""
}

func ordinal(n int) string {
	suffix := "th"
	switch {
	case n%100 >= 11 && n%100 <= 13:
	case n%10 == 1:
		suffix = "st"
	case n%10 == 2:
		suffix = "nd"
	case n%10 == 3:
		suffix = "rd"
	}
	return fmt.Sprintf("%d%s", n, suffix)
}
