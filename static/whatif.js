// The what-if answer of a trace (GET …/whatif): the whole trace replayed
// under its recorded settings and the usual cures for fragmentation, with
// the memory each needs. The incident page reads it for one OOM; the trace
// view shows what the run needs. Written as text, never as HTML.
import { api, el, fmtBytes } from "./common.js";

/**
 * Asks url until the replays are done (the server answers 202 while they
 * run), telling status how it goes, and returns the answer.
 */
export async function loadWhatIf(url, status) {
  status.textContent = "Replaying the trace under each setting…";
  for (;;) {
    const w = await api(url);
    if (w.status === "done") {
      let says = `${w.requests} requests replayed on ${w.device_text}.`;
      // A limit the snapshot does not record, and why it is believed.
      if (w.limit_from) says += ` Under ${w.limit_from}.`;
      if (w.contradiction) says += " " + w.contradiction;
      status.textContent = says;
      return w;
    }
    status.textContent = "Replaying the trace under each setting… (still running)";
  }
}

/** The memory a row needs, as the server words it, and why the replay failed when it did. */
function needed(r) {
  return r.error ? r.needed_text + " (the replay failed: " + r.error + ")" : r.needed_text;
}

/**
 * The table of w's rows. With oom (one of w.original_ooms, by position),
 * it says what each setting did with that request and the fragmentation
 * right after it.
 */
export function whatIfTable(w, oom) {
  const k = oom === undefined ? -1 : w.original_ooms.findIndex((o) => o.index === oom);
  const head = ["Settings"];
  if (k >= 0) head.push("This request", "Fragmentation here");
  head.push("OOMs", "New OOMs", "Peak reserved", "Memory needed");
  const t = el("table", { class: "data", id: "whatif-table" });
  t.append(el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { scope: "col" }, h)))));
  const body = el("tbody");
  w.rows.forEach((r, i) => {
    // The settings as written, then what they do (a fraction added only
    // to turn garbage collection on must not read as a limit lifted).
    const tr = el("tr", {}, el("td", { class: "setting" }, el("span", { class: "conf" }, (r.alloc_conf || "(defaults)") + (i === 0 ? " [original]" : "")),
      r.what ? el("div", { class: "dim what" }, r.what) : null));
    if (k >= 0) {
      const served = r.ooms.every((o) => o.index !== oom);
      tr.append(el("td", { class: served && i > 0 ? "yes" : null }, r.error ? "–" : served ? "served" : "failed"),
        el("td", {}, k < r.fragmentation_at_oom.length ? (100 * r.fragmentation_at_oom[k]).toFixed(1) + " %" : "–"));
    }
    // A replay that stopped counted nothing of the setting's: no figures.
    tr.append(el("td", {}, r.error ? "–" : String(r.ooms.length)), el("td", {}, i === 0 || r.error ? "–" : String(r.new_ooms.length)),
      el("td", {}, r.error ? "–" : fmtBytes(r.peak_reserved)), el("td", { class: "why" }, needed(r)));
    body.append(tr);
  });
  t.append(body);
  return t;
}

/**
 * The trace view's line on the memory the run needs, filled into box from
 * the trace's what-if; a live trace is left alone (it keeps growing).
 */
export async function showNeeded(id, box) {
  const status = el("p", { class: "dim", role: "status" });
  box.replaceChildren(status);
  box.hidden = false;
  const w = await loadWhatIf(`/api/traces/${id}/whatif`, status);
  box.append(el("p", { class: "needed" }, w.needed), whatIfTable(w));
  box.dataset.done = "1";
}
