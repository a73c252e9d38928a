// Package caching is a Go re-implementation of PyTorch's CUDA caching
// allocator (c10/cuda/CUDACachingAllocator.cpp): the same requests end with
// the same segments, blocks, statistics and OOM decisions. Comments name the
// PyTorch function each piece mirrors; the behaviour is specified in
// spec/allocator.md.
package caching

import (
	"errors"
	"fmt"
	"sort"

	"vramscope/gpu"
)

// Block is a piece of a segment (PyTorch's struct Block).
type Block struct {
	// The fields the best-fit search reads come first, to share cache lines.
	k         blockKey // the set's key, fixed while in a set (see blockSet)
	leaf      *bnode   // the set's leaf that holds the block
	inSet     *blockSet
	stream    int64
	size      uint64
	addr      uint64
	allocated bool
	mapped    bool

	requested   uint64
	pool        *blockPool
	region      *region
	prev, next  *Block
	eventCount  int
	streamUses  []int64
	gcCountBase uint64
	stack       gpu.StackID
	seq         int64
}

func (b *Block) isSplit() bool { return b.prev != nil || b.next != nil }

// region is what the driver handed out: one cudaMalloc segment, or one
// expandable segment's whole reserved address range.
type region struct {
	base, size uint64
	stream     int64
	pool       *blockPool
	first      *Block
	expandable bool
	pageSize   uint64 // an expandable region's page: what one physical allocation backs
}

type blockPool struct {
	blocks   blockSet // free mapped blocks by (stream, size, addr)
	unmapped blockSet // unmapped expandable blocks by (stream, addr)
	small    bool
	// private is the pool of a graph capture or MemPool that owns this
	// one (zero: the default pools).
	private PoolID
	// getFreeBlocksCallCount is the GC's age clock.
	getFreeBlocksCallCount uint64
}

func (p *blockPool) statIndex() int {
	if p.small {
		return statSmall
	}
	return statLarge
}

func (p *blockPool) kind() gpu.Pool {
	if p.small {
		return gpu.PoolSmall
	}
	return gpu.PoolLarge
}

// PoolID names a private pool as PyTorch does (segment_pool_id): a CUDA
// graph capture's or a torch.cuda.MemPool's; the zero value is the
// default pools.
type PoolID [2]int64

// privatePool is PyTorch's PrivatePool: a small and a large pool of
// their own, whose segments serve only the requests routed to them and
// are never released by empty_cache (only with the pool, which a replay
// does not see).
type privatePool struct{ small, large blockPool }

type pendingFree struct {
	block *Block
	fence gpu.Fence
}

// Allocator is one device's caching allocator (DeviceCachingAllocator).
// It is not safe for concurrent use.
type Allocator struct {
	dev   gpu.Device
	cfg   Config
	small blockPool
	large blockPool
	// private are the pools of graph captures and MemPools, by id.
	private map[PoolID]*privatePool

	live    ptrMap        // allocated blocks by address
	pending []pendingFree // cross-stream frees waiting for fences, in order
	regions map[uint64]*region
	stats   Stats

	totalAllocated uint64 // bytes held from the driver (segments and mapped pages)
	allowedMax     uint64
	setFraction    bool
	total          uint64

	sink  gpu.Sink
	batch []gpu.Event
	seq   int64
	now   func() int64
	stack gpu.StackID // the stack of the call being served

	spare []*Block // recycled Block structs: the hot path allocates none
}

// Option configures an Allocator.
type Option func(*Allocator)

// WithSink sends every event to s, in batches.
func WithSink(s gpu.Sink) Option { return func(a *Allocator) { a.sink = s } }

// WithClock stamps events with now() microseconds.
func WithClock(now func() int64) Option { return func(a *Allocator) { a.now = now } }

// New returns an allocator for dev with cfg.
func New(dev gpu.Device, cfg Config, opts ...Option) (*Allocator, error) {
	if cfg.MaxSplitSize == 0 {
		cfg.MaxSplitSize = gpu.Unlimited
	}
	if cfg.MaxNonSplitRounding == 0 {
		cfg.MaxNonSplitRounding = gpu.LargeBuffer
	}
	a := &Allocator{
		dev:     dev,
		cfg:     cfg,
		regions: make(map[uint64]*region),
	}
	a.small = blockPool{blocks: blockSet{bySize: true}, small: true}
	a.large = blockPool{blocks: blockSet{bySize: true}}
	a.stats.MaxSplitSize = -1
	if cfg.MaxSplitSize != gpu.Unlimited {
		a.stats.MaxSplitSize = int64(cfg.MaxSplitSize)
	}
	for _, o := range opts {
		o(a)
	}
	if a.sink != nil {
		a.batch = make([]gpu.Event, 0, 4096)
	}
	_, total, err := dev.MemInfo()
	if err != nil {
		return nil, err
	}
	a.total = total
	if cfg.MemoryFraction > 0 {
		a.SetMemoryFraction(cfg.MemoryFraction)
	}
	if cfg.Limit > 0 {
		a.allowedMax, a.setFraction = cfg.Limit, true
	}
	return a, nil
}

// Config returns the allocator's settings.
func (a *Allocator) Config() Config { return a.cfg }

// Device returns the device the allocator draws from.
func (a *Allocator) Device() gpu.Device { return a.dev }

// SetMemoryFraction is set_per_process_memory_fraction.
func (a *Allocator) SetMemoryFraction(f float64) {
	a.allowedMax = uint64(f * float64(a.total))
	a.setFraction = true
}

// Stats returns a copy of the statistics.
func (a *Allocator) Stats() Stats { return a.stats }

// ResetPeakStats is torch.cuda.reset_peak_memory_stats(): every peak
// becomes its current value.
func (a *Allocator) ResetPeakStats() { a.stats.resetPeaks() }

// ResetAccumulatedStats is torch.cuda.reset_accumulated_memory_stats():
// the cumulative counts start again from zero.
func (a *Allocator) ResetAccumulatedStats() { a.stats.resetAccumulated() }

// Reserved is reserved_bytes.all.current; Allocated is allocated_bytes.all.current.
func (a *Allocator) Reserved() uint64  { return uint64(a.stats.ReservedBytes[statAll].Current) }
func (a *Allocator) Allocated() uint64 { return uint64(a.stats.AllocatedBytes[statAll].Current) }

// Seq is the number of events emitted so far.
func (a *Allocator) Seq() int64 { return a.seq }

// Flush hands buffered events to the sink.
func (a *Allocator) Flush() {
	if a.sink != nil && len(a.batch) > 0 {
		a.sink.Emit(a.batch)
		a.batch = a.batch[:0]
	}
}

// Now is the time events are stamped with at this moment (0 without a
// clock).
func (a *Allocator) Now() int64 {
	if a.now == nil {
		return 0
	}
	return a.now()
}

func (a *Allocator) emit(action gpu.Action, addr, size uint64, stream int64, blockSize uint64, pool gpu.Pool, stack gpu.StackID) {
	if a.sink == nil {
		a.seq++
		return
	}
	e := gpu.Event{Seq: a.seq, TimeUS: a.Now(), Action: action, Stream: stream, Addr: addr, Size: size,
		BlockSize: blockSize, Pool: pool, Stack: stack}
	if action == gpu.ActionOOM {
		e.Addr, e.DeviceFree = 0, addr
	}
	a.seq++
	a.batch = append(a.batch, e)
	if len(a.batch) == cap(a.batch) {
		a.Flush()
	}
}

func (a *Allocator) newBlock(stream int64, size uint64, pool *blockPool, addr uint64, r *region) *Block {
	var b *Block
	if n := len(a.spare); n > 0 {
		b = a.spare[n-1]
		a.spare = a.spare[:n-1]
		*b = Block{}
	} else {
		b = &Block{}
	}
	b.stream, b.size, b.pool, b.addr, b.region, b.mapped, b.seq = stream, size, pool, addr, r, true, -1
	return b
}

func (a *Allocator) recycle(b *Block) {
	*b = Block{}
	a.spare = append(a.spare, b)
}

// fixHead keeps region.first pointing at the region's first block.
func fixHead(b *Block) {
	if b.prev == nil {
		b.region.first = b
	}
}

// OutOfMemoryError is torch.OutOfMemoryError: the message is PyTorch's, and
// the figures behind it are kept for the incident page.
type OutOfMemoryError struct {
	Device     int
	Requested  uint64 // the caller's bytes
	Rounded    uint64 // round_size(Requested)
	AllocSize  uint64 // the segment size the allocator tried to get ("Tried to allocate")
	Total      uint64 // device capacity
	DeviceFree uint64 // free bytes the driver reported
	Allowed    uint64 // memory fraction cap, 0 when none
	Allocated  uint64 // allocated_bytes.all.current
	Reserved   uint64 // reserved_bytes.all.current
	Stream     int64
	Message    string
}

func (e *OutOfMemoryError) Error() string { return e.Message }

// Is lets errors.Is(err, gpu.ErrOutOfMemory) match.
func (e *OutOfMemoryError) Is(target error) bool { return target == gpu.ErrOutOfMemory }

// OOMMessageSuffix is the end of the OOM message; PyTorch's wording of it
// changed over versions (spec §8), so it can be swapped.
var OOMMessageSuffix = " If reserved but unallocated memory is large try setting" +
	" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid" +
	" fragmentation.  See documentation for Memory Management " +
	" (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"

const maxRequest = 1 << 60 // 1 EiB

// Malloc allocates size bytes on stream (DeviceCachingAllocator::malloc).
// stack is stamped on the events this call emits.
func (a *Allocator) Malloc(size uint64, stream int64, stack gpu.StackID) (uint64, error) {
	return a.MallocIn(PoolID{}, size, stream, stack)
}

// MallocIn is Malloc into private pool id (the zero id: the default
// pools), as PyTorch routes the requests of a graph capture's stream or
// of a MemPool's context: the pool's own blocks serve it, and a new
// segment it needs is the pool's (always cudaMalloc'd: private pools do
// not use expandable segments).
func (a *Allocator) MallocIn(id PoolID, size uint64, stream int64, stack gpu.StackID) (uint64, error) {
	if size == 0 {
		return 0, nil
	}
	if size >= maxRequest {
		return 0, &OutOfMemoryError{Device: a.dev.Ordinal(), Requested: size, Message: "CUDA out of memory. Tried to allocate more than 1EB memory."}
	}
	a.stack = stack
	if err := a.processEvents(); err != nil {
		return 0, err
	}
	rounded := a.cfg.RoundSize(size)
	pool := a.poolFor(id, rounded)
	allocSize := gpu.AllocationSize(rounded)

	b := a.getFreeBlock(pool, stream, rounded)
	if b == nil {
		if a.setFraction && a.cfg.GarbageCollectionThreshold > 0 {
			if err := a.garbageCollect(); err != nil {
				return 0, err
			}
		}
		var err error
		if b, err = a.allocBlock(pool, stream, rounded, allocSize, false); err != nil {
			return 0, err
		}
		if b == nil {
			released, err := a.releaseAvailableCachedBlocks(pool, stream, rounded)
			if err != nil {
				return 0, err
			}
			if released {
				if b, err = a.allocBlock(pool, stream, rounded, allocSize, false); err != nil {
					return 0, err
				}
			}
		}
		if b == nil {
			if err := a.releaseCachedBlocks(); err != nil {
				return 0, err
			}
			if b, err = a.allocBlock(pool, stream, rounded, allocSize, true); err != nil {
				return 0, err
			}
		}
	}
	if b == nil {
		return 0, a.oom(size, rounded, allocSize, stream)
	}
	rules := a.cfg.Rules
	split := rules.ShouldSplit(pool.kind(), b.size, rounded)
	return a.allocFoundBlock(b, pool, rounded, size, split), nil
}

// poolFor is get_pool: the block pool of private pool id (created on
// first use) or the default one, small or large by the rounded size.
func (a *Allocator) poolFor(id PoolID, rounded uint64) *blockPool {
	small := rounded <= gpu.SmallSize
	if id == (PoolID{}) {
		if small {
			return &a.small
		}
		return &a.large
	}
	p := a.private[id]
	if p == nil {
		if a.private == nil {
			a.private = map[PoolID]*privatePool{}
		}
		p = &privatePool{
			small: blockPool{blocks: blockSet{bySize: true}, small: true, private: id},
			large: blockPool{blocks: blockSet{bySize: true}, private: id},
		}
		a.private[id] = p
	}
	if small {
		return &p.small
	}
	return &p.large
}

func (a *Allocator) oom(size, rounded, allocSize uint64, stream int64) error {
	free, total, err := a.dev.MemInfo()
	if err != nil {
		return err
	}
	e := &OutOfMemoryError{Device: a.dev.Ordinal(), Requested: size, Rounded: rounded, AllocSize: allocSize,
		Total: total, DeviceFree: free, Allocated: a.Allocated(), Reserved: a.Reserved(), Stream: stream}
	allowed := ""
	if a.setFraction {
		e.Allowed = a.allowedMax
		allowed = FormatSize(a.allowedMax) + " allowed; "
	}
	a.emit(gpu.ActionOOM, free, rounded, stream, 0, gpu.PoolUnknown, a.stack)
	a.stats.NumOOMs++
	e.Message = "CUDA out of memory. Tried to allocate " + FormatSize(allocSize) + ". GPU " + fmt.Sprint(e.Device) +
		" has a total capacity of " + FormatSize(total) + " of which " + FormatSize(free) + " is free. " +
		allowed + "Of the allocated memory " + FormatSize(e.Allocated) + " is allocated by PyTorch, and " +
		FormatSize(e.Reserved-e.Allocated) + " is reserved by PyTorch but unallocated." + OOMMessageSuffix
	a.Flush()
	return e
}

// getFreeBlock is get_free_block: best fit by (stream, size, address).
func (a *Allocator) getFreeBlock(pool *blockPool, stream int64, size uint64) *Block {
	if a.setFraction && a.cfg.GarbageCollectionThreshold > 0 {
		pool.getFreeBlocksCallCount++
	}
	b := pool.blocks.lowerBound(blockKey{uint64(stream), size, 0})
	if b == nil || b.stream != stream {
		return nil
	}
	if b.region.expandable {
		if a.cfg.Expandable {
			// Best fit counts an expandable block as the size it can grow to,
			// so blocks that cannot grow are preferred over the tail.
			expandableSize := func(b *Block) uint64 {
				if b.next != nil && !b.next.mapped {
					return b.size + b.next.size
				}
				return b.size
			}
			for b.region.expandable {
				n := pool.blocks.next(b)
				if n == nil || n.stream != stream || expandableSize(n) >= expandableSize(b) {
					break
				}
				b = n
			}
		} else {
			for b != nil && b.region.expandable {
				b = pool.blocks.next(b)
			}
			if b == nil || b.stream != stream {
				return nil
			}
		}
	}
	maxSplit := a.cfg.MaxSplitSize
	if size < maxSplit && b.size >= maxSplit {
		return nil
	}
	if size >= maxSplit && b.size >= size+a.cfg.MaxNonSplitRounding {
		return nil
	}
	pool.blocks.remove(b)
	return b
}

// allocBlock is alloc_block: new memory from the driver. It returns nil
// without error when the driver is out of memory.
func (a *Allocator) allocBlock(pool *blockPool, stream int64, rounded, allocSize uint64, isRetry bool) (*Block, error) {
	if isRetry {
		a.stats.NumAllocRetries++
	}
	if a.setFraction && a.totalAllocated+allocSize > a.allowedMax {
		return nil, nil
	}
	if a.cfg.Expandable && pool.private == (PoolID{}) {
		return a.tryAllocateExpandableBlock(pool, stream, rounded)
	}
	addr, err := a.dev.Malloc(allocSize)
	if errors.Is(err, gpu.ErrOutOfMemory) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r := &region{base: addr, size: allocSize, stream: stream, pool: pool}
	a.regions[addr] = r
	b := a.newBlock(stream, allocSize, pool, addr, r)
	r.first = b
	a.totalAllocated += allocSize
	si := pool.statIndex()
	a.stats.Segment.increase(si, 1)
	a.stats.ReservedBytes.increase(si, int64(allocSize))
	if allocSize >= a.cfg.MaxSplitSize {
		a.stats.OversizeSegments.increase(1)
	}
	a.stats.NumDeviceAlloc++
	a.emit(gpu.ActionSegmentAlloc, addr, allocSize, stream, 0, pool.kind(), a.stack)
	return b, nil
}

// allocFoundBlock is alloc_found_block: hand out the front of b.
func (a *Allocator) allocFoundBlock(b *Block, pool *blockPool, size, orig uint64, split bool) uint64 {
	si := pool.statIndex()
	alreadySplit := b.isSplit()
	expandable := b.region.expandable
	if split {
		remaining := b
		b = a.newBlock(remaining.stream, size, pool, remaining.addr, remaining.region)
		b.prev = remaining.prev
		if b.prev != nil {
			b.prev.next = b
		}
		b.next = remaining
		remaining.prev = b
		fixHead(b)
		remaining.addr += size
		remaining.size -= size
		a.insertFree(pool, remaining)
		if !expandable {
			if alreadySplit {
				a.stats.InactiveSplitBytes.decrease(si, int64(b.size))
			} else {
				a.stats.InactiveSplitBytes.increase(si, int64(remaining.size))
				a.stats.InactiveSplit.increase(si, 1)
			}
		}
	} else if alreadySplit && !expandable {
		a.stats.InactiveSplitBytes.decrease(si, int64(b.size))
		a.stats.InactiveSplit.decrease(si, 1)
	}
	b.allocated = true
	b.requested = orig
	b.stack = a.stack
	b.seq = a.seq
	a.emit(gpu.ActionAlloc, b.addr, orig, b.stream, b.size, pool.kind(), a.stack)
	a.live.put(b.addr, b)
	a.stats.Allocation.increase(si, 1)
	a.stats.AllocatedBytes.increase(si, int64(b.size))
	a.stats.Active.increase(si, 1)
	a.stats.ActiveBytes.increase(si, int64(b.size))
	a.stats.RequestedBytes.increase(si, int64(orig))
	if b.size >= a.cfg.MaxSplitSize {
		a.stats.OversizeAllocations.increase(1)
	}
	return b.addr
}

func (a *Allocator) insertFree(pool *blockPool, b *Block) {
	b.gcCountBase = pool.getFreeBlocksCallCount
	pool.blocks.insert(b)
}

// RecordStream is recordStream: the block at addr is also used on stream,
// so its memory must not be reused before that stream's work is done.
func (a *Allocator) RecordStream(addr uint64, stream int64) error {
	b := a.live.get(addr)
	if b == nil {
		return fmt.Errorf("record_stream: no allocation at %#x", addr)
	}
	if stream == b.stream {
		return nil
	}
	for _, s := range b.streamUses {
		if s == stream {
			return nil
		}
	}
	b.streamUses = append(b.streamUses, stream)
	return nil
}

// Free releases the allocation at addr (DeviceCachingAllocator::free)
// from no known stack: its events carry the allocation's, as PyTorch's do
// when it gathers no context.
func (a *Allocator) Free(addr uint64) error { return a.free(addr, 0, false) }

// FreeFrom is Free called from stack (0: a call with no frames, such as a
// free on the autograd thread): as PyTorch stamps a free's trace entries
// with the context of the free call, free_requested carries stack, and so
// does free_completed when the block goes back at once; a completion that
// waits for other streams carries the stack of the call that completes it
// (a later malloc's, or an empty_cache's).
func (a *Allocator) FreeFrom(addr uint64, stack gpu.StackID) error { return a.free(addr, stack, true) }

func (a *Allocator) free(addr uint64, stack gpu.StackID, exact bool) error {
	if addr == 0 {
		return nil // freeing the null pointer of a zero-byte malloc does nothing
	}
	b := a.live.get(addr)
	if b == nil {
		return fmt.Errorf("invalid device pointer: %#x", addr)
	}
	a.live.del(addr)
	b.allocated = false
	si := b.pool.statIndex()
	a.stats.Allocation.decrease(si, 1)
	a.stats.AllocatedBytes.decrease(si, int64(b.size))
	if !exact {
		stack = b.stack
	}
	a.emit(gpu.ActionFreeRequested, b.addr, b.requested, b.stream, b.size, b.pool.kind(), stack)
	if b.size >= a.cfg.MaxSplitSize {
		a.stats.OversizeAllocations.decrease(1)
	}
	if len(b.streamUses) > 0 {
		return a.insertEvents(b)
	}
	a.freeBlock(b, stack)
	return nil
}

// insertEvents is insert_events: one fence per stream that used the block.
func (a *Allocator) insertEvents(b *Block) error {
	uses := b.streamUses
	b.streamUses = nil
	for _, s := range uses {
		f, err := a.dev.RecordFence(s)
		if err != nil {
			return err
		}
		b.eventCount++
		a.pending = append(a.pending, pendingFree{b, f})
	}
	return nil
}

// ProcessEventsFrom is process_events called from stack: the frees
// whose other streams are done go back to their pools now, their
// free_completed carrying stack. Malloc does this first; a replay calls
// it where the recording completed a free.
func (a *Allocator) ProcessEventsFrom(stack gpu.StackID) error {
	a.stack = stack
	return a.processEvents()
}

// processEvents is process_events: complete the frees whose fences are done.
func (a *Allocator) processEvents() error {
	if len(a.pending) == 0 {
		return nil
	}
	kept := a.pending[:0]
	for _, p := range a.pending {
		done, err := a.dev.FenceDone(p.fence)
		if err != nil {
			return err
		}
		if !done {
			kept = append(kept, p)
			continue
		}
		p.block.eventCount--
		if p.block.eventCount == 0 {
			a.freeBlock(p.block, a.stack)
		}
	}
	clear(a.pending[len(kept):])
	a.pending = kept
	return nil
}

// freeBlock is free_block: the block goes back to its pool, merged with free
// neighbours; free_completed carries stack.
func (a *Allocator) freeBlock(b *Block, stack gpu.StackID) {
	a.emit(gpu.ActionFreeCompleted, b.addr, b.requested, b.stream, b.size, b.pool.kind(), stack)
	origSize, requested := b.size, b.requested
	pool := b.pool
	var netCount, netBytes int64
	for _, c := range [2]*Block{b.prev, b.next} {
		if n := a.tryMerge(b, c); n > 0 {
			netCount--
			netBytes -= int64(n)
		}
	}
	b.requested = 0
	b.stack = 0
	b.seq = -1
	a.insertFree(pool, b)
	if b.isSplit() {
		netCount++
		netBytes += int64(b.size)
	}
	si := pool.statIndex()
	if !b.region.expandable {
		if netCount > 0 {
			a.stats.InactiveSplit.increase(si, netCount)
		} else if netCount < 0 {
			a.stats.InactiveSplit.decrease(si, -netCount)
		}
		if netBytes > 0 {
			a.stats.InactiveSplitBytes.increase(si, netBytes)
		} else if netBytes < 0 {
			a.stats.InactiveSplitBytes.decrease(si, -netBytes)
		}
	}
	a.stats.Active.decrease(si, 1)
	a.stats.ActiveBytes.decrease(si, int64(origSize))
	a.stats.RequestedBytes.decrease(si, int64(requested))
}

// tryMerge is try_merge_blocks: dst absorbs its neighbour src when src is
// free, idle and in the same mapped state. It returns the bytes absorbed.
func (a *Allocator) tryMerge(dst, src *Block) uint64 {
	if src == nil || src.allocated || src.eventCount > 0 || len(src.streamUses) > 0 || dst.mapped != src.mapped {
		return 0
	}
	if dst.prev == src {
		dst.addr = src.addr
		dst.prev = src.prev
		if dst.prev != nil {
			dst.prev.next = dst
		}
		fixHead(dst)
	} else {
		dst.next = src.next
		if dst.next != nil {
			dst.next.prev = dst
		}
	}
	n := src.size
	dst.size += n
	if src.mapped {
		src.pool.blocks.remove(src)
	} else {
		src.pool.unmapped.remove(src)
	}
	a.recycle(src)
	return n
}

// releaseBlock is release_block: cudaFree a whole free segment.
func (a *Allocator) releaseBlock(b *Block) error {
	a.emit(gpu.ActionSegmentFree, b.addr, b.size, b.stream, 0, b.pool.kind(), a.stack)
	if err := a.dev.Free(b.addr); err != nil {
		return err
	}
	a.totalAllocated -= b.size
	si := b.pool.statIndex()
	a.stats.Segment.decrease(si, 1)
	a.stats.ReservedBytes.decrease(si, int64(b.size))
	a.stats.NumDeviceFree++
	if b.size >= a.cfg.MaxSplitSize {
		a.stats.OversizeSegments.decrease(1)
	}
	b.pool.blocks.remove(b)
	delete(a.regions, b.region.base)
	a.recycle(b)
	return nil
}

// releaseAvailableCachedBlocks is release_available_cached_blocks: with a
// max_split_size set, free cached oversize segments to make room.
func (a *Allocator) releaseAvailableCachedBlocks(pool *blockPool, stream int64, size uint64) (bool, error) {
	maxSplit := a.cfg.MaxSplitSize
	if maxSplit == gpu.Unlimited {
		return false, nil
	}
	key := max(size, maxSplit)
	// Expandable blocks are not segments of their own: they are skipped
	// here (today's PyTorch does; its 2024 code asserted they never come).
	b := pool.blocks.lowerBound(blockKey{uint64(stream), key, 0})
	if b != nil && b.stream == stream && !b.region.expandable {
		return true, a.releaseBlock(b)
	}
	// No single block is large enough: free oversize blocks from the largest down.
	cur := pool.blocks.before(blockKey{uint64(stream), key, 0})
	var released uint64
	for cur != nil && released < key && cur.size >= maxSplit && cur.stream == stream {
		prev := pool.blocks.before(cur.k)
		if !cur.region.expandable {
			released += cur.size
			if err := a.releaseBlock(cur); err != nil {
				return false, err
			}
		}
		cur = prev
	}
	return released >= key, nil
}

// releaseCachedBlocks is release_cached_blocks (and empty_cache): wait for
// pending frees, then give every fully free segment back to the driver.
func (a *Allocator) releaseCachedBlocks() error {
	if err := a.synchronizeAndFreeEvents(); err != nil {
		return err
	}
	if err := a.releaseBlocks(&a.large); err != nil {
		return err
	}
	return a.releaseBlocks(&a.small)
}

func (a *Allocator) synchronizeAndFreeEvents() error {
	a.stats.NumSyncAllStreams++
	for _, p := range a.pending {
		if err := a.dev.WaitFence(p.fence); err != nil {
			return err
		}
		p.block.eventCount--
		if p.block.eventCount == 0 {
			a.freeBlock(p.block, a.stack)
		}
	}
	clear(a.pending)
	a.pending = a.pending[:0]
	return nil
}

// releaseBlocks is release_blocks: free unsplit segments, unmap the free
// pages of expandable ones.
func (a *Allocator) releaseBlocks(pool *blockPool) error {
	var toUnmap []*Block
	for _, b := range pool.blocks.all() {
		if b.region.expandable {
			toUnmap = append(toUnmap, b)
		} else if b.prev == nil && b.next == nil {
			if err := a.releaseBlock(b); err != nil {
				return err
			}
		}
	}
	for _, b := range toUnmap {
		if err := a.unmapBlock(b); err != nil {
			return err
		}
		if b.prev == nil && b.next == nil {
			if err := a.releaseExpandableSegment(b); err != nil {
				return err
			}
		}
	}
	return nil
}

// EmptyCache is torch.cuda.empty_cache() called with no frames.
func (a *Allocator) EmptyCache() error { return a.EmptyCacheFrom(0) }

// EmptyCacheFrom is EmptyCache called from stack: its segment_free and
// segment_unmap entries carry stack, as PyTorch stamps them with the
// context of the call (those of a malloc that releases cached segments
// carry the malloc's).
func (a *Allocator) EmptyCacheFrom(stack gpu.StackID) error {
	a.stack = stack
	err := a.releaseCachedBlocks()
	a.Flush()
	return err
}

// garbageCollect is garbage_collect_cached_blocks: free the oldest unsplit
// cached large blocks until usage is back under the threshold.
func (a *Allocator) garbageCollect() error {
	threshold := uint64(a.cfg.GarbageCollectionThreshold * float64(a.allowedMax))
	if a.totalAllocated <= threshold {
		return nil
	}
	target := a.totalAllocated - threshold
	pool := &a.large
	age := func(b *Block) uint64 { return pool.getFreeBlocksCallCount - b.gcCountBase }
	var totalAge uint64
	count := 0
	for _, b := range pool.blocks.all() {
		if !b.isSplit() && !b.region.expandable {
			totalAge += age(b)
			count++
		}
	}
	if count == 0 {
		return nil
	}
	var reclaimed uint64
	freed := true
	for reclaimed < target && freed && count > 0 {
		threshold := float64(totalAge) / float64(count)
		freed = false
		for _, b := range pool.blocks.all() {
			if !b.isSplit() && !b.region.expandable && float64(age(b)) >= threshold {
				freed = true
				reclaimed += b.size
				totalAge -= age(b)
				count--
				if err := a.releaseBlock(b); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Live reports the allocation at addr: its size, requested size and stream.
func (a *Allocator) Live(addr uint64) (size, requested uint64, ok bool) {
	b := a.live.get(addr)
	if b == nil {
		return 0, 0, false
	}
	return b.size, b.requested, true
}

// Snapshot returns the segments and blocks (torch.cuda.memory_snapshot()),
// sorted by address; an expandable region gives one segment per mapped run.
func (a *Allocator) Snapshot() []gpu.Segment {
	regions := make([]*region, 0, len(a.regions))
	for _, r := range a.regions {
		regions = append(regions, r)
	}
	sort.Slice(regions, func(i, j int) bool { return regions[i].base < regions[j].base })
	var segs []gpu.Segment
	for _, r := range regions {
		var cur *gpu.Segment
		for b := r.first; b != nil; b = b.next {
			if !b.mapped {
				cur = nil
				continue
			}
			if cur == nil {
				segs = append(segs, gpu.Segment{Addr: b.addr, Stream: r.stream, Pool: r.pool.kind(), Expandable: r.expandable})
				cur = &segs[len(segs)-1]
			}
			st := gpu.BlockFree
			switch {
			case b.allocated:
				st = gpu.BlockAllocated
			case b.eventCount > 0 || len(b.streamUses) > 0:
				st = gpu.BlockPendingFree
			}
			blk := gpu.Block{Addr: b.addr, Size: b.size, State: st, Seq: b.seq, Stack: b.stack}
			if st != gpu.BlockFree {
				blk.Requested = b.requested
			}
			cur.Blocks = append(cur.Blocks, blk)
			cur.Size += b.size
		}
	}
	return segs
}

// SegmentPool is the private pool of the segment at addr (zero: a
// default pool's, or no segment there).
func (a *Allocator) SegmentPool(addr uint64) PoolID {
	if r := a.regions[addr]; r != nil {
		return r.pool.private
	}
	return PoolID{}
}

// Layout returns the snapshot as a gpu.Layout under the allocator's rules.
func (a *Allocator) Layout() *gpu.Layout {
	return &gpu.Layout{Rules: a.cfg.Rules, Segments: a.Snapshot()}
}
