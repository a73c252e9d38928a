package live_test

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"vramscope/internal/testkit"
	"vramscope/internal/testkit/need"
	"vramscope/server"
)

// BenchmarkPythonWatchOverhead runs testdata/bench_watch.py against the
// whole server: a job loop of GIL-bound Python work making 1,701 trace
// entries per 16 ms step, on the stand-in torch whose _snapshot() holds
// the GIL for $VRAMSCOPE_BENCH_US_PER_ENTRY microseconds an entry (2.9,
// the H200's), for $VRAMSCOPE_BENCH_STEPS steps (1,000) recording alone,
// watched, recording alone again and on out-of-memory only, then in paired
// chunks, then watched asking for 20 steps whole in the middle. It reports
// the ratios to recording alone and the worst stall, and for the steps
// read whole the ratios outside and inside their window, how many came
// complete, and what a complete step cost; the whole JSON is logged. It
// fails if fewer steps come complete than were asked for. One iteration
// takes about two and a half minutes:
//
//	go test ./live -run '^$' -bench PythonWatchOverhead -benchtime 1x -v
func BenchmarkPythonWatchOverhead(b *testing.B) {
	py := need.Program(b, "python3")
	db := testkit.OpenDB(b)
	srv := httptest.NewServer(server.New(server.Options{DB: db, Addr: "127.0.0.1:0"}).Handler())
	defer srv.Close()
	steps, us := os.Getenv("VRAMSCOPE_BENCH_STEPS"), os.Getenv("VRAMSCOPE_BENCH_US_PER_ENTRY")
	if steps == "" {
		steps = "1000"
	}
	if us == "" {
		us = "2.9"
	}
	for range b.N {
		// The machine's load is said with the figures: on a shared
		// machine it is what spreads them most.
		load, _ := os.ReadFile("/proc/loadavg")
		out, err := exec.Command(py, "testdata/bench_watch.py", "--url", srv.URL, "--steps", steps, "--us-per-entry", us).Output()
		if err != nil {
			b.Fatalf("%v\n%s", err, out)
		}
		after, _ := os.ReadFile("/proc/loadavg")
		b.Logf("load average before: %s, after: %s%s", strings.TrimSpace(string(load)), strings.TrimSpace(string(after)), out)
		var r struct {
			RatioWatched float64 `json:"ratio_watched"`
			RatioOnOOM   float64 `json:"ratio_on_oom"`
			Watched      struct {
				Stall float64 `json:"worst_stall_ms"`
				Sent  float64 `json:"entries_sent"`
				Made  float64 `json:"entries_made"`
			} `json:"watched"`
			Paired struct {
				Ratio  float64 `json:"ratio"`
				Median float64 `json:"median_pair_ratio"`
				Stall  float64 `json:"worst_stall_ms"`
			} `json:"paired"`
			Whole struct {
				Asked    int     `json:"asked"`
				Complete int     `json:"complete_steps"`
				Outside  float64 `json:"outside_ratio"`
				Inside   float64 `json:"inside_ratio"`
				Extra    float64 `json:"extra_per_complete_step_ms"`
				Read     float64 `json:"read_per_complete_step_ms"`
			} `json:"steps_whole"`
		}
		if err := json.Unmarshal(out, &r); err != nil {
			b.Fatal(fmt.Errorf("%v: %s", err, out))
		}
		b.ReportMetric(r.RatioWatched, "watched/recording")
		b.ReportMetric(r.Paired.Ratio, "paired-watched/recording")
		b.ReportMetric(r.Paired.Median, "median-pair-ratio")
		b.ReportMetric(r.RatioOnOOM, "on-oom/recording")
		b.ReportMetric(r.Watched.Stall, "worst-stall-ms")
		b.ReportMetric(r.Watched.Sent/r.Watched.Made, "entries-read/made")
		if r.Whole.Complete < r.Whole.Asked {
			b.Errorf("%d steps asked for whole, %d complete", r.Whole.Asked, r.Whole.Complete)
		}
		b.ReportMetric(r.Whole.Outside, "outside-window/recording")
		b.ReportMetric(r.Whole.Inside, "inside-window/recording")
		b.ReportMetric(r.Whole.Extra, "ms-per-complete-step")
		b.ReportMetric(r.Whole.Read, "read-ms-per-complete-step")
	}
}
