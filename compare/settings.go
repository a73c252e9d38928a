package compare

import (
	"encoding/json"
	"slices"

	"vramscope/gpu/caching"
	"vramscope/store"
)

// settingsDiff lists every allocator setting of two traces' settings
// strings, "default" where one leaves it at PyTorch's default. Settings
// that do not parse (a database from before imports checked them) are
// shown as written, first.
func settingsDiff(a, b string) []Setting {
	var kvs [2][]caching.KeyValue
	var out []Setting
	for i, s := range []string{a, b} {
		c, err := caching.ParseConfig(s)
		if err != nil {
			if out == nil {
				out = []Setting{{Key: "as recorded", A: a, B: b, Differs: a != b}}
			}
			c = caching.DefaultConfig()
		}
		kvs[i] = c.Settings()
	}
	for k, kv := range kvs[0] {
		v := [2]string{kv.Value, kvs[1][k].Value}
		for i := range v {
			if v[i] == "" {
				v[i] = "default"
			}
		}
		out = append(out, Setting{Key: kv.Key, A: v[0], B: v[1], Differs: v[0] != v[1]})
	}
	return out
}

// covered are the keys of a snapshot's allocator_settings that the
// settings above already show.
var covered = map[string]bool{"PYTORCH_CUDA_ALLOC_CONF": true, "max_split_size": true, "garbage_collection_threshold": true,
	"expandable_segments": true, "release_lock_on_cudamalloc": true, "roundup_power2_divisions": true}

// snapshotSettings lists the keys of the snapshots' allocator_settings that
// no PYTORCH_CUDA_ALLOC_CONF key shows (pinned memory, graph capture), as
// the files wrote them; "–" where a trace has none. Traces recorded by
// vramscope have no snapshot settings.
func snapshotSettings(db *store.DB, uploads [2]string) ([]Setting, error) {
	var vals [2]map[string]json.RawMessage
	var keys []string
	for i, up := range uploads {
		if up == "" {
			continue
		}
		u, err := db.Upload(up)
		if err != nil {
			return nil, err
		}
		if u.Settings == "" || json.Unmarshal([]byte(u.Settings), &vals[i]) != nil {
			continue // not an object: the conf keys say what is known
		}
		for k := range vals[i] {
			if !covered[k] && !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	slices.Sort(keys)
	var out []Setting
	for _, k := range keys {
		var v [2]string
		for i := range vals {
			v[i] = "–"
			if raw, ok := vals[i][k]; ok {
				v[i] = string(raw)
			}
		}
		out = append(out, Setting{Key: k, A: v[0], B: v[1], Differs: v[0] != v[1]})
	}
	return out, nil
}
