package gpu

import "time"

// Run is one job of several ranks (processes, usually one GPU each): an
// upload per rank (a snapshot file, a recorded run or a live stream), each
// of one trace per device.
type Run struct {
	ID      string    `json:"id"`
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	// WorldSize is how many ranks the job had, when known (0: unknown);
	// a run may hold fewer.
	WorldSize int       `json:"world_size"`
	Ranks     []RunRank `json:"ranks"`
}

// RunRank is one rank of a run: its upload and that upload's traces, by
// device.
type RunRank struct {
	Rank   int     `json:"rank"`
	Upload string  `json:"upload"`
	Traces []Trace `json:"traces"`
}

// RunOf says which run a trace belongs to, and as which rank.
type RunOf struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Rank      int    `json:"rank"`
	WorldSize int    `json:"world_size"`
}
