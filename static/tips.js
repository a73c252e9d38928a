// Hover tips shared by the trace view and the incident page: a box of rows
// near the pointer, then the top frames of the hovered allocation's stack
// once they arrive (if the tip still shows the same thing).
import { api, el } from "./common.js";

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
