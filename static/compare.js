// The compare page: two traces' memory on one axis (aligned by time, by
// training step, by event index or by request: the server's choice when
// the URL names none, by request for one program under two settings), their peaks and memory needed side by
// side, their allocator settings with the differing ones marked, and, at
// each one's peak, where they differ most and any instant clicked, the live
// bytes by code location in A, in B and the difference. Everything comes
// from one answer of /api/compare; the alignment, the grouping, the moment
// shown and the chosen instant are in the URL, so the view is a permalink.
import { api, el, fmtBytes, fmtBytesShort, fmtTime, initTheme, fitCanvas, niceTicks, queryNum, palette } from "./common.js";
import { FrameScheduler } from "./frames.js";

const root = document.getElementById("compare");
const A = root.dataset.a, B = root.dataset.b;
const canvas = document.getElementById("cmp-timeline");
const wrap = document.getElementById("cmp-wrap");
const tip = document.getElementById("cmp-tip");
const status = document.getElementById("status");
const LEFT = 70, RIGHT = 12, TOP = 44, BOTTOM = 24, HEIGHT = 320;
const ALIGNS = ["time", "step", "event", "request"], GROUPS = ["frame", "stack", "category"];

const q = new URLSearchParams(location.search);
const page = {
  align: ALIGNS.includes(q.get("align")) ? q.get("align") : null, // null: the server chooses
  group: GROUPS.includes(q.get("group")) ? q.get("group") : "frame",
  at: queryNum(q, "at"),
  moment: q.get("m") || null, // the moment shown: peak_a, peak_b, divergence, at
  x0: queryNum(q, "x0"), // the window of the aligned axis; null: the server's (the steps, else both traces whole)
  x1: queryNum(q, "x1"),
  data: null,
  hoverX: null,
  drag: null, // {a, b} in canvas pixels while dragging
};
if (!(page.x0 !== null && page.x1 > page.x0)) page.x0 = page.x1 = null;

const frames = new FrameScheduler((f) => {
  if (f.take("draw")) draw();
});

function saveURL() {
  const p = new URLSearchParams();
  if (page.align) p.set("align", page.align);
  if (page.group !== "frame") p.set("group", page.group);
  if (page.at !== null) p.set("at", Math.round(page.at));
  if (page.moment) p.set("m", page.moment);
  if (page.x0 !== null) { p.set("x0", Math.floor(page.x0)); p.set("x1", Math.ceil(page.x1)); }
  const s = p.toString();
  history.replaceState(null, "", s ? "?" + s : location.pathname);
  // Swapped, the same view but for the places on the axis (they are A's).
  for (const k of ["at", "x0", "x1", "m"]) p.delete(k);
  document.getElementById("swap").href = `/compare/${B}/${A}` + (p.size ? "?" + p : "");
}

// ---- data ----------------------------------------------------------------

let loading = null, polls = 0;
async function load() {
  loading?.abort();
  const ac = new AbortController();
  loading = ac;
  root.dataset.ready = "";
  status.textContent = "Comparing…";
  const p = new URLSearchParams({ group: page.group, n: Math.max(50, Math.min(4000, Math.floor(plotWidth()))) });
  if (page.align) p.set("align", page.align);
  if (page.at !== null) p.set("at", Math.round(page.at));
  if (page.x0 !== null) { p.set("x0", Math.floor(page.x0)); p.set("x1", Math.ceil(page.x1)); }
  try {
    const d = await api(`/api/compare/${A}/${B}?${p}`, { signal: ac.signal });
    if (ac.signal.aborted) return;
    page.data = d;
    status.textContent = "";
    if (!d.moments.some((m) => m.key === page.moment)) page.moment = page.at !== null ? "at" : "peak_a";
    show();
    root.dataset.ready = "1";
    // The memory needed comes from what-if replays that may still run: ask again.
    if ([d.a, d.b].some((s) => s.needed.status === "running") && polls++ < 60) setTimeout(load, 5000);
  } catch (e) {
    if (e.name !== "AbortError") status.textContent = "Compare: " + e.message;
  }
}

function show() {
  const d = page.data;
  const note = document.getElementById("align-note");
  const notes = [];
  if (d.align_note) notes.push(d.align_note[0].toUpperCase() + d.align_note.slice(1) + ".");
  if (d.reading) notes.push(d.reading + ".");
  if (d.timeline.steps_window) notes.push("The plot opens on the steps; “Whole traces” shows what came before them.");
  for (const [k, s] of [["A", d.a], ["B", d.b]]) {
    if (s.sampled_every > 1) notes.push(`${k} is compared at a sample of its events: each kept event stands for ${s.sampled_every} (those with the least and the most bytes).`);
  }
  note.hidden = notes.length === 0;
  note.textContent = notes.join(" ");
  // the alignment used, which the note explains when it is not the one asked
  for (const b of document.querySelectorAll("[data-align]")) b.setAttribute("aria-pressed", String(b.dataset.align === d.align));
  document.getElementById("group").value = page.group;
  document.getElementById("axis-label").textContent = {
    time: "time since each trace's first event",
    step: "A's time since its first event; B's steps stretched onto A's",
    event: "event index since each trace's first event",
    request: "requests (alloc and free) since each trace's first event",
  }[d.align];
  showFigures(d);
  showSettings(d);
  showMoments(d);
  frames.request("draw");
}

// ---- figures and settings ----------------------------------------------------

function deltaCell(v, known = true) {
  if (!known) return el("td", { class: "num dim" }, "–");
  const cls = v > 0 ? "num delta-more" : v < 0 ? "num delta-less" : "num";
  return el("td", { class: cls }, (v > 0 ? "+" : "") + fmtBytes(v));
}

function neededCell(n) {
  if (n.status === "done") return el("td", { class: "num", title: n.text || "" }, n.bytes ? fmtBytes(n.bytes) : "more than the replays try");
  return el("td", { class: "num dim", title: n.text || "" }, n.status === "running" ? "replaying…" : "unavailable");
}

function showFigures(d) {
  const t = document.getElementById("figures");
  const head = el("tr", {}, el("th", {}, ""), el("th", { class: "num" }, "A"), el("th", { class: "num" }, "B"), el("th", { class: "num" }, "B − A"));
  const rows = d.figures.map((f) => {
    if (f.key === "memory_needed") {
      return el("tr", { "data-key": f.key }, el("th", { scope: "row" }, f.label), neededCell(d.a.needed), neededCell(d.b.needed), deltaCell(f.delta, f.known));
    }
    return el("tr", { "data-key": f.key }, el("th", { scope: "row" }, f.label), el("td", { class: "num" }, fmtBytes(f.a)),
      el("td", { class: "num" }, fmtBytes(f.b)), deltaCell(f.delta));
  });
  const need = d.figures.find((f) => f.key === "memory_needed");
  const cap = need && need.note ? el("caption", { class: "dim" }, "Memory needed: " + need.note + ".") : null;
  t.replaceChildren(...[cap, el("thead", {}, head), el("tbody", {}, ...rows)].filter(Boolean));
}

function showSettings(d) {
  const t = document.getElementById("settings");
  const differ = d.settings.filter((s) => s.differs).length;
  document.getElementById("settings-summary").textContent = differ ? `${differ} differ` : "identical";
  t.replaceChildren(
    el("thead", {}, el("tr", {}, el("th", {}, "setting"), el("th", {}, "A"), el("th", {}, "B"))),
    el("tbody", {}, ...d.settings.map((s) => el("tr", { class: s.differs ? "differs" : null, "data-key": s.key },
      el("td", {}, s.key), el("td", {}, s.a), el("td", {}, s.b)))));
}

// ---- moments -------------------------------------------------------------------

const GROUP_NAMES = { frame: "First user frame", stack: "Stack", category: "Category" };

function pointText(side, p) {
  const when = p.seq < 0 ? "before the first event" : page.data.align === "event" ? `event ${p.seq}` : `after event ${p.seq}`;
  return `${side}: ${fmtBytes(p.allocated)} allocated, ${fmtBytes(p.reserved)} reserved, ${when}`;
}

function showMoments(d) {
  const tabs = document.getElementById("moment-tabs");
  tabs.replaceChildren(...d.moments.map((m) => {
    const b = el("button", { type: "button", class: "tab" + (m.key === page.moment ? " active" : ""), role: "tab",
      "aria-selected": String(m.key === page.moment), "data-moment": m.key }, `${m.label} (${fmtX(m.x)})`);
    b.addEventListener("click", () => { page.moment = m.key; saveURL(); showMoments(page.data); frames.request("draw"); });
    return b;
  }));
  const m = d.moments.find((x) => x.key === page.moment) || d.moments[0];
  const signed = (v) => (v > 0 ? "+" : "") + fmtBytes(v);
  document.getElementById("moment-label").textContent =
    `${pointText("A", m.a)} · ${pointText("B", m.b)} · B − A ${signed(m.divergence)} allocated, ${signed(m.reserved_delta)} reserved`;
  const top = Math.max(1, ...m.rows.map((r) => Math.abs(r.delta)));
  const table = document.getElementById("delta");
  table.replaceChildren(
    el("caption", { class: "dim" }, m.rows.length < m.rows_total ? `The ${m.rows.length} of ${m.rows_total} groups that differ most.` : `${m.rows_total} groups.`),
    el("thead", {}, el("tr", {}, el("th", {}, GROUP_NAMES[d.group]), el("th", { class: "num" }, "A"), el("th", { class: "num" }, "B"),
      el("th", { class: "num" }, "B − A"), el("th", {}, ""))),
    el("tbody", {}, ...m.rows.map((r) => {
      const bar = el("span", { class: "dbar " + (r.delta > 0 ? "more" : "less") });
      bar.style.width = (50 * Math.abs(r.delta) / top).toFixed(1) + "%";
      if (r.delta > 0) bar.style.left = "50%"; else bar.style.right = "50%";
      return el("tr", {}, el("td", { class: "c-frame", title: r.label }, r.label),
        el("td", { class: "num", title: `${r.count_a} allocations` }, fmtBytes(r.a)),
        el("td", { class: "num", title: `${r.count_b} allocations` }, fmtBytes(r.b)),
        deltaCell(r.delta), el("td", { class: "c-bar" }, el("span", { class: "dtrack" }, bar)));
    })));
}

// ---- the timeline ----------------------------------------------------------------

function plotWidth() { return Math.max(100, wrap.clientWidth - LEFT - RIGHT); }
function fmtX(x) {
  const unit = page.data && page.data.timeline.unit;
  if (unit === "event") return `#${Math.round(x)}`;
  if (unit === "request") return `request ${Math.round(x)}`;
  return fmtTime(x);
}
function xOf(x) { const t = page.data.timeline; return LEFT + ((x - t.x0) / (t.x1 - t.x0)) * plotWidth(); }
function xAt(px) { const t = page.data.timeline; return t.x0 + ((px - LEFT) / plotWidth()) * (t.x1 - t.x0); }

const MOMENT_NAMES = { peak_a: "A peak", peak_b: "B peak", divergence: "most apart", at: "chosen" };

function draw() {
  const d = page.data;
  if (!d) return;
  const pal = palette();
  const W = wrap.clientWidth, H = HEIGHT, plotH = H - TOP - BOTTOM;
  const ctx = fitCanvas(canvas, W, H);
  ctx.clearRect(0, 0, W, H);
  const tl = d.timeline;
  let top = 1;
  for (const u of [tl.a, tl.b]) for (let i = 0; i < tl.n; i++) top = Math.max(top, u.alloc_max[i], u.reserved_max[i]);
  const yOf = (v) => TOP + plotH - (v / top) * plotH;
  const colW = plotWidth() / tl.n;

  // Grid and axes.
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = pal.dim;
  ctx.strokeStyle = pal.grid;
  ctx.lineWidth = 1;
  ctx.textBaseline = "middle";
  for (const v of niceTicks(0, top, 5, true)) {
    const y = Math.round(yOf(v)) + 0.5;
    ctx.beginPath(); ctx.moveTo(LEFT, y); ctx.lineTo(LEFT + plotWidth(), y); ctx.stroke();
    ctx.fillText(fmtBytesShort(v), 4, y);
  }
  ctx.textBaseline = "alphabetic";
  for (const x of niceTicks(tl.x0, tl.x1, Math.max(2, Math.floor(plotWidth() / 110)), false, true)) { // whole µs or events
    const px = xOf(x), label = fmtX(x);
    ctx.fillRect(px, TOP + plotH, 1, 4);
    if (px + 2 + ctx.measureText(label).width <= W) ctx.fillText(label, px + 2, H - 6);
  }

  // Each trace: allocated as a band from least to greatest per column,
  // reserved dashed; drawn only where the trace has events, or across the
  // plot for a snapshot of none (its one state).
  const sides = [[tl.a, d.a, pal.reserved], [tl.b, d.b, pal.allocated]];
  for (const [u, s, colour] of sides) {
    let c0 = Math.max(0, Math.floor((xOf(s.range[0]) - LEFT) / colW)), c1 = Math.min(tl.n - 1, Math.floor((xOf(s.range[1]) - LEFT) / colW));
    if (s.events === 0) [c0, c1] = [0, tl.n - 1];
    if (c1 < c0) continue;
    ctx.save();
    ctx.beginPath();
    ctx.rect(LEFT, TOP - 2, plotWidth(), plotH + 4);
    ctx.clip();
    ctx.fillStyle = colour;
    ctx.globalAlpha = 0.85;
    for (let i = c0; i <= c1; i++) {
      const y0 = yOf(u.alloc_max[i]), y1 = yOf(u.alloc_min[i]);
      ctx.fillRect(LEFT + i * colW, y0 - 1, Math.max(colW, 1), Math.max(2, y1 - y0 + 1));
    }
    ctx.globalAlpha = 1;
    ctx.strokeStyle = colour;
    ctx.setLineDash([5, 4]);
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    for (let i = c0; i <= c1; i++) {
      const x = LEFT + i * colW, y = yOf(u.reserved_max[i]);
      if (i === c0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
      ctx.lineTo(x + colW, y);
    }
    ctx.stroke();
    ctx.restore();
  }

  // Step starts: A's above the plot, B's just under A's; aligned by step
  // they fall on the same places.
  ctx.font = "10px system-ui, sans-serif";
  const every = stepEvery(d);
  for (const [s, row, colour] of [[d.a, 0, pal.reserved], [d.b, 1, pal.allocated]]) {
    if (!s.steps.length) continue;
    ctx.fillStyle = colour;
    ctx.fillText(row ? "B steps" : "A steps", 4, row ? 38 : 11);
    let lastLabel = -1e9;
    for (const st of s.steps) {
      const px = xOf(st.x);
      if (px < LEFT || px > LEFT + plotWidth()) continue;
      ctx.fillRect(px, row ? 21 : 13, 1, 6);
      if (st.n % every === 0 && px - lastLabel > 28) {
        ctx.fillText(String(st.n), px + 2, row ? 38 : 11);
        lastLabel = px;
      }
    }
  }

  // The moments: a line each, the one shown solid; labels move down a
  // row when they would overlap.
  const placed = [];
  ctx.font = "11px system-ui, sans-serif";
  for (const m of d.moments) {
    const px = xOf(m.x);
    if (px < LEFT - 1 || px > LEFT + plotWidth() + 1) continue;
    const shown = m.key === page.moment;
    ctx.strokeStyle = pal.hl;
    ctx.lineWidth = shown ? 2 : 1;
    ctx.setLineDash(shown ? [] : [3, 3]);
    ctx.beginPath(); ctx.moveTo(px, TOP); ctx.lineTo(px, TOP + plotH); ctx.stroke();
    ctx.setLineDash([]);
    const label = MOMENT_NAMES[m.key] || m.key, w = ctx.measureText(label).width + 6;
    // Where the label is drawn (kept inside the plot) is what must not overlap.
    const lx = Math.min(px + 3, LEFT + plotWidth() - w);
    let row = 0;
    while (placed.some((p) => p.row === row && lx < p.x + p.w + 2 && lx + w + 2 > p.x)) row++;
    placed.push({ x: lx, w, row });
    ctx.fillStyle = pal.panel;
    ctx.fillRect(lx - 1, TOP + 2 + row * 14, w, 13);
    ctx.fillStyle = shown ? pal.fg : pal.dim;
    ctx.fillText(label, lx + 2, TOP + 12 + row * 14);
  }

  if (page.drag) {
    ctx.fillStyle = pal.brush;
    ctx.fillRect(Math.min(page.drag.a, page.drag.b), TOP, Math.abs(page.drag.b - page.drag.a), plotH);
  }
  document.getElementById("reset").hidden = tl.x0 <= tl.whole[0] && tl.x1 >= tl.whole[1];
  if (page.hoverX !== null) {
    ctx.strokeStyle = pal.cursor;
    ctx.lineWidth = 1;
    ctx.beginPath(); ctx.moveTo(page.hoverX + 0.5, TOP); ctx.lineTo(page.hoverX + 0.5, TOP + plotH); ctx.stroke();
  }
}

/** Label every how-many-th step so that labels do not crowd. */
function stepEvery(d) {
  const n = Math.max(d.a.steps.length, d.b.steps.length);
  const room = Math.floor(plotWidth() / 30);
  return n <= room ? 1 : Math.ceil(n / room);
}

// ---- input -------------------------------------------------------------------

function pointer(e) {
  const r = canvas.getBoundingClientRect();
  return { x: e.clientX - r.left, y: e.clientY - r.top };
}

canvas.addEventListener("pointermove", (e) => {
  const d = page.data;
  if (!d) return;
  const p = pointer(e);
  if (page.drag) {
    page.drag.b = Math.max(LEFT, Math.min(p.x, LEFT + plotWidth()));
    frames.request("draw");
    return;
  }
  if (p.x < LEFT || p.x > LEFT + plotWidth()) { page.hoverX = null; tip.hidden = true; frames.request("draw"); return; }
  page.hoverX = p.x;
  const tl = d.timeline, c = Math.min(tl.n - 1, Math.max(0, Math.floor((p.x - LEFT) / (plotWidth() / tl.n))));
  const side = (u, s, name) => {
    const x = xAt(p.x);
    if (x < s.range[0] || x > s.range[1]) return `${name}: not recorded here`;
    return `${name}: ${fmtBytes(u.alloc_max[c])} allocated, ${fmtBytes(u.reserved_max[c])} reserved`;
  };
  tip.replaceChildren(el("strong", {}, fmtX(xAt(p.x))), el("br"), side(tl.a, d.a, "A"), el("br"), side(tl.b, d.b, "B"),
    el("br"), el("span", { class: "dim" }, "click to compare the live memory here"));
  tip.hidden = false;
  tip.style.left = Math.min(p.x + 14, wrap.clientWidth - 300) + "px";
  tip.style.top = p.y + 14 + "px";
  frames.request("draw");
});
canvas.addEventListener("pointerleave", () => { page.hoverX = null; tip.hidden = true; frames.request("draw"); });
canvas.addEventListener("pointerdown", (e) => {
  const p = pointer(e);
  if (!page.data || p.x < LEFT || p.x > LEFT + plotWidth()) return;
  page.drag = { a: p.x, b: p.x };
  canvas.setPointerCapture(e.pointerId);
});
// A click compares the instant under it; a drag zooms to the range.
canvas.addEventListener("pointerup", () => {
  const g = page.drag;
  page.drag = null;
  if (!g) return;
  if (Math.abs(g.b - g.a) > 4) {
    setWindow(xAt(Math.min(g.a, g.b)), xAt(Math.max(g.a, g.b)));
    return;
  }
  page.at = Math.round(xAt(g.a));
  page.moment = "at";
  saveURL();
  load();
});
// Both traces whole: the window the server opens on is the steps'.
const whole = () => { const w = page.data?.timeline.whole; if (w) setWindow(w[0], w[1]); };
canvas.addEventListener("keydown", (e) => { if (e.key === "0") whole(); });
document.getElementById("reset").addEventListener("click", whole);

function setWindow(x0, x1) {
  [page.x0, page.x1] = x1 !== null && x1 - x0 >= 2 ? [x0, x1] : [null, null];
  saveURL();
  load();
}

for (const b of document.querySelectorAll("[data-align]")) {
  b.addEventListener("click", () => {
    if ((page.align || page.data?.align) === b.dataset.align) return;
    page.align = b.dataset.align;
    page.at = page.x0 = page.x1 = null; // a place on one axis means nothing on another
    if (page.moment === "at") page.moment = null;
    saveURL();
    load();
  });
}
document.getElementById("group").addEventListener("change", (e) => {
  page.group = e.target.value;
  saveURL();
  load();
});

let resizeTimer = 0;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(load, 200);
});
initTheme(() => frames.request("draw"));

// For tests and the console.
window.comparePage = { page, xOf };
saveURL();
load();
