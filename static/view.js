// The trace view: timeline, segment map and details kept in step through
// one page state (pagestate.js), which keeps the view (window, cursor,
// selection, panel, map offsets) in the URL.
import { api, el, dl, fmtBytes, fmtTime, fmtAddr } from "./common.js";
import { framesList } from "./tips.js";
import { PageState } from "./pagestate.js";
import { initShare } from "./share.js";
import { showIncidents } from "./incidents.js";
import { follow } from "./live.js";
import { showNeeded } from "./whatif.js";

const root = document.getElementById("view");
const firstUS = Number(root.dataset.firstUs), lastUS = Number(root.dataset.lastUs);
const panels = ["selection", "cursor", "summary"];

const view = new PageState(root, {
  fullT1: lastUS,
  panels,
  panel: "cursor",
  initialCursor: () => peakTime(view.timeline.usage),
  cursorLabel: (d) => "at " + fmtTime(view.cursor - firstUS) + (d ? " · event " + d.seq + " · " + d.segment_count + " segments, " + d.block_count + " blocks" : ""),
  details,
});
view.t0 ??= view.fullT0;
view.t1 ??= view.fullT1;
if (!(view.t1 > view.t0)) { view.t0 = view.fullT0; view.t1 = view.fullT1; }
window.vramscope = view; // for tests and the console

// No cursor in the URL: start at the peak of allocated memory.
function peakTime(u) {
  let best = 0, at = view.fullT1;
  for (let i = 0; i < u.events.length; i++) {
    if (u.allocated[2 * i + 1] > best) { best = u.allocated[2 * i + 1]; at = u.start_us + (i + 0.5) * u.bucket_us; }
  }
  return Math.round(Math.max(view.fullT0, Math.min(view.fullT1, at)));
}

// ---- details -------------------------------------------------------------

for (const p of panels) {
  document.getElementById("tab-" + p).addEventListener("click", () => view.setPanel(p));
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

function cursorPanel() {
  const d = view.segmap.data;
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

async function stackList(sid) { return framesList(await view.stackOf(sid)); }

// ---- start ---------------------------------------------------------------

view.start();
view.request("timeline", "map", "details");
initShare(view.id);
showIncidents(view, document.querySelector(".timeline-panel .legend")).catch((e) => view.error("Incidents: " + e.message));
if (root.dataset.status === "live") view.live = follow(view);
if (root.dataset.status !== "live") {
  document.getElementById("needed-panel").hidden = false;
  showNeeded(view.id, document.getElementById("needed")).catch((e) => view.error("Memory needed: " + e.message));
}
