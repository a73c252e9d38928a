package ingest

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"vramscope/pytorch"
)

// Files is a RunSource of snapshot files on disk, read side by side.
func Files(paths []string) RunSource {
	return &fileSource{paths: paths}
}

type fileSource struct {
	paths []string
	next  int
}

func (s *fileSource) Concurrent() bool { return true }

func (s *fileSource) Next() (RunFile, error) {
	if s.next == len(s.paths) {
		return RunFile{}, io.EOF
	}
	path := s.paths[s.next]
	s.next++
	f, err := os.Open(path)
	if err != nil {
		return RunFile{}, &InputError{err}
	}
	return RunFile{Name: path, R: f, Rank: -1, Close: f.Close}, nil
}

// WithRanks gives the files of src the ranks given, in order; more or
// fewer files than ranks are an InputError.
func WithRanks(src RunSource, ranks []int) RunSource {
	return &rankedSource{RunSource: src, ranks: ranks}
}

type rankedSource struct {
	RunSource
	ranks []int
	next  int
}

func (s *rankedSource) Next() (RunFile, error) {
	f, err := s.RunSource.Next()
	switch {
	case err == io.EOF && s.next < len(s.ranks):
		return f, &InputError{fmt.Errorf("%d ranks given for %d files", len(s.ranks), s.next)}
	case err != nil:
		return f, err
	case s.next == len(s.ranks):
		if f.Close != nil {
			f.Close()
		}
		return RunFile{}, &InputError{fmt.Errorf("%d ranks given for more files (%s is one too many)", len(s.ranks), f.Name)}
	}
	f.Rank = s.ranks[s.next]
	s.next++
	return f, nil
}

// ParseRanks reads a list of ranks written 0,1,2.
func ParseRanks(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || n >= 1<<20 {
			return nil, fmt.Errorf("%q is not a rank (0, 1, ...)", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// One is a RunSource of one stream, a run of one file.
func One(name string, r io.Reader) RunSource {
	return &oneSource{f: RunFile{Name: name, R: r, Rank: -1}}
}

type oneSource struct {
	f    RunFile
	done bool
}

func (s *oneSource) Concurrent() bool { return false }

func (s *oneSource) Next() (RunFile, error) {
	if s.done {
		return RunFile{}, io.EOF
	}
	s.done = true
	return s.f, nil
}

// SnapshotFiles lists the files a command line names, in order: a folder
// stands for the files in it and its subfolders (rank3/snapshot.pickle)
// and the links in them to files, sorted by path, leaving out hidden ones.
func SnapshotFiles(args []string) ([]string, error) {
	var out []string
	for _, a := range args {
		st, err := os.Stat(a)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			out = append(out, a)
			continue
		}
		var in []string
		err = filepath.WalkDir(a, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if strings.HasPrefix(d.Name(), ".") && p != a {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if d.Type().IsRegular() {
				in = append(in, p)
			} else if d.Type()&fs.ModeSymlink != 0 {
				// a link to a file counts (a folder of links to the ranks'
				// files); links to folders are not followed, so no loop
				if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
					in = append(in, p)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if len(in) == 0 {
			return nil, fmt.Errorf("%s: no files in the folder", a)
		}
		sort.Strings(in)
		out = append(out, in...)
	}
	return out, nil
}

// IsTar says whether br starts a tar archive, gzipped or not, without
// consuming it. The error is the reader's, other than its end: a body cut
// or too slow is refused here rather than read as a short snapshot.
func IsTar(br *bufio.Reader) (bool, error) {
	head, err := br.Peek(512)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
		return false, err
	}
	if len(head) >= 2 && head[0] == 0x1f && head[1] == 0x8b {
		zr, err := gzip.NewReader(bytes.NewReader(head))
		if err != nil {
			return false, nil
		}
		head, _ = io.ReadAll(io.LimitReader(zr, 512)) // a cut stream still yields its start
	}
	return len(head) >= 262 && string(head[257:262]) == "ustar", nil
}

// Tar is a RunSource of the regular files of a tar archive (gzipped or
// not), in archive order, read one after another; folders, links and
// hidden files are left out. The archive is read within opt's bounds:
// MaxBytes caps it whole, decompressed.
func Tar(r io.Reader, opt pytorch.Options) RunSource {
	return &tarSource{r: r, opt: opt}
}

type tarSource struct {
	r   io.Reader
	opt pytorch.Options
	tr  *tar.Reader
}

func (s *tarSource) Concurrent() bool { return false }

func (s *tarSource) Next() (RunFile, error) {
	if s.tr == nil {
		br := bufio.NewReader(s.r)
		var r io.Reader = br
		if head, _ := br.Peek(2); len(head) == 2 && head[0] == 0x1f && head[1] == 0x8b {
			zr, err := gzip.NewReader(br)
			if err != nil {
				return RunFile{}, &InputError{fmt.Errorf("tar.gz: %w", err)}
			}
			r = zr
		}
		s.tr = tar.NewReader(pytorch.LimitReader(r, s.opt))
	}
	for {
		h, err := s.tr.Next()
		if err == io.EOF {
			return RunFile{}, io.EOF
		}
		if err != nil {
			var le *pytorch.LimitError
			if errors.As(err, &le) || s.opt.Context != nil && s.opt.Context.Err() != nil {
				return RunFile{}, err
			}
			return RunFile{}, &InputError{fmt.Errorf("tar: %w", err)}
		}
		if h.Typeflag != tar.TypeReg || hidden(h.Name) {
			continue
		}
		return RunFile{Name: h.Name, R: s.tr, Rank: -1}, nil
	}
}

// hidden says whether a path has an element starting with a dot (macOS's
// ._ files, .DS_Store).
func hidden(name string) bool {
	for _, p := range strings.Split(strings.ReplaceAll(name, `\`, "/"), "/") {
		if strings.HasPrefix(p, ".") && p != "." && p != ".." {
			return true
		}
	}
	return false
}
