#include "cu.h"

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

// Layouts from cuda.h (LP64).
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
	int type;                 // CU_MEM_ALLOCATION_TYPE_PINNED = 1
	int requestedHandleTypes; // CU_MEM_HANDLE_TYPE_NONE = 0
	CUmemLocation location;   // CU_MEM_LOCATION_TYPE_DEVICE = 1, ordinal
	void *win32HandleMetaData;
	unsigned char compressionType;
	unsigned char gpuDirectRDMACapable;
	unsigned short usage;
	unsigned char reserved[4];
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;

_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation is 8 bytes");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp is 32 bytes");
_Static_assert(offsetof(CUmemAllocationProp, win32HandleMetaData) == 16, "win32HandleMetaData at 16");
_Static_assert(offsetof(CUmemAllocationProp, compressionType) == 24, "allocFlags at 24");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc is 12 bytes");

enum {
	CU_MEM_ALLOCATION_TYPE_PINNED = 1,
	CU_MEM_LOCATION_TYPE_DEVICE = 1,
	CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
	CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
};

static struct {
	CUresult (*init)(unsigned int);
	CUresult (*deviceGetCount)(int *);
	CUresult (*deviceGet)(CUdevice *, int);
	CUresult (*deviceGetName)(char *, int, CUdevice);
	CUresult (*deviceTotalMem)(size_t *, CUdevice);
	CUresult (*primaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*primaryCtxRelease)(CUdevice);
	CUresult (*ctxSetCurrent)(CUcontext);
	CUresult (*ctxSynchronize)(void);
	CUresult (*memAlloc)(CUdeviceptr *, size_t);
	CUresult (*memFree)(CUdeviceptr);
	CUresult (*memGetInfo)(size_t *, size_t *);
	CUresult (*memsetD8)(CUdeviceptr, unsigned char, size_t);
	CUresult (*memGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
	CUresult (*memAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*memAddressFree)(CUdeviceptr, size_t);
	CUresult (*memCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
	CUresult (*memRelease)(CUmemGenericAllocationHandle);
	CUresult (*memMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
	CUresult (*memUnmap)(CUdeviceptr, size_t);
	CUresult (*memSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	CUresult (*getErrorString)(CUresult, const char **);
} cu;

static void *cu_lib;
static char cu_err[512];

// The versioned names are the ones cuda.h #defines the plain names to.
static const struct { const char *name; void **slot; } cu_syms[] = {
	{"cuInit", (void **)&cu.init},
	{"cuDeviceGetCount", (void **)&cu.deviceGetCount},
	{"cuDeviceGet", (void **)&cu.deviceGet},
	{"cuDeviceGetName", (void **)&cu.deviceGetName},
	{"cuDeviceTotalMem_v2", (void **)&cu.deviceTotalMem},
	{"cuDevicePrimaryCtxRetain", (void **)&cu.primaryCtxRetain},
	{"cuDevicePrimaryCtxRelease_v2", (void **)&cu.primaryCtxRelease},
	{"cuCtxSetCurrent", (void **)&cu.ctxSetCurrent},
	{"cuCtxSynchronize", (void **)&cu.ctxSynchronize},
	{"cuMemAlloc_v2", (void **)&cu.memAlloc},
	{"cuMemFree_v2", (void **)&cu.memFree},
	{"cuMemGetInfo_v2", (void **)&cu.memGetInfo},
	{"cuMemsetD8_v2", (void **)&cu.memsetD8},
	{"cuMemGetAllocationGranularity", (void **)&cu.memGetAllocationGranularity},
	{"cuMemAddressReserve", (void **)&cu.memAddressReserve},
	{"cuMemAddressFree", (void **)&cu.memAddressFree},
	{"cuMemCreate", (void **)&cu.memCreate},
	{"cuMemRelease", (void **)&cu.memRelease},
	{"cuMemMap", (void **)&cu.memMap},
	{"cuMemUnmap", (void **)&cu.memUnmap},
	{"cuMemSetAccess", (void **)&cu.memSetAccess},
	{"cuGetErrorString", (void **)&cu.getErrorString},
};

const char *cu_load(const char *path) {
	cu_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!cu_lib) {
		snprintf(cu_err, sizeof cu_err, "dlopen %s: %s", path, dlerror());
		return cu_err;
	}
	for (size_t i = 0; i < sizeof cu_syms / sizeof cu_syms[0]; i++) {
		*cu_syms[i].slot = dlsym(cu_lib, cu_syms[i].name);
		if (!*cu_syms[i].slot) {
			snprintf(cu_err, sizeof cu_err, "dlsym %s: %s", cu_syms[i].name, dlerror());
			dlclose(cu_lib);
			cu_lib = NULL;
			memset(&cu, 0, sizeof cu);
			return cu_err;
		}
	}
	return NULL;
}

const char *cu_error_string(CUresult r) {
	const char *s = NULL;
	if (cu.getErrorString(r, &s) != 0) return NULL;
	return s;
}

CUresult cu_init(void) { return cu.init(0); }
CUresult cu_device_get_count(int *n) { return cu.deviceGetCount(n); }
CUresult cu_device_get(CUdevice *d, int ordinal) { return cu.deviceGet(d, ordinal); }
CUresult cu_device_get_name(char *buf, int len, CUdevice d) { return cu.deviceGetName(buf, len, d); }
CUresult cu_device_total_mem(size_t *bytes, CUdevice d) { return cu.deviceTotalMem(bytes, d); }
CUresult cu_primary_ctx_retain(CUcontext *c, CUdevice d) { return cu.primaryCtxRetain(c, d); }
CUresult cu_primary_ctx_release(CUdevice d) { return cu.primaryCtxRelease(d); }
CUresult cu_ctx_set_current(CUcontext c) { return cu.ctxSetCurrent(c); }
CUresult cu_ctx_synchronize(void) { return cu.ctxSynchronize(); }
CUresult cu_mem_alloc(CUdeviceptr *p, size_t n) { return cu.memAlloc(p, n); }
CUresult cu_mem_free(CUdeviceptr p) { return cu.memFree(p); }
CUresult cu_mem_get_info(size_t *free_bytes, size_t *total_bytes) { return cu.memGetInfo(free_bytes, total_bytes); }
CUresult cu_memset_d8(CUdeviceptr p, unsigned char v, size_t n) { return cu.memsetD8(p, v, n); }
CUresult cu_mem_address_reserve(CUdeviceptr *p, size_t n) { return cu.memAddressReserve(p, n, 0, 0, 0); }
CUresult cu_mem_address_free(CUdeviceptr p, size_t n) { return cu.memAddressFree(p, n); }
CUresult cu_mem_release(CUmemGenericAllocationHandle h) { return cu.memRelease(h); }
CUresult cu_mem_map(CUdeviceptr p, size_t n, CUmemGenericAllocationHandle h) { return cu.memMap(p, n, 0, h, 0); }
CUresult cu_mem_unmap(CUdeviceptr p, size_t n) { return cu.memUnmap(p, n); }

// Pinned device memory on dev with no exportable handle: vramscope needs no IPC.
static CUmemAllocationProp cu_prop(CUdevice dev) {
	CUmemAllocationProp p;
	memset(&p, 0, sizeof p);
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = dev;
	return p;
}

CUresult cu_mem_granularity(size_t *g, CUdevice dev) {
	CUmemAllocationProp p = cu_prop(dev);
	return cu.memGetAllocationGranularity(g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
}

CUresult cu_mem_create(CUmemGenericAllocationHandle *h, size_t n, CUdevice dev) {
	CUmemAllocationProp p = cu_prop(dev);
	return cu.memCreate(h, n, &p, 0);
}

CUresult cu_mem_set_access(CUdeviceptr p, size_t n, CUdevice dev) {
	CUmemAccessDesc d;
	memset(&d, 0, sizeof d);
	d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	d.location.id = dev;
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	return cu.memSetAccess(p, n, &d, 1);
}
