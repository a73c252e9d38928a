// The event list (memory_viz's Allocator State History): every event of the
// trace in a virtualised list, one row per event (action, size, address,
// stream, first user frame, time), fetched a page at a time around what is
// shown. The row of the cursor's event is marked; a click puts the cursor
// right after that event, and ↑/↓ step it. Lists taller than a browser can
// scroll map the scroll position onto the events instead of one pixel row
// per event pixel. A live trace's list grows as its events come (grow).
import { api, el, fmtAddr, fmtBytes } from "./common.js";

const ROW = 20, PAGE = 256, MAX_PX = 4e6;

export class EventList {
  /**
   * @param {HTMLElement} box  the scrolling container
   * @param {object} view  the page state; view.firstSeq..view.lastSeq are the events
   */
  constructor(box, view) {
    this.box = box;
    this.view = view;
    this.pages = new Map(); // page number -> Promise of {events, labels, user_metadata} (or the answer)
    this.n = view.firstSeq < 0 ? 0 : Math.max(0, view.lastSeq - view.firstSeq + 1);
    this.spacer = el("div", { class: "vspacer" });
    this.rows = el("div", { class: "vrows", role: "listbox", "aria-label": "Events" });
    box.replaceChildren(this.spacer, this.rows);
    if (!this.n) {
      this.empty = el("p", { class: "dim" }, view.noEvents ? "No events: the snapshot holds the allocator's state at one instant."
        : "No events yet: they are listed as they come.");
      box.append(this.empty);
    }
    this.spacer.style.height = Math.min(this.n * ROW, MAX_PX) + "px";
    box.addEventListener("scroll", () => this.render());
    new ResizeObserver(() => this.render()).observe(box);
    this.rows.addEventListener("click", (e) => {
      const row = e.target.closest("[data-seq]");
      if (row) view.setCursorSeq(Number(row.dataset.seq), Number(row.dataset.t));
    });
    this.render();
  }

  get visible() { return Math.max(1, Math.floor(this.box.clientHeight / ROW)); }

  /**
   * The trace now has events first..last (a live trace grew): the list
   * takes them, and reads again the page that held the old last event,
   * which was read before the events after it came.
   */
  grow(first, last) {
    const v = this.view, n = first < 0 ? 0 : Math.max(0, last - first + 1);
    if (first === v.firstSeq && n === this.n) return;
    if (first !== v.firstSeq) this.pages.clear();
    else for (const p of [...this.pages.keys()]) if (p >= Math.floor(Math.max(0, this.n - 1) / PAGE)) this.pages.delete(p);
    v.firstSeq = first;
    v.lastSeq = last;
    this.n = n;
    if (n) this.empty?.remove();
    this.spacer.style.height = Math.min(this.n * ROW, MAX_PX) + "px";
    this.render();
  }

  /** The index of the first row shown. */
  first() {
    const max = this.box.scrollHeight - this.box.clientHeight;
    if (this.n * ROW <= MAX_PX || max <= 0) return Math.floor(this.box.scrollTop / ROW);
    return Math.round((this.box.scrollTop / max) * Math.max(0, this.n - this.visible));
  }

  /** Scrolls so that event seq is shown (unless it already is). */
  reveal(seq) {
    const i = seq - this.view.firstSeq;
    if (i < 0 || i >= this.n) { this.render(); return; }
    const f = this.first();
    if (i >= f && i < f + this.visible - 1) { this.render(); return; }
    const want = Math.max(0, i - Math.floor(this.visible / 3));
    const max = this.box.scrollHeight - this.box.clientHeight;
    this.box.scrollTop = this.n * ROW <= MAX_PX ? want * ROW : (want / Math.max(1, this.n - this.visible)) * max;
    this.render();
  }

  page(p) {
    if (!this.pages.has(p)) {
      const from = this.view.firstSeq + p * PAGE;
      // A request grow() let go of (its page was read before the events
      // after it came) keeps nothing.
      const req = api(`/api/traces/${this.view.id}/events?from=${from}&to=${from + PAGE}`).then((r) => {
        const byseq = new Map(r.events.map((e) => [e.seq, e]));
        const pg = { byseq, labels: r.labels || {}, meta: r.user_metadata || {} };
        if (this.pages.get(p) === req) this.pages.set(p, pg);
        return pg;
      }, (e) => { if (this.pages.get(p) === req) this.pages.delete(p); throw e; });
      this.pages.set(p, req);
      if (this.pages.size > 64) this.pages.delete(this.pages.keys().next().value);
    }
    return this.pages.get(p);
  }

  render() {
    const v = this.view;
    const first = this.first(), count = this.visible + 2;
    // The rows sit where they scroll to (so the last one shows whole at
    // the end); in a list taller than a browser scrolls, at the top of
    // the box's visible part.
    const at = this.n * ROW <= MAX_PX ? first * ROW : this.box.scrollTop;
    this.rows.style.transform = `translateY(${at}px)`;
    const need = new Set();
    const out = [];
    const cur = v.segmap.data && (v.cursorSeq !== null || v.cursor !== null) ? v.segmap.data.seq : null;
    for (let i = first; i < Math.min(this.n, first + count); i++) {
      const seq = v.firstSeq + i, p = Math.floor(i / PAGE);
      const pg = this.pages.get(p);
      const e = pg && !(pg instanceof Promise) ? pg.byseq.get(seq) : null;
      if (!pg || pg instanceof Promise) need.add(p);
      out.push(this.row(seq, e, pg, seq === cur));
    }
    this.rows.replaceChildren(...out);
    for (const p of need) this.page(p).then(() => this.render(), (e) => v.error("Events: " + e.message));
  }

  row(seq, e, pg, current) {
    if (!e) return el("div", { class: "vrow dim" }, el("span", { class: "c-seq" }, "#" + seq), el("span", {}, pg && !(pg instanceof Promise) ? "" : "…"));
    const v = this.view;
    const size = e.action === "oom" ? "asked " + fmtBytes(e.size) : fmtBytes(e.block_size || e.size);
    const label = (e.stack && pg.labels[e.stack]) || "";
    const meta = pg.meta[seq];
    return el("div", { class: "vrow a-" + e.action + (current ? " current" : ""), role: "option", "aria-selected": String(current), "data-seq": seq, "data-t": e.time_us,
      title: meta ? "user_metadata: " + meta : null },
    el("span", { class: "c-seq" }, "#" + seq),
    el("span", { class: "c-action" }, e.action),
    el("span", { class: "c-size" }, size),
    el("span", { class: "c-addr" }, e.action === "oom" ? "" : fmtAddr(e.address)),
    el("span", { class: "c-stream", title: "stream " + e.stream }, String(e.stream)),
    frameCell(label, meta),
    el("span", { class: "c-time" }, v.noTime ? "" : v.fmtT(e.time_us))); // without times, "#N" would repeat the seq
  }
}

/**
 * The first user frame's cell: "file:line function" in a narrow column
 * gives up the file's name first, then the function, and keeps the line.
 */
function frameCell(label, meta) {
  const m = /^(.*?)(:(?:\d+|\?))( .*)?$/.exec(label);
  const mark = meta ? "● " : "";
  if (!m) return el("span", { class: "c-frame", title: label || null }, mark + label);
  return el("span", { class: "c-frame split", title: label }, el("span", { class: "f-file" }, mark + m[1]),
    el("span", { class: "f-line" }, m[2]), el("span", { class: "f-func" }, m[3] || ""));
}
