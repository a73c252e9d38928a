package gpu

import (
	"errors"
	"testing"
)

const mib = 1 << 20

// TestExpandableMapUnmap: mapped ranges join their neighbours, an unmap in
// the middle of a free block splits the segment in two, and undoing every
// event in reverse leads back to the empty layout.
func TestExpandableMapUnmap(t *testing.T) {
	base := uint64(0x7e0000000000)
	events := []Event{
		{Action: ActionSegmentMap, Addr: base, Size: 20 * mib, Pool: PoolLarge},
		{Action: ActionAlloc, Addr: base, Size: 6 * mib},
		{Action: ActionSegmentMap, Addr: base + 40*mib, Size: 20 * mib, Pool: PoolLarge},
		{Action: ActionSegmentMap, Addr: base + 20*mib, Size: 20 * mib, Pool: PoolLarge}, // joins both sides
		{Action: ActionAlloc, Addr: base + 6*mib, Size: 40 * mib},
		{Action: ActionFreeRequested, Addr: base + 6*mib, Size: 40 * mib},
		{Action: ActionFreeCompleted, Addr: base + 6*mib, Size: 40 * mib},
		{Action: ActionSegmentUnmap, Addr: base + 20*mib, Size: 20 * mib}, // splits the segment
	}
	l := NewLayout(Rules{MaxSplitSize: Unlimited, Expandable: true})
	var states []string
	for i := range events {
		events[i].Seq = int64(i)
		states = append(states, render(l))
		if err := l.Apply(events[i]); err != nil {
			t.Fatal(err)
		}
		if err := l.CheckTiling(); err != nil {
			t.Fatalf("after event %d: %v", i, err)
		}
	}
	if len(l.Segments) != 2 || l.Segments[0].Size != 20*mib || l.Segments[1].Addr != base+40*mib || l.Segments[1].Size != 20*mib {
		t.Fatalf("after unmap: %s", render(l))
	}
	if got := l.Segments[0].Blocks; len(got) != 2 || got[0].State != BlockAllocated || got[1].Size != 14*mib {
		t.Fatalf("first segment: %+v", got)
	}
	for i := len(events) - 1; i >= 0; i-- {
		if err := l.Undo(events[i]); err != nil {
			t.Fatalf("undo %d: %v", i, err)
		}
		if got := render(l); got != states[i] {
			t.Fatalf("undo %d:\n%s\nwant\n%s", i, got, states[i])
		}
	}
}

func TestApplyMismatches(t *testing.T) {
	l := NewLayout(DefaultRules())
	var me *MismatchError
	for _, e := range []Event{
		{Seq: 4, Action: ActionAlloc, Addr: 0x1000, Size: 512},
		{Seq: 5, Action: ActionFreeCompleted, Addr: 0x1000, Size: 512},
		{Seq: 6, Action: ActionSegmentFree, Addr: 0x1000, Size: 2 * mib},
	} {
		if err := l.Apply(e); !errors.As(err, &me) || me.Event.Seq != e.Seq {
			t.Errorf("%v: %v", e, err)
		}
	}
	if err := l.Apply(Event{Action: ActionSegmentAlloc, Addr: 0x200000, Size: 2 * mib}); err != nil {
		t.Fatal(err)
	}
	if err := l.Apply(Event{Action: ActionSegmentAlloc, Addr: 0x300000, Size: 2 * mib}); err == nil {
		t.Error("overlapping segment accepted")
	}
	if err := l.Apply(Event{Action: ActionAlloc, Addr: 0x200000, Size: 4 * mib}); err == nil {
		t.Error("alloc larger than the free block accepted")
	}
}

func render(l *Layout) string {
	out := ""
	for _, s := range l.Segments {
		out += hex(s.Addr) + ":"
		for _, b := range s.Blocks {
			out += " " + b.State.String() + "/" + hex(b.Size)
		}
		out += "\n"
	}
	return out
}

// A mismatch about a layout names no event; one about an event names it.
func TestMismatchErrorText(t *testing.T) {
	layout := &MismatchError{Reason: "segments overlap at 0x200"}
	if got := layout.Error(); got != "segments overlap at 0x200" {
		t.Errorf("layout: %q", got)
	}
	event := &MismatchError{Event: Event{Seq: 7, Action: ActionAlloc, Addr: 0x200, Size: 512}, Reason: "no free block"}
	if got := event.Error(); got != "event 7 (alloc at 0x200, 512 bytes): no free block" {
		t.Errorf("event: %q", got)
	}
}
