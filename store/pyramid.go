package store

import "vramscope/gpu"

// The usage pyramid: for every level k, the events are bucketed by
// time_us >> k, and each bucket keeps its event count and the min, max and
// last gpu.Totals after its events. Buckets are built bottom-up as time moves on:
// a bucket closes when an event falls outside it and is folded into its
// parent, so each event costs O(1) amortized. Closed buckets with at least
// levelMinEvents events become usage_levels rows; a reader answers any window
// with ~n buckets from one level, decoding the events of the few buckets
// that have no row.

type levelAcc struct {
	valid          bool
	b              int64
	n              int64
	min, max, last gpu.Totals
}

type levelRow struct {
	k   int
	acc levelAcc
}

type pyramid struct {
	lv  [numLevels]levelAcc
	out []levelRow
	// After a resume, the buckets holding priorUS lack the events before
	// the resume; they are never stored (readers decode their events).
	resumed bool
	priorUS int64
}

func minTotals(a, b gpu.Totals) gpu.Totals {
	return gpu.Totals{Reserved: min(a.Reserved, b.Reserved), Allocated: min(a.Allocated, b.Allocated), Active: min(a.Active, b.Active)}
}

func maxTotals(a, b gpu.Totals) gpu.Totals {
	return gpu.Totals{Reserved: max(a.Reserved, b.Reserved), Allocated: max(a.Allocated, b.Allocated), Active: max(a.Active, b.Active)}
}

func (a *levelAcc) merge(o *levelAcc) {
	a.n += o.n
	a.min = minTotals(a.min, o.min)
	a.max = maxTotals(a.max, o.max)
	a.last = o.last
}

// add records the gpu.Totals v after an event at time t.
func (p *pyramid) add(t int64, v gpu.Totals) {
	a := &p.lv[0]
	if a.valid && a.b == t {
		a.n++
		a.min = minTotals(a.min, v)
		a.max = maxTotals(a.max, v)
		a.last = v
		return
	}
	p.close(t, false)
	p.lv[0] = levelAcc{valid: true, b: t, n: 1, min: v, max: v, last: v}
}

func (p *pyramid) closeAll() { p.close(0, true) }

// close closes, from level 0 up, the buckets that do not hold t (all of them
// when all is set), folding each into its parent.
func (p *pyramid) close(t int64, all bool) {
	for k := range numLevels {
		a := &p.lv[k]
		if !a.valid {
			continue
		}
		if !all && a.b == t>>k {
			return
		}
		if a.n >= levelMinEvents && !(p.resumed && a.b == p.priorUS>>k) {
			p.out = append(p.out, levelRow{k, *a})
		}
		if k+1 < numLevels {
			up := &p.lv[k+1]
			if up.valid {
				up.merge(a)
			} else {
				*up = *a
				up.b = a.b >> 1
			}
		}
		a.valid = false
	}
}

// take returns the closed buckets not yet taken.
func (p *pyramid) take() []levelRow {
	out := p.out
	p.out = nil
	return out
}
