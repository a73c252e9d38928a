package caching

// blockSet is an ordered set of blocks: free blocks by (stream, size, addr)
// for best-fit lookup, or unmapped blocks by (stream, addr). It is a B+tree
// written for this one use: keys sit inline in the nodes, so a lookup
// touches a few cache lines instead of one per level as a binary tree does,
// each block knows its leaf, so removing it needs no search, and nodes are
// recycled, so the malloc/free hot path allocates nothing. (Library trees
// allocate per insert or hold keys behind pointers.)
type blockSet struct {
	root   *bnode
	bySize bool
	len    int
	spare  []*bnode
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

const fanout = 32

// bnode is a leaf (blocks, in key order, linked to its neighbours) or an
// inner node (kids; keys[i] is a lower bound of kids[i]'s keys, i > 0).
type bnode struct {
	parent     *bnode
	prev, next *bnode // leaves only
	leaf       bool
	n          int
	keys       [fanout]blockKey
	blocks     [fanout]*Block
	kids       [fanout]*bnode
}

func (s *blockSet) key(b *Block) blockKey {
	if s.bySize {
		return blockKey{uint64(b.stream), b.size, b.addr}
	}
	return blockKey{uint64(b.stream), 0, b.addr}
}

func (s *blockSet) newNode(leaf bool) *bnode {
	var n *bnode
	if k := len(s.spare); k > 0 {
		n = s.spare[k-1]
		s.spare = s.spare[:k-1]
	} else {
		n = new(bnode)
	}
	n.leaf = leaf
	return n
}

func (s *blockSet) freeNode(n *bnode) {
	*n = bnode{}
	s.spare = append(s.spare, n)
}

// child returns the index of the kid of inner node n whose range holds k:
// the last i with keys[i] <= k (keys[0] counts as minus infinity).
func (n *bnode) child(k blockKey) int {
	lo, hi := 1, n.n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if k.less(n.keys[m]) {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo - 1
}

// pos returns the index of the first block of leaf n not less than k.
func (n *bnode) pos(k blockKey) int {
	lo, hi := 0, n.n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if n.keys[m].less(k) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

func (s *blockSet) leafFor(k blockKey) *bnode {
	n := s.root
	for n != nil && !n.leaf {
		n = n.kids[n.child(k)]
	}
	return n
}

func (s *blockSet) insert(b *Block) {
	k := s.key(b)
	b.k, b.inSet = k, s
	if s.root == nil {
		s.root = s.newNode(true)
	}
	leaf := s.leafFor(k)
	if leaf.n == fanout {
		right := s.split(leaf)
		if !k.less(right.keys[0]) {
			leaf = right
		}
	}
	i := leaf.pos(k)
	copy(leaf.keys[i+1:leaf.n+1], leaf.keys[i:leaf.n])
	copy(leaf.blocks[i+1:leaf.n+1], leaf.blocks[i:leaf.n])
	leaf.keys[i], leaf.blocks[i] = k, b
	leaf.n++
	b.leaf = leaf
	s.len++
}

// split moves the upper half of full node n into a new right sibling,
// registers it in the parent (splitting that too if needed) and returns it.
func (s *blockSet) split(n *bnode) *bnode {
	r := s.newNode(n.leaf)
	half := n.n / 2
	r.n = n.n - half
	copy(r.keys[:r.n], n.keys[half:n.n])
	if n.leaf {
		copy(r.blocks[:r.n], n.blocks[half:n.n])
		clear(n.blocks[half:n.n])
		for _, b := range r.blocks[:r.n] {
			b.leaf = r
		}
		r.next, r.prev = n.next, n
		if n.next != nil {
			n.next.prev = r
		}
		n.next = r
	} else {
		copy(r.kids[:r.n], n.kids[half:n.n])
		clear(n.kids[half:n.n])
		for _, c := range r.kids[:r.n] {
			c.parent = r
		}
	}
	n.n = half
	p := n.parent
	if p == nil {
		p = s.newNode(false)
		p.n = 1
		p.kids[0], p.keys[0] = n, n.keys[0]
		n.parent = p
		s.root = p
	}
	if p.n == fanout {
		s.split(p)
		p = n.parent // n may have moved to the new sibling
	}
	i := 0
	for p.kids[i] != n {
		i++
	}
	copy(p.keys[i+2:p.n+1], p.keys[i+1:p.n])
	copy(p.kids[i+2:p.n+1], p.kids[i+1:p.n])
	p.keys[i+1], p.kids[i+1] = r.keys[0], r
	p.n++
	r.parent = p
	return r
}

func (s *blockSet) remove(b *Block) {
	if b.inSet != s {
		panic("caching: removing a block from a set that does not hold it")
	}
	leaf := b.leaf
	i := leaf.pos(b.k)
	for leaf.blocks[i] != b {
		i++
	}
	copy(leaf.keys[i:], leaf.keys[i+1:leaf.n])
	copy(leaf.blocks[i:], leaf.blocks[i+1:leaf.n])
	leaf.n--
	leaf.blocks[leaf.n] = nil
	b.inSet, b.leaf = nil, nil
	s.len--
	if leaf.n == 0 && leaf != s.root { // an empty root leaf stays for the next insert
		s.unlink(leaf)
	}
}

// unlink removes an empty node from the tree. Nodes are not rebalanced
// otherwise: separators stay valid lower bounds, and a node that empties
// goes, so the tree stays correct and walks never meet empty leaves.
func (s *blockSet) unlink(n *bnode) {
	if n.leaf {
		if n.prev != nil {
			n.prev.next = n.next
		}
		if n.next != nil {
			n.next.prev = n.prev
		}
	}
	p := n.parent
	s.freeNode(n)
	i := 0
	for p.kids[i] != n {
		i++
	}
	copy(p.keys[i:], p.keys[i+1:p.n])
	copy(p.kids[i:], p.kids[i+1:p.n])
	p.n--
	p.kids[p.n] = nil
	if p.n == 0 {
		s.unlink(p)
		return
	}
	// An inner root keeps at least two kids: collapse chains of one.
	for r := s.root; !r.leaf && r.n == 1; r = s.root {
		s.root = r.kids[0]
		s.root.parent = nil
		s.freeNode(r)
	}
}

// lowerBound returns the first block whose key is not less than k.
func (s *blockSet) lowerBound(k blockKey) *Block {
	leaf := s.leafFor(k)
	if leaf == nil {
		return nil
	}
	if i := leaf.pos(k); i < leaf.n {
		return leaf.blocks[i]
	}
	if leaf.next != nil {
		return leaf.next.blocks[0]
	}
	return nil
}

// next returns the block after b in set order.
func (s *blockSet) next(b *Block) *Block {
	leaf := b.leaf
	i := leaf.pos(b.k)
	for leaf.blocks[i] != b {
		i++
	}
	if i+1 < leaf.n {
		return leaf.blocks[i+1]
	}
	if leaf.next != nil {
		return leaf.next.blocks[0]
	}
	return nil
}

// before returns the last block whose key is less than k.
func (s *blockSet) before(k blockKey) *Block {
	leaf := s.leafFor(k)
	if leaf == nil {
		return nil
	}
	if i := leaf.pos(k); i > 0 {
		return leaf.blocks[i-1]
	}
	if leaf.prev != nil {
		return leaf.prev.blocks[leaf.prev.n-1]
	}
	return nil
}

// all returns the blocks in set order (for the rare whole-pool walks).
func (s *blockSet) all() []*Block {
	out := make([]*Block, 0, s.len)
	n := s.root
	for n != nil && !n.leaf {
		n = n.kids[0]
	}
	for ; n != nil; n = n.next {
		out = append(out, n.blocks[:n.n]...)
	}
	return out
}
