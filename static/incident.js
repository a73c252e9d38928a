// The incident page: one OOM explained. The segment map is frozen right
// after the oom event, with the live blocks that keep split segments from
// being released marked; the timeline shows the time leading up to it with
// the cursor fixed at the OOM. The window and the selection live in the
// URL, as on the trace view, so Share restores them. Everything shown comes
// from the JSON API and is written as text, never as HTML.
import { api, el, dl, fmtAddr, fmtBytes } from "./common.js";
import { framesList } from "./tips.js";
import { PageState } from "./pagestate.js";
import { initShare } from "./share.js";
import { loadWhatIf, whatIfTable } from "./whatif.js";
import { initKeys } from "./keys.js";

const root = document.getElementById("incident");
const lastUS = Number(root.dataset.lastUs);
const oomUS = Number(root.dataset.timeUs), n = Number(root.dataset.n);

let home = null; // the window the API suggests
const view = new PageState(root, {
  fullT1: Math.max(lastUS, oomUS),
  cursor: oomUS, // fixed: the map shows the OOM
  layoutSeq: Number(root.dataset.seq),
  markers: [{ t: oomUS, n }],
  home: () => home && [home.t0, home.t1],
  cursorLabel: (d) => d ? "right after event " + d.seq + " · " + d.segment_count + " segments, " + d.block_count + " blocks" : "",
});
window.vramscope = view; // for tests and the console

// ---- the report ----------------------------------------------------------

function table(id, head, rows) {
  const t = el("table", { class: "data", id });
  t.append(el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { scope: "col" }, h)))));
  const tb = el("tbody");
  for (const r of rows) tb.append(el("tr", {}, ...r.map((c) => el("td", {}, c))));
  t.append(tb);
  return t;
}

const MAX_ROWS = 50;
const STACK_FRAMES = 8; // frames shown of a pinning stack before "more frames"

function more(total) {
  return total > MAX_ROWS ? el("p", { class: "dim" }, `and ${total - MAX_ROWS} more`) : null;
}

function showReport(d) {
  const r = d.report, room = r.room;
  const verdict = document.getElementById("verdict");
  verdict.textContent = r.verdict;
  verdict.classList.add(r.kind);
  // The figures the verdict reads, each as the server counted it; the
  // sentences are the server's, so every page and the CLI say them alike.
  const notAllocated = fmtBytes(r.not_allocated_bytes) + " = " + fmtBytes(room.cached_bytes) + " cached + " + fmtBytes(room.headroom_bytes) +
    (room.limit_bytes ? " never reserved under the limit" : " free on the device");
  document.getElementById("facts").replaceChildren(dl([
    ["Asked for", fmtBytes(r.request_bytes) + " on stream " + r.stream + " (a new " + fmtBytes(r.segment_bytes) + " segment from the driver)"],
    ["Allocated", fmtBytes(r.allocated_bytes) + " in " + r.segments + " segments reserving " + fmtBytes(r.reserved_bytes)],
    ["Not allocated", notAllocated],
    ["Largest free block", fmtBytes(r.largest_free_bytes) + " (fragmentation " + (100 * r.fragmentation).toFixed(1) + " %: 1 − largest free / cached free)"],
    ...(r.limit_text ? [["Per-process limit", r.limit_text]] : []),
    ["Device", r.device_text],
  ]));
  document.getElementById("pools").replaceChildren(table("pools-table",
    ["Pool", "Stream", "Segments", "Reserved", "Free", "Largest free block"],
    r.pools.map((p) => [p.pool, String(p.stream), String(p.segments), fmtBytes(p.reserved_bytes), fmtBytes(p.free_bytes), fmtBytes(p.largest_free_bytes)])));
  const pinned = r.pinned_segments || [];
  document.getElementById("pinned-count").textContent = `(${pinned.length})`;
  document.getElementById("pinned").replaceChildren(pinned.length ? table("pinned-table",
    ["Segment", "Size", "Pool", "Stream", "Live blocks", "Live", "Free", "Largest free"],
    pinned.slice(0, MAX_ROWS).map((s) => [fmtAddr(s.address), fmtBytes(s.size), s.pool, String(s.stream), String(s.live_blocks),
      fmtBytes(s.live_bytes), fmtBytes(s.free_bytes), fmtBytes(s.largest_free_bytes)])) : el("p", {}, "None: no segment was split by live blocks."),
  more(pinned.length) || "");
  const groups = r.pinners || [];
  document.getElementById("pinners-count").textContent = `(${groups.length})`;
  const box = document.getElementById("pinners");
  box.replaceChildren();
  if (!groups.length) box.append(el("p", {}, "No live allocation pins a split segment."));
  for (const [i, g] of groups.slice(0, MAX_ROWS).entries()) {
    const frames = d.stacks[String(g.stack)];
    const list = el("div", {}, frames || !g.stack ? framesList(frames, { max: STACK_FRAMES }) : el("p", { class: "dim" }, "Stack #" + g.stack + " (not loaded)"));
    const head = el("summary", {}, `${g.count} allocation${g.count === 1 ? "" : "s"}, ${fmtBytes(g.bytes)}, pinning ${g.segments} segment${g.segments === 1 ? "" : "s"}`);
    // Each stack folded under its line, the first (the most segments)
    // open: the list reads as a table of them.
    box.append(el("details", { class: "pinner", open: i === 0 }, head, list));
    // The stack sorted for people: C++ and interpreter frames folded, the
    // first user frame as its label, long stacks cut to STACK_FRAMES.
    if (g.stack) {
      view.stackOf(g.stack).then((st) => {
        if (!st.frames.length) return;
        if (st.label) head.append(el("span", { class: "label" }, " · " + st.label));
        list.replaceChildren(framesList(st.frames, { max: STACK_FRAMES }));
      });
    }
  }
  const m = more(groups.length);
  if (m) box.append(m);
  for (const s of pinned) view.pinned.add(s.address);
}

// What each setting would have done with this request: the fix first (the
// setting that served it with the memory it needs), then the table
// (whatif.js); the replays can take a while on a big trace.
async function showWhatIf(url) {
  const w = await loadWhatIf(url, document.getElementById("whatif-status"));
  const fix = document.getElementById("fix");
  fix.textContent = w.incident ? w.incident.fix : w.needed;
  fix.classList.add("done");
  const says = w.incident ? el("ul", { class: "whatif-says" }, ...w.incident.sentences.map((s) => el("li", {}, s))) : "";
  document.getElementById("whatif").replaceChildren(says, whatIfTable(w, w.incident?.index));
  root.dataset.whatif = "done";
}

// ---- start ---------------------------------------------------------------

async function start() {
  const d = await api(`/api/traces/${view.id}/incidents/${n}`);
  home = d.window;
  if (view.t0 === null || view.t1 === null || !(view.t1 > view.t0)) { view.t0 = d.window.t0; view.t1 = d.window.t1; }
  showReport(d);
  view.request("timeline", "map");
  showWhatIf(d.whatif_url).catch((e) => {
    for (const id of ["whatif-status", "fix"]) {
      document.getElementById(id).textContent = "What-if failed: " + e.message;
      document.getElementById(id).classList.add("error");
    }
  });
}

view.start();
initKeys(view);
initShare(view.id);
start().catch((e) => view.error("Incident: " + e.message));
