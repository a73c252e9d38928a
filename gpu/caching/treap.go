package caching

// blockSet is an ordered set of blocks: free blocks by (stream, size, addr)
// for best-fit lookup, or unmapped blocks by (stream, addr). It is an
// intrusive treap: the tree links live in Block itself, so inserting and
// removing never allocate, which keeps the malloc/free hot path free of heap
// allocations (library trees allocate a node per insert).
type blockSet struct {
	root   *Block
	bySize bool
	len    int
	rng    uint32
}

type blockKey struct{ stream, size, addr uint64 }

func (k blockKey) less(o blockKey) bool {
	if k.stream != o.stream {
		return k.stream < o.stream
	}
	if k.size != o.size {
		return k.size < o.size
	}
	return k.addr < o.addr
}

func (s *blockSet) key(b *Block) blockKey {
	if s.bySize {
		return blockKey{uint64(b.stream), b.size, b.addr}
	}
	return blockKey{uint64(b.stream), 0, b.addr}
}

func (s *blockSet) nextPrio() uint32 {
	if s.rng == 0 {
		s.rng = 2463534242
	}
	s.rng ^= s.rng << 13
	s.rng ^= s.rng >> 17
	s.rng ^= s.rng << 5
	return s.rng
}

// insert descends to where b's priority belongs, then splits the subtree
// there by b's key into b's children (iterative: no recursion on the hot path).
func (s *blockSet) insert(b *Block) {
	k := s.key(b)
	b.k = k // frozen while b is in the set: comparisons read it directly
	b.prio = s.nextPrio()
	b.inSet = s
	link := &s.root
	for t := *link; t != nil && t.prio >= b.prio; t = *link {
		if k.less(t.k) {
			link = &t.left
		} else {
			link = &t.right
		}
	}
	l, r := &b.left, &b.right
	for t := *link; t != nil; {
		if t.k.less(k) {
			*l, l, t = t, &t.right, t.right
		} else {
			*r, r, t = t, &t.left, t.left
		}
	}
	*l, *r = nil, nil
	*link = b
	s.len++
}

func (s *blockSet) remove(b *Block) {
	if b.inSet != s {
		panic("caching: removing a block from a set that does not hold it")
	}
	k := b.k
	link := &s.root
	for *link != b {
		if k.less((*link).k) {
			link = &(*link).left
		} else {
			link = &(*link).right
		}
	}
	*link = merge(b.left, b.right)
	b.inSet, b.left, b.right = nil, nil, nil
	s.len--
}

// merge joins two treaps whose keys are all smaller in a than in b.
func merge(a, b *Block) *Block {
	var root *Block
	link := &root
	for a != nil && b != nil {
		if a.prio > b.prio {
			*link, link, a = a, &a.right, a.right
		} else {
			*link, link, b = b, &b.left, b.left
		}
	}
	if a != nil {
		*link = a
	} else {
		*link = b
	}
	return root
}

// lowerBound returns the first block whose key is not less than k.
func (s *blockSet) lowerBound(k blockKey) *Block {
	var res *Block
	for t := s.root; t != nil; {
		if !t.k.less(k) {
			res, t = t, t.left
		} else {
			t = t.right
		}
	}
	return res
}

// next returns the block after b in set order.
func (s *blockSet) next(b *Block) *Block {
	k := b.k
	var res *Block
	for t := s.root; t != nil; {
		if k.less(t.k) {
			res, t = t, t.left
		} else {
			t = t.right
		}
	}
	return res
}

// prev returns the block before the position of key k.
func (s *blockSet) before(k blockKey) *Block {
	var res *Block
	for t := s.root; t != nil; {
		if t.k.less(k) {
			res, t = t, t.right
		} else {
			t = t.left
		}
	}
	return res
}

// all returns the blocks in set order (for the rare whole-pool walks).
func (s *blockSet) all() []*Block {
	out := make([]*Block, 0, s.len)
	var walk func(t *Block)
	walk = func(t *Block) {
		if t == nil {
			return
		}
		walk(t.left)
		out = append(out, t)
		walk(t.right)
	}
	walk(s.root)
	return out
}
