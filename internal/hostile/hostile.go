// Package hostile builds the inputs of an attack on the server: snapshots
// that are small on the wire and costly to decode, and streams that are
// slow or never end. The tests of several rooms (pytorch, live, server)
// send the same bytes.
package hostile

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// Gzip compresses b at the best ratio.
func Gzip(b []byte) []byte {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

// GzipOf compresses what write writes, without holding it uncompressed.
func GzipOf(write func(w io.Writer)) []byte {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	write(zw)
	zw.Close()
	return buf.Bytes()
}

// repeat writes n bytes of pattern (n a multiple of its length).
func repeat(w io.Writer, pattern []byte, n int) {
	chunk := bytes.Repeat(pattern, (64<<10)/len(pattern))
	for n > 0 {
		k := min(n, len(chunk))
		w.Write(chunk[:k])
		n -= k
	}
}

// LongLine is a pickle whose one UNICODE line (the protocol 0 opcode
// whose argument ends at a newline) is n bytes long.
func LongLine(op byte, n int) []byte {
	var b bytes.Buffer
	b.WriteString("\x80\x04")
	b.WriteByte(op)
	repeat(&b, []byte("1"), n)
	b.WriteString("\n.")
	return b.Bytes()
}

// GzipLongLine is LongLine compressed, made without holding it whole.
func GzipLongLine(op byte, n int) []byte {
	return GzipOf(func(w io.Writer) {
		w.Write([]byte{0x80, 4, op})
		repeat(w, []byte("1"), n)
		w.Write([]byte("\n."))
	})
}

// EmptyTraceLists is a snapshot whose device_traces holds n empty lists:
// n bytes that would each become a device.
func EmptyTraceLists(n int) []byte {
	var b bytes.Buffer
	b.WriteString("\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces](")
	repeat(&b, []byte("]"), n)
	b.WriteString("eu.")
	return b.Bytes()
}

// DupListRounds is a pickle that DUPs a list n times between a MARK and
// LIST, rounds times over: each DUP is one byte and one more reference.
func DupListRounds(n, rounds int) []byte {
	return GzipOf(func(w io.Writer) {
		w.Write([]byte("\x80\x04]"))
		round := append(append([]byte{'('}, bytes.Repeat([]byte{'2'}, n)...), 'l')
		for range rounds {
			w.Write(round)
		}
		w.Write([]byte{'.'})
	})
}

// DupPop is a pickle of n DUP, POP pairs: it holds nothing, and takes a
// while to decode. gzip makes it about a thousandth of its size.
func DupPop(n int) []byte {
	return GzipOf(func(w io.Writer) {
		w.Write([]byte("\x80\x04N"))
		repeat(w, []byte("20"), 2*n)
		w.Write([]byte("."))
	})
}

// declared is what the inputs below hold of a string that declares more:
// a decoder must refuse it at the declaration, before it reads any.
const declared = 1 << 20

// BigBytes is a pickle of one BINBYTES8 that declares n bytes, gzipped.
func BigBytes(n int) []byte {
	return GzipOf(func(w io.Writer) {
		w.Write([]byte("\x80\x04\x8e"))
		binary.Write(w, binary.LittleEndian, uint64(n))
		repeat(w, []byte{0}, min(n, declared))
		w.Write([]byte("."))
	})
}

// LongFrameName is a snapshot of one segment whose block's stack has a
// frame whose name declares n bytes, gzipped.
func LongFrameName(n int) []byte {
	return GzipOf(func(w io.Writer) {
		str := func(s string) {
			w.Write([]byte{0x8c, byte(len(s))})
			w.Write([]byte(s))
		}
		w.Write([]byte("\x80\x04}("))
		str("segments")
		w.Write([]byte("]}("))
		str("device")
		w.Write([]byte("K\x00"))
		str("address")
		w.Write([]byte("J\x00\x00\x10\x00"))
		str("total_size")
		w.Write([]byte("J\x00\x00\x20\x00"))
		str("blocks")
		w.Write([]byte("]}("))
		str("size")
		w.Write([]byte("J\x00\x00\x20\x00"))
		str("state")
		str("active_allocated")
		str("frames")
		w.Write([]byte("]}("))
		str("name")
		w.Write([]byte{0x8d})
		binary.Write(w, binary.LittleEndian, uint64(n))
		repeat(w, []byte("f"), min(n, declared))
		str("filename")
		str("x.py")
		str("line")
		w.Write([]byte("K\x01ua")) // the frame into frames
		w.Write([]byte("ua"))      // the block into blocks
		w.Write([]byte("ua"))      // the segment into segments
		w.Write([]byte("u."))
	})
}

// SmallDisk mounts a file system of size bytes (a tmpfs) for the test and
// returns its directory. It skips where mounting is not allowed (a user
// who is not root, a container without the right).
func SmallDisk(t testing.TB, size int64) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Skipf("cannot mount a small file system here: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// Fill writes a file in dir until the file system has no more than leave
// bytes free.
func Fill(t testing.TB, dir string, leave uint64) {
	t.Helper()
	f, err := os.CreateTemp(dir, "filler-")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		free := st.Bavail * uint64(st.Bsize)
		if free <= leave {
			return
		}
		if _, err := f.Write(chunk[:min(uint64(len(chunk)), free-leave)]); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return
			}
			t.Fatal(err)
		}
	}
}
