// A fake libcuda.so.1 for testing the binding without a GPU: one 2 GiB
// device whose calls check their arguments the way the real driver would
// (current context per thread, struct contents, page alignment) and keep
// honest accounts of the memory in use. When FAKECUDA_COUNTS names a file,
// the driver counts its VMM calls there (failed calls too), so a test can
// read how many calls an operation made while the driver runs.
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long u64;

typedef struct { int type; int id; } Loc;
typedef struct {
	int type, handleTypes;
	Loc loc;
	void *win32;
	unsigned char compression, rdma;
	unsigned short usage;
	unsigned char reserved[4];
} Prop;
typedef struct { Loc loc; int flags; } Access;

enum { OK = 0, INVALID_VALUE = 1, OOM = 2, NOT_INITIALIZED = 3, INVALID_DEVICE = 101,
       INVALID_CONTEXT = 201, NOT_FOUND = 500 };
#define CAP (2ULL << 30)
#define PAGE (2ULL << 20)
#define MAX 4096

static int inited, refs;
static int ctx_object;
static __thread void *current;
static u64 used;

static struct { u64 addr, size; } allocs[MAX];
static u64 next_alloc = 0x700000000000ULL;
static struct { u64 addr, size; } reserves[MAX];
static u64 next_reserve = 0x600000000000ULL;
static struct { int live; u64 size, mapped_at; } handles[MAX];

// The counted calls, in the order of their counters in FAKECUDA_COUNTS:
// one native-endian 64-bit integer each.
enum { N_CREATE, N_MAP, N_SET_ACCESS, N_UNMAP, N_RELEASE, N_COUNTS };
static u64 no_file[N_COUNTS], *counts = no_file;

// The counters live in a shared mapping of the file, so every increment is
// in the file at once, without a write call.
__attribute__((constructor)) static void map_counts(void) {
	const char *path = getenv("FAKECUDA_COUNTS");
	if (!path) return;
	int fd = open(path, O_RDWR | O_CREAT, 0644);
	if (fd < 0) return;
	if (ftruncate(fd, sizeof no_file) == 0) {
		void *p = mmap(NULL, sizeof no_file, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p != MAP_FAILED) counts = p;
	}
	close(fd);
}

static CUresult need_ctx(void) {
	if (!inited) return NOT_INITIALIZED;
	return current == &ctx_object && refs > 0 ? OK : INVALID_CONTEXT;
}

CUresult cuInit(unsigned flags) { if (flags) return INVALID_VALUE; inited = 1; return OK; }
CUresult cuDeviceGetCount(int *n) { if (!inited) return NOT_INITIALIZED; *n = 1; return OK; }
CUresult cuDeviceGet(int *d, int ord) { if (!inited) return NOT_INITIALIZED; if (ord != 0) return INVALID_DEVICE; *d = 0; return OK; }
CUresult cuDeviceGetName(char *buf, int len, int d) {
	if (d != 0) return INVALID_DEVICE;
	strncpy(buf, "Fake GPU", len);
	return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *b, int d) { if (d != 0) return INVALID_DEVICE; *b = CAP; return OK; }
CUresult cuDevicePrimaryCtxRetain(void **c, int d) { if (d != 0) return INVALID_DEVICE; refs++; *c = &ctx_object; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { if (d != 0 || refs == 0) return INVALID_DEVICE; refs--; return OK; }
CUresult cuCtxSetCurrent(void *c) { if (c != &ctx_object) return INVALID_CONTEXT; current = c; return OK; }
CUresult cuCtxSynchronize(void) { return need_ctx(); }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) {
	CUresult r = need_ctx();
	if (r) return r;
	*f = CAP - used;
	*t = CAP;
	return OK;
}

CUresult cuMemAlloc_v2(u64 *p, size_t n) {
	CUresult r = need_ctx();
	if (r) return r;
	if (n == 0) return INVALID_VALUE;
	if (n > CAP - used) return OOM;
	for (int i = 0; i < MAX; i++) {
		if (allocs[i].size == 0) {
			allocs[i].addr = next_alloc;
			allocs[i].size = n;
			next_alloc += (n + PAGE - 1) / PAGE * PAGE;
			used += n;
			*p = allocs[i].addr;
			return OK;
		}
	}
	return OOM;
}

CUresult cuMemFree_v2(u64 p) {
	CUresult r = need_ctx();
	if (r) return r;
	for (int i = 0; i < MAX; i++) {
		if (allocs[i].size && allocs[i].addr == p) {
			used -= allocs[i].size;
			allocs[i].size = 0;
			return OK;
		}
	}
	return INVALID_VALUE;
}

static int page_mapped(u64 p) {
	for (int i = 0; i < MAX; i++)
		if (handles[i].live && handles[i].mapped_at && p >= handles[i].mapped_at && p < handles[i].mapped_at + handles[i].size)
			return 1;
	return 0;
}

CUresult cuMemsetD8_v2(u64 p, unsigned char v, size_t n) {
	(void)v;
	CUresult r = need_ctx();
	if (r) return r;
	for (int i = 0; i < MAX; i++)
		if (allocs[i].size && p >= allocs[i].addr && p + n <= allocs[i].addr + allocs[i].size) return OK;
	for (u64 q = p / PAGE * PAGE; q < p + n; q += PAGE)
		if (!page_mapped(q)) return INVALID_VALUE;
	return OK;
}

static int prop_ok(const Prop *p) {
	return p->type == 1 && p->handleTypes == 0 && p->loc.type == 1 && p->loc.id == 0 && p->win32 == NULL &&
	       p->compression == 0 && p->rdma == 0 && p->usage == 0;
}

CUresult cuMemGetAllocationGranularity(size_t *g, const Prop *p, int option) {
	if (!inited) return NOT_INITIALIZED;
	if (!prop_ok(p) || option != 0) return INVALID_VALUE;
	*g = PAGE;
	return OK;
}

CUresult cuMemAddressReserve(u64 *p, size_t n, size_t align, u64 addr, unsigned long long flags) {
	CUresult r = need_ctx();
	if (r) return r;
	if (n == 0 || n % PAGE || align || addr || flags) return INVALID_VALUE;
	for (int i = 0; i < MAX; i++) {
		if (reserves[i].size == 0) {
			reserves[i].addr = next_reserve;
			reserves[i].size = n;
			next_reserve += n + PAGE;
			*p = reserves[i].addr;
			return OK;
		}
	}
	return OOM;
}

CUresult cuMemAddressFree(u64 p, size_t n) {
	CUresult r = need_ctx();
	if (r) return r;
	for (int i = 0; i < MAX; i++) {
		if (reserves[i].size && reserves[i].addr == p) {
			if (reserves[i].size != n) return INVALID_VALUE;
			for (u64 q = p; q < p + n; q += PAGE)
				if (page_mapped(q)) return INVALID_VALUE;
			reserves[i].size = 0;
			return OK;
		}
	}
	return INVALID_VALUE;
}

CUresult cuMemCreate(u64 *h, size_t n, const Prop *p, unsigned long long flags) {
	counts[N_CREATE]++;
	CUresult r = need_ctx();
	if (r) return r;
	if (!prop_ok(p) || flags || n == 0 || n % PAGE) return INVALID_VALUE;
	if (n > CAP - used) return OOM;
	for (int i = 0; i < MAX; i++) {
		if (!handles[i].live) {
			handles[i].live = 1;
			handles[i].size = n;
			handles[i].mapped_at = 0;
			used += n;
			*h = (u64)i + 1;
			return OK;
		}
	}
	return OOM;
}

static int handle_index(u64 h) { return h >= 1 && h <= MAX && handles[h - 1].live ? (int)h - 1 : -1; }

CUresult cuMemRelease(u64 h) {
	counts[N_RELEASE]++;
	CUresult r = need_ctx();
	if (r) return r;
	int i = handle_index(h);
	if (i < 0 || handles[i].mapped_at) return INVALID_VALUE;
	handles[i].live = 0;
	used -= handles[i].size;
	return OK;
}

static int reserved(u64 p, u64 n) {
	for (int i = 0; i < MAX; i++)
		if (reserves[i].size && p >= reserves[i].addr && p + n <= reserves[i].addr + reserves[i].size) return 1;
	return 0;
}

CUresult cuMemMap(u64 p, size_t n, size_t offset, u64 h, unsigned long long flags) {
	counts[N_MAP]++;
	CUresult r = need_ctx();
	if (r) return r;
	int i = handle_index(h);
	if (i < 0 || handles[i].mapped_at || offset || flags || n != handles[i].size || p % PAGE || !reserved(p, n))
		return INVALID_VALUE;
	for (u64 q = p; q < p + n; q += PAGE)
		if (page_mapped(q)) return INVALID_VALUE;
	handles[i].mapped_at = p;
	return OK;
}

CUresult cuMemUnmap(u64 p, size_t n) {
	counts[N_UNMAP]++;
	CUresult r = need_ctx();
	if (r) return r;
	for (int i = 0; i < MAX; i++) {
		if (handles[i].live && handles[i].mapped_at == p) {
			if (handles[i].size != n) return INVALID_VALUE; // only whole mappings
			handles[i].mapped_at = 0;
			return OK;
		}
	}
	return INVALID_VALUE;
}

CUresult cuMemSetAccess(u64 p, size_t n, const Access *d, size_t count) {
	counts[N_SET_ACCESS]++;
	CUresult r = need_ctx();
	if (r) return r;
	if (count != 1 || d->loc.type != 1 || d->loc.id != 0 || d->flags != 3) return INVALID_VALUE;
	for (u64 q = p; q < p + n; q += PAGE)
		if (!page_mapped(q)) return INVALID_VALUE;
	return OK;
}

CUresult cuGetErrorString(CUresult e, const char **s) {
	switch (e) {
	case OK: *s = "no error"; return OK;
	case INVALID_VALUE: *s = "invalid argument"; return OK;
	case OOM: *s = "out of memory"; return OK;
	case NOT_INITIALIZED: *s = "initialization error"; return OK;
	case INVALID_DEVICE: *s = "invalid device ordinal"; return OK;
	case INVALID_CONTEXT: *s = "invalid device context"; return OK;
	}
	return INVALID_VALUE;
}
