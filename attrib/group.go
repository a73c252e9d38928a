// Package attrib says what was live at an instant and what it was: the
// live set grouped by code location (first user frame, whole stack) or by
// category, as a tree (the flame graph) and a table; categories from an
// ordered rule table and allocator facts; steps and phases from
// annotations; the live set as a pprof profile.
package attrib

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"vramscope/gpu"
	"vramscope/store"
)

// Grouping is how live allocations are grouped.
type Grouping string

const (
	// ByFrame groups by the first user frame (gpu.FirstUserFrame, the frame
	// that labels an allocation); below it in the tree, its callers.
	ByFrame Grouping = "frame"
	// ByStack groups by the whole stack: the tree is the call tree,
	// outermost frame first (a flame graph); rows are distinct stacks,
	// labelled by their innermost frames.
	ByStack Grouping = "stack"
	// ByCategory groups by category; below it, the call tree.
	ByCategory Grouping = "category"
)

// ParseGrouping reads a grouping's name; "" is ByFrame.
func ParseGrouping(s string) (Grouping, error) {
	switch g := Grouping(s); g {
	case "":
		return ByFrame, nil
	case ByFrame, ByStack, ByCategory:
		return g, nil
	}
	return "", fmt.Errorf("grouping %q is none of frame, stack, category", s)
}

// Options tune a grouping.
type Options struct {
	// AllFrames keeps the frames views hide by default (recorder and
	// native ones, gpu.FrameKind.Hidden).
	AllFrames bool
	// Categories is the category of each block of the live set (by index);
	// ByCategory needs it, and without it every block is Unknown.
	Categories []Verdict
	// MinBytes folds a node's children smaller than this into one
	// "(smaller)" child, so that a tree of many tiny stacks stays small;
	// rows are never folded.
	MinBytes uint64
}

// Node is a node of the tree: a frame, a category, or the root. It covers
// the blocks Order[B0:B1] of its Grouped; its bytes and count are theirs.
type Node struct {
	Name string `json:"name"`
	// Kind is the frame's kind (user, library, native, recorder), or
	// "category", "root", "none" (no stack) or "folded" ((smaller)).
	Kind     string  `json:"kind"`
	File     string  `json:"file,omitempty"` // the frame's file, whole
	Bytes    uint64  `json:"bytes"`
	Count    int     `json:"count"`
	B0       int     `json:"b0"`
	B1       int     `json:"b1"`
	Children []*Node `json:"children,omitempty"`

	key    string
	own    []int // blocks whose path ends here
	index  map[string]*Node
	folded []*Node // the children (smaller) stands for
}

// Row is one line of the table: a group of the root (a first user frame or
// a category), or a distinct stack. Key names the group the same way in
// every trace, so that two traces' rows can be matched (Diff).
type Row struct {
	Key   string  `json:"key"`
	Label string  `json:"label"`
	Kind  string  `json:"kind"`
	Bytes uint64  `json:"bytes"`
	Count int     `json:"count"`
	Share float64 `json:"share"` // of the live bytes
	B0    int     `json:"b0"`
	B1    int     `json:"b1"`
}

// Grouped is a live set grouped one way. Every node and row covers a
// contiguous run of Order, the indexes of the live set's blocks in tree
// order, so Bytes of the root, the sum of the rows and the sum over the
// live set's blocks are the same number.
type Grouped struct {
	Grouping Grouping `json:"grouping"`
	Bytes    uint64   `json:"bytes"`
	Count    int      `json:"count"`
	Tree     *Node    `json:"tree"`
	Rows     []Row    `json:"rows"` // largest first
	Order    []int    `json:"order"`
}

// step is one element of a block's path: a node's key, name and kind.
type step struct {
	key, name, kind, file string
	fn                    string // the frame's function, whole ("" for a step that is no frame)
	line                  uint64
}

// Group groups the live set ls.
func Group(ls *store.LiveSet, g Grouping, o Options) *Grouped {
	root := &Node{Name: "all", Kind: "root"}
	paths := map[gpu.StackID][]step{}
	for i := range ls.Blocks {
		b := &ls.Blocks[i]
		p, ok := paths[b.Stack]
		if !ok {
			p = path(ls.Stacks[b.Stack], g, o.AllFrames)
			paths[b.Stack] = p
		}
		if len(ls.Stacks[b.Stack]) == 0 && i < len(o.Categories) && o.Categories[i].Made != "" {
			p = unframed(o.Categories[i].Made)
		}
		if g == ByCategory {
			c := Unknown
			if i < len(o.Categories) {
				c = o.Categories[i].Category
			}
			p = append([]step{{key: "category:" + string(c), name: string(c), kind: "category"}}, p...)
		}
		n := root
		for _, s := range p {
			n = n.child(s)
		}
		n.own = append(n.own, i)
	}
	out := &Grouped{Grouping: g, Tree: root, Order: make([]int, 0, len(ls.Blocks))}
	out.order(root, ls, o.MinBytes)
	out.Bytes, out.Count = root.Bytes, root.Count
	if g == ByStack {
		// A row per distinct stack: its blocks are its node's own.
		for i := range out.Rows {
			out.Rows[i].Share = share(out.Rows[i].Bytes, root.Bytes)
		}
		slices.SortStableFunc(out.Rows, func(a, b Row) int { return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), strings.Compare(a.Label, b.Label)) })
		return out
	}
	// The rows are the root's groups, the folded ones too.
	for _, c := range append(root.Children[:len(root.Children):len(root.Children)], root.folded...) {
		if c.Kind != "folded" {
			out.Rows = append(out.Rows, Row{Key: c.key, Label: c.Name, Kind: c.Kind, Bytes: c.Bytes, Count: c.Count,
				Share: share(c.Bytes, root.Bytes), B0: c.B0, B1: c.B1})
		}
	}
	return out
}

// stackRow is the row of the stack that ends at n, whose path from the
// root is path: keyed by every frame of it, labelled by its innermost
// frames.
func stackRow(n *Node, path []*Node, own []int, ls *store.LiveSet) Row {
	keys := make([]string, len(path))
	for i, p := range path {
		keys[i] = p.key
	}
	label := n.Name
	for i := len(path) - 2; i >= 0 && i >= len(path)-3; i-- {
		label += " ← " + path[i].Name
	}
	if len(path) > 3 {
		label += " ← …"
	}
	r := Row{Key: "stack:" + strings.Join(keys, "\x1e"), Label: label, Kind: n.Kind, Count: len(own), B0: n.B0, B1: n.B0 + len(own)}
	for _, i := range own {
		r.Bytes += ls.Blocks[i].Size
	}
	return r
}

func share(part, whole uint64) float64 {
	if whole == 0 {
		return 0
	}
	return float64(part) / float64(whole)
}

func (n *Node) child(s step) *Node {
	if c, ok := n.index[s.key]; ok {
		return c
	}
	if n.index == nil {
		n.index = map[string]*Node{}
	}
	c := &Node{Name: s.name, Kind: s.kind, File: s.file, key: s.key}
	n.index[s.key] = c
	n.Children = append(n.Children, c)
	return c
}

// order sums the tree bottom up, sorts children largest first, folds
// small ones, and lays the blocks out in tree order.
func (g *Grouped) order(root *Node, ls *store.LiveSet, minBytes uint64) {
	sum(root, ls)
	var path []*Node // from the root's child to the node visited
	var visit func(n *Node)
	visit = func(n *Node) {
		if n != root {
			path = append(path, n)
			defer func() { path = path[:len(path)-1] }()
		}
		n.B0 = len(g.Order)
		g.Order = append(g.Order, n.own...)
		if g.Grouping == ByStack && len(n.own) > 0 {
			g.Rows = append(g.Rows, stackRow(n, path, n.own, ls))
		}
		// Largest first; ties by name, as pprof orders its rows.
		slices.SortFunc(n.Children, func(a, b *Node) int {
			return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), strings.Compare(a.Name, b.Name), strings.Compare(a.key, b.key))
		})
		keep := len(n.Children)
		for keep > 0 && n.Children[keep-1].Bytes < minBytes {
			keep--
		}
		for _, c := range n.Children[:keep] {
			visit(c)
		}
		if keep < len(n.Children) {
			small := n.Children[keep:]
			f := &Node{Name: "(smaller)", Kind: "folded", B0: len(g.Order)}
			for _, c := range small {
				visit(c)
				f.Bytes += c.Bytes
				f.Count += c.Count
			}
			f.B1 = len(g.Order)
			n.folded = small
			n.Children = append(n.Children[:keep:keep], f)
		}
		n.B1 = len(g.Order)
		n.index = nil
		n.own = nil
	}
	visit(root)
}

func sum(n *Node, ls *store.LiveSet) {
	for _, i := range n.own {
		n.Bytes += ls.Blocks[i].Size
		n.Count++
	}
	for _, c := range n.Children {
		sum(c, ls)
		n.Bytes += c.Bytes
		n.Count += c.Count
	}
}

// noStack is the path of a block without a stack and no word of where it
// was made.
var noStack = []step{{key: "none", name: "(no stack)", kind: "none"}}

// unframed is the path of a block without a stack made where made says.
func unframed(made string) []step {
	return []step{{key: "none\x1f" + made, name: UnframedName(made), kind: "none"}}
}

// UnframedName is what views call an allocation without a stack made
// where made says (Categorizer.Made): "backward (autograd thread) · no stack".
func UnframedName(made string) string { return made + " · no stack" }

// path is where a stack's blocks sit in the tree of grouping g.
func path(s gpu.Stack, g Grouping, all bool) []step {
	if len(s) == 0 {
		return noStack
	}
	shown := func(f gpu.Frame) bool { return all || !gpu.KindOf(f).Hidden() }
	var out []step
	if name, named := gpu.OperatorName(s); name != "" {
		// No Python frame: the autograd node and operator name it (in
		// every grouping: all its frames are hidden by default).
		out = append(out, step{key: "op\x1f" + name, name: name, kind: gpu.FrameNative.String()})
		if all {
			for _, f := range s[slices.Max(named)+1:] {
				out = append(out, frameStep(f))
			}
			if g == ByStack {
				slices.Reverse(out[1:])
				out = append(out[1:], out[0])
			}
		}
		return out
	}
	if g == ByFrame {
		label, _ := gpu.FirstUserFrame(s)
		i := slices.IndexFunc(s, func(f gpu.Frame) bool { return f == label })
		out = append(out, frameStep(label))
		for _, f := range s[i+1:] {
			if shown(f) {
				out = append(out, frameStep(f))
			}
		}
		return out
	}
	for i := len(s) - 1; i >= 0; i-- {
		if shown(s[i]) {
			out = append(out, frameStep(s[i]))
		}
	}
	if len(out) == 0 { // every frame hidden: the one that labels it
		f, _ := gpu.FirstUserFrame(s)
		out = append(out, frameStep(f))
	}
	return out
}

// frameStep names a frame by what it is in any trace: its function, file
// and line.
func frameStep(f gpu.Frame) step {
	return step{key: f.Name + "\x1f" + f.Filename + "\x1f" + strconv.FormatUint(f.Line, 10), name: gpu.Label(f),
		kind: gpu.KindOf(f).String(), file: f.Filename, fn: f.Name, line: f.Line}
}

// Delta is one group's live bytes in two traces.
type Delta struct {
	Key    string `json:"key"`
	Label  string `json:"label"`
	A      uint64 `json:"a"`
	B      uint64 `json:"b"`
	CountA int    `json:"count_a"`
	CountB int    `json:"count_b"`
	Delta  int64  `json:"delta"` // B - A
}

// Diff matches the rows of two groupings of the same kind by key: every
// group of either, with its bytes in each, largest |B - A| first (then by
// key).
func Diff(a, b *Grouped) []Delta {
	at := map[string]int{}
	var out []Delta
	for _, r := range a.Rows {
		at[r.Key] = len(out)
		out = append(out, Delta{Key: r.Key, Label: r.Label, A: r.Bytes, CountA: r.Count})
	}
	for _, r := range b.Rows {
		i, ok := at[r.Key]
		if !ok {
			i = len(out)
			out = append(out, Delta{Key: r.Key, Label: r.Label})
		}
		out[i].B, out[i].CountB = r.Bytes, r.Count
	}
	for i := range out {
		out[i].Delta = int64(out[i].B) - int64(out[i].A)
	}
	abs := func(v int64) int64 {
		if v < 0 {
			return -v
		}
		return v
	}
	slices.SortStableFunc(out, func(x, y Delta) int {
		if c := cmp.Compare(abs(y.Delta), abs(x.Delta)); c != 0 {
			return c
		}
		return strings.Compare(x.Key, y.Key)
	})
	return out
}
