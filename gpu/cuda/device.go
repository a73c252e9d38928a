package cuda

/*
#include "cu.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

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
	page    uint64                                    // VMM granularity
	handles map[uint64]C.CUmemGenericAllocationHandle // mapped page address -> its handle
	fences  uint64
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
	d := &Device{ordinal: ordinal, handles: map[uint64]C.CUmemGenericAllocationHandle{}}
	if err := check("cuDeviceGet", C.cu_device_get(&d.dev, C.int(ordinal))); err != nil {
		return nil, err
	}
	var name [256]C.char
	if err := check("cuDeviceGetName", C.cu_device_get_name(&name[0], C.int(len(name)), d.dev)); err != nil {
		return nil, err
	}
	d.name = C.GoString(&name[0])
	if err := check("cuDevicePrimaryCtxRetain", C.cu_primary_ctx_retain(&d.ctx, d.dev)); err != nil {
		return nil, err
	}
	var page C.size_t
	err := d.do(func() error { return check("cuMemGetAllocationGranularity", C.cu_mem_granularity(&page, d.dev)) })
	if err != nil {
		d.Close()
		return nil, err
	}
	d.page = uint64(page)
	return d, nil
}

// do runs f with the device's context current. Contexts are current per OS
// thread, so the goroutine stays on its thread until f returns.
func (d *Device) do(f func() error) error {
	if d.ctx == nil {
		return errClosed
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := check("cuCtxSetCurrent", C.cu_ctx_set_current(d.ctx)); err != nil {
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
		for p, h := range d.handles {
			errs = append(errs, check("cuMemUnmap", C.cu_mem_unmap(C.CUdeviceptr(p), C.size_t(d.page))))
			errs = append(errs, check("cuMemRelease", C.cu_mem_release(h)))
			delete(d.handles, p)
		}
		return errors.Join(errs...)
	})
	d.ctx = nil
	return errors.Join(err, check("cuDevicePrimaryCtxRelease_v2", C.cu_primary_ctx_release(d.dev)))
}

func (d *Device) Name() string { return d.name }
func (d *Device) Ordinal() int { return d.ordinal }

// PageSize is the VMM granularity: Map and Unmap take multiples of it.
func (d *Device) PageSize() uint64 { return d.page }

func (d *Device) MemInfo() (free, total uint64, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var f, t C.size_t
	err = d.do(func() error { return check("cuMemGetInfo_v2", C.cu_mem_get_info(&f, &t)) })
	return uint64(f), uint64(t), err
}

func (d *Device) Malloc(size uint64) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var p C.CUdeviceptr
	err := d.do(func() error { return check("cuMemAlloc_v2", C.cu_mem_alloc(&p, C.size_t(size))) })
	if err != nil {
		return 0, fmt.Errorf("malloc of %d bytes: %w", size, err)
	}
	return uint64(p), nil
}

func (d *Device) Free(addr uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.do(func() error { return check("cuMemFree_v2", C.cu_mem_free(C.CUdeviceptr(addr))) })
}

// Touch writes zeros over [addr, addr+size) and waits for the write, so the
// memory is really used (resident) and not only reserved.
func (d *Device) Touch(addr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.do(func() error {
		if err := check("cuMemsetD8_v2", C.cu_memset_d8(C.CUdeviceptr(addr), 0, C.size_t(size))); err != nil {
			return err
		}
		return check("cuCtxSynchronize", C.cu_ctx_synchronize())
	})
}

func (d *Device) Reserve(size uint64) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var p C.CUdeviceptr
	err := d.do(func() error { return check("cuMemAddressReserve", C.cu_mem_address_reserve(&p, C.size_t(size))) })
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
		return check("cuMemAddressFree", C.cu_mem_address_free(C.CUdeviceptr(addr), C.size_t(size)))
	})
}

// pages checks that [addr, addr+size) is a whole number of pages.
func (d *Device) pages(op string, addr, size uint64) error {
	if d.ctx == nil {
		return errClosed
	}
	if size == 0 || addr%d.page != 0 || size%d.page != 0 {
		return fmt.Errorf("cuda: %s [%#x, +%d): not a whole number of %d-byte pages", op, addr, size, d.page)
	}
	return nil
}

// Map gives every page of [addr, addr+size) its own physical allocation, so
// that Unmap can later release any page-aligned part of it (the driver
// unmaps only whole mappings). On failure nothing stays mapped.
func (d *Device) Map(addr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.pages("map", addr, size); err != nil {
		return err
	}
	for p := addr; p < addr+size; p += d.page {
		if _, ok := d.handles[p]; ok {
			return fmt.Errorf("cuda: map [%#x, +%d): page %#x is already mapped", addr, size, p)
		}
	}
	err := d.do(func() error {
		for p := addr; p < addr+size; p += d.page {
			var h C.CUmemGenericAllocationHandle
			if err := check("cuMemCreate", C.cu_mem_create(&h, C.size_t(d.page), d.dev)); err != nil {
				return err
			}
			if err := check("cuMemMap", C.cu_mem_map(C.CUdeviceptr(p), C.size_t(d.page), h)); err != nil {
				C.cu_mem_release(h)
				return err
			}
			d.handles[p] = h
		}
		return check("cuMemSetAccess", C.cu_mem_set_access(C.CUdeviceptr(addr), C.size_t(size), d.dev))
	})
	if err != nil {
		// Undo this call's pages; an error here is secondary to err.
		d.do(func() error { d.release(addr, size); return nil })
		return fmt.Errorf("map [%#x, +%d): %w", addr, size, err)
	}
	return nil
}

// release unmaps and releases the mapped pages in [addr, addr+size),
// returning the first driver error; it needs the context current.
func (d *Device) release(addr, size uint64) error {
	var first error
	for p := addr; p < addr+size; p += d.page {
		h, ok := d.handles[p]
		if !ok {
			continue
		}
		delete(d.handles, p)
		err := check("cuMemUnmap", C.cu_mem_unmap(C.CUdeviceptr(p), C.size_t(d.page)))
		if err == nil {
			err = check("cuMemRelease", C.cu_mem_release(h))
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// Unmap releases the physical memory behind [addr, addr+size); every page
// in it must be mapped. vramscope's only device work (Touch) has finished
// by the time it returns, so no synchronisation is needed first.
func (d *Device) Unmap(addr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.pages("unmap", addr, size); err != nil {
		return err
	}
	for p := addr; p < addr+size; p += d.page {
		if _, ok := d.handles[p]; !ok {
			return fmt.Errorf("cuda: unmap [%#x, +%d): page %#x is not mapped", addr, size, p)
		}
	}
	return d.do(func() error { return d.release(addr, size) })
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
	return d.do(func() error { return check("cuCtxSynchronize", C.cu_ctx_synchronize()) })
}
