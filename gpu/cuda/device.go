package cuda

/*
#include "cu.h"
*/
import "C"

import (
	"cmp"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"vramscope/gpu"
)

// Device is one GPU through its primary context (the context the CUDA
// runtime and PyTorch share). It is safe for concurrent use; calls are
// serialised by a mutex.
type Device struct {
	mu      sync.Mutex
	ordinal int
	dev     C.CUdevice
	ctx     C.CUcontext // nil once closed
	name    string
	page    uint64             // VMM granularity
	handles map[uint64]mapping // physical allocations by the address they are mapped at
	calls   map[string]*Call   // the driver calls made, by function
	fences  uint64
}

// mapping is one physical allocation (one page of a Map) and its size.
type mapping struct {
	h    C.CUmemGenericAllocationHandle
	size uint64
}

// Call is what the calls of one driver function took.
type Call struct {
	Name  string // e.g. "cuMemCreate"
	Count int
	Time  time.Duration
}

var _ gpu.Device = (*Device)(nil)

var errClosed = errors.New("cuda: device is closed")

// Open retains GPU ordinal's primary context. Close releases it.
func Open(ordinal int) (*Device, error) {
	if err := load(); err != nil {
		return nil, err
	}
	var n C.int
	if err := check("cuDeviceGetCount", C.cu_device_get_count(&n)); err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= int(n) {
		return nil, fmt.Errorf("cuda: no GPU %d (the driver sees %d)", ordinal, int(n))
	}
	d := &Device{ordinal: ordinal, handles: map[uint64]mapping{}, calls: map[string]*Call{}}
	if err := d.call("cuDeviceGet", func() C.CUresult { return C.cu_device_get(&d.dev, C.int(ordinal)) }); err != nil {
		return nil, err
	}
	var name [256]C.char
	if err := d.call("cuDeviceGetName", func() C.CUresult { return C.cu_device_get_name(&name[0], C.int(len(name)), d.dev) }); err != nil {
		return nil, err
	}
	d.name = C.GoString(&name[0])
	if err := d.call("cuDevicePrimaryCtxRetain", func() C.CUresult { return C.cu_primary_ctx_retain(&d.ctx, d.dev) }); err != nil {
		return nil, err
	}
	var page C.size_t
	err := d.do(func() error {
		return d.call("cuMemGetAllocationGranularity", func() C.CUresult { return C.cu_mem_granularity(&page, d.dev) })
	})
	if err != nil {
		d.Close()
		return nil, err
	}
	d.page = uint64(page)
	return d, nil
}

// call makes one driver call, counting and timing it under name, and
// checks its result.
func (d *Device) call(name string, f func() C.CUresult) error {
	start := time.Now()
	r := f()
	c := d.calls[name]
	if c == nil {
		c = &Call{Name: name}
		d.calls[name] = c
	}
	c.Count++
	c.Time += time.Since(start)
	return check(name, r)
}

// Calls returns, per driver function, the calls made since Open or the
// last ResetCalls, the longest total time first.
func (d *Device) Calls() []Call {
	d.mu.Lock()
	defer d.mu.Unlock()
	calls := make([]Call, 0, len(d.calls))
	for _, c := range d.calls {
		calls = append(calls, *c)
	}
	slices.SortFunc(calls, func(a, b Call) int {
		return cmp.Or(cmp.Compare(b.Time, a.Time), cmp.Compare(a.Name, b.Name))
	})
	return calls
}

// ResetCalls forgets the calls made so far.
func (d *Device) ResetCalls() {
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.calls)
}

// do runs f with the device's context current. Contexts are current per OS
// thread, so the goroutine stays on its thread until f returns.
func (d *Device) do(f func() error) error {
	if d.ctx == nil {
		return errClosed
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := d.call("cuCtxSetCurrent", func() C.CUresult { return C.cu_ctx_set_current(d.ctx) }); err != nil {
		return err
	}
	return f()
}

// Close unmaps and releases any pages still mapped, then releases the
// primary context. Allocations and reservations still held are the
// driver's to reclaim when the context goes.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil {
		return nil
	}
	err := d.do(func() error {
		var errs []error
		for p, m := range d.handles {
			errs = append(errs, d.unmap(p, m))
		}
		return errors.Join(errs...)
	})
	d.ctx = nil
	return errors.Join(err, d.call("cuDevicePrimaryCtxRelease_v2", func() C.CUresult { return C.cu_primary_ctx_release(d.dev) }))
}

func (d *Device) Name() string { return d.name }
func (d *Device) Ordinal() int { return d.ordinal }

// PageSize is the VMM granularity: Map's pages are multiples of it.
func (d *Device) PageSize() uint64 { return d.page }

func (d *Device) MemInfo() (free, total uint64, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var f, t C.size_t
	err = d.do(func() error { return d.call("cuMemGetInfo_v2", func() C.CUresult { return C.cu_mem_get_info(&f, &t) }) })
	return uint64(f), uint64(t), err
}

func (d *Device) Malloc(size uint64) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var p C.CUdeviceptr
	err := d.do(func() error {
		return d.call("cuMemAlloc_v2", func() C.CUresult { return C.cu_mem_alloc(&p, C.size_t(size)) })
	})
	if err != nil {
		return 0, fmt.Errorf("malloc of %d bytes: %w", size, err)
	}
	return uint64(p), nil
}

func (d *Device) Free(addr uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.do(func() error {
		return d.call("cuMemFree_v2", func() C.CUresult { return C.cu_mem_free(C.CUdeviceptr(addr)) })
	})
}

// Touch writes zeros over [addr, addr+size) and waits for the write, so the
// memory is really used (resident) and not only reserved.
func (d *Device) Touch(addr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.do(func() error {
		if err := d.call("cuMemsetD8_v2", func() C.CUresult { return C.cu_memset_d8(C.CUdeviceptr(addr), 0, C.size_t(size)) }); err != nil {
			return err
		}
		return d.call("cuCtxSynchronize", func() C.CUresult { return C.cu_ctx_synchronize() })
	})
}

func (d *Device) Reserve(size uint64) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var p C.CUdeviceptr
	err := d.do(func() error {
		return d.call("cuMemAddressReserve", func() C.CUresult { return C.cu_mem_address_reserve(&p, C.size_t(size)) })
	})
	if err != nil {
		return 0, fmt.Errorf("reserve of %d bytes: %w", size, err)
	}
	return uint64(p), nil
}

// Unreserve frees a reservation, which must have no page still mapped.
func (d *Device) Unreserve(addr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for p := range d.handles {
		if p >= addr && p < addr+size {
			return fmt.Errorf("cuda: unreserve [%#x, +%d): page %#x is still mapped", addr, size, p)
		}
	}
	return d.do(func() error {
		return d.call("cuMemAddressFree", func() C.CUresult { return C.cu_mem_address_free(C.CUdeviceptr(addr), C.size_t(size)) })
	})
}

// whole checks that [addr, addr+size) is a whole number of pages of page
// bytes, a multiple of the granularity.
func (d *Device) whole(op string, addr, size, page uint64) error {
	if d.ctx == nil {
		return errClosed
	}
	if size == 0 || page == 0 || page%d.page != 0 || addr%d.page != 0 || size%page != 0 {
		return fmt.Errorf("cuda: %s [%#x, +%d): not a whole number of %d-byte pages (granularity %d)", op, addr, size, page, d.page)
	}
	return nil
}

// Map gives every page of [addr, addr+size) its own physical allocation,
// as PyTorch's ExpandableSegment::map does, so that Unmap can later
// release any whole pages of it (the driver unmaps only whole
// allocations): first a cuMemCreate per page, then a cuMemMap per page and
// one cuMemSetAccess for the range. On failure nothing stays mapped.
func (d *Device) Map(addr, size, page uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.whole("map", addr, size, page); err != nil {
		return err
	}
	for p := addr; p < addr+size; p += d.page {
		if _, ok := d.handles[p]; ok {
			return fmt.Errorf("cuda: map [%#x, +%d): page %#x is already mapped", addr, size, p)
		}
	}
	hs := make([]C.CUmemGenericAllocationHandle, 0, size/page)
	err := d.do(func() error {
		for range size / page {
			var h C.CUmemGenericAllocationHandle
			if err := d.call("cuMemCreate", func() C.CUresult { return C.cu_mem_create(&h, C.size_t(page), d.dev) }); err != nil {
				return err
			}
			hs = append(hs, h)
		}
		for i, h := range hs {
			p := addr + uint64(i)*page
			if err := d.call("cuMemMap", func() C.CUresult { return C.cu_mem_map(C.CUdeviceptr(p), C.size_t(page), h) }); err != nil {
				return err
			}
			d.handles[p] = mapping{h, page}
		}
		return d.call("cuMemSetAccess", func() C.CUresult { return C.cu_mem_set_access(C.CUdeviceptr(addr), C.size_t(size), d.dev) })
	})
	if err != nil {
		// Undo this call's pages; an error here is secondary to err.
		d.do(func() error {
			for i, h := range hs {
				p := addr + uint64(i)*page
				if m, ok := d.handles[p]; ok {
					d.unmap(p, m)
				} else {
					d.call("cuMemRelease", func() C.CUresult { return C.cu_mem_release(h) })
				}
			}
			return nil
		})
		return fmt.Errorf("map [%#x, +%d): %w", addr, size, err)
	}
	return nil
}

// unmap unmaps and releases the physical allocation m mapped at p; it
// needs the context current.
func (d *Device) unmap(p uint64, m mapping) error {
	delete(d.handles, p)
	err := d.call("cuMemUnmap", func() C.CUresult { return C.cu_mem_unmap(C.CUdeviceptr(p), C.size_t(m.size)) })
	if err == nil {
		err = d.call("cuMemRelease", func() C.CUresult { return C.cu_mem_release(m.h) })
	}
	return err
}

// Unmap releases the physical memory behind [addr, addr+size): whole
// pages that Map calls mapped, a cuMemUnmap and a cuMemRelease each.
// vramscope's only device work (Touch) has finished by the time it
// returns, so no synchronisation is needed first.
func (d *Device) Unmap(addr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.whole("unmap", addr, size, d.page); err != nil {
		return err
	}
	end := addr + size
	for p := addr; p < end; {
		m, ok := d.handles[p]
		switch {
		case !ok:
			return fmt.Errorf("cuda: unmap [%#x, +%d): no page is mapped at %#x", addr, size, p)
		case p+m.size > end:
			return fmt.Errorf("cuda: unmap [%#x, +%d): the page mapped at %#x runs past its end", addr, size, p)
		}
		p += m.size
	}
	return d.do(func() error {
		var first error
		for p := addr; p < end; {
			m := d.handles[p]
			if err := d.unmap(p, m); first == nil {
				first = err
			}
			p += m.size
		}
		return first
	})
}

// Fences are trivially complete: vramscope launches no kernels and its one
// piece of device work, Touch, synchronises before returning, so whenever a
// fence is recorded all earlier work on every stream is already done. This
// saves creating and polling CUDA events for nothing.

func (d *Device) RecordFence(stream int64) (gpu.Fence, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil {
		return 0, errClosed
	}
	d.fences++
	return gpu.Fence(d.fences), nil
}

func (d *Device) FenceDone(f gpu.Fence) (bool, error) { return true, nil }
func (d *Device) WaitFence(f gpu.Fence) error         { return nil }

func (d *Device) Synchronize() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.do(func() error { return d.call("cuCtxSynchronize", func() C.CUresult { return C.cu_ctx_synchronize() }) })
}
