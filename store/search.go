package store

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"vramscope/gpu"
)

// SearchResult is the allocations a search found: Total in all, Matches the
// first of them by allocation order.
type SearchResult struct {
	Total   int64            `json:"total"`
	Matches []gpu.Allocation `json:"matches"`
	// Stacks are the ids of the stacks whose frames matched.
	Stacks []gpu.StackID `json:"stacks"`
	// Address is the address the text was read as, when it is one.
	Address *uint64 `json:"address,omitempty"`
}

// Search finds the allocations whose stack has a frame whose function or
// file name contains text (without regard to case), or whose address range
// holds text read as a hexadecimal address (with or without 0x). It
// returns the first limit of them by seq (those made before the trace
// first). The cost follows the trace's allocations: it reads them all.
func (db *DB) Search(id, text string, limit int) (SearchResult, error) {
	var out SearchResult
	r, err := db.begin(id)
	if err != nil {
		return out, err
	}
	defer r.close()
	needle := strings.ToLower(strings.TrimSpace(text))
	if needle == "" {
		return out, nil
	}
	if a, err := strconv.ParseUint(strings.TrimPrefix(needle, "0x"), 16, 64); err == nil {
		out.Address = &a
	}
	matched := map[gpu.StackID]bool{}
	rows, err := r.tx.Query("SELECT sid, frames FROM stacks WHERE tid = ? ORDER BY sid", r.tid)
	if err != nil {
		return out, err
	}
	for rows.Next() {
		var sid int64
		var frames string
		if err := rows.Scan(&sid, &frames); err != nil {
			rows.Close()
			return out, err
		}
		var st gpu.Stack
		if err := json.Unmarshal([]byte(frames), &st); err != nil {
			rows.Close()
			return out, err
		}
		for _, f := range st {
			if strings.Contains(strings.ToLower(f.Name), needle) || strings.Contains(strings.ToLower(f.Filename), needle) {
				matched[gpu.StackID(sid)] = true
				out.Stacks = append(out.Stacks, gpu.StackID(sid))
				break
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return out, err
	}
	if len(matched) == 0 && out.Address == nil {
		return out, nil
	}
	var found []allocRec
	// Once limit matches are kept, a match after the last of them by seq
	// is only counted: a common frame matches millions of allocations.
	var last allocRec
	full := false
	keep := func(a *allocRec) {
		if !matched[a.stack] && (out.Address == nil || *out.Address < a.addr || *out.Address >= a.addr+a.size) {
			return
		}
		out.Total++
		if full && !bySeq(a, &last) {
			return
		}
		found = append(found, *a)
		if len(found) > 4*limit+64 {
			found = firstBySeq(found, limit)
			last, full = found[len(found)-1], true
		}
	}
	open, err := r.openAllocs()
	if err != nil {
		return out, err
	}
	for i := range open {
		keep(&open[i])
	}
	if err := r.allBins(keep); err != nil {
		return out, err
	}
	found = firstBySeq(found, limit)
	out.Matches = make([]gpu.Allocation, len(found))
	for i := range found {
		out.Matches[i] = found[i].allocation()
	}
	return out, nil
}

// firstBySeq keeps the first n records by seq (then address).
func firstBySeq(recs []allocRec, n int) []allocRec {
	sort.Slice(recs, func(i, j int) bool { return bySeq(&recs[i], &recs[j]) })
	return recs[:min(n, len(recs))]
}

// bySeq orders records by seq, then address.
func bySeq(a, b *allocRec) bool {
	if a.allocSeq != b.allocSeq {
		return a.allocSeq < b.allocSeq
	}
	return a.addr < b.addr
}

// allBins calls fn for every finished allocation of the trace.
func (r *reader) allBins(fn func(a *allocRec)) error {
	rows, err := r.tx.Query("SELECT min_free, data FROM alloc_bins WHERE tid = ?", r.tid)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var minFree int64
		var data []byte
		if err := rows.Scan(&minFree, &data); err != nil {
			return err
		}
		if err := eachAllocRec(minFree, data, fn); err != nil {
			return fmt.Errorf("trace %s: allocation bin: %w", r.trace.ID, err)
		}
	}
	return rows.Err()
}
