package gpu

import "time"

// The records every room shares about stored traces: what a trace is, its
// incidents and its allocations. The store keeps them; the server, the web
// pages, live watching and the CLI show them.

// TraceSource says where a trace came from.
type TraceSource string

const (
	SourceTrace    TraceSource = "trace"
	SourceSnapshot TraceSource = "snapshot"
	SourceLive     TraceSource = "live"
	SourceReplay   TraceSource = "replay"
	// SourceEstimate: a script's requests estimated on a CPU (CUDA stood
	// in for) and run through the allocator; not recorded.
	SourceEstimate TraceSource = "estimate"
)

// EstimateNote is what every page and command says where the figures of
// an estimate appear.
const EstimateNote = "estimated on a CPU, not recorded"

// TraceStatus is a trace's state: live while a writer appends to it,
// complete or failed once closed, incomplete when its writer went away
// without closing.
type TraceStatus string

const (
	StatusLive       TraceStatus = "live"
	StatusComplete   TraceStatus = "complete"
	StatusIncomplete TraceStatus = "incomplete"
	StatusFailed     TraceStatus = "failed"
)

// TraceMeta is what the creator of a trace says about it.
type TraceMeta struct {
	Name          string      `json:"name"`
	Source        TraceSource `json:"source"`
	DeviceOrdinal int         `json:"device_ordinal"`
	DeviceName    string      `json:"device_name"`
	Capacity      uint64      `json:"capacity_bytes"`
	Settings      string      `json:"allocator_settings"` // PYTORCH_CUDA_ALLOC_CONF style
	// Upload names the upload (or recording) the trace came from: the
	// devices of one snapshot share it; "" for a trace on its own.
	Upload string `json:"upload,omitempty"`
	// NoTime: the source recorded no times, and TimeUS is the event's index.
	NoTime bool `json:"no_time,omitempty"`
}

// Upload is one snapshot file or one recorded run, which gave one trace
// per device, and what it said about all of them.
type Upload struct {
	ID      string    `json:"id"`
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	// Settings is allocator_settings as written, as JSON in the file's
	// key order; empty when the snapshot had none.
	Settings string `json:"allocator_settings,omitempty"`
	// Top is the rest of a snapshot's top level (its key order, the
	// length of device_traces, keys vramscope does not know), as JSON
	// that package pytorch reads.
	Top string `json:"-"`
	// Run is the run this upload is a rank of ("" for none), and Rank
	// that rank.
	Run  string `json:"run,omitempty"`
	Rank int    `json:"rank"`
}

// Annotation marks a moment of a trace: a PyTorch external_annotations
// entry (a record_function or dynamo region starting or ending) or a
// workload's step.
type Annotation struct {
	Device int    `json:"device"`
	TimeUS int64  `json:"time_us"`
	Stage  string `json:"stage"` // START or END
	Name   string `json:"name"`
	// Form is how a snapshot wrote the entry beyond these fields, as JSON
	// (package pytorch); empty as PyTorch writes it.
	Form string `json:"form,omitempty"`
}

// Annotator takes a trace's annotations; the store's writer is one.
type Annotator interface {
	Annotate(...Annotation)
}

// EventExtra is what a recorded event said beyond Event: a PyTorch trace
// entry's compile_context and user_metadata, an action Event does not name
// (annotate), and how the entry was written (Form, JSON for package
// pytorch). Events that say the same share one.
type EventExtra struct {
	Action         string `json:"action,omitempty"`
	CompileContext string `json:"compile_context,omitempty"`
	UserMetadata   string `json:"user_metadata,omitempty"`
	Form           string `json:"form,omitempty"`
}

// ExtraRun says that the events from Seq on, up to the next run, have the
// extra numbered Extra (from 1; 0 is none).
type ExtraRun struct {
	Seq   int64
	Extra uint32
}

// SnapshotSegment is a segment of a snapshot as the file wrote it: its
// place in the file, its blocks as they were (free blocks keep the size
// last requested from them, which no replay of events gives back), its
// private pool, the stack it was allocated under, and how its dict and
// its blocks' dicts were written (JSON for package pytorch).
type SnapshotSegment struct {
	Index      int
	Segment    Segment
	PoolID     [2]int64
	Stack      StackID
	Form       string
	BlockForms []string // one per block, "" as PyTorch writes it; nil when all are
}

// Trace is a stored trace: its metadata and what the store counted.
type Trace struct {
	ID string `json:"id"`
	TraceMeta
	Status        TraceStatus `json:"status"`
	Events        int64       `json:"events"`
	FirstSeq      int64       `json:"first_seq"` // -1 when there are no events
	LastSeq       int64       `json:"last_seq"`
	FirstUS       int64       `json:"first_us"`
	LastUS        int64       `json:"last_us"`
	PeakReserved  uint64      `json:"peak_reserved_bytes"`
	PeakAllocated uint64      `json:"peak_allocated_bytes"`
	PeakActive    uint64      `json:"peak_active_bytes"`
	OOMs          int64       `json:"oom_count"`
	// PeakSeq and PeakUS are the first event after which allocated bytes
	// stood at PeakAllocated (-1: none, or a trace stored before this was kept).
	PeakSeq int64     `json:"peak_seq"`
	PeakUS  int64     `json:"peak_us"`
	Created time.Time `json:"created"`
	Rules   Rules     `json:"-"`
	// Dropped: the events of the recording left out when it was stored.
	Dropped *Dropped `json:"dropped,omitempty"`
}

// Dropped says which events of a recording were left out when it was
// stored because they contradict its own segments: how many, and the
// first few with why; and, for a live trace, the job's entries that never
// reached the server (Lost, in Gaps).
type Dropped struct {
	Count int            `json:"count"`
	First []DroppedEvent `json:"first"`
	// Lost counts the job's entries known to be lost between two reads
	// of its ring (overwritten before they were read, or cleared); a gap
	// whose count is unknown adds nothing here and says so itself.
	Lost int64 `json:"lost,omitempty"`
	// GapCount counts the gaps; Gaps names the first MaxGapsShown.
	GapCount int   `json:"gap_count,omitempty"`
	Gaps     []Gap `json:"gaps,omitempty"`
	// Filled counts the events the server stood in for lost ones with:
	// those that bring its state to the job's at each gap.
	Filled int64 `json:"filled,omitempty"`
	// Whole are the reads of a live trace that hold every entry the job
	// made between them and the read before (asked for by a user: the
	// next N steps whole), the first MaxWholeShown.
	Whole []WholeRead `json:"whole,omitempty"`
}

// WholeRead is a read of a live trace holding every entry the job made
// since the one before it: events FirstSeq to LastSeq, made from FirstUS
// to LastUS. Entries lost before it were made at or before FirstUS, those
// lost after it at or after LastUS: a step that begins after FirstUS and
// ends before LastUS lost none. Asked is how many steps the user asked
// for.
type WholeRead struct {
	FirstSeq int64 `json:"first_seq"`
	LastSeq  int64 `json:"last_seq"`
	FirstUS  int64 `json:"first_us"`
	LastUS   int64 `json:"last_us"`
	Asked    int   `json:"asked"`
}

// MaxWholeShown is how many reads whole Dropped.Whole names.
const MaxWholeShown = 1000

// Holds says whether a span of time [t0, t1] lies strictly inside the read:
// no entry made in it was lost.
func (r WholeRead) Holds(t0, t1 int64) bool { return r.FirstUS < t0 && t1 < r.LastUS }

// Gap is where a live trace lost entries of the job: between event
// AfterSeq (-1: before the first) and event Seq. Lost is how many (-1:
// unknown, at least one); Filled events, numbered from AfterSeq+1, bring
// the state to the job's as it was before event Seq.
type Gap struct {
	AfterSeq int64 `json:"after_seq"`
	Seq      int64 `json:"seq"`
	TimeUS   int64 `json:"time_us"`
	Lost     int64 `json:"lost"`
	Filled   int64 `json:"filled"`
}

// MaxGapsShown is how many gaps Dropped.Gaps names.
const MaxGapsShown = 20

// AddGap records g.
func (d *Dropped) AddGap(g Gap) {
	d.GapCount++
	if g.Lost > 0 {
		d.Lost += g.Lost
	}
	d.Filled += g.Filled
	if len(d.Gaps) < MaxGapsShown {
		d.Gaps = append(d.Gaps, g)
	}
}

// DroppedEvent is one event left out: its index in the recording.
type DroppedEvent struct {
	Seq    int64  `json:"seq"`
	Reason string `json:"reason"`
}

// MaxDroppedShown is how many dropped events Dropped.First names.
const MaxDroppedShown = 10

// Title is what a trace is called: its name, or its id when it has none.
func (t Trace) Title() string {
	if t.Name == "" {
		return t.ID
	}
	return t.Name
}

// Incident is an oom event of a trace, numbered from 1.
type Incident struct {
	N          int     `json:"n"`
	Seq        int64   `json:"seq"`
	TimeUS     int64   `json:"time_us"`
	Size       uint64  `json:"size"` // the rounded request
	DeviceFree uint64  `json:"device_free"`
	Stream     int64   `json:"stream"`
	Stack      StackID `json:"stack"`
}

// BeforeTraceUS is Allocation.AllocUS for blocks allocated before the trace
// began (their Seq is -1).
const BeforeTraceUS int64 = -1 << 61

// NeverFreedUS is Allocation.FreeUS for allocations still live.
const NeverFreedUS int64 = 1<<63 - 1

// Allocation is one allocation's interval: from its alloc event to the event
// that ended it (free_requested, or free_completed when none came first).
type Allocation struct {
	Seq       int64   `json:"seq"`      // the alloc event; -1: allocated before the trace
	FreeSeq   int64   `json:"free_seq"` // -1: still allocated
	Addr      uint64  `json:"address"`
	Size      uint64  `json:"size"` // the block's size
	Requested uint64  `json:"requested_size"`
	Stream    int64   `json:"stream"`
	AllocUS   int64   `json:"alloc_us"` // BeforeTraceUS when Seq is -1
	FreeUS    int64   `json:"free_us"`  // NeverFreedUS while allocated
	Stack     StackID `json:"stack,omitempty"`
}

// Recording is an event stream with what is needed to run it again: the
// layout before its first event, the allocator settings it ran under, its
// device: ordinal and capacity (0 when the recording does not say), the
// stacks its blocks and events refer to, and its annotations (steps and
// phases), which a replay keeps.
type Recording struct {
	Initial  *Layout
	Events   []Event
	Settings string
	Device   int
	Capacity uint64
	// Pools are the private pools (a graph capture's, a MemPool's) of
	// the final layout's segments, by address; those of the default pools
	// are left out.
	Pools map[uint64][2]int64
	// Stacks are distinct: StackID i is Stacks[i-1].
	Stacks      []Stack
	Annotations []Annotation
	// Estimated: the events were not recorded but estimated on a CPU
	// (a script run with CUDA stood in for, its requests run through the
	// allocator); Capacity is then the device it was estimated for, less
	// what lies outside the allocator.
	Estimated bool
}
