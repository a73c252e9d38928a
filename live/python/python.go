// Package python ships the Python side of live watching: vramscope_watch.py,
// which a PyTorch job imports to stream its memory events to the server,
// and vramscope_estimate.py, which estimates a script's memory on a CPU.
// The server serves both (see Source) so a user can fetch them from the
// server they watch with.
package python

import _ "embed"

// Source is vramscope_watch.py.
//
//go:embed vramscope_watch.py
var Source []byte

// FileName is the name to save Source under.
const FileName = "vramscope_watch.py"

// EstimateSource is vramscope_estimate.py, which python -m vramscope_watch
// --estimate runs: a script's memory estimated on a CPU.
//
//go:embed vramscope_estimate.py
var EstimateSource []byte

// EstimateFileName is the name to save EstimateSource under, beside
// Source.
const EstimateFileName = "vramscope_estimate.py"
