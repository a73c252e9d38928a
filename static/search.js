// Search: the allocations whose stack has a frame whose function or file
// name contains the text, or whose address range holds it read as a hex
// address (GET /api/traces/{id}/search). The matches are listed (a click
// selects one and moves the cursor to it), ticked under the timeline and
// outlined where they are bands. The text is in the URL (q), so a search
// link is a permalink.
import { api, el, fmtAddr, fmtBytes } from "./common.js";

export class Search {
  constructor(view, form, input, box) {
    this.view = view;
    this.box = box;
    this.input = input;
    this.result = null;
    input.value = view.q;
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.run(input.value.trim());
    });
  }

  /** Searches for q ("" clears) and shows the search panel. */
  async run(q) {
    const v = this.view;
    v.q = q;
    this.input.value = q;
    this.result = null;
    v.searchMarks = v.searchSeqs = null;
    if (!q) {
      this.box.replaceChildren(el("p", { class: "dim" }, "Search the stacks for a function or file name, or an address."));
      v.redraw();
      return;
    }
    v.setPanel("search");
    this.box.replaceChildren(el("p", { class: "dim" }, "Searching…"));
    try {
      const r = await api(`/api/traces/${v.id}/search?q=${encodeURIComponent(q)}&limit=1000`);
      if (v.q !== q) return;
      this.result = r;
      v.searchMarks = r.matches.map((m) => Math.max(v.firstUS, m.alloc_us));
      v.searchSeqs = new Set(r.matches.map((m) => m.seq));
      v.redraw();
      this.render();
    } catch (e) {
      this.box.replaceChildren(el("p", { class: "error" }, "Search failed: " + e.message));
    }
  }

  render() {
    const r = this.result, v = this.view;
    if (!r) return;
    const what = r.address !== undefined && r.address !== null ? ` (or holding address ${fmtAddr(r.address)})` : "";
    const head = el("p", { id: "search-summary" }, `${r.total} allocation${r.total === 1 ? "" : "s"} whose stack mentions “${r.q}”${what}` +
      (r.total > r.matches.length ? `; the first ${r.matches.length} by allocation order:` : ":"));
    const t = el("table", { class: "data matches", id: "search-results" });
    t.append(el("thead", {}, el("tr", {}, ...["Alloc", "Size", "First user frame", "Allocated", "Freed"].map((h) => el("th", { scope: "col" }, h)))));
    const tb = el("tbody");
    for (const m of r.matches) {
      const before = m.seq < 0;
      const tr = el("tr", { class: "match", tabindex: "0", "data-seq": m.seq },
        el("td", {}, before ? "before" : "#" + m.seq), el("td", {}, fmtBytes(m.size)), el("td", { class: "c-frame" }, m.label || ""),
        el("td", {}, before ? "before the trace" : v.fmtT(m.alloc_us)), el("td", {}, m.free_us > 1e18 ? "never" : v.fmtT(m.free_us)));
      const go = () => {
        if (before) v.selectBlock({ addr: m.address, size: m.size, requested: m.requested_size, stack: m.stack, seq: -1 });
        else { v.select(m.seq); v.setCursor(m.alloc_us); }
        v.setPanel("selection");
      };
      tr.addEventListener("click", go);
      tr.addEventListener("keydown", (e) => { if (e.key === "Enter") go(); });
      tb.append(tr);
    }
    t.append(tb);
    this.box.replaceChildren(head, r.matches.length ? t : el("p", { class: "dim" }, "Nothing matches."));
  }
}
