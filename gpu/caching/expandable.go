package caching

import (
	"errors"

	"vramscope/gpu"
)

// Expandable segments (PyTorch's Note [Expandable Segments]): one large
// reservation of address space per (pool, stream), backed page by page with
// physical memory as requests need it, so freed neighbours merge across what
// would otherwise be separate segments.

// findExpandableBlock is find_expandable_block: the lowest unmapped block on
// this stream (or the free block right before it) whose free-plus-unmapped
// run reaches size, else a fresh reservation.
func (a *Allocator) findExpandableBlock(pool *blockPool, stream int64, size uint64) (*Block, error) {
	allocatable := func(b *Block) bool {
		return b != nil && !b.allocated && b.eventCount == 0 && len(b.streamUses) == 0
	}
	hasRoom := func(b *Block) bool {
		var n uint64
		for n < size && allocatable(b) {
			n += b.size
			b = b.next
		}
		return n >= size
	}
	for c := pool.unmapped.lowerBound(blockKey{uint64(stream), 0, 0}); c != nil && c.stream == stream; c = pool.unmapped.next(c) {
		cand := c
		if allocatable(cand.prev) {
			cand = cand.prev
		}
		if hasRoom(cand) {
			return cand, nil
		}
	}
	page := uint64(gpu.LargeBuffer)
	if pool.small {
		page = gpu.SmallBuffer
	}
	// Reserve 1 1/8 of the device's memory, as PyTorch does, so pages can be
	// unmapped early in the range and mapped again at its end.
	space := a.total + a.total/8
	pages := (space + page - 1) / page
	base, err := a.dev.Reserve(pages * page)
	if err != nil {
		return nil, err
	}
	r := &region{base: base, size: pages * page, stream: stream, pool: pool, expandable: true,
		pageSize: page}
	a.regions[base] = r
	b := a.newBlock(stream, r.size, pool, base, r)
	b.mapped = false
	r.first = b
	pool.unmapped.insert(b)
	return b, nil
}

// mapRange is ExpandableSegment::map: back the pages covering
// [addr, addr+size) with memory, one physical allocation per page and one
// device call for the range, as PyTorch does. It returns the mapped range;
// size 0 when the device is out of memory (the device then maps nothing).
func (a *Allocator) mapRange(r *region, addr, size uint64) (uint64, uint64, error) {
	begin := (addr - r.base) / r.pageSize
	end := (addr + size - r.base + r.pageSize - 1) / r.pageSize
	start := r.base + begin*r.pageSize
	if err := a.dev.Map(start, (end-begin)*r.pageSize, r.pageSize); err != nil {
		if errors.Is(err, gpu.ErrOutOfMemory) {
			return start, 0, nil
		}
		return 0, 0, err
	}
	return start, (end - begin) * r.pageSize, nil
}

// unmapRange is ExpandableSegment::unmap: release the whole pages strictly
// inside [addr, addr+size).
func (a *Allocator) unmapRange(r *region, addr, size uint64) (uint64, uint64, error) {
	begin := (addr - r.base + r.pageSize - 1) / r.pageSize
	end := (addr + size - r.base) / r.pageSize
	if begin >= end {
		return addr, 0, nil
	}
	if err := a.dev.Synchronize(); err != nil {
		return 0, 0, err
	}
	start := r.base + begin*r.pageSize
	if err := a.dev.Unmap(start, (end-begin)*r.pageSize); err != nil {
		return 0, 0, err
	}
	return start, (end - begin) * r.pageSize, nil
}

// mapBlock is map_block: map the front size bytes of the unmapped block b and
// merge them with free neighbours.
func (a *Allocator) mapBlock(b *Block, size uint64) (bool, error) {
	addr, mapped, err := a.mapRange(b.region, b.addr, size)
	if err != nil || mapped == 0 {
		return false, err
	}
	pool := b.pool
	pool.unmapped.remove(b)
	b.mapped = true
	if mapped < b.size {
		rest := a.newBlock(b.stream, b.size-mapped, pool, b.addr+mapped, b.region)
		rest.mapped = false
		rest.prev, rest.next = b, b.next
		if b.next != nil {
			b.next.prev = rest
		}
		b.next = rest
		pool.unmapped.insert(rest)
		b.size = mapped
	}
	a.tryMerge(b, b.prev)
	a.tryMerge(b, b.next)
	a.insertFree(pool, b)
	a.totalAllocated += mapped
	a.stats.ReservedBytes.increase(pool.statIndex(), int64(mapped))
	a.stats.NumDeviceAlloc++
	a.emit(gpu.ActionSegmentMap, addr, mapped, b.stream, 0, pool.kind(), a.stack)
	return true, nil
}

// tryAllocateExpandableBlock is try_allocate_expandable_block: map pages
// until one free block of at least size bytes exists, and take it out of the
// pool. nil without error when the device is out of memory.
func (a *Allocator) tryAllocateExpandableBlock(pool *blockPool, stream int64, size uint64) (*Block, error) {
	c, err := a.findExpandableBlock(pool, stream, size)
	if err != nil {
		return nil, err
	}
	if !c.mapped {
		ok, err := a.mapBlock(c, min(c.size, size))
		if err != nil || !ok {
			return nil, err
		}
	}
	for c.size < size {
		next := c.next
		ok, err := a.mapBlock(next, min(size-c.size, next.size))
		if err != nil || !ok {
			return nil, err
		}
		c = next
	}
	pool.blocks.remove(c)
	return c, nil
}

// unmapBlock is unmap_block: give the whole free pages inside b back to the
// device; partial pages at either end stay as small free blocks.
func (a *Allocator) unmapBlock(b *Block) error {
	addr, size, err := a.unmapRange(b.region, b.addr, b.size)
	if err != nil || size == 0 {
		return err
	}
	pool := b.pool
	pool.blocks.remove(b)
	if before := addr - b.addr; before > 0 {
		f := a.newBlock(b.stream, before, pool, b.addr, b.region)
		f.prev, f.next = b.prev, b
		if b.prev != nil {
			b.prev.next = f
		}
		b.prev = f
		fixHead(f)
		a.insertFree(pool, f)
	}
	if after := b.addr + b.size - (addr + size); after > 0 {
		f := a.newBlock(b.stream, after, pool, addr+size, b.region)
		f.prev, f.next = b, b.next
		if b.next != nil {
			b.next.prev = f
		}
		b.next = f
		a.insertFree(pool, f)
	}
	b.addr, b.size, b.mapped = addr, size, false
	a.tryMerge(b, b.prev)
	a.tryMerge(b, b.next)
	pool.unmapped.insert(b)
	a.totalAllocated -= size
	a.stats.ReservedBytes.decrease(pool.statIndex(), int64(size))
	a.stats.NumDeviceFree++
	a.emit(gpu.ActionSegmentUnmap, addr, size, b.stream, 0, pool.kind(), a.stack)
	return nil
}

// releaseExpandableSegment frees a reservation whose pages are all unmapped.
func (a *Allocator) releaseExpandableSegment(b *Block) error {
	r := b.region
	b.pool.unmapped.remove(b)
	delete(a.regions, r.base)
	a.recycle(b)
	return a.dev.Unreserve(r.base, r.size)
}
