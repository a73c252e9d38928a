// The trace view: timeline, segment map and details kept in step. The view
// (window, cursor, selection, panel, map offsets) is the URL's query
// string, rewritten with history.replaceState on every change, so a reload
// or a copied link restores it.
import { api, el, queryNum, fmtBytes, fmtTime, fmtAddr, initTheme, palette } from "./common.js";
import { frameText, hideTip, placeTip, stackLoader } from "./tips.js";
import { Timeline } from "./timeline.js";
import { SegMap } from "./segmap.js";
import { initShare } from "./share.js";
import { showIncidents } from "./incidents.js";
import { follow } from "./live.js";
import { showNeeded } from "./whatif.js";

const root = document.getElementById("view");
const firstUS = Number(root.dataset.firstUs), lastUS = Number(root.dataset.lastUs);
const fullT0 = firstUS;
let fullT1 = lastUS > firstUS ? lastUS : firstUS + 1; // grows while a live trace does
const MIN_SPAN = 10; // µs

const q = new URLSearchParams(location.search);

const view = {
  id: root.dataset.id,
  firstUS,
  t0: queryNum(q, "t0") ?? fullT0,
  t1: queryNum(q, "t1") ?? fullT1,
  cursor: queryNum(q, "c"),
  sel: queryNum(q, "sel"),
  m0: queryNum(q, "m0"),
  m1: queryNum(q, "m1"),
  panel: ["selection", "cursor", "summary"].includes(q.get("panel")) ? q.get("panel") : "cursor",
  stats: { fetchMs: [], drawMs: [], timelineMs: [], segmapMs: [], firstPaintMs: null },
};
if (!(view.t1 > view.t0)) { view.t0 = fullT0; view.t1 = fullT1; }
window.vramscope = view; // for tests and the console

let pal = palette();
const timeline = new Timeline(document.getElementById("timeline"), document.getElementById("timeline-tip"), view);
const segmap = new SegMap(document.getElementById("segmap"), document.getElementById("segmap-tip"), view);
view.timeline = timeline;
view.segmap = segmap;

// ---- state changes -------------------------------------------------------

let frame = 0, needTimeline = false, needMap = false, needDetails = false;

function schedule() {
  if (frame) return;
  frame = requestAnimationFrame(async () => {
    frame = 0;
    writeURL();
    draw();
    const loads = [];
    if (needTimeline) { needTimeline = false; loads.push(timeline.load()); }
    if (needMap && view.cursor !== null) { needMap = false; needDetails = true; loads.push(segmap.load()); }
    if (loads.length) {
      const done = await Promise.all(loads);
      if (view.cursor === null && timeline.usage) {
        // No cursor in the URL: start at the peak of allocated memory.
        view.cursor = peakTime(timeline.usage);
        needMap = true;
        schedule();
        return;
      }
      if (done.some(Boolean)) { draw(); firstPaint(); }
    }
    if (needDetails) { needDetails = false; details(); }
  });
}

view.redraw = () => schedule();

view.setWindow = (t0, t1) => {
  let span = Math.max(MIN_SPAN, t1 - t0);
  const full = fullT1 - fullT0, pad = Math.max(full * 0.05, MIN_SPAN);
  span = Math.min(span, full + 2 * pad);
  t0 = Math.max(fullT0 - pad, Math.min(t0, fullT1 + pad - span));
  // Whole microseconds: the URL holds the window exactly.
  view.t0 = Math.round(t0);
  view.t1 = Math.round(t0 + span);
  needTimeline = true;
  schedule();
};

view.zoomTime = (at, f) => {
  const t0 = at - (at - view.t0) * f, t1 = at + (view.t1 - at) * f;
  view.setWindow(t0, t1);
};

view.resetWindow = () => view.setWindow(fullT0, fullT1);
view.extendTo = (t) => { if (t > fullT1) fullT1 = t; };

view.setCursor = (t) => {
  view.cursor = Math.round(Math.max(fullT0, Math.min(fullT1, t)));
  needMap = true;
  schedule();
};

view.select = (seq) => {
  view.sel = seq;
  view.selBlock = null;
  view.panel = "selection";
  needDetails = true;
  schedule();
};

// A block allocated before the trace began has no alloc event to fetch.
view.selectBlock = (b) => {
  view.sel = null;
  view.selBlock = b;
  view.panel = "selection";
  needDetails = true;
  schedule();
};

view.setOffsets = (m0, m1) => {
  view.m0 = m0 === null ? null : Math.round(m0);
  view.m1 = m1 === null ? null : Math.round(m1);
  schedule();
};

const errBox = el("p", { class: "error", role: "alert", hidden: true });
root.prepend(errBox);
view.error = (msg) => { errBox.textContent = msg; errBox.hidden = false; };

function peakTime(u) {
  let best = 0, at = fullT1;
  for (let i = 0; i < u.events.length; i++) {
    if (u.allocated[2 * i + 1] > best) { best = u.allocated[2 * i + 1]; at = u.start_us + (i + 0.5) * u.bucket_us; }
  }
  return Math.round(Math.max(fullT0, Math.min(fullT1, at)));
}

function writeURL() {
  const p = new URLSearchParams();
  p.set("t0", Math.floor(view.t0));
  p.set("t1", Math.ceil(view.t1));
  if (view.cursor !== null) p.set("c", view.cursor);
  if (view.sel !== null) p.set("sel", view.sel);
  if (view.m0 !== null && view.m1 !== null) { p.set("m0", view.m0); p.set("m1", view.m1); }
  p.set("panel", view.panel);
  const url = location.pathname + "?" + p.toString();
  if (url !== location.pathname + location.search) history.replaceState(null, "", url);
}

function draw() {
  timeline.draw(pal);
  segmap.draw(pal);
  document.getElementById("window-label").textContent =
    fmtTime(view.t0 - firstUS) + " – " + fmtTime(view.t1 - firstUS) + " (" + fmtTime(view.t1 - view.t0) + ")";
  const d = segmap.data;
  document.getElementById("cursor-label").textContent =
    "at " + fmtTime(view.cursor - firstUS) + (d ? " · event " + d.seq + " · " + d.segment_count + " segments, " + d.block_count + " blocks" : "");
}

function firstPaint() {
  if (view.stats.firstPaintMs !== null || !timeline.usage || !segmap.data) return;
  performance.mark("vramscope-first-paint");
  view.stats.firstPaintMs = performance.now();
  root.dataset.ready = "1";
}

// ---- tooltips ------------------------------------------------------------

const stackOf = stackLoader(view.id);

view.showTip = (tip, h, x, y) => {
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
    const state = ["cached free", "allocated", "pending free"][b.state];
    rows.push(el("strong", {}, fmtBytes(b.size)), " " + state, el("br"));
    if (b.state !== 0) rows.push("requested " + fmtBytes(b.requested), el("br"), (b.seq >= 0 ? "alloc #" + b.seq : "allocated before the trace") + " at " + fmtAddr(b.addr));
    else rows.push("at " + fmtAddr(b.addr));
    sid = b.stack;
  } else {
    rows.push(el("strong", {}, fmtBytes(h.small)), el("br"), "small allocations, each under a pixel tall here: zoom in to see them");
  }
  placeTip(tip, rows, x, y, stackOf, sid);
};

// ---- details -------------------------------------------------------------

const panels = ["selection", "cursor", "summary"];
for (const p of panels) {
  document.getElementById("tab-" + p).addEventListener("click", () => { view.panel = p; needDetails = true; schedule(); });
}

let detailsAbort = null;

async function details() {
  for (const p of panels) {
    const active = p === view.panel;
    document.getElementById("panel-" + p).hidden = !active;
    const tab = document.getElementById("tab-" + p);
    tab.setAttribute("aria-selected", String(active));
    tab.classList.toggle("active", active);
  }
  detailsAbort?.abort();
  const ac = new AbortController();
  detailsAbort = ac;
  try {
    if (view.panel === "selection") await selectionPanel(ac.signal);
    else if (view.panel === "cursor") cursorPanel();
    else {
      const text = await api(`/api/traces/${view.id}/summary?t=${view.cursor}`, { signal: ac.signal, text: true });
      document.getElementById("summary-text").textContent = text;
    }
  } catch (e) {
    if (e.name !== "AbortError") view.error("Details: " + e.message);
  }
}

function dl(pairs) {
  const d = el("dl", { class: "facts" });
  for (const [k, v] of pairs) d.append(el("dt", {}, k), el("dd", {}, v));
  return d;
}

function cursorPanel() {
  const d = segmap.data;
  const box = document.getElementById("panel-cursor");
  if (!d) { box.replaceChildren(el("p", { class: "dim" }, "Loading…")); return; }
  const f = d.figures;
  box.replaceChildren(dl([
    ["Time", fmtTime(view.cursor - firstUS) + " (event " + d.seq + ")"],
    ["Reserved", fmtBytes(f.reserved_bytes)],
    ["Allocated", fmtBytes(f.allocated_bytes)],
    ["Active", fmtBytes(f.active_bytes)],
    ["Requested", fmtBytes(f.requested_bytes)],
    ["Cached free", fmtBytes(f.cached_free_bytes)],
    ["Largest free block", fmtBytes(f.largest_free_bytes) + (f.largest_free_bytes ? " at " + fmtAddr(d.largest_free_address) : "")],
    ["Fragmentation", (100 * f.fragmentation).toFixed(1) + " % (1 − largest free / total free)"],
    ["Segments", String(f.segments)],
    ["Blocks", String(f.blocks)],
  ]));
}

async function selectionPanel(signal) {
  const box = document.getElementById("panel-selection");
  if (view.sel === null && view.selBlock) {
    const b = view.selBlock;
    box.replaceChildren(el("h3", {}, "Block at " + fmtAddr(b.addr)), dl([
      ["Size", fmtBytes(b.size)], ["Requested", fmtBytes(b.requested)],
      ["Allocated", "before the trace began"],
    ]), await stackList(b.stack));
    return;
  }
  if (view.sel === null) {
    box.replaceChildren(el("p", { class: "dim" }, "Click an allocation on the timeline or a block on the map."));
    return;
  }
  const a = await api(`/api/traces/${view.id}/allocations/${view.sel}`, { signal });
  const freed = a.free_seq >= 0;
  const facts = dl([
    ["Allocation", "#" + a.seq + " at " + fmtAddr(a.address)],
    ["Size", fmtBytes(a.size) + " (" + a.size + " bytes)"],
    ["Requested", fmtBytes(a.requested_size) + " (" + a.requested_size + " bytes)"],
    ["Stream", String(a.stream)],
    ["Allocated at", fmtTime(a.alloc_us - firstUS)],
    ["Freed at", freed ? fmtTime(a.free_us - firstUS) + " (lived " + fmtTime(a.free_us - a.alloc_us) + ")" : "never (still allocated)"],
  ]);
  const evs = el("table", { class: "events" }, el("thead", {}, el("tr", {}, el("th", {}, "Event"), el("th", {}, "Action"), el("th", {}, "Time"), el("th", {}, "Stream"))));
  const tb = el("tbody");
  for (const e of a.events) tb.append(el("tr", {}, el("td", {}, "#" + e.seq), el("td", {}, e.action), el("td", {}, fmtTime(e.time_us - firstUS)), el("td", {}, String(e.stream))));
  evs.append(tb);
  const jump = el("button", { type: "button", class: "btn" }, "Move the cursor here");
  jump.addEventListener("click", () => view.setCursor(a.alloc_us));
  box.replaceChildren(el("h3", {}, "Allocation #" + a.seq), facts, jump, el("h4", {}, "Events"), evs, el("h4", {}, "Stack"), framesList(a.frames));
}

function framesList(frames) {
  if (!frames || !frames.length) return el("p", { class: "dim" }, "No stack was recorded.");
  const ol = el("ol", { class: "frames full" });
  for (const f of frames) ol.append(el("li", {}, frameText(f)));
  return ol;
}

async function stackList(sid) { return framesList(await stackOf(sid)); }

// ---- start ---------------------------------------------------------------

function layoutAll() { timeline.resize(); segmap.resize(); }

initTheme(() => { pal = palette(); schedule(); });
document.getElementById("reset").addEventListener("click", () => view.resetWindow());
let resizeTimer = 0;
new ResizeObserver(() => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => { const w = timeline.plotW; layoutAll(); if (timeline.plotW !== w) needTimeline = true; schedule(); }, 100);
}).observe(document.getElementById("timeline-wrap"));

layoutAll();
needTimeline = needMap = needDetails = true;
schedule();
initShare(view.id);
showIncidents(view, document.querySelector(".timeline-panel .legend")).catch((e) => view.error("Incidents: " + e.message));
if (root.dataset.status === "live") view.live = follow(view);
if (root.dataset.status !== "live") {
  document.getElementById("needed-panel").hidden = false;
  showNeeded(view.id, document.getElementById("needed")).catch((e) => view.error("Memory needed: " + e.message));
}
