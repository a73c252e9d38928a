// The incident page: one OOM explained. The segment map is frozen right
// after the oom event, with the live blocks that keep split segments from
// being released marked; the timeline shows the time leading up to it with
// the cursor fixed at the OOM. The window and the selection live in the
// URL, as on the trace view, so Share restores them. Everything shown comes
// from the JSON API and is written as text, never as HTML.
import { api, el, queryNum, fmtBytes, fmtTime, fmtAddr, initTheme, palette } from "./common.js";
import { frameText, hideTip, placeTip, stackLoader } from "./tips.js";
import { Timeline } from "./timeline.js";
import { SegMap } from "./segmap.js";
import { initShare } from "./share.js";
import { loadWhatIf, whatIfTable } from "./whatif.js";

const root = document.getElementById("incident");
const firstUS = Number(root.dataset.firstUs), lastUS = Number(root.dataset.lastUs);
const oomUS = Number(root.dataset.timeUs), n = Number(root.dataset.n);
const MIN_SPAN = 10; // µs

const q = new URLSearchParams(location.search);

const view = {
  id: root.dataset.id,
  firstUS,
  t0: queryNum(q, "t0"),
  t1: queryNum(q, "t1"),
  cursor: oomUS, // fixed: the map shows the OOM
  layoutSeq: Number(root.dataset.seq),
  sel: queryNum(q, "sel"),
  m0: queryNum(q, "m0"),
  m1: queryNum(q, "m1"),
  markers: [{ t: oomUS, n }],
  pinned: new Set(),
  home: null, // the window the API suggests
  stats: { fetchMs: [], drawMs: [], timelineMs: [], segmapMs: [], firstPaintMs: null },
};
window.vramscope = view; // for tests and the console

let pal = palette();
const timeline = new Timeline(document.getElementById("timeline"), document.getElementById("timeline-tip"), view);
const segmap = new SegMap(document.getElementById("segmap"), document.getElementById("segmap-tip"), view);
view.timeline = timeline;
view.segmap = segmap;

const errBox = el("p", { class: "error", role: "alert", hidden: true });
root.prepend(errBox);
view.error = (msg) => { errBox.textContent = msg; errBox.hidden = false; };

// ---- view state ----------------------------------------------------------

let frame = 0, needTimeline = false;

function schedule() {
  if (frame) return;
  frame = requestAnimationFrame(async () => {
    frame = 0;
    writeURL();
    draw();
    if (needTimeline) {
      needTimeline = false;
      if (await timeline.load()) draw();
    }
  });
}

view.redraw = () => schedule();

view.setWindow = (t0, t1) => {
  const full = Math.max(lastUS, oomUS) - firstUS, pad = Math.max(full * 0.05, MIN_SPAN);
  const span = Math.min(Math.max(MIN_SPAN, t1 - t0), full + 2 * pad);
  t0 = Math.max(firstUS - pad, Math.min(t0, firstUS + full + pad - span));
  view.t0 = Math.round(t0);
  view.t1 = Math.round(t0 + span);
  needTimeline = true;
  schedule();
};
view.zoomTime = (at, f) => view.setWindow(at - (at - view.t0) * f, at + (view.t1 - at) * f);
view.resetWindow = () => { if (view.home) view.setWindow(view.home.t0, view.home.t1); };
view.setCursor = () => {}; // the cursor stays at the OOM
view.select = (seq) => { view.sel = seq; schedule(); };
view.selectBlock = () => { view.sel = null; schedule(); };
view.setOffsets = (m0, m1) => {
  view.m0 = m0 === null ? null : Math.round(m0);
  view.m1 = m1 === null ? null : Math.round(m1);
  schedule();
};

function writeURL() {
  if (view.t0 === null) return;
  const p = new URLSearchParams();
  p.set("t0", Math.floor(view.t0));
  p.set("t1", Math.ceil(view.t1));
  if (view.sel !== null) p.set("sel", view.sel);
  if (view.m0 !== null && view.m1 !== null) { p.set("m0", view.m0); p.set("m1", view.m1); }
  const url = location.pathname + "?" + p.toString();
  if (url !== location.pathname + location.search) history.replaceState(null, "", url);
}

function draw() {
  if (view.t0 === null) return;
  timeline.draw(pal);
  segmap.draw(pal);
  document.getElementById("window-label").textContent =
    fmtTime(view.t0 - firstUS) + " – " + fmtTime(view.t1 - firstUS) + " (" + fmtTime(view.t1 - view.t0) + ")";
  const d = segmap.data;
  document.getElementById("cursor-label").textContent =
    d ? "right after event " + d.seq + " · " + d.segment_count + " segments, " + d.block_count + " blocks" : "";
}

// ---- tooltips ------------------------------------------------------------

const stackOf = stackLoader(view.id);

view.showTip = (tip, h, x, y) => {
  if (!h || (!h.band && !h.block && !h.small)) { hideTip(tip); return; }
  const rows = [];
  let sid = 0;
  if (h.band) {
    rows.push(el("strong", {}, fmtBytes(h.band.size)), el("br"), "alloc #" + h.band.seq + " at " + fmtAddr(h.band.address));
    sid = h.band.stack;
  } else if (h.block) {
    const b = h.block;
    rows.push(el("strong", {}, fmtBytes(b.size)), " " + ["cached free", "allocated", "pending free"][b.state], el("br"));
    if (b.state !== 0 && view.pinned.has(b.segment)) rows.push("pins its segment: it cannot be released", el("br"));
    rows.push("at " + fmtAddr(b.addr));
    sid = b.state !== 0 ? b.stack : 0;
  } else {
    rows.push(el("strong", {}, fmtBytes(h.small)), el("br"), "small allocations: zoom in to see them");
  }
  placeTip(tip, rows, x, y, stackOf, sid);
};

// ---- the report ----------------------------------------------------------

function dl(pairs) {
  const d = el("dl", { class: "facts" });
  for (const [k, v] of pairs) d.append(el("dt", {}, k), el("dd", {}, v));
  return d;
}

function table(id, head, rows) {
  const t = el("table", { class: "data", id });
  t.append(el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { scope: "col" }, h)))));
  const tb = el("tbody");
  for (const r of rows) tb.append(el("tr", {}, ...r.map((c) => el("td", {}, c))));
  t.append(tb);
  return t;
}

const MAX_ROWS = 50;

function more(total) {
  return total > MAX_ROWS ? el("p", { class: "dim" }, `and ${total - MAX_ROWS} more`) : null;
}

function showReport(d) {
  const r = d.report;
  const verdict = document.getElementById("verdict");
  verdict.textContent = r.verdict;
  verdict.classList.add(r.kind);
  const cap = r.capacity_bytes ? fmtBytes(r.capacity_bytes) + (d.capacity_estimated ? " (estimated: the recording lacks it)" : "") : "unknown";
  document.getElementById("facts").replaceChildren(dl([
    ["Asked for", fmtBytes(r.request_bytes) + " on stream " + r.stream],
    ["Tried to reserve", fmtBytes(r.segment_bytes) + " from the driver (a new segment for the request)"],
    ["Free on the device", fmtBytes(r.device_free_bytes) + " of " + cap],
    ["Reserved by the allocator", fmtBytes(r.reserved_bytes) + " in " + r.segments + " segments"],
    ["Allocated", fmtBytes(r.allocated_bytes)],
    ["Reserved but unallocated", fmtBytes(r.cached_free_bytes)],
    ["Largest free block", fmtBytes(r.largest_free_bytes)],
    ["Not allocated in all", fmtBytes(r.not_allocated_bytes) + " (device free + reserved but unallocated)"],
    ["Fragmentation", (100 * r.fragmentation).toFixed(1) + " % (1 − largest free / cached free)"],
  ]));
  document.getElementById("pools").replaceChildren(table("pools-table",
    ["Pool", "Stream", "Segments", "Reserved", "Free", "Largest free block"],
    r.pools.map((p) => [p.pool, String(p.stream), String(p.segments), fmtBytes(p.reserved_bytes), fmtBytes(p.free_bytes), fmtBytes(p.largest_free_bytes)])));
  const pinned = r.pinned_segments || [];
  document.getElementById("pinned").replaceChildren(pinned.length ? table("pinned-table",
    ["Segment", "Size", "Pool", "Stream", "Live blocks", "Live", "Free", "Largest free"],
    pinned.slice(0, MAX_ROWS).map((s) => [fmtAddr(s.address), fmtBytes(s.size), s.pool, String(s.stream), String(s.live_blocks),
      fmtBytes(s.live_bytes), fmtBytes(s.free_bytes), fmtBytes(s.largest_free_bytes)])) : el("p", {}, "None: no segment was split by live blocks."),
  more(pinned.length) || "");
  const groups = r.pinners || [];
  const box = document.getElementById("pinners");
  box.replaceChildren();
  if (!groups.length) box.append(el("p", {}, "No live allocation pins a split segment."));
  for (const g of groups.slice(0, MAX_ROWS)) {
    const frames = d.stacks[String(g.stack)];
    const list = frames && frames.length ? el("ol", { class: "frames full" }, ...frames.map((f) => el("li", {}, frameText(f))))
      : el("p", { class: "dim" }, g.stack ? "Stack #" + g.stack + " (not loaded)" : "No stack was recorded.");
    box.append(el("div", { class: "pinner" },
      el("h4", {}, `${g.count} allocation${g.count === 1 ? "" : "s"}, ${fmtBytes(g.bytes)}, pinning ${g.segments} segment${g.segments === 1 ? "" : "s"}`),
      list));
  }
  const m = more(groups.length);
  if (m) box.append(m);
  for (const s of pinned) view.pinned.add(s.address);
}

// What each setting would have done with this request, in words and as a
// table (whatif.js); the replays can take a while on a big trace.
async function showWhatIf(url) {
  const w = await loadWhatIf(url, document.getElementById("whatif-status"));
  const says = w.incident ? el("ul", { class: "whatif-says" }, ...w.incident.sentences.map((s) => el("li", {}, s))) : "";
  document.getElementById("whatif").replaceChildren(says, whatIfTable(w, w.incident?.index));
  root.dataset.whatif = "done";
}

// ---- start ---------------------------------------------------------------

function layoutAll() { timeline.resize(); segmap.resize(); }

async function start() {
  const d = await api(`/api/traces/${view.id}/incidents/${n}`);
  view.home = d.window;
  if (view.t0 === null || view.t1 === null || !(view.t1 > view.t0)) { view.t0 = d.window.t0; view.t1 = d.window.t1; }
  showReport(d);
  layoutAll();
  const [tl, sm] = await Promise.all([timeline.load(), segmap.load()]);
  draw();
  if (tl && sm) root.dataset.ready = "1";
  showWhatIf(d.whatif_url).catch((e) => {
    document.getElementById("whatif-status").textContent = "What-if failed: " + e.message;
    document.getElementById("whatif-status").classList.add("error");
  });
}

initTheme(() => { pal = palette(); schedule(); });
initShare(view.id);
document.getElementById("reset").addEventListener("click", () => view.resetWindow());
let resizeTimer = 0;
new ResizeObserver(() => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => { const w = timeline.plotW; layoutAll(); if (timeline.plotW !== w) needTimeline = true; schedule(); }, 100);
}).observe(document.getElementById("timeline-wrap"));
start().catch((e) => view.error("Incident: " + e.message));
