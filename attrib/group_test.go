package attrib_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"vramscope/attrib"
	"vramscope/gpu"
	"vramscope/ingest"
	"vramscope/internal/testkit"
	"vramscope/pytorch"
	"vramscope/store"
)

var (
	userFrame = func(fn string, line uint64) gpu.Frame {
		return gpu.Frame{Name: fn, Filename: "/home/u/model.py", Line: line}
	}
	libFrame  = gpu.Frame{Name: "forward", Filename: "/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", Line: 125}
	cppFrame  = gpu.Frame{Name: "c10::cuda::CUDACachingAllocator::malloc(unsigned long)", Filename: "??"}
	mainFrame = gpu.Frame{Name: "main", Filename: "/home/u/train.py", Line: 9}
)

// synthetic is a live set of five blocks under three stacks, and one
// without a stack.
func synthetic() *store.LiveSet {
	return &store.LiveSet{
		Stacks: map[gpu.StackID]gpu.Stack{
			1: {cppFrame, libFrame, userFrame("attn", 10), mainFrame},
			2: {cppFrame, libFrame, userFrame("mlp", 20), mainFrame},
			3: {cppFrame, userFrame("attn", 10), userFrame("block", 30), mainFrame},
		},
		Blocks: []store.LiveBlock{
			{Block: gpu.Block{Addr: 0x1000, Size: 100, Stack: 1, Seq: 1}},
			{Block: gpu.Block{Addr: 0x2000, Size: 200, Stack: 2, Seq: 2}},
			{Block: gpu.Block{Addr: 0x3000, Size: 400, Stack: 3, Seq: 3}},
			{Block: gpu.Block{Addr: 0x4000, Size: 800, Stack: 1, Seq: 4}},
			{Block: gpu.Block{Addr: 0x5000, Size: 1600, Seq: -1}},
		},
	}
}

// checkGrouped checks that every node covers exactly the blocks of its
// range, its children partition what is not its own, and the rows add up
// to the live set.
func checkGrouped(t *testing.T, ls *store.LiveSet, g *attrib.Grouped) {
	t.Helper()
	if len(g.Order) != len(ls.Blocks) {
		t.Fatalf("%s: order holds %d blocks of %d", g.Grouping, len(g.Order), len(ls.Blocks))
	}
	seen := make([]bool, len(ls.Blocks))
	for _, i := range g.Order {
		if seen[i] {
			t.Fatalf("%s: block %d twice in the order", g.Grouping, i)
		}
		seen[i] = true
	}
	var check func(n *attrib.Node)
	check = func(n *attrib.Node) {
		var bytes uint64
		for _, i := range g.Order[n.B0:n.B1] {
			bytes += ls.Blocks[i].Size
		}
		if bytes != n.Bytes || n.B1-n.B0 != n.Count {
			t.Fatalf("%s: node %q has %d bytes in %d blocks, its range [%d, %d) %d bytes", g.Grouping, n.Name, n.Bytes, n.Count, n.B0, n.B1, bytes)
		}
		at := n.B1
		for i := len(n.Children) - 1; i >= 0; i-- {
			c := n.Children[i]
			if c.B1 != at || c.B0 < n.B0 {
				t.Fatalf("%s: child %q of %q covers [%d, %d), not a run ending at %d", g.Grouping, c.Name, n.Name, c.B0, c.B1, at)
			}
			if i > 0 && n.Children[i-1].Bytes < c.Bytes && c.Kind != "folded" {
				t.Fatalf("%s: children of %q not largest first", g.Grouping, n.Name)
			}
			at = c.B0
			check(c)
		}
	}
	check(g.Tree)
	var rows uint64
	for _, r := range g.Rows {
		rows += r.Bytes
		var bytes uint64
		for _, i := range g.Order[r.B0:r.B1] {
			bytes += ls.Blocks[i].Size
		}
		if bytes != r.Bytes || r.B1-r.B0 != r.Count {
			t.Fatalf("%s: row %q has %d bytes in %d blocks, its range [%d, %d) %d bytes", g.Grouping, r.Label, r.Bytes, r.Count, r.B0, r.B1, bytes)
		}
	}
	if want := ls.Bytes(); g.Bytes != want || rows != want || g.Tree.Bytes != want {
		t.Fatalf("%s: tree %d, rows %d, live blocks %d bytes", g.Grouping, g.Tree.Bytes, rows, want)
	}
}

func TestGroupSynthetic(t *testing.T) {
	ls := synthetic()
	byFrame := attrib.Group(ls, attrib.ByFrame, attrib.Options{})
	checkGrouped(t, ls, byFrame)
	// attn:10 holds blocks 0, 2 and 3 (stacks 1 and 3): 1300 bytes.
	want := []struct {
		label string
		bytes uint64
	}{{"(no stack)", 1600}, {"model.py:10 attn", 1300}, {"model.py:20 mlp", 200}}
	if len(byFrame.Rows) != len(want) {
		t.Fatalf("rows %+v", byFrame.Rows)
	}
	for i, w := range want {
		if r := byFrame.Rows[i]; r.Label != w.label || r.Bytes != w.bytes {
			t.Errorf("row %d: %q %d, want %q %d", i, r.Label, r.Bytes, w.label, w.bytes)
		}
	}
	// Below the first user frame, its callers: attn is called from main
	// (stack 1) and from block (stack 3).
	attn := byFrame.Tree.Children[1]
	if len(attn.Children) != 2 || attn.Children[0].Name != "train.py:9 main" || attn.Children[0].Bytes != 900 ||
		attn.Children[1].Name != "model.py:30 block" || attn.Children[1].Bytes != 400 {
		t.Errorf("callers of attn: %+v", attn.Children)
	}

	byStack := attrib.Group(ls, attrib.ByStack, attrib.Options{})
	checkGrouped(t, ls, byStack)
	// A row per distinct stack, labelled by its innermost frames; the
	// tree's roots are the outermost ones.
	stacks := []struct {
		label string
		bytes uint64
	}{{"(no stack)", 1600}, {"linear.py:125 forward ← model.py:10 attn ← train.py:9 main", 900},
		{"model.py:10 attn ← model.py:30 block ← train.py:9 main", 400}, {"linear.py:125 forward ← model.py:20 mlp ← train.py:9 main", 200}}
	if len(byStack.Rows) != len(stacks) {
		t.Fatalf("by stack: %+v", byStack.Rows)
	}
	for i, w := range stacks {
		if r := byStack.Rows[i]; r.Label != w.label || r.Bytes != w.bytes {
			t.Errorf("stack row %d: %q %d, want %q %d", i, r.Label, r.Bytes, w.label, w.bytes)
		}
	}
	if len(byStack.Tree.Children) != 2 || byStack.Tree.Children[1].Name != "train.py:9 main" || byStack.Tree.Children[1].Bytes != 1500 {
		t.Errorf("by stack, the roots: %+v", byStack.Tree.Children)
	}
	// The recorder frame is hidden unless asked for.
	leaf := byStack.Tree.Children[1]
	for len(leaf.Children) > 0 {
		leaf = leaf.Children[0]
	}
	if leaf.Kind != "library" {
		t.Errorf("deepest frame %q (%s), want the library frame", leaf.Name, leaf.Kind)
	}
	all := attrib.Group(ls, attrib.ByStack, attrib.Options{AllFrames: true})
	checkGrouped(t, ls, all)
	for leaf = all.Tree.Children[1]; len(leaf.Children) > 0; leaf = leaf.Children[0] {
	}
	if leaf.Kind != "recorder" {
		t.Errorf("all frames: deepest frame %q (%s), want the allocator's", leaf.Name, leaf.Kind)
	}

	cats := []attrib.Verdict{{Category: attrib.Activations}, {Category: attrib.Parameters}, {Category: attrib.Activations},
		{Category: attrib.Activations}, {Category: attrib.Unknown}}
	byCat := attrib.Group(ls, attrib.ByCategory, attrib.Options{Categories: cats})
	checkGrouped(t, ls, byCat)
	if byCat.Rows[0].Label != "unknown" || byCat.Rows[1].Label != "activations" || byCat.Rows[1].Bytes != 1300 {
		t.Errorf("by category: %+v", byCat.Rows)
	}

	// Folding: every child under 300 bytes goes into one (smaller) node;
	// the rows keep every group.
	folded := attrib.Group(ls, attrib.ByFrame, attrib.Options{MinBytes: 300})
	checkGrouped(t, ls, folded)
	if n := len(folded.Tree.Children); n != 3 || folded.Tree.Children[2].Kind != "folded" || folded.Tree.Children[2].Bytes != 200 {
		t.Errorf("folded tree: %+v", folded.Tree.Children)
	}
	if len(folded.Rows) != 3 {
		t.Errorf("folded rows: %+v", folded.Rows)
	}
}

func TestDiff(t *testing.T) {
	a := synthetic()
	b := synthetic()
	b.Blocks = b.Blocks[:3]                                                            // no more block 3 (attn, 800) nor the stackless 1600
	b.Blocks = append(b.Blocks, store.LiveBlock{Block: gpu.Block{Size: 50, Stack: 2}}) // mlp +50
	d := attrib.Diff(attrib.Group(a, attrib.ByFrame, attrib.Options{}), attrib.Group(b, attrib.ByFrame, attrib.Options{}))
	want := []attrib.Delta{
		{Label: "(no stack)", A: 1600, B: 0, CountA: 1, Delta: -1600},
		{Label: "model.py:10 attn", A: 1300, B: 500, CountA: 3, CountB: 2, Delta: -800},
		{Label: "model.py:20 mlp", A: 200, B: 250, CountA: 1, CountB: 2, Delta: 50},
	}
	if len(d) != len(want) {
		t.Fatalf("diff %+v", d)
	}
	for i, w := range want {
		w.Key = d[i].Key
		if d[i] != w {
			t.Errorf("delta %d: %+v, want %+v", i, d[i], w)
		}
	}
	self := attrib.Diff(attrib.Group(a, attrib.ByStack, attrib.Options{}), attrib.Group(a, attrib.ByStack, attrib.Options{}))
	for _, x := range self {
		if x.Delta != 0 {
			t.Errorf("a trace against itself: %+v", x)
		}
	}
}

// importSnapshot stores a snapshot of the older real set and returns its
// traces.
func importSnapshot(t *testing.T, db *store.DB, name string) []gpu.Trace {
	t.Helper()
	return importFile(t, db, testkit.Snapshot(t, name))
}

// importFile stores the snapshot at path, named by its file name, and
// returns its traces.
func importFile(t *testing.T, db *store.DB, path string) []gpu.Trace {
	t.Helper()
	traces, err := storeFile(db, path)
	if err != nil {
		t.Fatal(err)
	}
	return traces
}

func storeFile(db *store.DB, path string) ([]gpu.Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ids, err := ingest.Snapshot(db, f, filepath.Base(path), pytorch.Options{})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []gpu.Trace
	for _, id := range ids {
		tr, err := db.Trace(id)
		if err != nil {
			return nil, err
		}
		out = append(out, tr)
	}
	return out, nil
}

// cursors are instants to look at: before the trace, at its first event,
// a few inside, at the peak and at the end.
func cursors(tr gpu.Trace) []int64 {
	out := []int64{-1}
	if tr.FirstSeq < 0 {
		return out
	}
	for i := int64(0); i <= 8; i++ {
		out = append(out, tr.FirstSeq+(tr.LastSeq-tr.FirstSeq)*i/8)
	}
	if tr.PeakSeq >= 0 {
		out = append(out, tr.PeakSeq)
	}
	return out
}

// On every real snapshot (every file of both real sets: the 2.11
// recordings bring private pools and deferred frees), at every cursor, the
// grouped live bytes are the allocated bytes of the layout there, exactly,
// whichever the grouping.
func TestGroupSumsOnRealSnapshots(t *testing.T) {
	db := testkit.OpenDB(t)
	files := append(testkit.RealFiles(t, "pytorch"), testkit.RealFiles(t, "pytorch-2.11")...)
	for _, path := range files {
		name := filepath.Base(path)
		traces, err := storeFile(db, path)
		if err != nil && strings.Contains(err.Error(), "holds no segments and no trace events") {
			continue // empty_four_devices: nothing to group, and not stored
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, tr := range traces {
			for _, seq := range cursors(tr) {
				ls, err := db.LiveAtSeq(tr.ID, seq)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				l, _, err := db.LayoutAtSeq(tr.ID, seq)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := ls.Bytes(), l.Figures().Allocated; got != want {
					t.Fatalf("%s seq %d: live set %d bytes, layout allocated %d", name, seq, got, want)
				}
				cats := make([]attrib.Verdict, len(ls.Blocks))
				for i := range cats {
					cats[i] = attrib.Verdict{Category: attrib.Category([]string{"a", "b", "c"}[i%3])}
				}
				for _, g := range []attrib.Grouping{attrib.ByFrame, attrib.ByStack, attrib.ByCategory} {
					checkGrouped(t, ls, attrib.Group(ls, g, attrib.Options{Categories: cats, MinBytes: ls.Bytes() / 500}))
				}
			}
		}
	}
}
