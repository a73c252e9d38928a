package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"vramscope/internal/derive"
	"vramscope/internal/testkit"
	"vramscope/replay"
	"vramscope/store"
	"vramscope/tracer"
)

// fitDB records the training workload at batch 2, 4 and 8 and a
// fragmentation stress into a database file.
func fitDB(t *testing.T) (path string, batch map[int]string, frag string) {
	path = filepath.Join(t.TempDir(), "fit.db")
	db, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	batch = map[int]string{}
	for _, b := range []int{2, 4, 8} {
		w := tracer.DefaultTrain()
		w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 4, 512, 8192, b, 512, 2
		batch[b] = testkit.Record(t, db, "train", w, 80<<30, "")
	}
	frag = testkit.Record(t, db, "frag", tracer.DefaultFrag(), 8<<30, "")
	return path, batch, frag
}

func TestFitJSON(t *testing.T) {
	path, batch, _ := fitDB(t)
	code, out, errs := runCmd("fit", "--db", path, "--batch", "2,4", "--at", "4,8,64", "--capacity", "16GiB", "--json", batch[2], batch[4])
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var res struct {
		Paired        int     `json:"paired"`
		Requests      int     `json:"requests"`
		UnpairedBytes *uint64 `json:"unpaired_bytes"`
		Predictions   []struct {
			Batch          int    `json:"batch"`
			PeakAllocated  uint64 `json:"peak_allocated"`
			PeakReserved   uint64 `json:"peak_reserved"`
			CapacityNeeded uint64 `json:"capacity_needed"`
		} `json:"predictions"`
		Largest  *int   `json:"largest_batch"`
		Capacity uint64 `json:"capacity_bytes"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.Paired == 0 || res.Paired != res.Requests || res.UnpairedBytes == nil || *res.UnpairedBytes != 0 {
		t.Errorf("paired %d of %d, unpaired bytes %v", res.Paired, res.Requests, res.UnpairedBytes)
	}
	if len(res.Predictions) != 3 || res.Predictions[0].Batch != 4 || res.Predictions[2].Batch != 64 {
		t.Fatalf("predictions %+v", res.Predictions)
	}
	for i, p := range res.Predictions {
		if p.PeakAllocated == 0 || p.PeakReserved < p.PeakAllocated || p.CapacityNeeded == 0 || p.CapacityNeeded > p.PeakReserved+2<<20 ||
			i > 0 && p.PeakAllocated <= res.Predictions[i-1].PeakAllocated {
			t.Errorf("prediction %+v", p)
		}
	}
	// Batch 8 as recorded: the trace's own peaks.
	db, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tr, err := db.Trace(batch[8])
	if err != nil {
		t.Fatal(err)
	}
	if p := res.Predictions[1]; p.PeakAllocated != tr.PeakAllocated || p.PeakReserved != tr.PeakReserved {
		t.Errorf("batch 8 predicted %d allocated, %d reserved; recorded %d, %d", p.PeakAllocated, p.PeakReserved, tr.PeakAllocated, tr.PeakReserved)
	}
	if res.Capacity != 16<<30 || res.Largest == nil || *res.Largest < 8 {
		t.Fatalf("largest batch on %d bytes: %v", res.Capacity, res.Largest)
	}
	// The largest batch needs at most the device; one more needs more.
	l := *res.Largest
	code, out, errs = runCmd("fit", "--db", path, "--batch", "2,4", "--at", fmt.Sprintf("%d,%d", l, l+1), "--json", batch[2], batch[4])
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Predictions) != 2 || res.Predictions[0].CapacityNeeded > 16<<30 || res.Predictions[1].CapacityNeeded <= 16<<30 {
		t.Errorf("largest batch on 16 GiB %d, but batches %d and %d need %+v", l, l, l+1, res.Predictions)
	}
}

func TestFitTextChecksTheThird(t *testing.T) {
	path, batch, _ := fitDB(t)
	code, out, errs := runCmd("fit", "--db", path, "--batch", "2,4,8", batch[2], batch[4], batch[8])
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"fit by batch: " + batch[2] + " (batch 2), " + batch[4] + " (batch 4), " + batch[8] + " (batch 8)",
		"requests pair up in every recording fitted (100.0%)", "2 (recorded)", "largest batch that fits 80.00 GiB (recorded with the trace): ",
		"check: " + batch[8] + " at batch 8"} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
	// The check's two columns agree: the same program.
	i := strings.Index(out, "check: ")
	for _, row := range strings.Split(out[i:], "\n")[2:5] {
		f := strings.Fields(row)
		if len(f) != 6 || f[2]+f[3] != f[4]+f[5] {
			t.Errorf("check row %q: predicted and recorded differ", row)
		}
	}
}

func TestFitRefusals(t *testing.T) {
	path, batch, frag := fitDB(t)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{batch[2], frag, "--batch", "2,4"}, 2, "are not recordings of the same program: only 0 of "},
		{[]string{batch[2], batch[4]}, 2, "give the batch size of each recording"},
		{[]string{batch[2], batch[4], "--batch", "2"}, 2, "--batch gives 1 values for 2 recordings"},
		{[]string{batch[2], batch[4], "--batch", "2,x"}, 2, `"x" is not a positive whole number`},
		{[]string{batch[2], batch[4], "--seq", "256,512"}, 2, "a fit along sequence length takes 3 recordings, got 2"},
		{[]string{batch[2], batch[4], "--batch", "2,4", "--seq", "1,2"}, 2, "not both"},
		{[]string{batch[2], batch[4], "--batch", "2,2"}, 1, "are both at batch 2"},
		{[]string{batch[2], "nosuch", "--batch", "2,4"}, 2, "nosuch is neither a file nor a trace"},
	} {
		code, _, errs := runCmd(append([]string{"fit", "--db", path}, c.args...)...)
		if code != c.code || !strings.Contains(errs, c.want) {
			t.Errorf("fit %q: exit %d, %q; want %d and %q", c.args, code, errs, c.code, c.want)
		}
	}
}

// --seq fits three recordings at sequence lengths; a fourth is checked;
// --whatif adds each setting's memory needed and largest length.
func TestFitSeqJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seq.db")
	db, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range []int{256, 512, 768, 1024} {
		w := tracer.DefaultTrain()
		w.Layers, w.Hidden, w.Vocab, w.Batch, w.Seq, w.Steps = 2, 512, 8192, 2, s, 2
		ids = append(ids, testkit.Record(t, db, "train", w, 80<<30, ""))
	}
	db.Close()
	code, out, errs := runCmd(append([]string{"fit", "--db", path, "--seq", "256,512,768,1024", "--at", "2048", "--step", "128", "--capacity", "4GiB", "--whatif", "--json"}, ids...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var res struct {
		By          string `json:"by"`
		Paired      int    `json:"paired"`
		Requests    int    `json:"requests"`
		Predictions []struct {
			Seq            int `json:"seq"`
			CapacityNeeded uint64
			WhatIf         []struct {
				AllocConf      string `json:"alloc_conf"`
				CapacityNeeded uint64 `json:"capacity_needed"`
			} `json:"whatif"`
		} `json:"predictions"`
		Largest       *int `json:"largest_seq"`
		LargestWhatIf []struct {
			AllocConf string `json:"alloc_conf"`
			Largest   int    `json:"largest"`
		} `json:"largest_whatif"`
		Checks []struct {
			Name      string
			Predicted map[string]any
			Recorded  map[string]any
		} `json:"checks"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.By != "seq" || res.Paired == 0 || res.Paired != res.Requests || len(res.Predictions) != 1 || res.Predictions[0].Seq != 2048 {
		t.Fatalf("%+v", res)
	}
	if len(res.Predictions[0].WhatIf) != 6 || res.Predictions[0].WhatIf[0].AllocConf != "expandable_segments:True" || res.Predictions[0].WhatIf[0].CapacityNeeded == 0 {
		t.Errorf("what-if: %+v\n%s", res.Predictions[0].WhatIf, out)
	}
	if res.Largest == nil || *res.Largest < 1024 || *res.Largest%128 != 0 || len(res.LargestWhatIf) != 6 {
		t.Errorf("largest sequence length on 4 GiB: %v, with other settings %+v", res.Largest, res.LargestWhatIf)
	}
	if len(res.Checks) != 1 || res.Checks[0].Name != ids[3] {
		t.Fatalf("checks: %+v", res.Checks)
	}
	for _, k := range []string{"peak_allocated", "peak_reserved", "capacity_needed"} {
		if p, r := res.Checks[0].Predicted[k], res.Checks[0].Recorded[k]; p == nil || p == 0.0 || p != r {
			t.Errorf("check of seq 1024, %s: predicted %v, recorded %v", k, p, r)
		}
	}
}

// ddpRank1 derives rank 1 of record.py's ddp job (batch 8) from
// ddp_rank0.pickle (rank 0, batch 4), as no GPU is here to record it: the
// same program at twice the batch, freeing in another order.
//
// Sizes: each rank runs GPT(layers=4, d=512, h=8, T=512, vocab 32000)
// under DDP on x of shape (4 + 4·rank, 512); a tensor whose shape holds
// the batch is twice as large on rank 1. What does not hold it keeps its
// size: whatever was made before the first step (the model, DDP's
// buckets), what lives to the end (the optimizer's state, the rebuilt
// buckets), the parameters' sizes in fp32 and as autocast casts them to
// bf16 (weights, their gradients, AdamW's temporaries), and whatever is
// smaller than the smallest tensor of a batch (4·512 bf16, 4,096 B). The
// (4, 512, 512) activations are 2 MiB in bf16 and 4 MiB in fp32 at batch
// 4, the size of the 512×2048 weights' casts and gradients: kept too, so
// the derived rank under-states those.
//
// Frees: rank 1's gradient all-reduces finish in another order, and so
// do the frees they make: every run of frees is reversed (a deferred
// free's completion stays after it).
func ddpRank1(t *testing.T) string {
	t.Helper()
	rank0, err := derive.Stream(testkit.SnapshotOf(t, "pytorch-2.11", "ddp_rank0.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	var firstStep int64 = math.MaxInt64
	for _, a := range rank0.Annotations {
		if strings.HasPrefix(a.Name, "ProfilerStep#") {
			firstStep = min(firstStep, a.TimeUS)
		}
	}
	freed := map[int64]bool{}
	for _, r := range rank0.Requests {
		if r.Op == replay.OpFree {
			freed[r.ID] = true
		}
	}
	params := map[uint64]bool{}
	for _, n := range []uint64{32000 * 512, 512 * 512, 512, 3 * 512 * 512, 3 * 512, 4 * 512, 4 * 512 * 512} {
		params[4*n], params[2*n] = true, true
	}
	rank1 := derive.FreesReordered(derive.Scaled(rank0, 2, func(_ int, r replay.Request) bool {
		return r.TimeUS < firstStep || !freed[r.ID] || params[r.Size] || r.Size < 4*512*2
	}))
	b, err := derive.UntilOOM(rank1, derive.Run{Device: 150109880320})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ddp_rank1.pickle")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// replayedPeak is the most a snapshot's requests allocate, replayed as a
// prediction is: from an empty device, placed anew, under its settings.
func replayedPeak(t *testing.T, path string) uint64 {
	t.Helper()
	s, err := derive.Stream(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := s.Config("")
	if err != nil {
		t.Fatal(err)
	}
	s = s.Unplaced()
	_, res, err := s.Run(cfg, replay.MaxCapacityNeeded)
	if err != nil {
		t.Fatal(err)
	}
	return res.PeakAllocated
}

// TestFitDDPRanks: the two ranks of one DDP job, at batch 4 and 8, whose
// frees come in another order, are fitted (frees pair by the allocations
// they free, and their order does not count); the predictions at the
// ranks' batches allocate at their peaks what each rank's own requests
// do.
func TestFitDDPRanks(t *testing.T) {
	rank1Path := ddpRank1(t)
	rank0Path := testkit.SnapshotOf(t, "pytorch-2.11", "ddp_rank0.pickle")
	code, out, errs := runCmd("fit", "--batch", "4,8", "--at", "4,8,16", "--capacity", "16GiB", "--json", rank0Path, rank1Path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var res struct {
		Paired      int      `json:"paired"`
		Requests    int      `json:"requests"`
		Notes       []string `json:"notes"`
		Predictions []struct {
			Batch         int    `json:"batch"`
			PeakAllocated uint64 `json:"peak_allocated"`
			Guessed       uint64 `json:"guessed_bytes"`
		} `json:"predictions"`
		Largest *int `json:"largest_batch"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	// Every request pairs up but one: the derived rank, replayed, completes
	// one of its deferred frees with no call between, and its snapshot has
	// the two as one free.
	if res.Paired < res.Requests-1 || len(res.Notes) != 0 || len(res.Predictions) != 3 || res.Largest == nil || *res.Largest < 16 {
		t.Fatalf("paired %d of %d, notes %q, predictions %+v, largest %v", res.Paired, res.Requests, res.Notes, res.Predictions, res.Largest)
	}
	for i, path := range []string{rank0Path, rank1Path} {
		if p, want := res.Predictions[i], replayedPeak(t, path); p.PeakAllocated != want || p.Guessed != 0 {
			t.Errorf("batch %d: predicted peak allocated %d (%d guessed), the rank's own requests %d", p.Batch, p.PeakAllocated, p.Guessed, want)
		}
	}
	if p := res.Predictions; !(p[2].PeakAllocated > p[1].PeakAllocated && p[1].PeakAllocated > p[0].PeakAllocated) {
		t.Errorf("the peaks do not grow with the batch: %+v", p)
	}
	t.Logf("peaks allocated at batch 4, 8, 16: %d, %d, %d; largest batch on 16 GiB %d", res.Predictions[0].PeakAllocated,
		res.Predictions[1].PeakAllocated, res.Predictions[2].PeakAllocated, *res.Largest)
}

// TestFitSaysWhatItCannotShow: two recordings of the same requests (one
// run given twice) fit, and the fit says nothing grows in them; two
// runs under different allocator settings fit, and it says whose
// settings the predictions replay under.
func TestFitSaysWhatItCannotShow(t *testing.T) {
	train := testkit.SnapshotOf(t, "pytorch-2.11", "train_default.pickle")
	expandable := testkit.SnapshotOf(t, "pytorch-2.11", "train_expandable.pickle")
	code, out, errs := runCmd("fit", "--batch", "8,16", "--at", "8", train, train)
	if code != 0 || !strings.Contains(out, "note: "+train+" at batch 8 and "+train+" at batch 16 make the same requests, every size alike: nothing in them grows with the batch") ||
		!strings.Contains(out, "any (nothing the job asks for grows with it)") {
		t.Errorf("the same run twice: exit %d, %s%s", code, out, errs)
	}
	code, out, errs = runCmd("fit", "--batch", "8,16", "--at", "8", train, expandable)
	if code != 0 || !strings.Contains(out, "note: "+expandable+" ran under other allocator settings (expandable_segments:True) than "+train+" (the defaults)") {
		t.Errorf("two settings: exit %d, %s%s", code, out, errs)
	}
}
