"""GPU check: how large a batch fits, predicted from two recordings and
measured (#31, issue 36).

    python3 scripts/gpu_batch_check.py --vramscope BIN --recordings DIR --rec DIR
        [--python P] [--work DIR] [--limit S]

Records with record.py on this card, into --rec unless there already: its
GPT training (6 steps, as train_default.pickle) at batch 4, 8 and 16, the
memory batch 16 needs (record.py train_needed: the real allocator's
bisection over a per-process limit), and its DDP job (ddp: two ranks on
this one GPU over gloo, batch 4 and 8). Then `vramscope fit` predicts
batch 16 from batches 4 and 8, against what the real allocator measured:
peak allocated (within 2 %), peak reserved and memory needed (within 5 %);
and fits the DDP job's two ranks, which must be answered, not refused as
two programs.
"""

import argparse
import json
import os
import sys

import gpucheck as g

BOUNDS = {"peak allocated": 2, "peak reserved": 5, "memory needed": 5}


def fit(log, vramscope, files, batches, *flags, timeout=None):
    """vramscope fit --json: (the answer, or None and why not)."""
    status, out = log.run([vramscope, "fit", *files, "--batch", ",".join(map(str, batches)), *flags, "--json"],
                          timeout=timeout, stdout_only=True)
    if status != 0:
        said = log.last_err.strip().splitlines() or ["no message"]
        return None, "vramscope fit: status %d: %s" % (status, said[0])
    return json.loads(out), None


def prediction(answer, at):
    for p in answer["predictions"]:
        if p.get("batch") == at:
            return p
    return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vramscope", required=True)
    p.add_argument("--recordings", required=True, help="shared/testdata/pytorch-2.11 (record.py)")
    p.add_argument("--rec", required=True, help="where record.py's new recordings go (or are)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--work", default=None)
    p.add_argument("--limit", type=float, default=0)
    a = p.parse_args()
    dl = g.Deadline(a.limit)
    log = g.Log(os.path.join(a.work or a.rec, "batch-commands.log"))

    def rec(scenario, name, *flags, makes=None, keep=20):
        return g.record(log, a.python, a.recordings, a.rec, scenario, name, *flags, makes=makes, timeout=dl.left(keep))

    whys = [rec("train", "train_b4", "--batch", "4", "--steps", "6"),
            rec("train", "train_default", "--steps", "6"),
            rec("train", "train_b16", "--batch", "16", "--steps", "6"),
            rec("train_needed", "train_b16_needed", "--batch", "16", "--steps", "6"),
            rec("ddp", "ddp", "--steps", "4", makes="ddp_rank1.json", keep=10)]
    failed = [w for w in whys if w]
    path = lambda f: os.path.join(a.rec, f)

    rows = []
    trains = [path(f) for f in ("train_b4.pickle", "train_default.pickle", "train_b16.pickle")]
    answer, why = (fit(log, a.vramscope, trains, (4, 8, 16), "--at", "16", timeout=dl.left(5))
                   if all(map(os.path.exists, trains)) else (None, "not recorded"))
    if answer is None:
        failed.append("batch 16 from 4 and 8: %s" % why)
    else:
        pred = prediction(answer, 16) or {}
        replayed = (answer.get("checks") or [{}])[0].get("recorded", {})
        real = g.load_json(path("train_b16.json"))["memory_stats"]
        needed = g.load_json(path("train_b16_needed.json")) if os.path.exists(path("train_b16_needed.json")) else {}
        real_needed = (needed.get("bisect") or {}).get("needed")
        for label, key, truth, source in (
                ("peak allocated", "peak_allocated", real["allocated_bytes.all.peak"], "memory_stats()"),
                ("peak reserved", "peak_reserved", real["reserved_bytes.all.peak"], "memory_stats()"),
                ("memory needed", "capacity_needed", real_needed, "bisection")):
            d = g.diff_pct(truth, pred.get(key)) if truth and pred.get(key) is not None else None
            ok = g.within(d, BOUNDS[label])
            rows.append((label, g.gib(pred[key]) if key in pred else "-", g.gib(replayed[key]) if key in replayed else "-",
                         "%s (%s)" % (g.gib(truth), source) if truth else "not measured", g.pct_text(d),
                         "%d %%" % BOUNDS[label], "ok" if ok else "FAIL"))
            if not ok:
                failed.append("batch 16's %s predicted %s" % (label, g.pct_text(d) if d is not None else "without a real figure"))
        rows.append(("requests paired", "%s of %s (%.1f %%)" % (g.num(answer["paired"]), g.num(answer["requests"]),
                                                               100 * answer["paired"] / max(answer["requests"], 1)),
                     "", "", "", "", ""))
        for n in answer.get("notes") or []:
            rows.append(("note", n, "", "", "", "", ""))
    print("GPT training (6 layers, d 768, T 1024, AdamW, bf16 autocast, 6 steps) recorded on this card at batch 4, 8, 16;")
    print("batch 16 predicted by `vramscope fit` from 4 and 8, replayed from its own recording, and measured")
    g.table(("BATCH 16", "PREDICTED", "REPLAYED", "REAL", "PREDICTED vs REAL", "BOUND", ""), rows)

    print()
    ranks = [path("ddp_rank0.pickle"), path("ddp_rank1.pickle")]
    rows = []
    if all(map(os.path.exists, ranks)):
        answer, why = fit(log, a.vramscope, ranks, (4, 8), "--at", "4,8,16", timeout=dl.left(2))
        if answer is None:
            failed.append("the DDP ranks: %s" % why)
            rows.append(("fit", "refused: " + why))
        else:
            rows.append(("fit", "answered"))
            rows.append(("requests paired", "%s of %s (%.1f %%)" % (g.num(answer["paired"]), g.num(answer["requests"]),
                                                                   100 * answer["paired"] / max(answer["requests"], 1))))
            for b in (4, 8, 16):
                pr = prediction(answer, b) or {}
                rows.append(("batch %d" % b, "peak allocated %s, reserved %s, needs %s" % (
                    g.gib(pr.get("peak_allocated", 0)), g.gib(pr.get("peak_reserved", 0)), g.gib(pr.get("capacity_needed", 0)))))
            for n in answer.get("notes") or []:
                rows.append(("note", n))
                if "same requests" in n:
                    failed.append("the DDP ranks: " + n)
    else:
        failed.append("the DDP ranks were not recorded")
        rows.append(("fit", "not run: no recording"))
    print("record.py ddp: rank 0 at batch 4 and rank 1 at batch 8 of one DDP job (gloo, both on this card), fitted")
    g.table(("DDP RANKS", ""), rows)
    if failed:
        return g.verdict(g.FAIL, "; ".join(failed))
    return g.verdict(g.OK, "batch 16 predicted within its bounds from 4 and 8; the DDP ranks fitted")


if __name__ == "__main__":
    sys.exit(main())
