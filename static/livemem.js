// Live memory at the cursor (GET /api/traces/{id}/live): a flame graph and
// the table of its top groups (first user frames, stacks or categories),
// the bytes of every category (unknown too, never hidden), jumps to the
// peak, each OOM and each step's peak, and the same live set as a pprof
// profile. A frame picked in the graph or the table highlights its
// allocations on the timeline and the segment map.
import { api, el, fmtBytes, LatestFetch, afterEvent } from "./common.js";
import { Flame } from "./flame.js";

export class LivePanel {
  constructor(view) {
    this.view = view;
    this.data = null;
    this.seq = null; // the event the last answer is right after
    this.fetcher = new LatestFetch(view, "Live memory");
    this.label = document.getElementById("live-label");
    this.table = document.getElementById("live-table");
    this.cats = document.getElementById("live-cats");
    this.note = document.getElementById("live-note");
    this.pprof = document.getElementById("live-pprof");
    this.group = document.getElementById("live-group");
    this.flame = new Flame(document.getElementById("flame"), document.getElementById("flame-tip"), view, (n) => this.highlight(n));
    this.group.value = view.group;
    this.group.addEventListener("change", () => {
      const fold = (g) => (g === "stack" ? "stack" : "frame");
      const refold = fold(view.group) !== fold(this.group.value); // the timeline folds by stack or by frame
      view.group = this.group.value;
      view.setHighlight(null);
      view.request(...(refold ? ["timeline"] : []));
      this.load(this.seq, true);
    });
    view.addEventListener("highlight", () => { if (!view.highlight) { this.flame.selected = null; this.flame.draw(); this.markRow(); } });
    new ResizeObserver(() => this.flame.draw()).observe(document.getElementById("flame-wrap"));
    view.addEventListener("theme", () => this.flame.draw());
  }

  /** Loads the live set right after event seq (again when force, or when the grouping changed). */
  async load(seq, force = false) {
    if (seq === null || seq === undefined || (seq === this.seq && !force)) return;
    this.seq = seq;
    const v = this.view;
    const frames = v.allFrames ? "&frames=all" : "";
    const url = `/api/traces/${v.id}/live?seq=${seq}&group=${v.group}${frames}&limit=200`;
    this.label.textContent = "Loading…";
    const d = await this.fetcher.run((signal) => api(url, { signal }));
    if (!d) { if (this.fetcher.failed) this.label.textContent = "failed: " + this.fetcher.failed; return; }
    this.data = d;
    this.pprof.href = `/api/traces/${v.id}/live.pb.gz?seq=${d.seq}${frames}`;
    this.label.textContent = `${fmtBytes(d.bytes)} in ${d.count} allocation${d.count === 1 ? "" : "s"}, ${afterEvent(d.seq, v.noEvents)}` +
      (d.step ? ` · in step ${d.step.step}` : "");
    this.flame.set(d);
    this.renderCategories();
    this.renderTable();
    this.renderNote();
    // A highlight follows the picked node into the new live set.
    const e = this.flame.selectedEntry();
    if (e) this.highlight(e.node);
    else if (v.highlight) v.setHighlight(null);
    v.root.dataset.liveSeq = String(d.seq);
  }

  /** Highlights the allocations of a node or a row (blocks [b0, b1)); null clears. */
  highlight(n) {
    const v = this.view, d = this.data;
    if (!n || !d) { v.setHighlight(null); this.markRow(); return; }
    const seqs = new Set(), addrs = new Set();
    for (let i = n.b0; i < n.b1; i++) {
      if (d.blocks.seq[i] >= 0) seqs.add(d.blocks.seq[i]);
      else addrs.add(d.blocks.address[i]);
    }
    v.setHighlight({ seqs, addrs, label: n.name || n.label, b0: n.b0, b1: n.b1 });
    this.markRow();
  }

  markRow() {
    const h = this.view.highlight;
    for (const tr of this.table.querySelectorAll("tbody tr")) {
      tr.classList.toggle("picked", !!h && Number(tr.dataset.b0) === h.b0 && Number(tr.dataset.b1) === h.b1);
    }
  }

  renderCategories() {
    const d = this.data;
    const chips = d.categories.map((c, i) => {
      const [hi, mid, lo] = c.by_sure;
      const sure = c.bytes ? `how sure: ${fmtBytes(hi)} high, ${fmtBytes(mid)} medium, ${fmtBytes(lo)} low` : "none live";
      const chip = el("span", { class: "cat" + (c.bytes ? "" : " empty"), title: `${c.name}: ${c.count} allocations; ${sure}`, "data-category": c.name },
        el("i", { class: "sw sw-" + i }), c.name + " " + fmtBytes(c.bytes));
      return chip;
    });
    this.cats.replaceChildren(...chips);
  }

  /** Why allocations have no stack: made before the recording began, or
   *  (with Python frames only) on the autograd thread, and what that costs. */
  renderNote() {
    const d = this.data;
    let bytes = 0, n = 0, before = 0, nBefore = 0;
    for (let i = 0; i < d.blocks.stack.length; i++) {
      if (d.blocks.stack[i]) continue;
      bytes += d.blocks.size[i]; n++;
      if (d.blocks.seq[i] < 0) { before += d.blocks.size[i]; nBefore++; }
    }
    this.note.hidden = !n;
    if (!n) return;
    const allocations = (k) => `${k} allocation${k === 1 ? "" : "s"}`;
    let text = `${fmtBytes(bytes)} in ${allocations(n)} (${(100 * bytes / d.bytes).toFixed(1)} %) have no stack. `;
    if (nBefore) {
      text += `${nBefore === n ? "They were" : `${fmtBytes(before)} in ${allocations(nBefore)} were`} made before the recording began ` +
        `(torch.cuda.memory._record_memory_history), so it holds no frames for them. `;
    }
    if (nBefore < n) {
      text += `With stacks="python", PyTorch's default, nothing the autograd thread allocates (the backward's gradients and temporaries) gets a frame: ` +
        `they are named by where they were made (between a step's start and its Optimizer.step: the backward) and sorted by how long they lived. ` +
        `torch.cuda.memory._record_memory_history(stacks="all") records their C++ frames, named here by autograd node and operator ` +
        `(LogSoftmaxBackward0 · _log_softmax_backward_data); it costs an unwinding per allocation and a slower dump ` +
        `(2.7 s instead of 0.02 s for a 2-step run on an H200).`;
    }
    this.note.textContent = text.trim();
  }

  renderTable() {
    const d = this.data;
    const what = { frame: "First user frame", stack: "Stack (outermost frame first)", category: "Category" }[d.grouping];
    const head = el("thead", {}, el("tr", {}, el("th", { scope: "col" }, what), el("th", { scope: "col", class: "num" }, "Live"),
      el("th", { scope: "col", class: "num" }, "Share"), el("th", { scope: "col", class: "num" }, "Allocations")));
    const body = el("tbody");
    for (const r of d.rows) {
      const tr = el("tr", { tabindex: "0", "data-b0": r.b0, "data-b1": r.b1, title: "Highlight these allocations" },
        el("td", { class: "c-frame frame-" + r.kind }, r.label), el("td", { class: "num" }, fmtBytes(r.bytes)),
        el("td", { class: "num" }, (100 * r.share).toFixed(1) + " %"), el("td", { class: "num" }, String(r.count)));
      const go = () => this.flame.chooseRow(r);
      tr.addEventListener("click", go);
      tr.addEventListener("keydown", (e) => { if (e.key === "Enter") go(); });
      body.append(tr);
    }
    const foot = d.rows_total > d.rows.length ? el("caption", { class: "dim" }, `the top ${d.rows.length} of ${d.rows_total}`) : null;
    this.table.replaceChildren(...[foot, head, body].filter(Boolean));
    this.markRow();
  }
}

/**
 * Jumps: the peak, each OOM and each step's peak, in the live panel's head.
 * goTo(seq, t) moves the cursor right after an event.
 */
export async function showJumps(view, goTo, ooms) {
  const box = document.getElementById("live-jumps");
  for (const o of ooms) {
    const b = el("button", { type: "button", class: "btn oom-jump", title: "The live memory right after out-of-memory event " + o.seq }, "OOM " + o.n);
    b.addEventListener("click", () => goTo(o.seq, o.time_us));
    box.append(b);
  }
  await loadSteps(view, goTo);
}

/**
 * Reads the trace's steps and regions (again, as a live trace grows) into
 * the view, and the step menu of the live panel's head.
 */
export async function loadSteps(view, goTo) {
  const st = await api(`/api/traces/${view.id}/steps?limit=2000`);
  view.regions = st.regions;
  view.steps = st.steps;
  view.stepsSampled = st.sampled; // then only the steps marked complete lost no entry
  view.metaMarks = st.metadata;
  view.goToStep = (r) => {
    const s = st.steps.find((x) => x.step === r.step && x.start_us === r.start_us);
    if (s) goToStepPeak(view, goTo, s);
  };
  view.redraw();
  document.getElementById("step-select")?.remove();
  if (!st.steps.length) return;
  const sel = el("select", { id: "step-select", "aria-label": "Go to a step's peak" },
    el("option", { value: "" }, `Step… (${st.steps_total}${st.sampled ? `, ${st.complete} complete` : ""})`));
  for (const [i, s] of st.steps.entries()) {
    const read = st.sampled ? (s.complete ? " · complete" : " · sampled") : "";
    sel.append(el("option", { value: String(i) }, `step ${s.step}: peak ${fmtBytes(s.peak.allocated_bytes)}${s.open ? " so far (running)" : ""}${read}`));
  }
  sel.addEventListener("change", () => {
    if (sel.value !== "") goToStepPeak(view, goTo, st.steps[Number(sel.value)]);
    sel.value = "";
  });
  document.getElementById("live-jumps").append(sel);
}

/** Shows a step: the window on it, the cursor at its peak. */
function goToStepPeak(view, goTo, s) {
  const pad = (s.end_us - s.start_us) * 0.05;
  view.showTimes(s.start_us - pad, s.end_us + pad);
  goTo(s.peak.seq, s.peak.time_us);
}
