// Package live streams a running job's allocator events to the server and
// from there to every open page of that trace, as they happen. wire.go is
// the protocol both sides speak (below); client.go is the sending side in
// Go (python/ holds the same for PyTorch jobs); hub*.go is the server side:
// the hub, its ingest connections and its viewers.
//
// Ingest (GET /ws/ingest, a websocket; "Authorization: Bearer TOKEN" when the
// server has a token). The client's first message is a text hello:
//
//	{"type":"hello","trace":"","meta":{...gpu.TraceMeta},"snapshot":{...},
//	 "run":{"name":"job-42","rank":3,"world_size":8}}
//
// An empty trace starts a new live trace (meta names it; snapshot, optional,
// is a PyTorch snapshot in JSON form whose segments are the state before the
// first event; run, optional, makes it a rank of a run, see RunJoin); a
// trace id resumes that trace after a dropped connection.
// The server answers {"type":"ready","trace":ID,"seq":S,"url":"/traces/ID"}:
// S is the last stored sequence number (-1 for none) and the client sends
// the events after it. Events then come as text messages
//
//	{"type":"events","stacks":{"1":[frames]},"events":[{"seq":0,"time_us":..,
//	 "action":"alloc","addr":..,"size":..,"stream":..,"stack":1}, ...]}
//
// (the events are PyTorch trace entries plus "seq"; an entry may carry its
// own "frames" instead of a "stack") or as binary messages in the compact
// form of AppendBatch, or as polls (AppendPoll): what a PyTorch job's
// helper read of its ring at once, as the pickle PyTorch's own snapshot
// makes, so that the job spends no time converting entries. A poll's
// segments are the job's state after its entries; when the state the
// server has before them is not the job's (entries were lost between two
// reads: the ring was overwritten, or cleared, before they were read), the
// server records a gap there, how many entries it lost (as the poll says;
// unknown when it does not know) and fills it with the events that bring
// its state to the job's. Those take sequence numbers of their own: the
// numbers the client sends, acks and ready count only its entries. A
// poll that reads whole (version 3, Poll.Whole) holds every entry the job
// made since the ring was last cleared: the steps within it are complete
// (see RequestComplete below). A text events message may also carry the job's
// annotations (its steps and phases, as a snapshot's
// external_annotations), "annotations":[{"time_us":..,"stage":"START"|"END",
// "name":..}], numbered in the order sent from 0: "ready" and every "ack"
// say how many the server has ("annotations":A, absent for none), and after
// a reconnect the client sends those after them. Stack ids are the client's own and hold for one
// connection: after a reconnect the client defines them again. Sequence
// numbers are not negative and must follow one another without gaps; events
// at or below the last stored one are dropped, so a resend after a reconnect
// never duplicates.
// The server answers {"type":"ack","seq":N,"annotations":A} whenever
// events up to N (and A annotations) are committed, ends with {"type":"done","seq":N} after the client's
// {"type":"end","status":"complete"|"failed"}, and sends
// {"type":"error","error":"..."} before closing on anything it refuses.
// A client that reads a sample of the job's entries says so in its hello
// ("sampled":true); the server may then ask it, for a user, to read every
// entry of the next N steps: {"type":"complete","steps":N}. It answers in
// time with a poll that reads whole.
// A connection that drops leaves the trace incomplete, ready to resume; a
// hello resuming a trace that was ended (complete or failed) is answered
// with its done, so a client whose done was lost learns its end was stored.
//
// Viewers (GET /ws/traces/{id}) get text messages
//
//	{"type":"tail","trace":ID,"status":"live","seq":N,"events":E,
//	 "first_us":..,"last_us":..,"rate":R,"coalesced":C,"sent_ms":..,
//	 "gaps":G,"lost":L,"sampled":true,"asked":N,"whole":W}
//
// each of which says everything a page needs to follow the tail (it then
// fetches what it shows through the JSON API), so a newer one replaces an
// older one unread: a viewer's queue is one slot, and C counts the updates
// folded into the one sent. The server sends one message per credit: the
// first comes with the connection, and the viewer sends {"type":"more"} when
// it is ready for the next, so a slow page gets fewer, fresher updates and
// never holds up ingest or other viewers. sampled says the stream reads a
// sample of the job's entries (steps can be asked for whole), asked how
// many steps a user asked for whole that are not read yet, whole how many
// reads whole the trace has.
package live

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/gorilla/websocket"

	"vramscope/gpu"
)

// hello is the ingest client's first message.
type hello struct {
	Type     string          `json:"type"`
	Trace    string          `json:"trace,omitempty"`
	Meta     gpu.TraceMeta   `json:"meta"`
	Snapshot json.RawMessage `json:"snapshot,omitempty"`
	Run      *RunJoin        `json:"run,omitempty"`
	// Sampled: the client reads a sample of the job's entries, and reads
	// the next N steps whole when asked to.
	Sampled bool `json:"sampled,omitempty"`
}

// RunJoin, in a hello that starts a trace, makes the trace rank Rank of
// the newest run named Name that has no such rank yet (a new run when
// none has): the ranks of one job each stream to the same run.
type RunJoin struct {
	Name      string `json:"name"`
	Rank      int    `json:"rank"`
	WorldSize int    `json:"world_size,omitempty"` // 0: unknown
}

// maxRank bounds what a hello may say of its run's ranks.
const maxRank = 1 << 20

// check refuses a run the hello cannot join, and trims its name.
func (r *RunJoin) check() error {
	name, err := gpu.CheckName(r.Name)
	switch {
	case err != nil:
		return fmt.Errorf("hello: run: name: %v", err)
	case name == "":
		return fmt.Errorf("hello: run: a name is needed")
	case r.Rank < 0 || r.Rank >= maxRank:
		return fmt.Errorf("hello: run: rank %d is not in [0, %d)", r.Rank, maxRank)
	case r.WorldSize < 0 || r.WorldSize > maxRank:
		return fmt.Errorf("hello: run: world size %d is not in [0, %d]", r.WorldSize, maxRank)
	case r.WorldSize > 0 && r.Rank >= r.WorldSize:
		return fmt.Errorf("hello: run: rank %d of a world of %d", r.Rank, r.WorldSize)
	}
	r.Name = name
	return nil
}

// reply is every message the server sends an ingest client.
type reply struct {
	Type        string `json:"type"`
	Trace       string `json:"trace,omitempty"`
	Seq         int64  `json:"seq"`
	Annotations int64  `json:"annotations,omitempty"` // how many the server has
	URL         string `json:"url,omitempty"`
	Error       string `json:"error,omitempty"`
	Steps       int    `json:"steps,omitempty"` // "complete": how many steps to read whole
}

// jsonEvent is a PyTorch trace entry plus its sequence number.
type jsonEvent struct {
	Seq        int64     `json:"seq"`
	TimeUS     int64     `json:"time_us"`
	Action     string    `json:"action"`
	Addr       uint64    `json:"addr"`
	Size       uint64    `json:"size"`
	Stream     int64     `json:"stream"`
	DeviceFree uint64    `json:"device_free"`
	Stack      uint64    `json:"stack"`
	Frames     gpu.Stack `json:"frames"`
}

// jsonAnnotation is an annotation as a snapshot's external_annotations
// write it, less the device (the trace's).
type jsonAnnotation struct {
	TimeUS int64  `json:"time_us"`
	Stage  string `json:"stage"`
	Name   string `json:"name"`
}

// jsonBatch is a text events message (and the text end message).
type jsonBatch struct {
	Type        string               `json:"type"`
	Stacks      map[string]gpu.Stack `json:"stacks,omitempty"`
	Events      []jsonEvent          `json:"events,omitempty"`
	Annotations []jsonAnnotation     `json:"annotations,omitempty"`
	Status      string               `json:"status,omitempty"`
}

// Tail is the message viewers get.
type Tail struct {
	Type      string          `json:"type"` // "tail"
	Trace     string          `json:"trace"`
	Status    gpu.TraceStatus `json:"status"`
	Seq       int64           `json:"seq"` // last event stored; -1 for none
	Events    int64           `json:"events"`
	FirstUS   int64           `json:"first_us"`
	LastUS    int64           `json:"last_us"`
	Rate      float64         `json:"rate"`      // events per second lately
	Coalesced int             `json:"coalesced"` // updates folded into this one
	SentMS    int64           `json:"sent_ms"`   // server clock, Unix ms
	// Gaps and Lost: where the job's entries were lost, and how many
	// were known lost (gpu.Dropped's GapCount and Lost).
	Gaps int   `json:"gaps,omitempty"`
	Lost int64 `json:"lost,omitempty"`
	// Sampled: the stream reads a sample of the job's entries; Asked:
	// steps a user asked for whole, not read yet; Whole: the reads whole
	// the trace has (gpu.Dropped's Whole).
	Sampled bool `json:"sampled,omitempty"`
	Asked   int  `json:"asked,omitempty"`
	Whole   int  `json:"whole,omitempty"`
}

// StackDef is a stack the client defines for the ids its events use.
type StackDef struct {
	ID     uint64
	Frames gpu.Stack
}

// batchVersion opens every binary batch.
const batchVersion = 1

// pollVersion opens every binary poll; pollWholeVersion one that reads
// whole.
const (
	pollVersion      = 2
	pollWholeVersion = 3
)

// Poll is one read of a PyTorch job's ring: its entries are numbered from
// Seq; Lost says how many entries the client knows were lost before them
// (0: none known, -1: some, how many unknown); its annotations are
// numbered from Ann; Pickle is a PyTorch snapshot (pickle protocol 2 to
// 5, or JSON) holding the entries, the annotations and the segments after
// them. Whole, when not 0, says the read holds every entry the job made
// since the ring was last cleared, and is how many steps were asked for.
type Poll struct {
	Seq    int64
	Lost   int64
	Ann    int64
	Whole  int64
	Pickle []byte
}

// maxWholeSteps bounds the steps a poll says were asked for whole.
const maxWholeSteps = 1 << 20

// AppendPoll appends p's binary form: the version byte (3 when it reads
// whole, else 2), uvarint Seq, varint Lost, uvarint Ann, uvarint Whole
// (version 3 only), then the pickle to the end of the message.
func AppendPoll(buf []byte, p Poll) []byte {
	v := byte(pollVersion)
	if p.Whole > 0 {
		v = pollWholeVersion
	}
	buf = append(buf, v)
	buf = binary.AppendUvarint(buf, uint64(p.Seq))
	buf = binary.AppendVarint(buf, p.Lost)
	buf = binary.AppendUvarint(buf, uint64(p.Ann))
	if p.Whole > 0 {
		buf = binary.AppendUvarint(buf, uint64(p.Whole))
	}
	return append(buf, p.Pickle...)
}

// ParsePoll decodes a binary poll; the pickle is not copied.
func ParsePoll(b []byte) (Poll, error) {
	r := byteReader{b: b}
	v := r.byte()
	if v != pollVersion && v != pollWholeVersion {
		return Poll{}, fmt.Errorf("binary poll version %d, want %d or %d", v, pollVersion, pollWholeVersion)
	}
	seq, lost, ann := r.uvarint(), r.varint(), r.uvarint()
	var whole uint64
	if v == pollWholeVersion {
		whole = r.uvarint()
	}
	if r.err != nil {
		return Poll{}, fmt.Errorf("binary poll at byte %d: %w", r.off, r.err)
	}
	if seq > 1<<62 || ann > 1<<62 || lost < -1 {
		return Poll{}, fmt.Errorf("binary poll: entry %d, annotation %d, %d lost: out of range", seq, ann, lost)
	}
	if v == pollWholeVersion && (whole == 0 || whole > maxWholeSteps) {
		return Poll{}, fmt.Errorf("binary poll read whole: %d steps asked for, not in [1, %d]", whole, maxWholeSteps)
	}
	return Poll{Seq: int64(seq), Lost: lost, Ann: int64(ann), Whole: int64(whole), Pickle: b[r.off:]}, nil
}

// AppendBatch appends the binary form of stacks and events to buf: a version
// byte, the stack definitions (uvarint id, uvarint length, JSON frames), then
// the events, each as varint deltas of seq and time from the previous one
// (from 0 for the first), the action and pool bytes, varint stream, and
// uvarints addr, size, device_free, block_size and stack.
func AppendBatch(buf []byte, stacks []StackDef, events []gpu.Event) []byte {
	buf = append(buf, batchVersion)
	buf = binary.AppendUvarint(buf, uint64(len(stacks)))
	for _, s := range stacks {
		b, _ := json.Marshal(s.Frames)
		buf = binary.AppendUvarint(buf, s.ID)
		buf = binary.AppendUvarint(buf, uint64(len(b)))
		buf = append(buf, b...)
	}
	buf = binary.AppendUvarint(buf, uint64(len(events)))
	var seq, us int64
	for i := range events {
		e := &events[i]
		buf = binary.AppendVarint(buf, e.Seq-seq)
		buf = binary.AppendVarint(buf, e.TimeUS-us)
		seq, us = e.Seq, e.TimeUS
		buf = append(buf, byte(e.Action), byte(e.Pool))
		buf = binary.AppendVarint(buf, e.Stream)
		buf = binary.AppendUvarint(buf, e.Addr)
		buf = binary.AppendUvarint(buf, e.Size)
		buf = binary.AppendUvarint(buf, e.DeviceFree)
		buf = binary.AppendUvarint(buf, e.BlockSize)
		buf = binary.AppendUvarint(buf, uint64(e.Stack))
	}
	return buf
}

var errShort = errors.New("batch ends early")

// ParseBatch decodes a binary batch, appending to stacks and events.
func ParseBatch(b []byte, stacks []StackDef, events []gpu.Event) ([]StackDef, []gpu.Event, error) {
	r := byteReader{b: b}
	if v := r.byte(); v != batchVersion {
		return stacks, events, fmt.Errorf("binary batch version %d, want %d", v, batchVersion)
	}
	ns := r.uvarint()
	if ns > uint64(len(b)) {
		return stacks, events, fmt.Errorf("binary batch: %d stacks in %d bytes", ns, len(b))
	}
	for i := uint64(0); i < ns && r.err == nil; i++ {
		id := r.uvarint()
		n := r.uvarint()
		raw := r.bytes(n)
		if r.err != nil {
			break
		}
		var s gpu.Stack
		if err := json.Unmarshal(raw, &s); err != nil {
			return stacks, events, fmt.Errorf("binary batch: stack %d: %v", id, err)
		}
		stacks = append(stacks, StackDef{id, s})
	}
	ne := r.uvarint()
	if ne > uint64(len(b)) {
		return stacks, events, fmt.Errorf("binary batch: %d events in %d bytes", ne, len(b))
	}
	var seq, us int64
	for i := uint64(0); i < ne && r.err == nil; i++ {
		seq += r.varint()
		us += r.varint()
		a, p := r.byte(), r.byte()
		if r.err != nil {
			break
		}
		// gpu.ActionNone, like an action a text batch names that this
		// version does not know, stores nothing and keeps its seq.
		if gpu.Action(a) > gpu.ActionOOM {
			return stacks, events, fmt.Errorf("binary batch: event %d: unknown action %d", seq, a)
		}
		if gpu.Pool(p) > gpu.PoolLarge {
			return stacks, events, fmt.Errorf("binary batch: event %d: unknown pool %d", seq, p)
		}
		e := gpu.Event{Seq: seq, TimeUS: us, Action: gpu.Action(a), Pool: gpu.Pool(p)}
		e.Stream = r.varint()
		e.Addr = r.uvarint()
		e.Size = r.uvarint()
		e.DeviceFree = r.uvarint()
		e.BlockSize = r.uvarint()
		st := r.uvarint()
		if st > 1<<32-1 {
			return stacks, events, fmt.Errorf("binary batch: event %d: stack id %d out of range", seq, st)
		}
		e.Stack = gpu.StackID(st)
		events = append(events, e)
	}
	if r.err != nil {
		return stacks, events, fmt.Errorf("binary batch at byte %d: %w", r.off, r.err)
	}
	if r.off != len(b) {
		return stacks, events, fmt.Errorf("binary batch: %d bytes left over", len(b)-r.off)
	}
	return stacks, events, nil
}

type byteReader struct {
	b   []byte
	off int
	err error
}

func (r *byteReader) byte() byte {
	if r.err != nil || r.off >= len(r.b) {
		r.err = errShort
		return 0
	}
	r.off++
	return r.b[r.off-1]
}

func (r *byteReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b[r.off:])
	if n <= 0 {
		r.err = errShort
		return 0
	}
	r.off += n
	return v
}

// varint undoes binary.AppendVarint's zig-zag encoding.
func (r *byteReader) varint() int64 {
	u := r.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

func (r *byteReader) bytes(n uint64) []byte {
	if r.err != nil || n > uint64(len(r.b)-r.off) {
		r.err = errShort
		return nil
	}
	r.off += int(n)
	return r.b[r.off-int(n) : r.off]
}

// message is one ingest message after the hello, decoded.
type message struct {
	end    bool // {"type":"end"}: status says how
	status gpu.TraceStatus
	defs   []StackDef
	events []gpu.Event
	frames []gpu.Stack // per event, its own frames; nil when no event has any
	anns   []gpu.Annotation
	poll   *Poll // a binary poll, still to be read (ingestConn.poll)
}

// decode reads a websocket message of type typ into m, reusing its
// buffers. What it costs follows from the message's size, which the
// connection caps.
func (m *message) decode(typ int, msg []byte) error {
	m.end, m.status = false, ""
	m.defs, m.events, m.frames, m.anns, m.poll = m.defs[:0], m.events[:0], nil, m.anns[:0], nil
	if typ == websocket.BinaryMessage && len(msg) > 0 && (msg[0] == pollVersion || msg[0] == pollWholeVersion) {
		p, err := ParsePoll(msg)
		m.poll = &p
		return err
	}
	if typ == websocket.BinaryMessage {
		var err error
		m.defs, m.events, err = ParseBatch(msg, m.defs, m.events)
		return err
	}
	var b jsonBatch
	if err := json.Unmarshal(msg, &b); err != nil {
		return fmt.Errorf("message: %v", err)
	}
	switch b.Type {
	case "end":
		switch st := gpu.TraceStatus(b.Status); st {
		case "", gpu.StatusComplete:
			m.end, m.status = true, gpu.StatusComplete
		case gpu.StatusFailed, gpu.StatusIncomplete:
			m.end, m.status = true, st
		default:
			return fmt.Errorf("end: status %q is not complete, failed or incomplete", b.Status)
		}
		return nil
	case "events":
	default:
		return fmt.Errorf("unknown message type %q", b.Type)
	}
	for k, frames := range b.Stacks {
		id, err := strconv.ParseUint(k, 10, 64)
		if err != nil || id == 0 {
			return fmt.Errorf("stacks: id %q is not a positive integer", k)
		}
		m.defs = append(m.defs, StackDef{id, frames})
	}
	for i := range b.Events {
		je := &b.Events[i]
		a, ok := gpu.ParseAction(je.Action)
		if !ok {
			// An action this version does not know (PyTorch adds some)
			// is skipped; its seq still counts.
			a = gpu.ActionNone
		}
		m.events = append(m.events, gpu.Event{Seq: je.Seq, TimeUS: je.TimeUS, Action: a, Addr: je.Addr, Size: je.Size,
			Stream: je.Stream, DeviceFree: je.DeviceFree, Stack: gpu.StackID(je.Stack)})
		if len(je.Frames) > 0 {
			if m.frames == nil {
				m.frames = make([]gpu.Stack, len(b.Events))
			}
			m.frames[i] = je.Frames
		}
	}
	for i, a := range b.Annotations {
		if a.Stage != "START" && a.Stage != "END" {
			return fmt.Errorf("annotations[%d] (%q): stage %q is neither START nor END", i, a.Name, a.Stage)
		}
		m.anns = append(m.anns, gpu.Annotation{TimeUS: a.TimeUS, Stage: a.Stage, Name: a.Name})
	}
	return nil
}

// keptEvents: buffers grown past this many events by a big message are
// let go after it, not held for the connection's life.
const keptEvents = 1 << 14

// release lets go of buffers a big message grew.
func (m *message) release() {
	if cap(m.events) > keptEvents {
		m.events = nil
	}
	if cap(m.defs) > keptEvents {
		m.defs = nil
	}
	if cap(m.anns) > keptEvents {
		m.anns = nil
	}
	m.frames = nil
}
