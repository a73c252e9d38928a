// What a snapshot recorded beside its events (GET /api/traces/{id}/extras):
// the allocator settings as written, the annotations (record_function and
// dynamo region boundaries; a click moves the cursor there) and the events
// that carry user_metadata.
import { api, el } from "./common.js";

const ANNOTATIONS_PAGE = 500;

export async function showSnapshot(view, box) {
  const x = await api(`/api/traces/${view.id}/extras`);
  const parts = [el("h3", {}, "Allocator settings")];
  if (x.settings && typeof x.settings === "object") {
    const t = el("table", { class: "data", id: "settings-table" });
    for (const [k, v] of Object.entries(x.settings)) t.append(el("tr", {}, el("th", { scope: "row" }, k), el("td", {}, typeof v === "object" ? JSON.stringify(v) : String(v))));
    parts.push(t);
  } else {
    parts.push(el("p", { class: "dim" }, x.conf ? "The snapshot records none; the trace ran under " + x.conf + "." : "No allocator settings recorded (PyTorch's defaults)."));
  }
  parts.push(el("h3", {}, `Annotations (${x.annotations.length})`));
  if (x.annotations.length) {
    const t = el("table", { class: "data", id: "annotations-table" });
    t.append(el("thead", {}, el("tr", {}, el("th", {}, "Time"), el("th", {}, "Stage"), el("th", {}, "Name"))));
    const tb = el("tbody");
    t.append(tb);
    parts.push(t);
    // Rows a page at a time: a long run has tens of thousands, and laying
    // out a table of thousands of rows holds the page for a second.
    const more = el("button", { type: "button", class: "btn", id: "annotations-more" });
    const show = () => {
      const from = tb.childElementCount;
      for (const a of x.annotations.slice(from, from + ANNOTATIONS_PAGE)) {
        const tr = el("tr", { class: "annotation", tabindex: "0" }, el("td", {}, view.fmtT(a.time_us)), el("td", {}, a.stage), el("td", {}, a.name));
        tr.addEventListener("click", () => view.setCursor(a.time_us));
        tb.append(tr);
      }
      const left = x.annotations.length - tb.childElementCount;
      more.textContent = `Show ${Math.min(left, ANNOTATIONS_PAGE)} more (${left} not shown)`;
      more.hidden = left === 0;
    };
    more.addEventListener("click", show);
    show();
    parts.push(more);
  } else parts.push(el("p", { class: "dim" }, "None recorded."));
  parts.push(el("h3", {}, `user_metadata (${x.user_metadata_total} event${x.user_metadata_total === 1 ? "" : "s"})`));
  if (x.user_metadata.length) {
    const t = el("table", { class: "data", id: "metadata-table" });
    for (const m of x.user_metadata) {
      const tr = el("tr", { tabindex: "0" }, el("td", {}, "#" + m.seq), el("td", {}, m.user_metadata));
      tr.addEventListener("click", () => view.setCursorSeq(m.seq));
      t.append(tr);
    }
    parts.push(t);
  } else parts.push(el("p", { class: "dim" }, "No event carries any (torch.cuda.memory._set_memory_metadata was not used)."));
  box.replaceChildren(...parts);
  view.annotations = x.annotations;
  view.redraw();
}
