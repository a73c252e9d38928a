package live

import (
	"bytes"
	"fmt"

	"vramscope/gpu"
	"vramscope/pytorch"
)

// clientSeq is stored sequence number seq as the client numbers it: less
// the events the server made to fill gaps. The caller holds s.mu or is
// the reader.
func (s *ingestConn) clientSeq(seq int64) int64 {
	if seq < 0 {
		return seq
	}
	return max(seq-s.off, -1)
}

// readPoll turns the poll in s.msg into the events, stacks and
// annotations store takes: the job's entries numbered as stored, after the
// events that fill a gap before them when the server's state is not the
// one the job's snapshot had before them.
func (s *ingestConn) readPoll() error {
	p := s.msg.poll
	traces, err := pytorch.DecodeWith(bytes.NewReader(p.Pickle), pytorch.Options{MaxBytes: int64(len(p.Pickle))})
	if err != nil {
		return fmt.Errorf("poll at entry %d: %w", p.Seq, err)
	}
	var tr *pytorch.Trace
	for _, t := range traces {
		if t.Device == s.device {
			tr = t
		}
	}
	s.mu.Lock()
	st, fresh, last := s.state, s.fresh, s.clientSeq(s.state.Seq)
	s.mu.Unlock()
	cur := s.w.Layout()
	var entries []gpu.Event
	before := gpu.NewLayout(cur.Rules) // the device has no segments and no entries in the poll
	if tr != nil {
		entries, before = tr.Events, tr.Initial
	}
	n := int64(0)
	if len(entries) > 0 {
		n = entries[len(entries)-1].Seq + 1
	}
	switch {
	case n > 0 && p.Seq+n-1 <= last && !fresh:
		s.pollAnnotations(p, tr)
		return nil // sent again after a reconnect: stored already
	case p.Seq != last+1 && !fresh:
		return fmt.Errorf("poll at entry %d: the trace has entries up to %d; a poll goes on from there", p.Seq, last)
	case p.Seq < 0:
		return fmt.Errorf("poll at entry %d: entries are numbered from 0", p.Seq)
	}
	// The stored numbers of the poll: fresh, the first is the client's.
	next := st.Seq + 1
	if fresh {
		next = p.Seq + s.off
	}
	if p.Lost != 0 || !cur.Same(before) {
		fill, err := cur.EventsTo(before)
		if err != nil {
			return fmt.Errorf("poll at entry %d: entries were lost before it, and the state the job had there cannot be reached: %v", p.Seq, err)
		}
		us := st.LastUS
		if len(entries) > 0 {
			us = max(us, entries[0].TimeUS)
		}
		for i := range fill {
			fill[i].Seq, fill[i].TimeUS = next+int64(i), us
			if tr != nil {
				fill[i].Stack = s.w.Stack(tr.Stack(fill[i].Stack))
			}
		}
		lost := p.Lost
		if lost == 0 {
			lost = -1 // the client did not know; the state says some were
		}
		k := int64(len(fill))
		s.w.EmitGap(gpu.Gap{AfterSeq: next - 1, Seq: next + k, TimeUS: us, Lost: lost, Filled: k}, fill)
		if err := s.w.Err(); err != nil {
			return err
		}
		s.mu.Lock()
		s.off += k
		s.state.Gaps++
		s.state.Lost += max(lost, 0)
		if k > 0 {
			if s.state.Events == 0 {
				s.state.FirstUS = us
			}
			s.state.Seq, s.state.Events, s.state.LastUS = next+k-1, s.state.Events+k, max(s.state.LastUS, us)
			s.fresh = false
		}
		s.mu.Unlock()
		next += k
	}
	// Entries the decoder left out (they contradict the job's own
	// segments) keep their numbers, as events store skips.
	k := int64(0)
	for _, e := range entries {
		for ; k < e.Seq; k++ {
			s.msg.events = append(s.msg.events, gpu.Event{Seq: next + k, Action: gpu.ActionNone})
		}
		e.Seq = next + k
		k++
		s.msg.events = append(s.msg.events, e)
	}
	if p.Whole > 0 && len(entries) > 0 {
		s.wholeRead(next, k, entries, p.Whole)
	}
	if tr != nil && len(tr.Dropped) > 0 {
		d := s.w.Dropped()
		if d == nil {
			d = &gpu.Dropped{}
		}
		for _, x := range tr.Dropped {
			d.Count++
			if len(d.First) < gpu.MaxDroppedShown {
				d.First = append(d.First, gpu.DroppedEvent{Seq: next + x.Seq, Reason: x.Reason})
			}
		}
		s.w.SetDropped(*d)
	}
	// Every event with a stack names it by its frames (the writer interns
	// them), as a text message's own frames do.
	if tr != nil {
		s.msg.frames = make([]gpu.Stack, len(s.msg.events))
		for i, e := range s.msg.events {
			s.msg.frames[i] = tr.Stack(e.Stack)
			s.msg.events[i].Stack = 0
		}
	}
	s.pollAnnotations(p, tr)
	return nil
}

// wholeRead records that the poll's k entries, stored from seq next on,
// are every entry the job made since its read before: the steps within
// are complete. The steps asked for are then read.
func (s *ingestConn) wholeRead(next, k int64, entries []gpu.Event, asked int64) {
	d := s.w.Dropped()
	if d == nil {
		d = &gpu.Dropped{}
	}
	if len(d.Whole) < gpu.MaxWholeShown {
		d.Whole = append(d.Whole, gpu.WholeRead{FirstSeq: next, LastSeq: next + k - 1,
			FirstUS: entries[0].TimeUS, LastUS: entries[len(entries)-1].TimeUS, Asked: int(asked)})
	}
	s.w.SetDropped(*d)
	s.mu.Lock()
	s.state.Whole++
	s.state.Asked = 0
	s.mu.Unlock()
}

// pollAnnotations queues the poll's annotations the trace lacks: they are
// numbered from p.Ann, and the trace has s.anns.
func (s *ingestConn) pollAnnotations(p *Poll, tr *pytorch.Trace) {
	if tr == nil {
		return
	}
	s.mu.Lock()
	have := s.anns
	s.mu.Unlock()
	for i, a := range tr.Annotations() {
		if p.Ann+int64(i) >= have {
			s.msg.anns = append(s.msg.anns, gpu.Annotation{TimeUS: a.TimeUS, Stage: a.Stage, Name: a.Name})
		}
	}
}
