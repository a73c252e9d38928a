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

func (s *blockSet) insert(b *Block) {
	b.left, b.right, b.prio = nil, nil, s.nextPrio()
	b.inSet = s
	s.root = s.ins(s.root, b, s.key(b))
	s.len++
}

func (s *blockSet) ins(t, b *Block, k blockKey) *Block {
	if t == nil {
		return b
	}
	if k.less(s.key(t)) {
		t.left = s.ins(t.left, b, k)
		if t.left.prio > t.prio {
			l := t.left
			t.left, l.right = l.right, t
			return l
		}
	} else {
		t.right = s.ins(t.right, b, k)
		if t.right.prio > t.prio {
			r := t.right
			t.right, r.left = r.left, t
			return r
		}
	}
	return t
}

func (s *blockSet) remove(b *Block) {
	if b.inSet != s {
		panic("caching: removing a block from a set that does not hold it")
	}
	s.root = s.del(s.root, b, s.key(b))
	b.inSet, b.left, b.right = nil, nil, nil
	s.len--
}

func (s *blockSet) del(t, b *Block, k blockKey) *Block {
	if t == b {
		return merge(t.left, t.right)
	}
	if k.less(s.key(t)) {
		t.left = s.del(t.left, b, k)
	} else {
		t.right = s.del(t.right, b, k)
	}
	return t
}

func merge(a, b *Block) *Block {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case a.prio > b.prio:
		a.right = merge(a.right, b)
		return a
	default:
		b.left = merge(a, b.left)
		return b
	}
}

// lowerBound returns the first block whose key is not less than k.
func (s *blockSet) lowerBound(k blockKey) *Block {
	var res *Block
	for t := s.root; t != nil; {
		if !s.key(t).less(k) {
			res, t = t, t.left
		} else {
			t = t.right
		}
	}
	return res
}

// next returns the block after b in set order.
func (s *blockSet) next(b *Block) *Block {
	k := s.key(b)
	var res *Block
	for t := s.root; t != nil; {
		if k.less(s.key(t)) {
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
		if s.key(t).less(k) {
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
