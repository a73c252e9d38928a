package pytorch

import (
	"errors"
	"fmt"

	"vramscope/gpu"
)

// deriveInitial finds the initial layout by undoing the events from the final
// one, last to first, then applies them forward from it to learn each
// event's block size. An event that does not fit is recorded in
// Mismatches and Dropped and left out of Events, so what is stored replays cleanly;
// the rest carry on. It stops with canceled's error when that has one
// (looked at every checkEvery events).
func (t *Trace) deriveInitial(canceled func() error) error {
	l := t.Final.Clone()
	undone := make(map[int64]int) // seq: its mismatch's index
	for i := len(t.Events) - 1; i >= 0; i-- {
		if i%checkEvery == 0 {
			if err := canceled(); err != nil {
				return err
			}
		}
		if err := l.Undo(t.Events[i]); err != nil {
			t.mismatch(t.Events[i], "undo", err)
			undone[t.Events[i].Seq] = len(t.Mismatches) - 1
		}
	}
	t.Initial = l.Clone()
	dropped := map[int]bool{}
	for i := range t.Events {
		if i%checkEvery == 0 {
			if err := canceled(); err != nil {
				return err
			}
		}
		e := &t.Events[i]
		if e.Action == gpu.ActionFreeRequested || e.Action == gpu.ActionFreeCompleted {
			if b := l.BlockAt(e.Addr); b != nil && b.Addr == e.Addr {
				e.BlockSize = b.Size
			}
		}
		err := l.Apply(*e)
		if err != nil {
			m, ok := undone[e.Seq]
			if !ok {
				t.mismatch(*e, "replay", err)
				m = len(t.Mismatches) - 1
			}
			t.Dropped = append(t.Dropped, gpu.DroppedEvent{Seq: e.Seq, Reason: t.Mismatches[m].Reason})
			dropped[i] = true
			continue
		}
		if e.Action == gpu.ActionAlloc {
			if b := l.BlockAt(e.Addr); b != nil {
				e.BlockSize = b.Size
			}
		}
	}
	t.adoptSeqs(l)
	t.drop(dropped)
	return nil
}

// drop removes the events at the given indexes (they keep their Seq, so
// Mismatches still name them).
func (t *Trace) drop(idx map[int]bool) {
	if len(idx) == 0 {
		return
	}
	kept := t.Events[:0]
	var extra []uint32
	for i, e := range t.Events {
		if idx[i] {
			continue
		}
		kept = append(kept, e)
		if t.ExtraOf != nil {
			extra = append(extra, t.ExtraOf[i])
		}
	}
	t.Events = kept
	if t.ExtraOf != nil {
		t.ExtraOf = extra
	}
}

func (t *Trace) mismatch(e gpu.Event, pass string, err error) {
	var me *gpu.MismatchError
	if errors.As(err, &me) {
		t.Mismatches = append(t.Mismatches, gpu.MismatchError{Event: me.Event, Reason: pass + ": " + me.Reason})
		return
	}
	t.Mismatches = append(t.Mismatches, gpu.MismatchError{Event: e, Reason: pass + ": " + err.Error()})
}

// adoptSeqs copies, from the replayed layout, which event allocated each
// live block of the final layout, and records the first place where the
// replay ended apart from the snapshot.
func (t *Trace) adoptSeqs(replayed *gpu.Layout) {
	differ := ""
	if len(replayed.Segments) != len(t.Final.Segments) {
		differ = fmt.Sprintf("%d segments after the replay, %d in the snapshot", len(replayed.Segments), len(t.Final.Segments))
	}
	for i := range t.Final.Segments {
		s := &t.Final.Segments[i]
		for j := range s.Blocks {
			b := &s.Blocks[j]
			r := replayed.BlockAt(b.Addr)
			if r == nil || r.Addr != b.Addr || r.Size != b.Size || r.State != b.State {
				if differ == "" {
					differ = fmt.Sprintf("the block at %#x differs after the replay", b.Addr)
				}
				continue
			}
			if b.State != gpu.BlockFree {
				b.Seq = r.Seq
			}
		}
	}
	if differ != "" && len(t.Events) > 0 {
		t.Mismatches = append(t.Mismatches, gpu.MismatchError{
			Event:  gpu.Event{Seq: int64(len(t.Events))},
			Reason: fmt.Sprintf("end of trace (after event %d): %s", len(t.Events)-1, differ),
		})
	}
}
