package gpu

import "errors"

// ErrOutOfMemory is returned (possibly wrapped) by a Device when the driver
// has no memory left for a request; the caching allocator treats it as the
// signal to free cached memory and retry, every other error is fatal.
var ErrOutOfMemory = errors.New("out of memory")

// Fence marks a point in a stream's work (a CUDA event on a real device).
type Fence uint64

// Device is what the caching allocator needs from a GPU: plain allocations,
// the virtual-memory calls expandable segments use, and stream fences for
// cross-stream frees. Implementations: gpu/sim (simulated) and gpu/cuda.
type Device interface {
	// Name is the device's marketing name, e.g. "NVIDIA H200" or "sim".
	Name() string
	// Ordinal is the device index (the "GPU 0" of OOM messages).
	Ordinal() int
	// MemInfo reports free and total bytes, as cudaMemGetInfo does.
	MemInfo() (free, total uint64, err error)

	// Malloc returns the address of size new bytes (cudaMalloc).
	Malloc(size uint64) (uint64, error)
	// Free releases an address returned by Malloc (cudaFree).
	Free(addr uint64) error

	// Reserve reserves size bytes of virtual address space (cuMemAddressReserve).
	Reserve(size uint64) (uint64, error)
	// Unreserve gives a reservation back (cuMemAddressFree).
	Unreserve(addr, size uint64) error
	// Map backs [addr, addr+size) with new physical memory, one allocation
	// of page bytes per page (cuMemCreate and cuMemMap each, then one
	// cuMemSetAccess over the range), as PyTorch backs an expandable
	// segment's pages. size is a multiple of page, page of the device's
	// granularity. ErrOutOfMemory when the physical memory is not there; on
	// any failure nothing of the range stays mapped.
	Map(addr, size, page uint64) error
	// Unmap releases the physical memory behind [addr, addr+size), whole
	// pages mapped by Map (cuMemUnmap and cuMemRelease each).
	Unmap(addr, size uint64) error

	// RecordFence marks the current end of stream's work.
	RecordFence(stream int64) (Fence, error)
	// FenceDone reports whether the work before f has finished.
	FenceDone(f Fence) (bool, error)
	// WaitFence blocks until the work before f has finished.
	WaitFence(f Fence) error
	// Synchronize waits for all work on the device.
	Synchronize() error
}
