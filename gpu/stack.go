package gpu

import "strconv"

// Stacks interns stacks into ids: the store's writer, the live client and
// anything that stamps frames on events implement it.
type Stacks interface {
	Stack(Stack) StackID
}

// Recorder is where an allocator's events go: a sink that also interns the
// stacks the events name.
type Recorder interface {
	Sink
	Stacks
}

// StackTable numbers distinct stacks 1, 2, ... in the order first seen.
// It is not safe for concurrent use.
type StackTable struct {
	ids map[string]StackID
}

// Intern returns s's id and whether s was new; the empty stack is 0.
func (t *StackTable) Intern(s Stack) (StackID, bool) {
	if len(s) == 0 {
		return 0, false
	}
	if t.ids == nil {
		t.ids = make(map[string]StackID)
	}
	k := stackKey(s)
	if id, ok := t.ids[k]; ok {
		return id, false
	}
	id := StackID(len(t.ids) + 1)
	t.ids[k] = id
	return id, true
}

// Add records s under an id chosen elsewhere (a stack table read back).
func (t *StackTable) Add(s Stack, id StackID) {
	if t.ids == nil {
		t.ids = make(map[string]StackID)
	}
	t.ids[stackKey(s)] = id
}

// Len is how many stacks the table holds.
func (t *StackTable) Len() int { return len(t.ids) }

// stackKey is a map key that tells stacks apart exactly: every string is
// length-prefixed, so no name can pass for another frame's fields.
func stackKey(s Stack) string {
	b := make([]byte, 0, 64*len(s))
	for _, f := range s {
		b = strconv.AppendInt(b, int64(len(f.Name)), 10)
		b = append(b, ':')
		b = append(b, f.Name...)
		b = strconv.AppendInt(b, int64(len(f.Filename)), 10)
		b = append(b, ':')
		b = append(b, f.Filename...)
		b = strconv.AppendUint(b, f.Line, 10)
		if f.Extra != "" {
			b = append(b, '+')
			b = strconv.AppendInt(b, int64(len(f.Extra)), 10)
			b = append(b, ':')
			b = append(b, f.Extra...)
		}
		b = append(b, ';')
	}
	return string(b)
}
