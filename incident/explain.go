package incident

import (
	"fmt"
	"strconv"

	"vramscope/gpu"
	"vramscope/replay"
)

// Store is what explaining a stored incident reads; the SQLite store has it.
type Store interface {
	Trace(id string) (gpu.Trace, error)
	Incidents(id string) ([]gpu.Incident, error)
	IncidentN(id string, n int) (gpu.Incident, error)
	Events(id string, from, to int64) ([]gpu.Event, error)
	LayoutAtSeq(id string, seq int64) (*gpu.Layout, int64, error)
	Stack(id string, sid gpu.StackID) (gpu.Stack, error)
	Recording(id string) (gpu.Recording, error)
}

// maxPinnerStacks bounds the stacks sent with an incident: the groups are
// sorted by how many segments they pin, and the tail matters little.
const maxPinnerStacks = 50

// Explanation is one stored OOM explained, with the frames of its pinning
// stacks and the time window worth showing first.
type Explanation struct {
	Trace    string               `json:"trace"`
	N        int                  `json:"n"`
	Count    int                  `json:"count"`
	Incident gpu.Incident         `json:"incident"`
	Report   Report               `json:"report"`
	Stacks   map[string]gpu.Stack `json:"stacks"`
	Window   struct {
		T0 int64 `json:"t0"`
		T1 int64 `json:"t1"`
	} `json:"window"`
}

// DeviceOf is what stream s, replayed, knows of its device and limit.
func DeviceOf(s replay.Stream) Device {
	var d Device
	if s.Capacity.Source == replay.CapacityRecorded {
		d.Capacity = s.Capacity.Bytes
	}
	d.Limit, d.LimitInferred = s.LimitBytes()
	if d.LimitInferred {
		d.LimitLow = s.Limit.Low
	}
	return d
}

// Explain analyzes incident n (from 1) of trace id from the layout right
// after its oom event.
func Explain(db Store, id string, n int) (Explanation, error) {
	var out Explanation
	t, err := db.Trace(id)
	if err != nil {
		return out, err
	}
	in, err := db.IncidentN(id, n)
	if err != nil {
		return out, err
	}
	all, err := db.Incidents(id)
	if err != nil {
		return out, err
	}
	evs, err := db.Events(id, in.Seq, in.Seq+1)
	if err != nil {
		return out, err
	}
	if len(evs) != 1 || evs[0].Action != gpu.ActionOOM {
		return out, fmt.Errorf("trace %q: incident %d (event %d) is not an oom event", id, n, in.Seq)
	}
	l, _, err := db.LayoutAtSeq(id, in.Seq)
	if err != nil {
		return out, err
	}
	// The limit the what-if replays under (inferred from every OOM and
	// retry of the recording, or recorded), so that the verdict and the
	// what-if read one room.
	rec, err := db.Recording(id)
	if err != nil {
		return out, err
	}
	dev := DeviceOf(replay.FromRecording(rec))
	out.Trace, out.N, out.Count, out.Incident = id, n, len(all), in
	out.Report = Analyze(l, evs[0], dev)
	out.Stacks = map[string]gpu.Stack{}
	for i, g := range out.Report.Pinners {
		if i == maxPinnerStacks {
			break
		}
		if g.Stack == 0 {
			continue
		}
		st, err := db.Stack(id, g.Stack)
		if err != nil {
			return out, err
		}
		out.Stacks[strconv.FormatUint(uint64(g.Stack), 10)] = st
	}
	// The time leading up to the OOM, ending just after it.
	lead := max((t.LastUS-t.FirstUS)/4, 2_000_000)
	out.Window.T0 = max(t.FirstUS, in.TimeUS-lead)
	out.Window.T1 = in.TimeUS + max((in.TimeUS-out.Window.T0)/20, 10)
	return out, nil
}
