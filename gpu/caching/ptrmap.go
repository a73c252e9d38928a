package caching

// ptrMap maps block addresses to blocks: an open-addressing table with
// linear probing and backward-shift deletion. It is the allocator's
// ptr->Block map, on the malloc/free hot path, where it costs a third of
// Go's built-in map (no tombstones, no per-entry hashing of a generic key:
// addresses are distinct multiples of 512, so a Fibonacci hash spreads them).
type ptrMap struct {
	keys  []uint64 // 0: empty (no block lives at address 0)
	vals  []*Block
	n     int
	shift uint
}

func (m *ptrMap) slot(k uint64) int {
	return int((k >> 9) * 0x9E3779B97F4A7C15 >> m.shift)
}

func (m *ptrMap) get(k uint64) *Block {
	if m.n == 0 {
		return nil
	}
	mask := len(m.keys) - 1
	for i := m.slot(k); ; i = (i + 1) & mask {
		switch m.keys[i] {
		case k:
			return m.vals[i]
		case 0:
			return nil
		}
	}
}

func (m *ptrMap) put(k uint64, b *Block) {
	if 2*(m.n+1) > len(m.keys) {
		m.grow()
	}
	mask := len(m.keys) - 1
	i := m.slot(k)
	for m.keys[i] != 0 && m.keys[i] != k {
		i = (i + 1) & mask
	}
	if m.keys[i] == 0 {
		m.n++
	}
	m.keys[i], m.vals[i] = k, b
}

func (m *ptrMap) del(k uint64) {
	if m.n == 0 {
		return
	}
	mask := len(m.keys) - 1
	i := m.slot(k)
	for m.keys[i] != k {
		if m.keys[i] == 0 {
			return
		}
		i = (i + 1) & mask
	}
	m.n--
	// Shift later entries of the probe run back over the hole, so lookups
	// never need tombstones.
	for j := (i + 1) & mask; m.keys[j] != 0; j = (j + 1) & mask {
		home := m.slot(m.keys[j])
		if (j-home)&mask >= (j-i)&mask {
			m.keys[i], m.vals[i] = m.keys[j], m.vals[j]
			i = j
		}
	}
	m.keys[i], m.vals[i] = 0, nil
}

func (m *ptrMap) grow() {
	size := max(64, 2*len(m.keys))
	old, oldVals := m.keys, m.vals
	m.keys, m.vals, m.n = make([]uint64, size), make([]*Block, size), 0
	m.shift = uint(64 - bitsLen(size-1))
	for i, k := range old {
		if k != 0 {
			m.put(k, oldVals[i])
		}
	}
}

func bitsLen(x int) int {
	n := 0
	for ; x > 0; x >>= 1 {
		n++
	}
	return n
}
