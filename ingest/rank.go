package ingest

import (
	"path"
	"regexp"
	"strconv"
	"strings"
)

// Where a rank is written, in the order they are tried on each part of a
// path, the file name first: "rank3", "rank_3", "Rank-03", "rank3_of_8"
// (torchtitan's rank0_memory_snapshot.pickle, memory_snapshot_rank_3.pickle);
// "_r3_", "-r3.", "r3_" at the start; "3_of_8".
var rankPatterns = []*regexp.Regexp{
	regexp.MustCompile(`(?i)(?:^|[^a-z])rank[_\-. ]?(\d{1,6})(?:[_\-. ]?of[_\-. ]?(\d{1,6}))?(?:[^0-9]|$)`),
	regexp.MustCompile(`(?i)(?:^|[_\-. ])r(\d{1,6})(?:[_\-. ]|$)`),
	regexp.MustCompile(`(?i)(?:^|[^0-9a-z])(\d{1,6})[_\-]of[_\-](\d{1,6})(?:[^0-9]|$)`),
}

// RankOfName reads a rank from a file's path (a name, or a path with / or
// \ between folders): from the file name, else from the nearest folder
// that names one ("rank3/snapshot.pickle"). world is the world size when
// the name says it ("rank3_of_8"), else 0.
func RankOfName(name string) (rank, world int, ok bool) {
	parts := strings.Split(strings.ReplaceAll(name, `\`, "/"), "/")
	for i := len(parts) - 1; i >= 0; i-- {
		base := parts[i]
		if i == len(parts)-1 {
			base = strings.TrimSuffix(base, path.Ext(base))
		}
		for _, re := range rankPatterns {
			if m := re.FindStringSubmatch(base); m != nil {
				rank, _ = strconv.Atoi(m[1])
				if len(m) > 2 && m[2] != "" {
					world, _ = strconv.Atoi(m[2])
				}
				return rank, world, true
			}
		}
	}
	return 0, 0, false
}

// metadataRank finds "rank" and a number in user_metadata ("rank=3",
// "rank: 3", "{'rank': 3}", "RANK 3").
var metadataRank = regexp.MustCompile(`(?i)(?:^|[^a-z_])(?:global_)?rank['"]?\s*[:=]?\s*['"]?(\d{1,6})(?:[^0-9]|$)`)

// RankOfMetadata reads a rank from a snapshot's user_metadata texts: the
// first that names one.
func RankOfMetadata(texts []string) (int, bool) {
	for _, t := range texts {
		if m := metadataRank.FindStringSubmatch(t); m != nil {
			n, _ := strconv.Atoi(m[1])
			return n, true
		}
	}
	return 0, false
}
