// The trace view: timeline, segment map, event list and details kept in
// step through one page state (pagestate.js), which keeps the view
// (window, memory range, cursor, selection, panel, search) in the URL.
import { api, el, dl, fmtBytes, fmtAddr, afterEvent } from "./common.js";
import { framesList } from "./tips.js";
import { PageState } from "./pagestate.js";
import { initShare } from "./share.js";
import { showIncidents } from "./incidents.js";
import { follow } from "./live.js";
import { showNeeded } from "./whatif.js";
import { initKeys } from "./keys.js";
import { EventList } from "./events.js";
import { Search } from "./search.js";
import { showSnapshot } from "./snapshot.js";
import { LivePanel, showJumps, loadSteps } from "./livemem.js";
import { phaseLegend } from "./timeline.js";

const root = document.getElementById("view");
const data = root.dataset;
const panels = ["selection", "cursor", "summary", "search", "snapshot"];

const view = new PageState(root, {
  fullT1: Number(data.lastUs),
  panels,
  panel: "cursor",
  initialCursor,
  cursorLabel: (d) => view.cursor === null && !d ? "Loading…" : (view.noEvents ? "" : "at " + view.fmtT(view.cursor)) +
    (d ? (view.noEvents ? afterEvent(d.seq, true) : d.seq < 0 ? " · before the first event" : " · event " + d.seq) + " · " + d.segment_count + " segments, " + d.block_count + " blocks" : ""),
  details,
  mapLoaded: (d) => {
    events.reveal(d?.seq ?? view.firstSeq);
    if (d) live.load(d.seq);
    if (view.panel === "cursor") cursorPanel(); // a new map, or its failure, replaces "Loading…"
  },
});
view.firstSeq = Number(data.firstSeq);
view.lastSeq = Number(data.lastSeq);
view.noEvents = view.lastSeq < 0 && data.status !== "live"; // a snapshot of its state alone
// No window in the URL: where the server says a first look should go (the
// steady steps, or where the events are), with a note of what that left
// out until the window moves; else the whole trace.
const openNote = document.getElementById("open-note");
if (view.t0 === null || view.t1 === null) {
  const ev = view.axis === "event";
  view.t0 = Number(ev ? data.openE0 : data.openT0);
  view.t1 = Number(ev ? data.openE1 : data.openT1);
  openNote.hidden = !openNote.firstChild?.textContent.trim();
}
if (!(view.t1 > view.t0)) { view.t0 = view.fullT0; view.t1 = view.fullT1; }
view.addEventListener("move", (e) => { if (e.detail.kind === "window" && e.detail.user) openNote.hidden = true; });
document.getElementById("open-whole").addEventListener("click", () => view.resetWindow());
window.vramscope = view; // for tests and the console

// No cursor in the URL: start right after the event at the peak of
// allocated memory (the store knows it exactly).
function initialCursor() {
  const seq = Number(data.peakSeq);
  if (seq >= 0) {
    view.cursorSeq = seq;
    return Number(data.peakUs);
  }
  return view.lastUS;
}

// ---- going to events -------------------------------------------------------

/** Puts the cursor right after event seq at time t, bringing t into the window. */
function goTo(seq, t) {
  const u = view.axis === "event" ? seq + 0.5 : t;
  if (u < view.t0 || u > view.t1) {
    const span = view.t1 - view.t0;
    view.setWindow(u - span / 2, u + span / 2);
  }
  view.setCursorSeq(seq, t);
}

/** Steps the cursor by d events. */
function step(d) {
  // The event asked for last, even if its map has not come yet: keys
  // pressed quickly step that many events.
  const cur = view.cursorSeq ?? view.segmap.data?.seq ?? view.firstSeq - 1;
  const seq = Math.max(view.firstSeq - 1, Math.min(view.lastSeq, cur + d));
  view.setCursorSeq(seq);
}

document.getElementById("go-peak").addEventListener("click", () => {
  const seq = Number(data.peakSeq);
  if (seq >= 0) goTo(seq, Number(data.peakUs));
});
let ooms = [];
document.getElementById("go-oom").addEventListener("click", () => {
  if (ooms.length) goTo(ooms[0].seq, ooms[0].time_us);
});

// ---- details -------------------------------------------------------------

for (const p of panels) {
  document.getElementById("tab-" + p).addEventListener("click", () => view.setPanel(p));
}
const allFrames = document.getElementById("all-frames");
allFrames.checked = view.allFrames;
allFrames.addEventListener("change", () => { view.setAllFrames(allFrames.checked); live.load(live.seq, true); });

let detailsAbort = null;
let snapshotShown = false;

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
    else if (view.panel === "summary") {
      const d = view.segmap.data;
      // No cursor yet (it starts at the peak once usage loads): the map's
      // load renders the details again.
      if (!d && view.cursor === null) { document.getElementById("summary-text").textContent = "Loading…"; return; }
      const at = d ? "seq=" + d.seq : "t=" + view.cursor;
      const text = await api(`/api/traces/${view.id}/summary?${at}`, { signal: ac.signal, text: true });
      document.getElementById("summary-text").textContent = text;
    } else if (view.panel === "snapshot" && !snapshotShown) {
      snapshotShown = true;
      await showSnapshot(view, document.getElementById("panel-snapshot"));
    }
  } catch (e) {
    if (e.name !== "AbortError") view.error("Details: " + e.message);
  }
}

function cursorPanel() {
  const d = view.segmap.data;
  const box = document.getElementById("panel-cursor");
  const failed = view.segmap.fetcher.failed;
  if (failed) { box.replaceChildren(el("p", { class: "error" }, "The segment map at the cursor failed: " + failed)); return; }
  if (!d) { box.replaceChildren(el("p", { class: "dim" }, "Loading…")); return; }
  const f = d.figures;
  box.replaceChildren(dl([
    ["Time", view.noEvents ? afterEvent(d.seq, true) : view.fmtT(d.seq >= 0 ? d.t : view.cursor) + " (" + afterEvent(d.seq) + ")"],
    ["Reserved", fmtBytes(f.reserved_bytes)],
    ["Allocated", fmtBytes(f.allocated_bytes)],
    ["Active", fmtBytes(f.active_bytes)],
    ["Requested", fmtBytes(f.requested_bytes)],
    ["Cached free", fmtBytes(f.cached_free_bytes)],
    ["Largest free block", fmtBytes(f.largest_free_bytes) + (f.largest_free_bytes ? " at " + fmtAddr(d.largest_free_address) : "")],
    ["Fragmentation", (100 * f.fragmentation).toFixed(1) + " % (1 − largest free / cached free)"],
    ["Segments", String(f.segments)],
    ["Blocks", String(f.blocks)],
  ]));
}

async function selectionPanel(signal) {
  const box = document.getElementById("panel-selection");
  if (view.sel === null && view.selBlock) {
    const b = view.selBlock;
    const st = await view.stackOf(b.stack);
    box.replaceChildren(el("h3", {}, "Block at " + fmtAddr(b.addr)), dl([
      ["Size", fmtBytes(b.size)], ["Requested", fmtBytes(b.requested)],
      ["Allocated", "before the trace began"],
      ["First user frame", st.label || "–"],
    ]), framesList(st.frames, { all: view.allFrames, named: st.named || [] }));
    return;
  }
  if (view.sel === null) {
    box.replaceChildren(el("p", { class: "dim" }, "Click an allocation on the timeline or a block on the map."));
    return;
  }
  const a = await api(`/api/traces/${view.id}/allocations/${view.sel}`, { signal });
  view.selInfo = a;
  const freed = a.free_seq >= 0;
  const facts = dl([
    ["Allocation", "#" + a.seq + " at " + fmtAddr(a.address)],
    ["Size", fmtBytes(a.size) + " (" + a.size + " bytes)"],
    ["Requested", fmtBytes(a.requested_size) + " (" + a.requested_size + " bytes)"],
    ["Stream", String(a.stream)],
    [a.named ? "Named by" : "First user frame", a.label || (a.verdict.made ? a.verdict.made + " · no stack" : "–")],
    ["Category", `${a.verdict.category} (${a.verdict.sure}: rule ${a.verdict.rule})`],
    ["Allocated at", view.fmtT(a.alloc_us)],
    ["Freed at", freed ? view.fmtT(a.free_us) + " (lived " + view.fmtDur(a.free_us - a.alloc_us) + ")" : "never (still allocated)"],
  ]);
  const evs = el("table", { class: "events" }, el("thead", {}, el("tr", {}, el("th", {}, "Event"), el("th", {}, "Action"), el("th", {}, "Time"), el("th", {}, "Stream"))));
  const tb = el("tbody");
  for (const e of a.events) {
    const tr = el("tr", { class: "event-row", tabindex: "0" }, el("td", {}, "#" + e.seq), el("td", {}, e.action), el("td", {}, view.fmtT(e.time_us)), el("td", {}, String(e.stream)));
    tr.addEventListener("click", () => goTo(e.seq, e.time_us));
    tb.append(tr);
  }
  evs.append(tb);
  const jump = el("button", { type: "button", class: "btn" }, "Move the cursor here");
  jump.addEventListener("click", () => goTo(a.seq, a.alloc_us));
  const fit = el("button", { type: "button", class: "btn" }, "Fit (F)");
  fit.addEventListener("click", () => view.fitSelection());
  box.replaceChildren(el("h3", {}, "Allocation #" + a.seq), facts, jump, " ", fit, el("h4", {}, "Events"), evs, el("h4", {}, "Stack"),
    framesList(a.frames, { all: view.allFrames, named: a.named || [], made: a.verdict.made }));
}

// ---- devices of the upload -----------------------------------------------

async function showDevices() {
  const t = await api(`/api/traces/${view.id}`);
  const nav = document.getElementById("devices");
  const run = t.run ? el("a", { href: "/runs/" + t.run.id, id: "run-link", title: "every rank of this run" }, `Run ${t.run.name} · rank ${t.run.rank}`) : null;
  if (!t.devices || t.devices.length < 2) {
    if (run) { nav.replaceChildren(run); nav.hidden = false; }
    return;
  }
  nav.replaceChildren(...(run ? [run, " "] : []), el("span", { class: "dim" }, "Device:"));
  for (const d of t.devices) {
    const name = "cuda:" + d.device + (d.oom_count ? " (OOM)" : "");
    nav.append(d.id === view.id ? el("span", { class: "current", "aria-current": "page" }, name)
      : el("a", { href: "/traces/" + d.id, class: d.oom_count ? "oom-device" : null, title: d.oom_count ? "this device ran out of memory" : null }, name));
  }
  nav.hidden = false;
}

// ---- start ---------------------------------------------------------------

const events = new EventList(document.getElementById("events"), view);
const live = new LivePanel(view);
window.vramscopeLive = live; // for tests and the console
document.getElementById("live-peak").addEventListener("click", () => document.getElementById("go-peak").click());
// A snapshot of its state alone has no peak event to go to.
document.getElementById("go-peak").hidden = document.getElementById("live-peak").hidden = view.noEvents;

// How the timeline colours its bands; the categories' legend shows with them.
const bandMode = document.getElementById("band-mode");
const catLegend = document.getElementById("cat-legend");
function showBandMode() {
  catLegend.hidden = view.bandMode === "alloc";
  if (!catLegend.hidden && !catLegend.childElementCount) {
    const names = ["parameters", "optimizer state", "gradients", "activations", "temporaries", "communication", "persistent state", "side stream", "unknown"];
    catLegend.replaceChildren(...names.map((n, i) => el("span", { class: "key cat" }, el("i", { class: "sw sw-" + i }), n)));
  }
}
bandMode.value = view.bandMode;
bandMode.addEventListener("change", () => { view.setBandMode(bandMode.value); showBandMode(); });
showBandMode();
// The axis: time, or events (offered for a trace of timed events, not live).
const axis = document.getElementById("axis");
document.getElementById("axis-label").hidden = data.eventAxis !== "1";
axis.value = view.axis;
axis.addEventListener("change", () => view.setAxis(axis.value).catch((e) => view.error("The event axis: " + e.message)));
view.addEventListener("axis", () => { axis.value = view.axis; });
const search = new Search(view, document.getElementById("search-form"), document.getElementById("search-q"), document.getElementById("panel-search"));
view.search = search;
initKeys(view, [
  ["↑", "cursor to the event before", () => step(-1)],
  ["↓", "cursor to the event after", () => step(1)],
  ["/", "search the stacks", () => { document.getElementById("search-q").focus(); }],
  ["L", "follow a live trace (or stop following)", () => false],
]);
view.start();
document.getElementById("fit-memory").addEventListener("click", () => view.setMemory(null, null));
view.request("timeline", "map", "details");
if (view.q) search.run(view.q);
initShare(view.id);
showDevices().catch((e) => view.error("Devices: " + e.message));
showIncidents(view, document.querySelector(".timeline-panel .legend")).then((list) => {
  ooms = list || [];
  document.getElementById("go-oom").hidden = !ooms.length;
  return showJumps(view, goTo, ooms);
}).then(showPhases).catch((e) => view.error("Incidents and steps: " + e.message));

function showPhases() {
  const phases = document.getElementById("phase-legend");
  phases.replaceChildren(...phaseLegend(view.regions));
  phases.hidden = !phases.childElementCount;
}

// ---- a live trace grows ----------------------------------------------------

// The event list takes the new events, and the steps (their regions and
// peaks) are read again: at most every STEPS_MS while the trace streams
// (a change within that is read at its end), and at once when it ends.
const STEPS_MS = 2000;
let stepsRead = 0, stepsReading = null, stepsDirty = false, stepsTimer = 0, streamEnded = false, firstSeqAsked = null;

function readSteps() {
  clearTimeout(stepsTimer);
  stepsTimer = 0;
  stepsRead = performance.now();
  stepsReading = loadSteps(view, goTo).then(showPhases).catch((e) => view.error("Steps: " + e.message)).finally(() => {
    stepsReading = null;
    if (stepsDirty) scheduleSteps(); // the trace changed while they were read
  });
}

function scheduleSteps() {
  if (stepsReading) { stepsDirty = true; return; }
  stepsDirty = false;
  const wait = streamEnded ? 0 : STEPS_MS - (performance.now() - stepsRead);
  if (wait <= 0) readSteps();
  else stepsTimer ||= setTimeout(readSteps, wait);
}

async function grown(m) {
  streamEnded = m.status !== "live";
  scheduleSteps();
  if (m.events > 0 && view.firstSeq < 0) {
    // The page opened before the first event: which it is, the trace says.
    firstSeqAsked ??= api(`/api/traces/${view.id}`).then((t) => t.first_seq);
    const first = await firstSeqAsked;
    if (first >= 0) events.grow(first, m.seq);
  } else if (m.events > 0) {
    events.grow(view.firstSeq, m.seq);
  }
}

if (data.status === "live") {
  view.live = follow(view);
  view.addEventListener("tail", (e) => grown(e.detail));
}
if (data.status !== "live") {
  document.getElementById("needed-panel").hidden = false;
  showNeeded(view.id, document.getElementById("needed")).catch((e) => view.error("Memory needed: " + e.message));
}
