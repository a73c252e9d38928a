package cuda

// The TestGPU* tests need a GPU and skip without one. To run them on another
// machine, build them here and copy the binary:
//
//	go test -c -o cuda.test ./gpu/cuda
//	./cuda.test -test.v -test.run GPU
//
// TestFakeDriver runs them here, in a child process, against a fake
// libcuda.so.1 built from testdata/fakecuda.c.

import (
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/internal/testkit/need"
)

const mib = 1 << 20

// driverMissing reports whether this process has no driver to load.
func driverMissing(t *testing.T) (string, bool) {
	t.Helper()
	if err := load(); err != nil && strings.HasPrefix(err.Error(), "no CUDA driver: ") {
		return err.Error(), true
	}
	return "", false
}

func TestNoDriver(t *testing.T) {
	if os.Getenv(LibraryEnv) != "" {
		t.Skipf("%s is set", LibraryEnv)
	}
	msg, missing := driverMissing(t)
	if !missing {
		t.Skip("a CUDA driver is installed")
	}
	if !strings.HasPrefix(msg, "no CUDA driver: dlopen libcuda.so.1: ") {
		t.Errorf("load error %q does not name dlopen libcuda.so.1", msg)
	}
	d, err := Open(0)
	if d != nil || err == nil || err.Error() != msg {
		t.Errorf("Open(0) = %v, %v; want nil, %q", d, err, msg)
	}
	infos, err := Devices()
	if infos != nil || err == nil || err.Error() != msg {
		t.Errorf("Devices() = %v, %v; want nil, %q", infos, err, msg)
	}
	if errors.Is(err, gpu.ErrOutOfMemory) {
		t.Error("the no-driver error matches ErrOutOfMemory")
	}
}

func TestErrorMapping(t *testing.T) {
	oom := error(&Error{Call: "cuMemCreate", Code: 2, Msg: "out of memory"})
	if !errors.Is(oom, gpu.ErrOutOfMemory) || !errors.Is(errors.Join(errors.New("x"), oom), gpu.ErrOutOfMemory) {
		t.Error("CUDA_ERROR_OUT_OF_MEMORY does not match gpu.ErrOutOfMemory")
	}
	other := &Error{Call: "cuMemFree_v2", Code: 1, Msg: "invalid argument"}
	if errors.Is(other, gpu.ErrOutOfMemory) {
		t.Error("CUDA_ERROR_INVALID_VALUE matches gpu.ErrOutOfMemory")
	}
	if got, want := other.Error(), "cuMemFree_v2: invalid argument (CUresult 1)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

// openGPU opens GPU 0 or skips the test when there is none.
func openGPU(t *testing.T) *Device {
	t.Helper()
	d, err := Open(0)
	if err != nil {
		var ce *Error
		if _, missing := driverMissing(t); missing || (errors.As(err, &ce) && ce.Code == 100) {
			t.Skipf("needs a CUDA GPU: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}

func memFree(t *testing.T, d *Device) uint64 {
	t.Helper()
	free, total, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	if free > total || total == 0 {
		t.Fatalf("MemInfo = %d free of %d", free, total)
	}
	return free
}

func TestGPUDevices(t *testing.T) {
	d := openGPU(t)
	infos, err := Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) == 0 || infos[0].Name != d.Name() || infos[0].Total == 0 || infos[0].Free > infos[0].Total {
		t.Fatalf("Devices() = %+v", infos)
	}
	t.Logf("%+v", infos)
	if _, err := Open(len(infos)); err == nil {
		t.Errorf("Open(%d) past the last GPU: no error", len(infos))
	}
}

func TestGPUMallocFree(t *testing.T) {
	d := openGPU(t)
	before := memFree(t, d)
	const size = 256 * mib
	addr, err := d.Malloc(size)
	if err != nil {
		t.Fatal(err)
	}
	if addr == 0 {
		t.Fatal("Malloc returned address 0")
	}
	// Other processes may use the GPU too: require only the drop we caused.
	if during := memFree(t, d); before-during < size {
		t.Errorf("free went from %d to %d after a %d-byte Malloc", before, during, size)
	}
	if err := d.Touch(addr, size); err != nil {
		t.Errorf("Touch of the allocation: %v", err)
	}
	if err := d.Touch(addr+mib, 1000); err != nil {
		t.Errorf("Touch inside the allocation: %v", err)
	}
	if err := d.Free(addr); err != nil {
		t.Fatal(err)
	}
	if after := memFree(t, d); after+size/2 < before {
		t.Errorf("free is %d after Free, was %d before Malloc", after, before)
	}
	var ce *Error
	if err := d.Free(addr); !errors.As(err, &ce) || ce.Call != "cuMemFree_v2" {
		t.Errorf("double Free = %v, want a cuMemFree_v2 error", err)
	}
}

func TestGPUOutOfMemory(t *testing.T) {
	d := openGPU(t)
	_, err := d.Malloc(1 << 50)
	if !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Fatalf("Malloc(1 PiB) = %v, want ErrOutOfMemory", err)
	}
	if !strings.Contains(err.Error(), "cuMemAlloc_v2") {
		t.Errorf("error %q does not name the call", err)
	}
	// The device is still usable afterwards.
	addr, err := d.Malloc(mib)
	if err != nil {
		t.Fatalf("Malloc after an OOM: %v", err)
	}
	if err := d.Free(addr); err != nil {
		t.Error(err)
	}
}

func TestGPUVMM(t *testing.T) {
	d := openGPU(t)
	page := d.PageSize()
	if page == 0 || 2*mib%page != 0 {
		t.Fatalf("granularity %d does not divide 2 MiB", page)
	}
	const size = 8 * 2 * mib
	r, err := d.Reserve(size)
	if err != nil {
		t.Fatal(err)
	}
	before := memFree(t, d)
	if err := d.Map(r, 2*mib, 2*mib); err != nil {
		t.Fatal(err)
	}
	if err := d.Map(r+2*mib, 4*mib, 2*mib); err != nil {
		t.Fatal(err)
	}
	if during := memFree(t, d); before-during < 6*mib {
		t.Errorf("free went from %d to %d after mapping 6 MiB", before, during)
	}
	if err := d.Touch(r, 6*mib); err != nil {
		t.Errorf("Touch of the mapped pages: %v", err)
	}
	if err := d.Map(r+4*mib, 2*mib, 2*mib); err == nil {
		t.Error("Map of a mapped page: no error")
	}
	if err := d.Map(r+page/2, page, page); err == nil {
		t.Error("Map of an unaligned range: no error")
	}
	if err := d.Map(r+8*mib, 6*mib, 4*mib); err == nil {
		t.Error("Map of a range not a whole number of pages: no error")
	}
	if err := d.Unreserve(r, size); err == nil {
		t.Error("Unreserve with pages mapped: no error")
	}
	// Unmap across the two Map calls' boundary: pages are independent.
	if err := d.Unmap(r, 4*mib); err != nil {
		t.Fatal(err)
	}
	if err := d.Unmap(r, 2*mib); err == nil {
		t.Error("Unmap of an unmapped page: no error")
	}
	if err := d.Unmap(r+4*mib, 2*mib); err != nil {
		t.Fatal(err)
	}
	// Pages larger than the granularity unmap whole, in any grouping.
	if err := d.Map(r+4*mib, 12*mib, 4*mib); err != nil {
		t.Fatal(err)
	}
	if err := d.Touch(r+4*mib, 12*mib); err != nil {
		t.Errorf("Touch of the 4 MiB pages: %v", err)
	}
	for _, c := range [][2]uint64{{r + 4*mib, 2 * mib}, {r + 6*mib, 4 * mib}, {r + 4*mib, 6 * mib}} {
		if err := d.Unmap(c[0], c[1]); err == nil {
			t.Errorf("Unmap [%#x, +%d) cutting a 4 MiB page: no error", c[0], c[1])
		}
	}
	if err := d.Unmap(r+8*mib, 4*mib); err != nil {
		t.Fatal(err)
	}
	if err := d.Unmap(r+4*mib, 4*mib); err != nil {
		t.Fatal(err)
	}
	if err := d.Unmap(r+12*mib, 4*mib); err != nil {
		t.Fatal(err)
	}
	if after := memFree(t, d); after+2*mib < before {
		t.Errorf("free is %d after unmapping, was %d", after, before)
	}
	if err := d.Unreserve(r, size); err != nil {
		t.Fatal(err)
	}
}

func TestGPUMapOutOfMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("maps the whole GPU page by page")
	}
	d := openGPU(t)
	free := memFree(t, d)
	page := 10 * d.page
	size := (free/page + 2) * page
	r, err := d.Reserve(size)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Unreserve(r, size)
	if err := d.Map(r, size, page); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Fatalf("Map of more than the free memory = %v, want ErrOutOfMemory", err)
	}
	if len(d.handles) != 0 {
		t.Errorf("%d pages still mapped after a failed Map", len(d.handles))
	}
	if after := memFree(t, d); after+64*mib < free {
		t.Errorf("free is %d after a failed Map, was %d", after, free)
	}
	if err := d.Map(r, 2*mib, 2*mib); err != nil {
		t.Errorf("Map after a failed Map: %v", err)
	}
	if err := d.Unmap(r, 2*mib); err != nil {
		t.Error(err)
	}
}

func TestGPUFencesAndClose(t *testing.T) {
	d := openGPU(t)
	f, err := d.RecordFence(7)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := d.FenceDone(f); !ok || err != nil {
		t.Errorf("FenceDone = %v, %v", ok, err)
	}
	if err := d.WaitFence(f); err != nil {
		t.Error(err)
	}
	if err := d.Synchronize(); err != nil {
		t.Error(err)
	}
	d2, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	r, err := d2.Reserve(4 * mib)
	if err != nil {
		t.Fatal(err)
	}
	if err := d2.Map(r, 4*mib, 2*mib); err != nil {
		t.Fatal(err)
	}
	if err := d2.Close(); err != nil {
		t.Fatalf("Close with pages mapped: %v", err)
	}
	if _, err := d2.Malloc(mib); !errors.Is(err, errClosed) {
		t.Errorf("Malloc after Close = %v", err)
	}
	// d still holds the primary context: the reservation can go through it.
	if err := d.Unreserve(r, 4*mib); err != nil {
		t.Error(err)
	}
}

// fakeCountsEnv names the file where the fake driver counts its VMM calls.
const fakeCountsEnv = "FAKECUDA_COUNTS"

// vmmCalls are the driver calls of expandable segments, in the order of the
// fake driver's counters.
var vmmCalls = [...]string{"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease"}

// vmmCounts returns how many of each of vmmCalls d has made, and, against
// the fake driver, how many the driver counted.
func vmmCounts(t *testing.T, d *Device) (ours, driver [len(vmmCalls)]uint64) {
	t.Helper()
	for _, c := range d.Calls() {
		if i := slices.Index(vmmCalls[:], c.Name); i >= 0 {
			ours[i] = uint64(c.Count)
		}
	}
	path := os.Getenv(fakeCountsEnv)
	if path == "" {
		return ours, ours
	}
	b, err := os.ReadFile(path)
	if err != nil || len(b) != 8*len(driver) {
		t.Fatalf("the fake driver's counts: %d bytes, %v", len(b), err)
	}
	for i := range driver {
		driver[i] = binary.NativeEndian.Uint64(b[8*i:])
	}
	return ours, driver
}

// TestGPUExpandablePages maps 1 GiB through the caching allocator's
// expandable segments in each pool and counts the driver calls: as
// PyTorch, one physical allocation per allocator page (20 MiB in the large
// pool, 2 MiB in the small one) and one cuMemSetAccess per mapped range;
// empty_cache gives back each page it mapped.
func TestGPUExpandablePages(t *testing.T) {
	d := openGPU(t)
	cfg, err := caching.ParseConfig("expandable_segments:True")
	if err != nil {
		t.Fatal(err)
	}
	a, err := caching.New(d, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// step runs f and checks the calls it made, by us and the driver.
	step := func(name string, want [len(vmmCalls)]uint64, f func() error) {
		t.Helper()
		ours0, driver0 := vmmCounts(t, d)
		if err := f(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ours1, driver1 := vmmCounts(t, d)
		var ours, driver [len(vmmCalls)]uint64
		for i := range want {
			ours[i], driver[i] = ours1[i]-ours0[i], driver1[i]-driver0[i]
		}
		t.Logf("%s: %v %v", name, vmmCalls, driver)
		if ours != want || driver != want {
			t.Errorf("%s: counted %v, the driver %v; want %v", name, ours, driver, want)
		}
	}
	var big uint64
	step("1 GiB in the large pool", [...]uint64{52, 52, 1, 0, 0}, func() (err error) {
		big, err = a.Malloc(1<<30, 0, 0) // 52 pages of 20 MiB
		return err
	})
	if err := d.Touch(big, 1<<30); err != nil {
		t.Errorf("Touch of the 1 GiB: %v", err)
	}
	step("its empty_cache", [...]uint64{0, 0, 0, 52, 52}, func() error {
		if err := a.Free(big); err != nil {
			return err
		}
		return a.EmptyCache()
	})
	var small []uint64
	step("1 GiB in the small pool", [...]uint64{512, 512, 512, 0, 0}, func() error {
		for range 1024 { // two 1 MiB blocks a 2 MiB page, each page mapped on its own
			p, err := a.Malloc(1<<20, 0, 0)
			if err != nil {
				return err
			}
			small = append(small, p)
		}
		return nil
	})
	step("its empty_cache", [...]uint64{0, 0, 0, 512, 512}, func() error {
		for _, p := range small {
			if err := a.Free(p); err != nil {
				return err
			}
		}
		return a.EmptyCache()
	})
	if r := a.Reserved(); r != 0 {
		t.Errorf("%d bytes reserved after empty_cache", r)
	}
}

// TestFakeDriver runs the GPU tests in a child process against a fake
// driver, which checks the calls' arguments and struct layouts.
func TestFakeDriver(t *testing.T) {
	if os.Getenv(LibraryEnv) != "" {
		t.Skip("already running against a named driver")
	}
	src, err := filepath.Abs("testdata/fakecuda.c")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(src); err != nil {
		t.Fatal(err)
	}
	cc := need.Program(t, "cc")
	lib := filepath.Join(t.TempDir(), "libcuda.so.1")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-Wall", "-Werror", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("building the fake driver: %v\n%s", err, out)
	}
	cmd := exec.Command(os.Args[0], "-test.v", "-test.run", "^TestGPU")
	cmd.Env = append(os.Environ(), LibraryEnv+"="+lib, fakeCountsEnv+"="+filepath.Join(t.TempDir(), "counts"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("GPU tests against the fake driver: %v\n%s", err, out)
	}
	for _, name := range []string{"Devices", "MallocFree", "OutOfMemory", "VMM", "MapOutOfMemory", "FencesAndClose", "ExpandablePages"} {
		if !strings.Contains(string(out), "--- PASS: TestGPU"+name+" ") {
			t.Errorf("TestGPU%s did not pass against the fake driver:\n%s", name, out)
		}
	}

	// A library without the driver's symbols names the missing one.
	cmd = exec.Command(os.Args[0], "-test.v", "-test.run", "^TestGPUDevices$")
	cmd.Env = append(os.Environ(), LibraryEnv+"=libc.so.6")
	out, _ = cmd.CombinedOutput()
	if !strings.Contains(string(out), "no CUDA driver: dlsym cuInit: ") {
		t.Errorf("against libc.so.6, want a dlsym cuInit error:\n%s", out)
	}
}
