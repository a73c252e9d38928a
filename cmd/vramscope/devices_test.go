package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"vramscope/gpu/cuda"
)

func withDevices(t *testing.T, infos []cuda.Info, err error) {
	t.Helper()
	old := listDevices
	listDevices = func() ([]cuda.Info, error) { return infos, err }
	t.Cleanup(func() { listDevices = old })
}

func runCmd(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestDevicesNoDriverHere(t *testing.T) {
	if _, err := cuda.Devices(); err == nil || os.Getenv(cuda.LibraryEnv) != "" {
		t.Skip("a CUDA driver is installed")
	}
	code, out, errOut := runCmd("devices")
	if code != 1 || out != "" {
		t.Errorf("exit %d, stdout %q; want 1 and nothing", code, out)
	}
	if !strings.Contains(errOut, "vramscope devices: no GPU found: no CUDA driver: dlopen libcuda.so.1: ") {
		t.Errorf("stderr %q does not say why", errOut)
	}
	code, out, _ = runCmd("devices", "--json")
	if code != 1 || strings.TrimSpace(out) != "[]" {
		t.Errorf("--json: exit %d, stdout %q; want 1 and []", code, out)
	}
}

func TestDevicesList(t *testing.T) {
	withDevices(t, []cuda.Info{
		{Ordinal: 0, Name: "NVIDIA H200", Total: 150110011392, Free: 149500000000},
		{Ordinal: 1, Name: "NVIDIA A10G", Total: 24 << 30, Free: 1536 << 20},
	}, nil)
	code, out, errOut := runCmd("devices")
	want := "GPU  NAME         TOTAL       FREE\n" +
		"0    NVIDIA H200  139.80 GiB  139.23 GiB\n" +
		"1    NVIDIA A10G  24.00 GiB   1.50 GiB\n"
	if code != 0 || out != want || errOut != "" {
		t.Errorf("exit %d, stderr %q, stdout:\n%s\nwant:\n%s", code, errOut, out, want)
	}

	code, out, _ = runCmd("devices", "--json")
	var got []map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != 0 {
		t.Fatalf("--json: exit %d, %v: %s", code, err, out)
	}
	if len(got) != 2 || got[0]["index"] != 0.0 || got[0]["name"] != "NVIDIA H200" ||
		got[0]["total_bytes"] != 150110011392.0 || got[1]["free_bytes"] != float64(1536<<20) {
		t.Errorf("--json = %s", out)
	}
}

func TestDevicesErrors(t *testing.T) {
	withDevices(t, nil, nil)
	if code, _, errOut := runCmd("devices"); code != 1 || !strings.Contains(errOut, "no GPU found: the driver sees no GPU") {
		t.Errorf("zero GPUs: exit %d, stderr %q", code, errOut)
	}
	withDevices(t, nil, errors.New("cuInit: no CUDA-capable device is detected (CUresult 100)"))
	if code, _, errOut := runCmd("devices"); code != 1 || !strings.Contains(errOut, "no CUDA-capable device") {
		t.Errorf("cuInit error: exit %d, stderr %q", code, errOut)
	}
	if code, _, _ := runCmd("devices", "extra"); code != 2 {
		t.Errorf("extra argument: exit %d, want 2", code)
	}
	if code, _, _ := runCmd("devices", "--bogus"); code != 2 {
		t.Errorf("unknown flag: exit %d, want 2", code)
	}
}
