// Stacks for people and the hover tips of the trace view and the incident
// page. The server sorts every frame (gpu.KindOf): "user" and "library"
// frames are Python code, "native" and "recorder" frames are C++, the
// interpreter and the allocator recording the stack; the latter are folded
// away unless the page shows all frames. An allocation is labelled by its
// stack's first user frame.
import { api, el, fmtAddr, fmtBytes } from "./common.js";

const HIDDEN = new Set(["native", "recorder"]);

/** A frame as text ("?" for PyTorch's unknown line 2^64-1). */
export function frameText(f) {
  const line = f.line >= 2 ** 63 ? "?" : f.line;
  return `${f.name} (${f.filename}:${line})`;
}

/** A function giving the stack ({frames, label}) of a stack id of traceId, fetched once each. */
export function stackLoader(traceId) {
  const cache = new Map();
  const none = Promise.resolve({ frames: [], label: "" });
  return (sid) => {
    if (!sid) return none;
    if (!cache.has(sid)) {
      cache.set(sid, api(`/api/traces/${traceId}/stacks/${sid}`).then((r) => ({ frames: r.frames || [], label: r.label || "", named: r.named || [] }), () => ({ frames: [], label: "" })));
    }
    return cache.get(sid);
  };
}

/**
 * A stack as a list: the frames people read, with each run of hidden ones
 * (C++, interpreter, allocator) folded into one line, or every frame when
 * all is set. max, when given, shows that many visible frames and folds the
 * rest into a "show all" toggle (the incident page's long stacks).
 */
export function framesList(frames, { all = false, max = 0, named = [], made = "" } = {}) {
  if (!frames || !frames.length) {
    const why = made.startsWith("backward") ? ` With stacks="python" PyTorch records no frames on the autograd thread; stacks="all" would name its node and operator.` : "";
    return el("p", { class: "dim" }, "No stack was recorded." + (made ? ` Where it was made: ${made}.${why}` : ""));
  }
  // The frames that named a stack without Python frames show, hidden or not.
  const naming = new Set(named.map((i) => frames[i]));
  const hidden = (f) => !all && HIDDEN.has(f.kind) && !naming.has(f);
  const ol = el("ol", { class: "frames full" });
  const visible = frames.filter((f) => !hidden(f));
  const shown = max && visible.length > max + 2 ? new Set(visible.slice(0, max)) : null;
  // Past the shown frames, frames and folded runs alike go under the toggle.
  let rest = null, into = ol, folded = 0, moreFrames = 0;
  const flush = () => {
    if (folded) into.append(el("li", { class: "folded" }, `${folded} C++/interpreter frame${folded === 1 ? "" : "s"}`));
    folded = 0;
  };
  for (const f of frames) {
    if (hidden(f)) { folded++; continue; }
    if (shown && !shown.has(f) && !rest) into = rest = el("ol", { class: "frames full" });
    flush();
    into.append(el("li", { class: "frame-" + (f.kind || "user") + (naming.has(f) ? " named" : ""), title: naming.has(f) ? "this frame names the allocation" : null }, frameText(f)));
    if (rest) moreFrames++;
  }
  flush();
  if (!rest) return ol;
  const more = el("details", { class: "more-frames" }, el("summary", {}, `${moreFrames} more frames`), rest);
  return el("div", {}, ol, more);
}

let tipToken = 0;

/** Hides tip (and drops frames still on their way to it). */
export function hideTip(tip) {
  ++tipToken;
  tip.hidden = true;
}

/**
 * madeLoader(traceId) returns made(seq): a promise of where allocation seq,
 * one without frames, was made ("backward (autograd thread)", a region…),
 * or "", each asked for once.
 */
export function madeLoader(traceId) {
  const cache = new Map();
  return (seq) => {
    if (!cache.has(seq)) {
      cache.set(seq, api(`/api/traces/${traceId}/allocations/${seq}`).then((a) => a.verdict.made || "", () => ""));
    }
    return cache.get(seq);
  };
}

/**
 * Shows rows in tip at (x, y) within its parent, then stack sid's label and
 * first frames; without a stack, where the allocation was made (made, a
 * promise of it, when given).
 */
export function placeTip(tip, rows, x, y, stackOf, sid, all, made) {
  const token = ++tipToken;
  tip.replaceChildren(...rows);
  const wrap = tip.parentElement.getBoundingClientRect();
  tip.style.left = Math.max(0, Math.min(x + 14, wrap.width - 280)) + "px";
  tip.style.top = y + 14 + "px";
  tip.hidden = false;
  if (!sid) {
    made?.then((m) => {
      if (token === tipToken && m) tip.append(el("div", { class: "label" }, m + " · no stack"));
    });
    return;
  }
  stackOf(sid).then((st) => {
    if (token !== tipToken || !st.frames.length) return;
    if (st.label) tip.append(el("div", { class: "label" }, st.label));
    const list = el("ol", { class: "frames" });
    for (const f of st.frames.filter((f) => all || !HIDDEN.has(f.kind)).slice(0, 4)) list.append(el("li", {}, frameText(f)));
    tip.append(list);
  });
}

const STATES = ["cached free", "allocated", "pending free"];

/**
 * Shows what the timeline or the segment map has under the pointer: h is
 * {band}, {block} or {small} from their hit tests, or null to hide the tip.
 * view gives stackOf, the frames setting and the segments marked as pinned.
 */
export function showHitTip(view, tip, h, x, y) {
  if (!h || (!h.band && !h.block && !h.small && !h.fold)) { hideTip(tip); return; }
  const rows = [];
  let sid = 0, seq = -1;
  if (h.band) {
    const b = h.band;
    rows.push(el("strong", {}, fmtBytes(b.size)), el("br"), "requested " + fmtBytes(b.requested_size), el("br"),
      (b.seq >= 0 ? "alloc #" + b.seq : "allocated before the trace") + " at " + fmtAddr(b.address));
    sid = b.stack, seq = b.seq;
  } else if (h.block) {
    const b = h.block;
    rows.push(el("strong", {}, fmtBytes(b.size)), " " + STATES[b.state], el("br"));
    if (b.state !== 0) {
      if (view.pinned.has(b.segment)) rows.push("pins its segment: it cannot be released", el("br"));
      rows.push("requested " + fmtBytes(b.requested), el("br"), (b.seq >= 0 ? "alloc #" + b.seq : "allocated before the trace") + " at " + fmtAddr(b.addr));
      sid = b.stack, seq = b.seq;
    } else rows.push("at " + fmtAddr(b.addr));
  } else if (h.fold) {
    // A folded band: allocations too small to draw one by one here, named
    // by the group holding most of its bytes and by its largest.
    const f = h.fold, r = f.rep;
    rows.push(el("strong", {}, fmtBytes(f.size) + " in " + f.count + (f.count === 1 ? " allocation" : " allocations")), el("br"),
      "folded: each too small to draw at this zoom; most bytes from " + (h.group || "allocations without frames"), el("br"),
      "the largest: " + fmtBytes(r.size) + ", " + (r.seq >= 0 ? "alloc #" + r.seq : "allocated before the trace") + " at " + fmtAddr(r.address));
    sid = r.stack, seq = r.seq;
  } else {
    rows.push(el("strong", {}, "up to " + fmtBytes(h.small) + " allocated here"), el("br"),
      "not told apart: left out of an answer that holds at most 2,000 bands;", el("br"),
      "zoom in (W, or shift-drag a rectangle) to see them");
  }
  // A dense window's columns are wider than a pixel, each drawn at its peak.
  if (h.wide >= 2 && !h.block) rows.push(el("br"), "drawn at the peak of its " + Math.round(h.wide) + " px column (a window this dense has fewer columns)");
  placeTip(tip, rows, x, y, view.stackOf, sid, view.allFrames, !sid && seq >= 0 ? view.madeOf(seq) : null);
}
