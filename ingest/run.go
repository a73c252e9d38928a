package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"sort"
	"sync"

	"vramscope/gpu"
	"vramscope/pytorch"
	"vramscope/store"
)

// RunFile is one snapshot of a run: a rank's file.
type RunFile struct {
	// Name is its name or path; a rank in it ("rank3.pickle",
	// "rank3/snapshot.pickle") is the file's rank unless Rank says one.
	Name string
	R    io.Reader
	// Rank is the file's rank when it is given, else -1: then its name
	// says it, else its user_metadata, else its place among the files.
	Rank int
	// Close, when set, is called once the file has been read.
	Close func() error
}

// RunSource hands out the files of a run one at a time: Next returns
// io.EOF after the last. Concurrent says whether a file may still be read
// after Next returns the following one (files on disk); a stream's files
// (a tar, a multipart form) are read one after another.
type RunSource interface {
	Next() (RunFile, error)
	Concurrent() bool
}

// RunRank is one file of an imported run: its rank, name, and the
// figures and trace of each device it held, by device. The decoded
// devices themselves are let go once stored: a run of many big files
// would otherwise hold them all until its end.
type RunRank struct {
	Rank    int
	Name    string
	Devices []DeviceFigures
	Traces  []string
}

// DeviceFigures are what a decoded device held at snapshot time.
type DeviceFigures struct {
	Device    int    `json:"device"`
	Segments  int    `json:"segments"`
	Blocks    int    `json:"blocks"`
	Events    int    `json:"events"`
	Allocated uint64 `json:"allocated_bytes"`
	Reserved  uint64 `json:"reserved_bytes"`
	OOMs      int    `json:"ooms"`
	TraceID   string `json:"trace_id,omitempty"`
	// Estimated: the snapshot was estimated on a CPU, not recorded.
	Estimated bool `json:"estimated,omitempty"`
}

// FiguresOf sums up a decoded device.
func FiguresOf(t *pytorch.Trace) DeviceFigures {
	fg := t.Final.Figures()
	return DeviceFigures{Device: t.Device, Segments: fg.Segments, Blocks: fg.Blocks, Events: len(t.Events),
		Allocated: fg.Allocated, Reserved: fg.Reserved, OOMs: t.OOMs(), Estimated: t.Estimate() != nil}
}

// runWorkers is how many files Run decodes side by side: one per core.
func runWorkers() int { return max(1, runtime.NumCPU()) }

// MemoryLimit is the soft memory limit (debug.SetMemoryLimit) for a
// process importing the snapshot files paths, several as Run does:
// pytorch.MemoryLimit of the largest files it decodes at once. It is 0,
// no limit, when one of them is not a regular file (a pipe, read only
// once, is not opened here), is gzipped (its decoded size is unknown) or
// cannot be read.
func MemoryLimit(paths []string) int64 {
	sizes := make([]int64, len(paths))
	for i, p := range paths {
		st, err := os.Stat(p)
		if err != nil || !st.Mode().IsRegular() {
			return 0
		}
		f, err := os.Open(p)
		if err != nil {
			return 0
		}
		var head [2]byte
		_, err = io.ReadFull(f, head[:])
		f.Close()
		if err == nil && head == [2]byte{0x1f, 0x8b} {
			return 0
		}
		sizes[i] = st.Size()
	}
	slices.Sort(sizes)
	var atOnce int64
	for _, s := range sizes[max(0, len(sizes)-runWorkers()):] {
		atOnce += s
	}
	return pytorch.MemoryLimit(atOnce)
}

// Run decodes and stores the files of src as the ranks of a new run named
// name and returns the run's id and its ranks, by rank. Files are decoded
// and stored on every core: files on disk side by side, a stream's one
// after another, each stored while the next is decoded. It is all or
// nothing: readers see no trace until every rank is stored, and on an
// error (naming the file), or when ctx ends, nothing is kept. Errors are
// those of Snapshot; two files of one rank are an InputError.
func Run(ctx context.Context, db *store.DB, name string, src RunSource, opt pytorch.Options) (string, []RunRank, error) {
	return run(ctx, db, name, false, src, opt)
}

// JoinRun is Run into the newest run named name that has none of src's
// ranks yet (store.PublishJoinRun): a job's ranks imported on several
// machines, each its share, make one run.
func JoinRun(ctx context.Context, db *store.DB, name string, src RunSource, opt pytorch.Options) (string, []RunRank, error) {
	return run(ctx, db, name, true, src, opt)
}

func run(ctx context.Context, db *store.DB, name string, join bool, src RunSource, opt pytorch.Options) (string, []RunRank, error) {
	name, err := gpu.CheckName(name)
	if err != nil {
		return "", nil, &InputError{fmt.Errorf("the run's name: %w", err)}
	}
	if name == "" {
		return "", nil, &InputError{errors.New("the run has no name")}
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	opt.Context = ctx
	var (
		mu      sync.Mutex // guards src, files, stages and first
		turn    sync.Mutex // a stream's files are decoded one at a time
		files   []RunRank
		stages  []*staged
		places  []int // each file's place, and whether its rank was found
		found   []bool
		first   error
		ended   bool               // Next said io.EOF: a source is not asked again
		named   = map[int]string{} // ranks given or in the files' names, known before decoding
		wg      sync.WaitGroup
		workers = runWorkers()
	)
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
			cancel(err)
		}
		mu.Unlock()
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if !src.Concurrent() {
					turn.Lock()
				}
				mu.Lock()
				f, err := RunFile{}, io.EOF
				if !ended {
					f, err = src.Next()
				}
				ended = ended || err == io.EOF
				place := len(files)
				if err == nil {
					if err = checkFileName(f.Name); err == nil {
						err = claimRank(named, f)
					}
					if err != nil && f.Close != nil {
						f.Close()
					}
				}
				if err == nil {
					files = append(files, RunRank{Name: f.Name, Rank: f.Rank})
					stages, places, found = append(stages, nil), append(places, place), append(found, f.Rank >= 0)
				}
				stop := first != nil
				mu.Unlock()
				if err != nil || stop {
					if !src.Concurrent() {
						turn.Unlock()
					}
					if err != nil && err != io.EOF {
						fail(err)
					}
					if err == nil && f.Close != nil {
						f.Close()
					}
					return
				}
				traces, err := decodeRankFile(f, opt)
				if !src.Concurrent() {
					turn.Unlock()
				}
				if err != nil {
					fail(err)
					return
				}
				rank, ok := f.knownRank()
				if !ok {
					rank, ok = RankOfMetadata(userMetadata(traces))
				}
				s, err := stage(ctx, db, traces, baseName(f.Name))
				if err != nil {
					fail(fileError(f.Name, err))
					return
				}
				figs := make([]DeviceFigures, len(traces))
				for i, t := range traces {
					figs[i] = FiguresOf(t)
				}
				mu.Lock()
				files[place].Rank, files[place].Devices, found[place], stages[place] = rank, figs, ok, s
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	abort := func(err error) (string, []RunRank, error) {
		for _, s := range stages {
			if s != nil {
				s.abort()
			}
		}
		return "", nil, err
	}
	if first != nil {
		return abort(first)
	}
	if len(files) == 0 {
		return abort(&InputError{errors.New("the run holds no snapshot")})
	}
	// Files whose rank nothing said take their place in the list.
	world := 0
	for i := range files {
		if !found[i] {
			files[i].Rank = places[i]
		}
		if _, w, ok := RankOfName(files[i].Name); ok && files[i].Rank < w {
			world = max(world, w)
		}
	}
	if err := distinctRanks(files); err != nil {
		return abort(err)
	}
	ups := make([]store.StagedUpload, len(files))
	for i, s := range stages {
		s.Upload.Rank = files[i].Rank
		ups[i] = store.StagedUpload(*s)
		files[i].Traces = s.traceIDs()
		for j := range files[i].Devices {
			files[i].Devices[j].TraceID = files[i].Traces[j]
		}
	}
	publish := db.PublishRun
	if join {
		publish = db.PublishJoinRun
	}
	run, err := publish(name, world, ups)
	if err != nil {
		return abort(err)
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Rank < files[j].Rank })
	return run, files, nil
}

// decodeRankFile decodes one file of a run and picks its devices.
func decodeRankFile(f RunFile, opt pytorch.Options) ([]*pytorch.Trace, error) {
	if f.Close != nil {
		defer f.Close()
	}
	traces, err := pytorch.DecodeWith(f.R, opt)
	if err == nil {
		traces, err = pytorch.Devices(traces, -1)
	}
	if err != nil {
		return nil, fileError(f.Name, decodeError(err, opt))
	}
	return traces, nil
}

// decodeError is err as Snapshot returns it: the reader's, limits and the
// context's end as they are, the rest the file's fault.
func decodeError(err error, opt pytorch.Options) error {
	var mbe *http.MaxBytesError
	var le *pytorch.LimitError
	var ie *InputError
	if errors.As(err, &mbe) || errors.As(err, &le) || errors.As(err, &ie) || opt.Context != nil && opt.Context.Err() != nil {
		return err
	}
	return &InputError{err}
}

// fileError says which file of a run err is about, keeping its kind.
func fileError(name string, err error) error {
	var ie *InputError
	if errors.As(err, &ie) {
		return &InputError{fmt.Errorf("%s: %w", name, ie.Err)}
	}
	return fmt.Errorf("%s: %w", name, err)
}

// checkFileName refuses a file whose name (without its folders) cannot
// name its trace, saying which file without repeating a long name whole.
func checkFileName(name string) error {
	base, err := gpu.CheckName(baseName(name))
	if err == nil && base == "" {
		err = errors.New("its name is blank")
	}
	if err != nil {
		shown := name
		if len(shown) > 80 {
			shown = "…" + shown[len(shown)-80:] // its end names it best
		}
		return &InputError{fmt.Errorf("file %q: %w", shown, err)}
	}
	return nil
}

// knownRank is the file's rank as known before decoding it: given, or in
// its name.
func (f RunFile) knownRank() (int, bool) {
	if f.Rank >= 0 {
		return f.Rank, true
	}
	rank, _, ok := RankOfName(f.Name)
	return rank, ok
}

// claimRank refuses a file whose rank, given or in its name, an earlier
// file of the run already has, before either is decoded: the run would be
// refused once they were.
func claimRank(named map[int]string, f RunFile) error {
	rank, ok := f.knownRank()
	if !ok {
		return nil
	}
	if other, dup := named[rank]; dup {
		return rankTwice(rank, other, f.Name)
	}
	named[rank] = f.Name
	return nil
}

// distinctRanks refuses two files of one rank, naming them.
func distinctRanks(files []RunRank) error {
	by := map[int]string{}
	for _, f := range files {
		if other, ok := by[f.Rank]; ok {
			return rankTwice(f.Rank, other, f.Name)
		}
		by[f.Rank] = f.Name
	}
	return nil
}

func rankTwice(rank int, a, b string) error {
	return &InputError{fmt.Errorf("rank %d twice: %s and %s (name the files by rank, or give the ranks)", rank, a, b)}
}

// userMetadata lists the distinct user_metadata texts of decoded traces.
func userMetadata(traces []*pytorch.Trace) []string {
	var out []string
	for _, t := range traces {
		for _, x := range t.Extras {
			if x.UserMetadata != "" && !slices.Contains(out, x.UserMetadata) {
				out = append(out, x.UserMetadata)
			}
		}
	}
	return out
}

// baseName is a path's last element, / or \ separated.
func baseName(name string) string {
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '/' || name[i] == '\\' {
			return name[i+1:]
		}
	}
	return name
}
