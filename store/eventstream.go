package store

import (
	"database/sql"
	"fmt"

	"vramscope/gpu"
)

// eventStream reads a trace's events in order, with the totals after
// each, and can be moved on to any event (a replay that goes on from a
// checkpoint). Chunks are read a page at a time, each page whole before
// any of its events is used: the caller may query the same transaction
// meanwhile, which PostgreSQL cannot while a query's rows are still
// coming. A page after a move is small (a dense window's sample reads a
// few chunks past a checkpoint) and pages double from there.
type eventStream struct {
	r      *reader
	end    int64 // the last event read
	page   []*chunk
	pi     int // the page's chunk being decoded
	pages  int // chunks the next page reads
	dec    decoder
	before gpu.Totals // before ev
	// ev is the next event, decoded (ready), with the totals after it.
	ev    gpu.Event
	ends  bool
	after gpu.Totals
	ready bool
	from  int64 // the first event of interest: those before are decoded, not given
	done  bool
	err   error
}

// seek moves s on to the first event with seq >= from.
func (s *eventStream) seek(from int64) {
	var first sql.NullInt64
	if s.err = s.r.tx.QueryRow("SELECT max(first_seq) FROM chunks WHERE tid = ? AND first_seq <= ?", s.r.tid, from).Scan(&first); s.err != nil {
		return
	}
	start := from
	if first.Valid {
		start = first.Int64
	}
	s.seekChunk(from, start, 2)
}

// seekChunk is seek where the chunk holding from is known to begin at
// start, reading pages chunks first; where that chunk is in the page read
// last, it decodes it again rather than read it.
func (s *eventStream) seekChunk(from, start int64, pages int) {
	if s.err == nil {
		for i, c := range s.page {
			if c.firstSeq == start {
				s.pi, s.ready, s.done, s.from = i, false, false, from
				s.open()
				return
			}
		}
	}
	s.page, s.pi, s.pages, s.ready, s.done, s.from = nil, 0, max(1, min(pages, chunkPageSize)), false, false, from
	s.dec = decoder{}
	s.read(start)
}

// read reads the next page, from the chunk starting at start.
func (s *eventStream) read(start int64) {
	s.page, s.pi = nil, 0
	if start > s.end {
		s.done = true
		return
	}
	rows, err := s.r.tx.Query("SELECT "+chunkCols+" FROM chunks WHERE tid = ? AND first_seq >= ? AND first_seq <= ? ORDER BY first_seq LIMIT ?",
		s.r.tid, start, s.end, s.pages)
	if err != nil {
		s.err = err
		return
	}
	defer rows.Close()
	for rows.Next() {
		c, err := scanChunk(rows)
		if err != nil {
			s.err = err
			return
		}
		s.page = append(s.page, c)
	}
	s.err = rows.Err()
	s.pages = min(2*s.pages, chunkPageSize)
	if len(s.page) == 0 {
		s.done = true
		return
	}
	s.open()
}

// open starts decoding the page's chunk pi.
func (s *eventStream) open() {
	c := s.page[s.pi]
	s.dec = decoder{buf: c.data, st: encState{seq: c.firstSeq - 1, us: c.firstUS}}
	s.before = c.before
}

// peek decodes the next event of interest into s.ev (s.after its totals)
// unless it is there already; false past the end or on an error (s.err).
func (s *eventStream) peek() bool {
	for !s.ready {
		if s.done || s.err != nil {
			return false
		}
		ends, ok := s.dec.next(&s.ev)
		if !ok {
			if s.dec.err != nil {
				s.err = fmt.Errorf("trace %s: chunk at seq %d: %w", s.r.trace.ID, s.page[s.pi].firstSeq, s.dec.err)
				return false
			}
			if s.pi++; s.pi < len(s.page) {
				s.open()
			} else {
				s.read(s.page[len(s.page)-1].firstSeq + 1)
			}
			continue
		}
		if s.ev.Seq > s.end {
			s.done = true
			return false
		}
		s.ends, s.after = ends, s.before
		s.after.Apply(&s.ev, ends)
		if s.ev.Seq < s.from {
			s.before = s.after
			continue
		}
		s.ready = true
	}
	return true
}

// take consumes the event peek decoded.
func (s *eventStream) take() {
	s.ready, s.before = false, s.after
}
