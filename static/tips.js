// Hover tips shared by the trace view and the incident page: a box of rows
// near the pointer, then the top frames of the hovered allocation's stack
// once they arrive (if the tip still shows the same thing).
import { api, el, fmtAddr, fmtBytes } from "./common.js";

/** A frame as text ("?" for PyTorch's unknown line 2^64-1). */
export function frameText(f) {
  const line = f.line >= 2 ** 63 ? "?" : f.line;
  return `${f.name} (${f.filename}:${line})`;
}

/** A function giving the frames of a stack id of traceId, fetched once each. */
export function stackLoader(traceId) {
  const cache = new Map();
  return (sid) => {
    if (!sid) return Promise.resolve([]);
    if (!cache.has(sid)) {
      cache.set(sid, api(`/api/traces/${traceId}/stacks/${sid}`).then((r) => r.frames || []).catch(() => []));
    }
    return cache.get(sid);
  };
}

let tipToken = 0;

/** Hides tip (and drops frames still on their way to it). */
export function hideTip(tip) {
  ++tipToken;
  tip.hidden = true;
}

/** Shows rows in tip at (x, y) within its parent, then stack sid's top frames. */
export function placeTip(tip, rows, x, y, stackOf, sid) {
  const token = ++tipToken;
  tip.replaceChildren(...rows);
  const wrap = tip.parentElement.getBoundingClientRect();
  tip.style.left = Math.min(x + 14, wrap.width - 260) + "px";
  tip.style.top = y + 14 + "px";
  tip.hidden = false;
  if (!sid) return;
  stackOf(sid).then((frames) => {
    if (token !== tipToken || !frames.length) return;
    const list = el("ol", { class: "frames" });
    for (const f of frames.slice(0, 4)) list.append(el("li", {}, frameText(f)));
    tip.append(list);
  });
}

const STATES = ["cached free", "allocated", "pending free"];

/**
 * Shows what the timeline or the segment map has under the pointer: h is
 * {band}, {block} or {small} from their hit tests, or null to hide the tip.
 * view gives stackOf and the segments marked as pinned.
 */
export function showHitTip(view, tip, h, x, y) {
  if (!h || (!h.band && !h.block && !h.small)) { hideTip(tip); return; }
  const rows = [];
  let sid = 0;
  if (h.band) {
    const b = h.band;
    rows.push(el("strong", {}, fmtBytes(b.size)), el("br"), "requested " + fmtBytes(b.requested_size), el("br"),
      "alloc #" + b.seq + " at " + fmtAddr(b.address));
    sid = b.stack;
  } else if (h.block) {
    const b = h.block;
    rows.push(el("strong", {}, fmtBytes(b.size)), " " + STATES[b.state], el("br"));
    if (b.state !== 0) {
      if (view.pinned.has(b.segment)) rows.push("pins its segment: it cannot be released", el("br"));
      rows.push("requested " + fmtBytes(b.requested), el("br"), (b.seq >= 0 ? "alloc #" + b.seq : "allocated before the trace") + " at " + fmtAddr(b.addr));
      sid = b.stack;
    } else rows.push("at " + fmtAddr(b.addr));
  } else {
    rows.push(el("strong", {}, fmtBytes(h.small)), el("br"), "small allocations, each under a pixel tall here: zoom in to see them");
  }
  placeTip(tip, rows, x, y, view.stackOf, sid);
}

/** A stack as a numbered list of frames (or a note that none was recorded). */
export function framesList(frames) {
  if (!frames || !frames.length) return el("p", { class: "dim" }, "No stack was recorded.");
  const ol = el("ol", { class: "frames full" });
  for (const f of frames) ol.append(el("li", {}, frameText(f)));
  return ol;
}
