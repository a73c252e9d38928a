package incident

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"vramscope/gpu"
	"vramscope/gpu/caching"
	"vramscope/gpu/sim"
	"vramscope/internal/derive"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/replay"
)

// run is a recording made up for a test: reqs run through the allocator
// on a device of capacity bytes under conf, with a per-process limit of
// limit bytes (0: none) that a stored trace records (its settings and
// device) or a snapshot does not (recorded false: no settings beyond
// conf, no device size, as PyTorch writes it).
type run struct {
	reqs     []replay.Request
	capacity uint64
	conf     string
	limit    uint64
	recorded bool
}

// record runs r until its first OOM, as a job dies there.
func (r run) record(t *testing.T) gpu.Recording {
	t.Helper()
	conf := r.conf
	if r.recorded && r.limit > 0 {
		conf = strings.Trim(conf+fmt.Sprintf(",per_process_memory_fraction:%g", float64(r.limit)/float64(r.capacity)), ",")
	}
	cfg, err := caching.ParseConfig(conf)
	if err != nil {
		t.Fatal(err)
	}
	if !r.recorded {
		cfg.Limit = r.limit
	}
	var events []gpu.Event
	a, err := caching.New(sim.New(r.capacity), cfg, caching.WithSink(gpu.SinkFunc(func(b []gpu.Event) { events = append(events, b...) })))
	if err != nil {
		t.Fatal(err)
	}
	p := replay.NewReplayer(a)
	for i, q := range r.reqs {
		if err := p.Step(i, q); err != nil {
			t.Fatal(err)
		}
		if len(p.OOMs()) > 0 {
			break
		}
	}
	p.Result()
	rec := gpu.Recording{Events: events, Settings: cfg.String()}
	if r.recorded {
		rec.Capacity = r.capacity
	}
	for _, s := range a.Snapshot() {
		if id := a.SegmentPool(s.Addr); id != (caching.PoolID{}) {
			if rec.Pools == nil {
				rec.Pools = map[uint64][2]int64{}
			}
			rec.Pools[s.Addr] = id
		}
	}
	for i := range rec.Events {
		rec.Events[i].Seq = int64(i)
	}
	return rec
}

// bothReadings reads each OOM of rec by the rule twice: the verdict, from
// the recorded layout right after it, and the what-if, from the replay
// under the recorded settings when it refuses the request too; they must
// agree. A shortage is served by no setting: the allocated memory does not
// change with them. It returns the verdicts and the table.
func bothReadings(t *testing.T, name string, rec gpu.Recording) ([]Report, Table) {
	t.Helper()
	s := replay.FromRecording(rec)
	s.Use(0, replay.DefaultCapacity)
	table, err := Answer(s)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	l := gpu.NewLayout(caching.DefaultConfig().Rules)
	if rec.Initial != nil {
		l = rec.Initial.Clone()
	}
	var reports []Report
	for _, e := range rec.Events {
		if err := l.Apply(e); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if e.Action != gpu.ActionOOM {
			continue
		}
		r := Analyze(l, e, DeviceOf(s))
		k := len(reports)
		reports = append(reports, r)
		f, ok := table.ForOOM(k)
		if !ok {
			t.Errorf("%s: OOM %d (event %d) is not in the what-if", name, k, e.Seq)
			continue
		}
		if f.Kind != r.Kind {
			t.Errorf("%s: OOM %d (event %d): the verdict says %s, the what-if's replay %s\n%s\n%+v", name, k, e.Seq, r.Kind, f.Kind, r.Verdict, table.Rows[0].RoomAtOOM)
		}
		if r.Kind == KindShortage && len(f.ServedBy) > 0 {
			t.Errorf("%s: OOM %d is a shortage, yet %v served it: %s", name, k, f.ServedBy, r.Verdict)
		}
	}
	return reports, table
}

func malloc(id int64, size uint64) replay.Request {
	return replay.Request{Op: replay.OpMalloc, ID: id, Size: size}
}

func mallocIn(pool caching.PoolID, id int64, size uint64) replay.Request {
	return replay.Request{Op: replay.OpMalloc, ID: id, Size: size, Pool: pool}
}

func free(id int64) replay.Request { return replay.Request{Op: replay.OpFree, ID: id} }

// sixes are six 6 MiB tensors in two 20 MiB segments, a, c, d and f freed:
// 28 MiB cached in four holes (two of 6 MiB, two of 8 MiB), 40 MiB
// reserved.
func sixes() []replay.Request {
	var reqs []replay.Request
	for i := int64(1); i <= 6; i++ {
		reqs = append(reqs, malloc(i, 6*MiB))
	}
	return append(reqs, free(1), free(3), free(4), free(6))
}

// TestRuleAtItsBoundaries: made-up OOMs where the request fits the cached
// memory alone, the headroom alone (the device's free memory, or what a
// limit left), the two only together, or neither (a byte short, and
// exactly enough), under expandable segments, with the cached memory in a
// private pool, and under a limit the recording does not say (only its
// bounds). The kinds and figures are worked out by hand below; the verdict
// and the what-if's replay must both reach them.
func TestRuleAtItsBoundaries(t *testing.T) {
	expandable := func(last uint64) []replay.Request {
		// Ten 3 MiB tensors fill the 40 MiB device's two 20 MiB maps of
		// one expandable segment; every other one freed leaves five 3 MiB
		// holes and the 10 MiB at the end cached, 25 MiB, none mapped more.
		var reqs []replay.Request
		for i := int64(1); i <= 10; i++ {
			reqs = append(reqs, malloc(i, 3*MiB))
		}
		for i := int64(1); i <= 10; i += 2 {
			reqs = append(reqs, free(i))
		}
		return append(reqs, malloc(11, last))
	}
	for _, c := range []struct {
		name                       string
		run                        run
		kind                       string
		cached, headroom, limitLow uint64
		// threshold: the least limit that makes it fragmentation (KindEither).
		threshold uint64
	}{
		// Scenario D: 42 MiB cached, largest hole 8 MiB, the device full.
		{"cached alone", run{reqs: testkit.ScenarioD(), capacity: 60 * MiB}, KindFragmentation, 42 * MiB, 0, 0, 0},
		// 45 MiB takes a 46 MiB segment whole; 1.5 MiB asks for a 20 MiB
		// segment with 14 MiB free: nothing cached, the free memory holds it.
		{"headroom alone, the device's", run{reqs: []replay.Request{malloc(1, 45*MiB), malloc(2, 3*MiB/2)}, capacity: 60 * MiB},
			KindFragmentation, 0, 14 * MiB, 0, 0},
		// The same under a recorded 64 MiB limit of a 256 MiB device: 18 MiB
		// under the limit, 210 MiB free on the device.
		{"headroom alone, a recorded limit's", run{reqs: []replay.Request{malloc(1, 45*MiB), malloc(2, 3*MiB/2)}, capacity: 256 * MiB, limit: 64 * MiB, recorded: true},
			KindFragmentation, 0, 18 * MiB, 0, 0},
		// 30 MiB: 28 MiB cached and 20 MiB free, neither enough alone.
		{"both", run{reqs: append(sixes(), malloc(7, 30*MiB)), capacity: 60 * MiB}, KindFragmentation, 28 * MiB, 20 * MiB, 0, 0},
		{"both, exactly", run{reqs: append(sixes(), malloc(7, 48*MiB)), capacity: 60 * MiB}, KindFragmentation, 28 * MiB, 20 * MiB, 0, 0},
		{"neither, by 512 B", run{reqs: append(sixes(), malloc(7, 48*MiB+1)), capacity: 60 * MiB}, KindShortage, 28 * MiB, 20 * MiB, 0, 0},
		// Under a recorded 60 MiB limit of a 1 GiB device: the same room.
		{"both, a recorded limit's", run{reqs: append(sixes(), malloc(7, 30*MiB)), capacity: 1 << 30, limit: 60 * MiB, recorded: true},
			KindFragmentation, 28 * MiB, 20 * MiB, 0, 0},
		{"neither, a recorded limit's", run{reqs: append(sixes(), malloc(7, 50*MiB)), capacity: 1 << 30, limit: 60 * MiB, recorded: true},
			KindShortage, 28 * MiB, 20 * MiB, 0, 0},
		{"expandable segments, exactly", run{reqs: expandable(25 * MiB), capacity: 40 * MiB, conf: "expandable_segments:True"}, KindFragmentation, 25 * MiB, 0, 0, 0},
		{"expandable segments, by 512 B", run{reqs: expandable(25*MiB + 1), capacity: 40 * MiB, conf: "expandable_segments:True"}, KindShortage, 25 * MiB, 0, 0, 0},
		// 6 MiB tensors a, b, c in a private pool's 20 MiB segment, a and c
		// freed: 14 MiB cached there; 20 and 18 MiB in the default pool
		// leave 2 MiB free; 10 MiB asked in the default pool.
		{"cached in a private pool", run{reqs: []replay.Request{mallocIn(caching.PoolID{1, 0}, 1, 6*MiB), mallocIn(caching.PoolID{1, 0}, 2, 6*MiB),
			mallocIn(caching.PoolID{1, 0}, 3, 6*MiB), free(1), free(3), malloc(4, 20*MiB), malloc(5, 18*MiB), malloc(6, 10*MiB)}, capacity: 60 * MiB},
			KindFragmentation, 14 * MiB, 2 * MiB, 0, 0},
		// Under a 60 MiB limit a snapshot does not record: it was at least
		// the 40 MiB reserved, under 40 + 30 MiB asked. From 40 + 30 - 28 =
		// 42 MiB up it is fragmentation, below a shortage.
		{"a limit only bounded", run{reqs: append(sixes(), malloc(7, 30*MiB)), capacity: 1 << 30, limit: 60 * MiB},
			KindEither, 28 * MiB, 30*MiB - 1, 40 * MiB, 42 * MiB},
		// Scenario D under it: the cached memory alone holds the request,
		// whatever the limit.
		{"a limit only bounded, cached alone", run{reqs: testkit.ScenarioD(), capacity: 1 << 30, limit: 60 * MiB},
			KindFragmentation, 42 * MiB, 10*MiB - 1, 60 * MiB, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			reports, table := bothReadings(t, c.name, c.run.record(t))
			if len(reports) != 1 {
				t.Fatalf("%d OOMs", len(reports))
			}
			r := reports[0]
			if r.Kind != c.kind || r.Room.Cached != c.cached || r.Room.Headroom != c.headroom || r.Room.LimitLow != c.limitLow {
				t.Errorf("%s (cached %d, headroom %d, limit from %d to %d), want %s (%d, %d, from %d): %s", r.Kind, r.Room.Cached, r.Room.Headroom,
					r.Room.LimitLow, r.Room.Limit, c.kind, c.cached, c.headroom, c.limitLow, r.Verdict)
			}
			if c.kind == KindEither {
				// The run's own limit decides: it was 60 MiB, over the
				// threshold, so in truth fragmentation.
				truth := RoomOf(&gpu.Layout{}, r.Room.Need, r.Room.DeviceFree, c.run.limit, 0)
				truth.Reserved, truth.Cached = r.Room.Reserved, r.Room.Cached
				truth.Headroom = truth.headroomUnder(c.run.limit)
				if r.Room.Threshold() != c.threshold || truth.Kind() != KindFragmentation ||
					!strings.Contains(r.Verdict, "From a limit of "+gpu.FormatBytes(c.threshold)+" up") {
					t.Errorf("threshold %d, want %d; under the run's limit %s: %s", r.Room.Threshold(), c.threshold, truth.Kind(), r.Verdict)
				}
			}
			f, _ := table.ForOOM(0)
			t.Logf("%s\n%s", r.Verdict, f.Fix)
		})
	}
}

// TestRuleOnEveryRealRecording runs the rule on every OOM of every real
// recording in shared/testdata, and on recordings derived from them where
// the real allocator's own figures give the truth: the verdict and the
// what-if agree on each; the 2.11 fragmenting stream's limit, which its
// .json gives (oom.limit), lies within the bounds the verdict infers, and
// the kind under it is the verdict's.
func TestRuleOnEveryRealRecording(t *testing.T) {
	seen := 0
	for _, set := range []string{"pytorch", "pytorch-2.11"} {
		dir := filepath.Dir(testkit.SnapshotOf(t, set, "PROVENANCE.md"))
		files, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			name := f.Name()
			if !strings.HasSuffix(name, ".pickle") && !strings.HasSuffix(name, ".pkl") && !strings.HasSuffix(name, ".json") || name == "big.json" ||
				set == "pytorch-2.11" && strings.HasSuffix(name, ".json") {
				continue // the .json of the 2.11 set are their runs' figures, not snapshots
			}
			traces, err := pytorch.DecodeFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			for _, tr := range traces {
				if tr.OOMs() == 0 {
					continue
				}
				reports, _ := bothReadings(t, fmt.Sprintf("%s device %d", name, tr.Device), tr.Recording())
				seen += len(reports)
				for _, r := range reports {
					t.Logf("%s device %d: %s: %s", name, tr.Device, r.Kind, r.Verdict)
				}
			}
		}
	}
	// big.pickle.gz (a 300-step run with no OOM) is left out: decoding
	// its 82 MB takes longer than the rest, and it has no OOM to read.
	if seen < 3 {
		t.Errorf("%d OOMs read in the real recordings, want the 3 they hold at least", seen)
	}

	// frag_default_oom.pickle ran under a 5,297,405,952 B limit (its .json).
	traces, err := pytorch.DecodeFile(testkit.SnapshotOf(t, "pytorch-2.11", "frag_default_oom.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	reports, _ := bothReadings(t, "frag_default_oom.pickle", traces[0].Recording())
	const realLimit = 5297405952
	r := reports[0]
	if r.Room.LimitLow > realLimit || r.Room.Limit < realLimit || r.Room.Reserved != 5005901824 {
		t.Errorf("limit from %d to %d, reserved %d: want the real %d within, and PyTorch's reserved_bytes 5,005,901,824", r.Room.LimitLow, r.Room.Limit, r.Room.Reserved, realLimit)
	}
	truth := r.Room
	truth.Headroom, truth.LimitLow = truth.headroomUnder(realLimit), 0
	if truth.Kind() != r.Kind || r.Kind != KindFragmentation {
		t.Errorf("under the real limit %s, the verdict %s: %s", truth.Kind(), r.Kind, r.Verdict)
	}

	// train_default.pickle's stream run again under per-process limits a
	// snapshot does not record, as record.py's jobs die at their first OOM:
	// at 6,715,080,704 B (2 MiB under what it needs, train_default.json)
	// the 1000 MiB logits find 812.59 MiB cached and 998 MiB under the
	// limit, fragmentation; at 3 GiB 26.31 MiB cached and about 700 MiB, a
	// shortage. The recording bounds the limit only: the verdict says from
	// which limit up it is fragmentation, and each real limit falls on its
	// side.
	s, err := derive.Stream(testkit.SnapshotOf(t, "pytorch-2.11", "train_default.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		limit uint64
		truth string
	}{{6715080704, KindFragmentation}, {3 << 30, KindShortage}} {
		b, err := derive.UntilOOM(s, derive.Run{Device: h200, Limit: c.limit})
		if err != nil {
			t.Fatal(err)
		}
		traces, err := pytorch.Decode(strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		reports, table := bothReadings(t, fmt.Sprint("train under ", c.limit), traces[0].Recording())
		r := reports[0]
		truth := r.Room
		truth.Headroom, truth.LimitLow = truth.headroomUnder(c.limit), 0
		above := c.limit >= r.Room.Threshold()
		if truth.Kind() != c.truth || r.Kind != KindEither || above != (c.truth == KindFragmentation) || r.Room.Need != 1000*MiB {
			t.Errorf("under %d: truth %s, verdict %s, threshold %d: %s", c.limit, truth.Kind(), r.Kind, r.Room.Threshold(), r.Verdict)
		}
		if c.truth == KindFragmentation && (r.Room.Cached != 852067328 || r.Room.Largest != 742916096) {
			t.Errorf("cached %d, largest %d: the issue's 812.59 MiB and 708.5 MiB", r.Room.Cached, r.Room.Largest)
		}
		f, _ := table.ForOOM(0)
		if c.truth == KindFragmentation && !slices.Contains(f.ServedBy, "expandable_segments:True") {
			t.Errorf("expandable segments do not serve it: %+v", f)
		}
		t.Logf("%s\n%s", r.Verdict, f.Fix)
	}
}

// h200 is the memory of the H200 the 2.11 recordings were made on.
const h200 = 150109880320

// TestDeviceAsTheRecordingKnowsIt: what this allocator reserved and what
// the device had free at the OOM, and the rest of a device whose size is
// recorded, held outside the allocator; a snapshot's device size is not
// made up from the two.
func TestDeviceAsTheRecordingKnowsIt(t *testing.T) {
	// Another library holds all but 60 MiB of the H200: the allocator
	// sees a 60 MiB device.
	rec := run{reqs: append(sixes(), malloc(7, 50*MiB)), capacity: 60 * MiB}.record(t)
	l, oom := atFirstOOM(t, gpu.NewLayout(gpu.DefaultRules()), rec.Events)
	r := Analyze(l, oom, Device{Capacity: h200})
	if r.Outside != h200-60*MiB || r.Device != "This allocator had reserved 40.00 MiB and the device had 20.00 MiB free at the OOM; "+
		"the rest of the 139.80 GiB device, 139.74 GiB, was held outside this allocator (the CUDA context, another process or library)." {
		t.Errorf("outside %d: %q", r.Outside, r.Device)
	}
	r = Analyze(l, oom, Device{})
	if r.Capacity != 0 || r.Outside != 0 || !strings.HasSuffix(r.Device, "The recording does not say the device's size: whatever it has beyond these 60.00 MiB "+
		"was held outside this allocator (the CUDA context, another process or library).") {
		t.Errorf("capacity %d, outside %d: %q", r.Capacity, r.Outside, r.Device)
	}
}
