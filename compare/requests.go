package compare

import (
	"fmt"
	"sync"

	"vramscope/gpu"
	"vramscope/store"
)

// requests are a trace's allocator requests (alloc and free requests;
// segment events and completed frees are the allocator's answer, not the
// program's asks): how many came up to each event, and the sizes of its
// alloc requests in order.
type requests struct {
	first int64
	upTo  []uint32 // by seq - first: the requests up to and including that event
	sizes []uint64
}

// at is how many requests came up to and including event seq.
func (r *requests) at(seq int64) int64 {
	switch i := seq - r.first; {
	case i < 0 || len(r.upTo) == 0:
		return 0
	case i >= int64(len(r.upTo)):
		return int64(r.upTo[len(r.upTo)-1])
	default:
		return int64(r.upTo[i])
	}
}

// requestCache keeps the requests of the traces last compared: the page
// asks again at every zoom and click, and reading a trace of a million
// events takes seconds.
var requestCache = struct {
	sync.Mutex
	entries []requestEntry // most recent last
}{}

type requestEntry struct {
	key requestKey
	r   *requests
}

type requestKey struct {
	id              string
	lastSeq, events int64
	status          gpu.TraceStatus
}

const maxCachedRequests = 4

// readRequests reads the requests of trace t, or takes them from the
// cache while the trace is as it was.
func readRequests(db *store.DB, t gpu.Trace) (*requests, error) {
	key := requestKey{t.ID, t.LastSeq, t.Events, t.Status}
	c := &requestCache
	c.Lock()
	for i, e := range c.entries {
		if e.key == key {
			c.entries = append(append(c.entries[:i:i], c.entries[i+1:]...), e)
			c.Unlock()
			return e.r, nil
		}
	}
	c.Unlock()
	r, err := scanRequests(db, t)
	if err != nil {
		return nil, err
	}
	c.Lock()
	defer c.Unlock()
	kept := c.entries[:0]
	for _, e := range c.entries {
		if e.key.id != t.ID {
			kept = append(kept, e)
		}
	}
	if len(kept) >= maxCachedRequests {
		kept = kept[1:]
	}
	c.entries = append(kept, requestEntry{key, r})
	return r, nil
}

// scanRequests reads trace t's events a batch at a time.
func scanRequests(db *store.DB, t gpu.Trace) (*requests, error) {
	out := &requests{first: t.FirstSeq}
	if t.LastSeq >= t.FirstSeq {
		out.upTo = make([]uint32, 0, t.LastSeq-t.FirstSeq+1)
	}
	const batch = 1 << 16
	n := uint32(0)
	for from := t.FirstSeq; from <= t.LastSeq; from += batch {
		evs, err := db.Events(t.ID, from, min(from+batch, t.LastSeq+1))
		if err != nil {
			return nil, err
		}
		if len(evs) == 0 {
			break
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
			for int64(len(out.upTo)) < e.Seq-t.FirstSeq { // a gap: the count so far
				out.upTo = append(out.upTo, n)
			}
			out.upTo = append(out.upTo, n)
		}
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
