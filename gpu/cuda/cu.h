// The CUDA driver API as vramscope uses it, resolved at run time with dlopen
// and dlsym so that building needs no CUDA toolkit or headers.
#ifndef VRAMSCOPE_CU_H
#define VRAMSCOPE_CU_H

#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef unsigned long long CUmemGenericAllocationHandle;

// cu_load opens the library at path and resolves every symbol; on failure it
// returns a message (valid until the next call) and leaves nothing loaded.
const char *cu_load(const char *path);

// One wrapper per driver call, because Go cannot call C function pointers.
// cu_error_string returns NULL when the driver has no string for r.
const char *cu_error_string(CUresult r);
CUresult cu_init(void);
CUresult cu_device_get_count(int *n);
CUresult cu_device_get(CUdevice *d, int ordinal);
CUresult cu_device_get_name(char *buf, int len, CUdevice d);
CUresult cu_device_total_mem(size_t *bytes, CUdevice d);
CUresult cu_primary_ctx_retain(CUcontext *c, CUdevice d);
CUresult cu_primary_ctx_release(CUdevice d);
CUresult cu_ctx_set_current(CUcontext c);
CUresult cu_ctx_synchronize(void);
CUresult cu_mem_alloc(CUdeviceptr *p, size_t n);
CUresult cu_mem_free(CUdeviceptr p);
CUresult cu_mem_get_info(size_t *free_bytes, size_t *total_bytes);
CUresult cu_memset_d8(CUdeviceptr p, unsigned char v, size_t n);
// VMM: pinned memory on dev, minimum granularity, read-write access for dev.
CUresult cu_mem_granularity(size_t *g, CUdevice dev);
CUresult cu_mem_address_reserve(CUdeviceptr *p, size_t n);
CUresult cu_mem_address_free(CUdeviceptr p, size_t n);
CUresult cu_mem_create(CUmemGenericAllocationHandle *h, size_t n, CUdevice dev);
CUresult cu_mem_release(CUmemGenericAllocationHandle h);
CUresult cu_mem_map(CUdeviceptr p, size_t n, CUmemGenericAllocationHandle h);
CUresult cu_mem_unmap(CUdeviceptr p, size_t n);
CUresult cu_mem_set_access(CUdeviceptr p, size_t n, CUdevice dev);

#endif
