// Package cuda is a real GPU: the CUDA driver API, loaded at run time with
// dlopen("libcuda.so.1"). Building needs only a C compiler and <dlfcn.h>: the
// few driver types, structs and constants are declared here, from the
// driver's documented ABI, so no CUDA toolkit or headers are needed. On a
// machine without a driver every entry point returns a clear error.
package cuda

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "cu.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"vramscope/gpu"
)

// LibraryEnv names an environment variable that, when set, replaces
// "libcuda.so.1" as the library to open (a driver outside the loader path).
const LibraryEnv = "VRAMSCOPE_LIBCUDA"

// CUresult codes this package treats specially.
const (
	errOutOfMemory = 2
)

// Error is a failed driver call.
type Error struct {
	Call string // the driver function, e.g. "cuMemAlloc_v2"
	Code int    // the CUresult
	Msg  string // the driver's error string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (CUresult %d)", e.Call, e.Msg, e.Code)
}

// Is makes CUDA_ERROR_OUT_OF_MEMORY match gpu.ErrOutOfMemory.
func (e *Error) Is(target error) bool {
	return target == gpu.ErrOutOfMemory && e.Code == errOutOfMemory
}

// check turns a CUresult into nil or an *Error naming call.
func check(call string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	msg := "unknown error"
	if s := C.cu_error_string(r); s != nil {
		msg = C.GoString(s)
	}
	return &Error{Call: call, Code: int(r), Msg: msg}
}

var (
	loadOnce sync.Once
	loadErr  error
)

// load opens the driver and runs cuInit once per process.
func load() error {
	loadOnce.Do(func() {
		path := os.Getenv(LibraryEnv)
		if path == "" {
			path = "libcuda.so.1"
		}
		cpath := C.CString(path)
		defer C.free(unsafe.Pointer(cpath))
		if msg := C.cu_load(cpath); msg != nil {
			loadErr = errors.New("no CUDA driver: " + C.GoString(msg))
			return
		}
		loadErr = check("cuInit", C.cu_init())
	})
	return loadErr
}

// Info describes one GPU.
type Info struct {
	Ordinal int    `json:"index"`
	Name    string `json:"name"`
	Total   uint64 `json:"total_bytes"`
	Free    uint64 `json:"free_bytes"`
}

// Devices lists the GPUs the driver sees. Measuring free memory needs a
// context, so each device's primary context is retained for the query (the
// driver creates it if no one holds it yet, which costs some memory).
func Devices() ([]Info, error) {
	if err := load(); err != nil {
		return nil, err
	}
	var n C.int
	if err := check("cuDeviceGetCount", C.cu_device_get_count(&n)); err != nil {
		return nil, err
	}
	infos := make([]Info, 0, int(n))
	for i := range int(n) {
		d, err := Open(i)
		if err != nil {
			return nil, err
		}
		free, total, err := d.MemInfo()
		d.Close()
		if err != nil {
			return nil, fmt.Errorf("GPU %d: %w", i, err)
		}
		infos = append(infos, Info{Ordinal: i, Name: d.name, Total: total, Free: free})
	}
	return infos, nil
}
