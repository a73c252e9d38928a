package store

import (
	"errors"
	"fmt"
	"slices"

	"vramscope/gpu"
)

// liveEntry is one live allocation in the stack.
type liveEntry struct {
	seq       int64
	addr      uint64
	size      uint64 // 0: freed, waiting for the list to be compacted
	requested uint64
	stack     gpu.StackID
	band      int32 // index in bandLayout.bands, -1 for none
}

// liveSet is the live allocations in stacking order, with their index by
// address (built when first needed: a checkpoint sample may need none).
type liveSet struct {
	list []liveEntry
	at   map[uint64]int32 // nil until built
	dead int
	// buffers reused by fromCheckpoint
	spare []liveEntry
	keys  []uint64
}

func (s *liveSet) add(e liveEntry) {
	s.at[e.addr] = int32(len(s.list))
	s.list = append(s.list, e)
}

// apply moves the set past one event.
func (s *liveSet) apply(e *gpu.Event, ends bool) {
	if s.at == nil {
		s.at = make(map[uint64]int32, len(s.list))
		for i := range s.list {
			if s.list[i].size != 0 {
				s.at[s.list[i].addr] = int32(i)
			}
		}
	}
	switch {
	case e.Action == gpu.ActionAlloc:
		s.add(liveEntry{seq: e.Seq, addr: e.Addr, size: e.BlockSize, requested: e.Size, stack: e.Stack, band: -1})
	case endsAllocation(e, ends):
		i, ok := s.at[e.Addr]
		if !ok {
			return
		}
		delete(s.at, e.Addr)
		s.list[i].size = 0
		if s.dead++; s.dead > 64 && s.dead > len(s.list)/2 {
			s.compact()
		}
	}
}

func (s *liveSet) compact() {
	kept := s.list[:0]
	for _, e := range s.list {
		if e.size != 0 {
			s.at[e.addr] = int32(len(kept))
			kept = append(kept, e)
		}
	}
	s.list, s.dead = kept, 0
}

// fromCheckpoint replaces the set with the allocated blocks of a stored
// layout (see appendLayout), read without building the layout.
func (s *liveSet) fromCheckpoint(data []byte) error {
	s.list, s.dead, s.at = s.list[:0], 0, nil
	d := &decoder{buf: data}
	n := d.uvarint()
	var prevEnd uint64
	for range n {
		addr := prevEnd + d.uvarint()
		size := d.uvarint()
		d.varint() // stream
		if _, ok := d.byte1(); !ok {
			return errors.New("corrupt layout checkpoint")
		}
		nb := d.uvarint()
		at := addr
		for range nb {
			b := liveEntry{addr: at, size: d.uvarint(), band: -1}
			state, ok := d.byte1()
			if !ok || d.err != nil {
				return errors.New("corrupt layout checkpoint")
			}
			b.requested = b.size - uint64(d.varint())
			b.stack = gpu.StackID(d.uvarint())
			b.seq = d.varint()
			at += b.size
			if gpu.BlockState(state) == gpu.BlockAllocated && b.size > 0 {
				s.list = append(s.list, b)
			}
		}
		prevEnd = addr + size
	}
	if d.err != nil {
		return fmt.Errorf("corrupt layout checkpoint: %w", d.err)
	}
	// Stacking order: by seq, those before the trace (seq -1) first in
	// address order, which is the order they were read in. One key per
	// entry, (seq+1) above its index, sorts faster than the entries.
	if len(s.list) >= 1<<idxBits {
		return fmt.Errorf("%d live blocks", len(s.list))
	}
	keys := s.keys[:0]
	for i := range s.list {
		keys = append(keys, uint64(s.list[i].seq+1)<<idxBits|uint64(i))
	}
	slices.Sort(keys)
	sorted := s.spare[:0]
	for _, k := range keys {
		sorted = append(sorted, s.list[k&(1<<idxBits-1)])
	}
	s.list, s.spare, s.keys = sorted, s.list, keys
	return nil
}

// idxBits is the bits of a sort key that hold the entry's index.
const idxBits = 24
