package store

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"vramscope/gpu"
)

// Range is the least and greatest value in a bucket.
type Range struct {
	Min uint64 `json:"min"`
	Max uint64 `json:"max"`
}

// UsageBucket covers [StartUS, StartUS+Usage.BucketUS): the least and
// greatest gpu.Totals in effect in it, that is, entering it and after each of its
// events.
type UsageBucket struct {
	StartUS   int64 `json:"start_us"`
	Events    int64 `json:"events"`
	Reserved  Range `json:"reserved"`
	Allocated Range `json:"allocated"`
	Active    Range `json:"active"`
}

// Usage is a usage timeline at one resolution.
type Usage struct {
	BucketUS int64         `json:"bucket_us"`
	Buckets  []UsageBucket `json:"buckets"`
}

// Usage summarizes reserved, allocated and active bytes over [t0, t1] in at
// most n buckets. The bucket width is the smallest power of two that covers
// the window in n buckets, and buckets start at multiples of it, so results
// for nearby windows line up and can be cached.
func (db *DB) Usage(id string, t0, t1 int64, n int) (Usage, error) {
	return db.UsageOf(id, t0, t1, n, AllSeries)
}

// Series picks which of reserved, allocated and active bytes a usage
// query reads.
type Series uint8

const (
	SeriesReserved Series = 1 << iota
	SeriesAllocated
	SeriesActive
	AllSeries = SeriesReserved | SeriesAllocated | SeriesActive
)

// pick is r when s picks series t, else zero.
func (s Series) pick(t Series, r Range) Range {
	if s&t == 0 {
		return Range{}
	}
	return r
}

// UsageOf is Usage of the series s picks; the others are zero.
func (db *DB) UsageOf(id string, t0, t1 int64, n int, s Series) (Usage, error) {
	us, err := db.Usages([]string{id}, t0, t1, n, s)
	if err != nil {
		return Usage{}, err
	}
	return us[0], nil
}

// usageOf is one trace's part of a Usages read: the stored buckets of
// its level, then the events of the others, then the totals entering the
// window.
type usageOf struct {
	r      *reader
	aggs   []levelAcc
	stored []bool
	carry  gpu.Totals
	found  bool // carry is known
}

// Usages is UsageOf several traces over one window, in one read: the rows
// of a run's heatmap. The buckets of traces asked for the same window
// line up. However many traces, the read makes the same few queries, each
// for all of them: on a database server every query is a round trip.
func (db *DB) Usages(ids []string, t0, t1 int64, n int, s Series) ([]Usage, error) {
	if n < 1 || t1 < t0 {
		return nil, fmt.Errorf("store: usage needs t0 <= t1 and n >= 1 (got [%d, %d], n=%d)", t0, t1, n)
	}
	t0, t1 = max(t0, -1<<60), min(t1, 1<<60)
	k := 0
	for k < numLevels-1 && (t1>>k)-(t0>>k)+1 > int64(n) {
		k++
	}
	b0, b1 := t0>>k, t1>>k
	nb := int(b1 - b0 + 1)
	startUS, endUS := b0<<k, (b1+1)<<k-1

	tx, err := db.r.BeginTx(context.Background(), db.be.readOptions())
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	readers, err := lookupAll(tx, ids)
	if err != nil {
		return nil, err
	}
	of := make(map[int64]*usageOf, len(readers))
	tids := make([]any, 0, len(readers))
	for _, r := range readers {
		of[r.tid] = &usageOf{r: r, aggs: make([]levelAcc, nb), stored: make([]bool, nb)}
		tids = append(tids, r.tid)
	}

	err = levels(tx, tids, k, b0, b1, s, func(tid int64, a levelAcc) {
		u := of[tid]
		u.aggs[a.b-b0] = a
		u.stored[a.b-b0] = true
	})
	if err != nil {
		return nil, err
	}
	if err := decodeUnstored(tx, of, tids, k, b0, startUS, endUS); err != nil {
		return nil, err
	}
	if err := carries(tx, of, tids, startUS); err != nil {
		return nil, err
	}

	out := make([]Usage, len(ids))
	for i, id := range ids {
		u := of[readers[id].tid]
		carry := u.carry
		o := Usage{BucketUS: 1 << k, Buckets: make([]UsageBucket, nb)}
		for j := range u.aggs {
			a := &u.aggs[j]
			lo, hi := carry, carry
			if a.valid {
				lo, hi = minTotals(lo, a.min), maxTotals(hi, a.max)
				carry = a.last
			}
			o.Buckets[j] = UsageBucket{StartUS: (b0 + int64(j)) << k, Events: a.n,
				Reserved:  s.pick(SeriesReserved, Range{lo.Reserved, hi.Reserved}),
				Allocated: s.pick(SeriesAllocated, Range{lo.Allocated, hi.Allocated}),
				Active:    s.pick(SeriesActive, Range{lo.Active, hi.Active})}
		}
		out[i] = o
	}
	return out, nil
}

// inBatch is how many values one IN list holds, well inside both
// databases' limits on parameters (a variable for tests).
var inBatch = 500

// queryIn runs q for list in batches, q's "%s" the items of a batch's IN
// list, after the parameters args; fn scans each row.
func queryIn(tx *sql.Tx, q string, args, list []any, fn func(*sql.Rows) error) error {
	return queryInGroups(tx, q, args, "?", list, fn)
}

// queryInGroups is queryIn for a list whose items are groups of
// parameters: each item of the IN list is group (as "(?, ?)"), taking as
// many of list's values as it has parameters.
func queryInGroups(tx *sql.Tx, q string, args []any, group string, list []any, fn func(*sql.Rows) error) error {
	per := strings.Count(group, "?")
	for lo := 0; lo < len(list); lo += inBatch * per {
		part := list[lo:min(lo+inBatch*per, len(list))]
		in := strings.TrimSuffix(strings.Repeat(group+",", len(part)/per), ",")
		rows, err := tx.Query(fmt.Sprintf(q, in), append(slices.Clip(args), part...)...)
		if err != nil {
			return err
		}
		for rows.Next() {
			if err := fn(rows); err != nil {
				rows.Close()
				return err
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	return nil
}

// lookupAll finds the traces ids names as readers of tx, by id.
func lookupAll(tx *sql.Tx, ids []string) (map[string]*reader, error) {
	list := make([]any, len(ids))
	for i, id := range ids {
		list[i] = id
	}
	out := make(map[string]*reader, len(ids))
	err := queryIn(tx, "SELECT "+traceCols+" FROM traces WHERE "+hidden+" AND id IN (%s)", nil, list, func(rows *sql.Rows) error {
		tid, t, err := scanTrace(rows)
		out[t.ID] = &reader{tx: tx, tid: tid, trace: t}
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if out[id] == nil {
			return nil, fmt.Errorf("trace %q: %w", id, ErrNotFound)
		}
	}
	return out, nil
}

// levels calls fn with the stored usage buckets of level k from b0 to b1
// of the traces tids, with the series s picks. Only those columns are
// read, into plain values (database/sql converts into typed pointers by
// reflection): a run's heatmap reads a hundred thousand buckets.
func levels(tx *sql.Tx, tids []any, k int, b0, b1 int64, s Series, fn func(tid int64, a levelAcc)) error {
	cols := "tid, b, n"
	var picked []*uint64 // where each number after tid, b and n goes, in a
	var a levelAcc
	for _, c := range []struct {
		s      Series
		prefix string
		min    *uint64
		max    *uint64
		last   *uint64
	}{
		{SeriesReserved, "res", &a.min.Reserved, &a.max.Reserved, &a.last.Reserved},
		{SeriesAllocated, "alloc", &a.min.Allocated, &a.max.Allocated, &a.last.Allocated},
		{SeriesActive, "act", &a.min.Active, &a.max.Active, &a.last.Active},
	} {
		if s&c.s != 0 {
			cols += fmt.Sprintf(", %[1]s_min, %[1]s_max, %[1]s_last", c.prefix)
			picked = append(picked, c.min, c.max, c.last)
		}
	}
	vals := make([]any, 3+len(picked))
	ptrs := make([]any, len(vals))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	return queryIn(tx, "SELECT "+cols+" FROM usage_levels WHERE k = ? AND b BETWEEN ? AND ? AND tid IN (%s)", []any{k, b0, b1}, tids, func(rows *sql.Rows) error {
		if err := rows.Scan(ptrs...); err != nil {
			return err
		}
		a = levelAcc{valid: true}
		var tid int64
		for j, v := range vals {
			n, ok := v.(int64)
			if !ok {
				return fmt.Errorf("usage level %d: %T in column %d", k, v, j)
			}
			switch j {
			case 0:
				tid = n
			case 1:
				a.b = n
			case 2:
				a.n = n
			default:
				*picked[j-3] = uint64(n)
			}
		}
		fn(tid, a)
		return nil
	})
}

// decodeUnstored fills in the buckets without a stored row from the
// events of the chunks that overlap them.
func decodeUnstored(tx *sql.Tx, of map[int64]*usageOf, tids []any, k int, b0, startUS, endUS int64) error {
	// Only traces with such buckets where they have events: most have a
	// row for every bucket, and their chunks are as many rows again.
	var gaps []any
	for _, tid := range tids {
		u := of[tid.(int64)]
		t := u.r.trace
		if t.Events == 0 || t.LastUS < startUS || t.FirstUS > endUS {
			continue
		}
		if slices.Contains(u.stored[max(t.FirstUS, startUS)>>k-b0:min(t.LastUS, endUS)>>k-b0+1], false) {
			gaps = append(gaps, tid)
		}
	}
	// Bounded at both ends: PostgreSQL sends every row a query selects.
	// In seq order within a trace, batch after batch: a bucket's last
	// totals are its last event's.
	var keys []any // (tid, first seq) pairs
	err := queryIn(tx, "SELECT tid, first_seq, first_us, last_us FROM chunks WHERE last_us >= ? AND first_us <= ? AND tid IN (%s) ORDER BY tid, first_seq",
		[]any{startUS, endUS}, gaps, func(rows *sql.Rows) error {
			var tid, first, f, l int64
			if err := rows.Scan(&tid, &first, &f, &l); err != nil {
				return err
			}
			u := of[tid]
			for b := max(f, startUS)>>k - b0; b <= min(l, endUS)>>k-b0; b++ {
				if !u.stored[b] {
					keys = append(keys, tid, first)
					break
				}
			}
			return nil
		})
	if err != nil || len(keys) == 0 {
		return err
	}
	// The pairs are typed, or PostgreSQL takes VALUES of parameters for
	// text.
	return queryInGroups(tx, "SELECT tid, "+chunkCols+" FROM chunks WHERE (tid, first_seq) IN (VALUES %s) ORDER BY tid, first_seq",
		nil, "(CAST(? AS bigint), CAST(? AS bigint))", keys, func(rows *sql.Rows) error {
			var tid int64
			c, err := scanChunk(rows, &tid)
			if err != nil {
				return err
			}
			return of[tid].add(c, k, b0, startUS, endUS)
		})
}

// add counts the events of c in the window's buckets that have no
// stored row.
func (u *usageOf) add(c *chunk, k int, b0, startUS, endUS int64) error {
	err := c.walk(func(e *gpu.Event, _ bool, v gpu.Totals, _ allocCounts) bool {
		if e.TimeUS < startUS {
			return true
		}
		if e.TimeUS > endUS {
			return false
		}
		i := e.TimeUS>>k - b0
		if u.stored[i] {
			return true
		}
		a := &u.aggs[i]
		if !a.valid {
			*a = levelAcc{valid: true, b: e.TimeUS >> k, n: 1, min: v, max: v, last: v}
		} else {
			a.n++
			a.min, a.max, a.last = minTotals(a.min, v), maxTotals(a.max, v), v
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("trace %s: %w", u.r.trace.ID, err)
	}
	return nil
}

// carries sets each trace's totals entering the window: after its last
// event before startUS, else before its first event (reader.stateAt and
// reader.initial, for all traces at once).
func carries(tx *sql.Tx, of map[int64]*usageOf, tids []any, startUS int64) error {
	err := queryIn(tx, "SELECT t.tid, "+qualified("c", chunkCols)+` FROM traces t JOIN chunks c ON c.tid = t.tid AND c.first_seq =
		(SELECT c2.first_seq FROM chunks c2 WHERE c2.tid = t.tid AND c2.first_us < ? ORDER BY c2.first_us DESC, c2.first_seq DESC LIMIT 1)
		WHERE t.tid IN (%s)`, []any{startUS}, tids, func(rows *sql.Rows) error {
		var tid int64
		c, err := scanChunk(rows, &tid)
		if err != nil {
			return err
		}
		u := of[tid]
		_, u.carry, _, err = c.stateAt(startUS, false)
		u.found = true
		if err != nil {
			return fmt.Errorf("trace %s: %w", u.r.trace.ID, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	var rest []any
	for _, tid := range tids {
		if !of[tid.(int64)].found {
			rest = append(rest, tid)
		}
	}
	err = queryIn(tx, `SELECT t.tid, c.reserved0, c.allocated0, c.active0 FROM traces t JOIN chunks c ON c.tid = t.tid AND c.first_seq =
		(SELECT MIN(c2.first_seq) FROM chunks c2 WHERE c2.tid = t.tid) WHERE t.tid IN (%s)`, nil, rest, func(rows *sql.Rows) error {
		var tid, r, a, ac int64
		if err := rows.Scan(&tid, &r, &a, &ac); err != nil {
			return err
		}
		u := of[tid]
		u.carry, u.found = gpu.Totals{Reserved: uint64(r), Allocated: uint64(a), Active: uint64(ac)}, true
		return nil
	})
	if err != nil {
		return err
	}
	// Traces without chunks: their initial checkpoint.
	for _, tid := range rest {
		if u := of[tid.(int64)]; !u.found {
			if u.carry, _, err = u.r.initial(); err != nil {
				return err
			}
		}
	}
	return nil
}

// qualified prefixes each of the comma-separated columns cols with table.
func qualified(table, cols string) string {
	return table + "." + strings.ReplaceAll(cols, ", ", ", "+table+".")
}
