package store

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"vramscope/gpu"
)

// liveEntry is one allocation in the stack.
type liveEntry struct {
	seq       int64
	addr      uint64
	size      uint64
	requested uint64
	// freed is the event that ended it (alive: math.MaxInt64). A freed
	// entry stays in the list until the samples that may still show it
	// are taken (see liveSet.visible).
	freed int64
	stack gpu.StackID
	band  int32 // index in bandLayout.bands, -1 for none
	group int32 // its fold group, -1 until first needed
}

// alive is liveEntry.freed of an allocation not freed.
const alive = math.MaxInt64

// visible says whether e was live right after event p: made by then and
// not freed yet. Events are applied in order, so after the events of a
// column the list can still show any instant of it.
func (e *liveEntry) visible(p int64) bool { return e.seq <= p && e.freed > p }

// liveSet is the allocations in stacking order (allocation order), the
// freed ones kept until compact, with the live ones' index by address.
type liveSet struct {
	list []liveEntry
	at   addrIndex // built when first needed: a checkpoint sample may need none
	dead int       // freed entries in list
	// buffers reused by fromCheckpoint
	spare []liveEntry
	keys  []uint64
}

// apply moves the set past one event.
func (s *liveSet) apply(e *gpu.Event, ends bool) {
	if s.at.slots == nil {
		s.index()
	}
	switch {
	case e.Action == gpu.ActionAlloc:
		s.at.put(e.Addr, int32(len(s.list)))
		s.list = append(s.list, liveEntry{seq: e.Seq, addr: e.Addr, size: e.BlockSize, requested: e.Size, freed: alive, stack: e.Stack, band: -1, group: -1})
	case endsAllocation(e, ends):
		if i, ok := s.at.take(e.Addr); ok {
			s.list[i].freed = e.Seq
			s.dead++
		}
	}
}

// index builds the index by address of the live entries.
func (s *liveSet) index() {
	s.at.reset(len(s.list))
	for i := range s.list {
		if s.list[i].freed == alive {
			s.at.put(s.list[i].addr, int32(i))
		}
	}
}

// compact drops the freed entries when they are many: only once no sample
// still to come can show them (every event applied is before its instant).
func (s *liveSet) compact() {
	if s.dead <= 64 || s.dead <= len(s.list)/2 {
		return
	}
	kept := s.list[:0]
	for _, e := range s.list {
		if e.freed == alive {
			kept = append(kept, e)
		}
	}
	s.list, s.dead = kept, 0
	s.index()
}

// fromCheckpoint replaces the set with the allocated blocks of a stored
// layout (see appendLayout), read without building the layout.
func (s *liveSet) fromCheckpoint(data []byte) error {
	s.list, s.dead = s.list[:0], 0
	s.at.slots = nil
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
			b := liveEntry{addr: at, size: d.uvarint(), freed: alive, band: -1, group: -1}
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

// addrIndex maps the addresses of live allocations to their places in
// the list: open addressing with linear probing, which costs a third of
// a Go map's time on the sweep's every alloc and free.
type addrIndex struct {
	slots []addrSlot // a power of two of them, at most half full
	n     int
}

type addrSlot struct {
	addr uint64
	i    int32 // the entry's index + 1; 0: empty
}

// reset empties the index, sized for about n addresses.
func (x *addrIndex) reset(n int) {
	size := 64
	for size < 4*n {
		size *= 2
	}
	if cap(x.slots) >= size && cap(x.slots) <= 4*size {
		x.slots = x.slots[:cap(x.slots)]
		clear(x.slots)
	} else {
		x.slots = make([]addrSlot, size)
	}
	x.n = 0
}

func (x *addrIndex) home(addr uint64) int {
	return int((addr * 0x9e3779b97f4a7c15) >> 32 & uint64(len(x.slots)-1))
}

// put maps addr to i, replacing what it mapped to.
func (x *addrIndex) put(addr uint64, i int32) {
	if 2*(x.n+1) > len(x.slots) {
		x.grow()
	}
	mask := len(x.slots) - 1
	for j := x.home(addr); ; j = (j + 1) & mask {
		s := &x.slots[j]
		if s.i == 0 {
			*s = addrSlot{addr, i + 1}
			x.n++
			return
		}
		if s.addr == addr {
			s.i = i + 1
			return
		}
	}
}

// take removes addr, returning what it mapped to.
func (x *addrIndex) take(addr uint64) (int32, bool) {
	mask := len(x.slots) - 1
	j := x.home(addr)
	for ; x.slots[j].addr != addr || x.slots[j].i == 0; j = (j + 1) & mask {
		if x.slots[j].i == 0 {
			return 0, false
		}
	}
	i := x.slots[j].i - 1
	// Move back the slots after it that would no longer be found.
	for k := (j + 1) & mask; x.slots[k].i != 0; k = (k + 1) & mask {
		h := x.home(x.slots[k].addr)
		if (k-h)&mask >= (k-j)&mask {
			x.slots[j] = x.slots[k]
			j = k
		}
	}
	x.slots[j] = addrSlot{}
	x.n--
	return i, true
}

func (x *addrIndex) grow() {
	old := x.slots
	x.slots = make([]addrSlot, 2*len(old))
	x.n = 0
	for _, s := range old {
		if s.i != 0 {
			x.put(s.addr, s.i-1)
		}
	}
}
