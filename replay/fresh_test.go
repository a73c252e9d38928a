package replay_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"testing"

	"vramscope/internal/testkit"
)

// TestFragStreamNeededFresh runs TestFragStreamNeeded's fresh subtest in a
// child process, as scripts/gpu-check.sh does after record.py frag: a copy
// of ../shared's frag_default.json passes; one whose probe just under the
// memory needed is said to have run, or whose bisection needed 2 MiB
// less, fails naming the probe or the figure.
func TestFragStreamNeededFresh(t *testing.T) {
	data, err := os.ReadFile(testkit.SnapshotOf(t, "pytorch-2.11", "frag_default.json"))
	if err != nil {
		t.Fatal(err)
	}
	var facts map[string]any
	if err := json.Unmarshal(data, &facts); err != nil {
		t.Fatal(err)
	}
	needed := facts["bisect"].(map[string]any)["needed"].(float64)
	for _, c := range []struct {
		name   string
		change func(probes []any, bisect map[string]any)
		want   string
	}{
		{"copy", func([]any, map[string]any) {}, "--- PASS: TestFragStreamNeeded/fresh"},
		{"probe flipped", func(probes []any, _ map[string]any) {
			for _, p := range probes {
				if p := p.(map[string]any); p["limit"].(float64) == needed-2<<20 {
					p["ok"] = true
				}
			}
		}, "default settings under 5297405952 B: runs false (<nil>), the real allocator true"},
		{"needed", func(_ []any, bisect map[string]any) { bisect["needed"] = needed - 2<<20 },
			"the real allocator 5297405952"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var f map[string]any
			if err := json.Unmarshal(data, &f); err != nil {
				t.Fatal(err)
			}
			c.change(f["probes"].([]any), f["bisect"].(map[string]any))
			out, err := json.Marshal(f)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			if err := os.WriteFile(dir+"/frag_default.json", out, 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run", "^TestFragStreamNeeded$/^fresh$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "VRAMSCOPE_FRESH_RECORDINGS="+dir)
			got, err := cmd.CombinedOutput()
			if (err != nil) != (c.name != "copy") || !bytes.Contains(got, []byte(c.want)) {
				t.Errorf("ended with %v, want failing %v and %q:\n%s", err, c.name != "copy", c.want, got)
			}
		})
	}
}
