// Package python ships the Python side of live watching: vramscope_watch.py,
// which a PyTorch job imports to stream its memory events to the server. The
// server serves it (see Source) so a user can fetch it from the server they
// watch with.
package python

import _ "embed"

// Source is vramscope_watch.py.
//
//go:embed vramscope_watch.py
var Source []byte

// FileName is the name to save Source under.
const FileName = "vramscope_watch.py"
