// The state of a page that shows a trace through a timeline and a segment
// map (the trace view and the incident page): the time window, the cursor,
// the selection and the map's offset range. It is kept in the URL's query
// string, rewritten with history.replaceState on every change, so a reload
// or a copied link restores it; one frame scheduler redraws and reloads
// what a change needs.
//
// Moves of the window or the cursor are announced as "move" events whose
// detail says {kind: "window"|"cursor", user}. The page's own moves (such
// as following a live trace) pass {user: false}, so listeners can tell the
// user's moves from the program's.
import { el, queryNum, fmtTime, initTheme, palette } from "./common.js";
import { FrameScheduler, Samples } from "./frames.js";
import { Timeline } from "./timeline.js";
import { SegMap } from "./segmap.js";
import { showHitTip, stackLoader } from "./tips.js";

const MIN_SPAN = 10; // µs

export class PageState extends EventTarget {
  /**
   * @param {HTMLElement} root  the page's main element (data-id, data-first-us, data-last-us)
   * @param {object} o
   *   fullT1      the end of the trace's time range (the start is data-first-us)
   *   cursor      a fixed cursor time (the incident page); else the URL's c
   *   layoutSeq   the event whose segment map to show instead of the cursor's
   *   panels      the details tabs whose choice the URL keeps, and panel, the default
   *   home()      the window Reset returns to (default: the whole trace)
   *   initialCursor()  where the cursor starts when the URL has none, once usage has loaded
   *   cursorLabel(layout)  the text beside the segment map
   *   details()   renders the details panel
   */
  constructor(root, o) {
    super();
    const q = new URLSearchParams(location.search);
    this.root = root;
    this.id = root.dataset.id;
    this.firstUS = Number(root.dataset.firstUs);
    this.fullT0 = this.firstUS;
    this.fullT1 = Math.max(o.fullT1, this.firstUS + 1);
    this.t0 = queryNum(q, "t0");
    this.t1 = queryNum(q, "t1");
    this.fixedCursor = o.cursor !== undefined;
    this.cursor = this.fixedCursor ? o.cursor : queryNum(q, "c");
    this.layoutSeq = o.layoutSeq ?? null;
    this.sel = queryNum(q, "sel");
    this.selBlock = null; // a block allocated before the trace began (no alloc event)
    this.m0 = queryNum(q, "m0");
    this.m1 = queryNum(q, "m1");
    this.panels = o.panels || null;
    this.panel = this.panels ? (this.panels.includes(q.get("panel")) ? q.get("panel") : o.panel) : null;
    this.markers = o.markers || [];
    this.pinned = new Set(); // segments whose live blocks are drawn as pinning them
    this.stats = {
      fetchMs: new Samples(), drawMs: new Samples(), timelineMs: new Samples(), segmapMs: new Samples(),
      firstPaintMs: null,
      clear() { for (const s of [this.fetchMs, this.drawMs, this.timelineMs, this.segmapMs]) s.clear(); },
    };
    this.hooks = o;
    this.frames = new FrameScheduler(() => this.frame());
    this.pal = palette();
    this.stackOf = stackLoader(this.id);

    this.errBox = el("p", { class: "error", role: "alert", hidden: true });
    root.prepend(this.errBox);
    this.timeline = new Timeline(document.getElementById("timeline"), document.getElementById("timeline-tip"), this);
    this.segmap = new SegMap(document.getElementById("segmap"), document.getElementById("segmap-tip"), this);
  }

  /** Wires the theme, the reset button and resizing; call once the page's hooks are ready. */
  start() {
    initTheme(() => { this.pal = palette(); this.redraw(); });
    document.getElementById("reset").addEventListener("click", () => this.resetWindow());
    let timer = 0;
    new ResizeObserver(() => {
      clearTimeout(timer);
      timer = setTimeout(() => {
        const w = this.timeline.plotW;
        this.layout();
        if (this.timeline.plotW !== w) this.frames.request("timeline");
        this.redraw();
      }, 100);
    }).observe(document.getElementById("timeline-wrap"));
    this.layout();
  }

  layout() { this.timeline.resize(); this.segmap.resize(); }

  /** Asks for a frame doing the named work besides drawing: "timeline", "map", "details". */
  request(...work) { this.frames.request(...work); }

  redraw() { this.frames.request(); }

  error(msg) { this.errBox.textContent = msg; this.errBox.hidden = false; }

  moved(kind, user) { this.dispatchEvent(new CustomEvent("move", { detail: { kind, user } })); }

  // ---- moves -------------------------------------------------------------

  /** Shows [t0, t1], clamped to the trace with a margin; whole microseconds so the URL holds it exactly. */
  setWindow(t0, t1, { user = true } = {}) {
    const full = this.fullT1 - this.fullT0, pad = Math.max(full * 0.05, MIN_SPAN);
    const span = Math.min(Math.max(MIN_SPAN, t1 - t0), full + 2 * pad);
    t0 = Math.max(this.fullT0 - pad, Math.min(t0, this.fullT1 + pad - span));
    this.t0 = Math.round(t0);
    this.t1 = Math.round(t0 + span);
    this.request("timeline");
    this.moved("window", user);
  }

  /** Scales the window by f around time at. */
  zoomTime(at, f, opts) { this.setWindow(at - (at - this.t0) * f, at + (this.t1 - at) * f, opts); }

  resetWindow() {
    const h = this.hooks.home ? this.hooks.home() : [this.fullT0, this.fullT1];
    if (h) this.setWindow(h[0], h[1]);
  }

  /** Grows the trace's time range (a live trace). */
  extendTo(t) { if (t > this.fullT1) this.fullT1 = t; }

  setCursor(t, { user = true } = {}) {
    if (this.fixedCursor) return;
    this.cursor = Math.round(Math.max(this.fullT0, Math.min(this.fullT1, t)));
    this.request("map");
    this.moved("cursor", user);
  }

  select(seq) {
    this.sel = seq;
    this.selBlock = null;
    if (this.panels) this.panel = "selection";
    this.request("details");
  }

  selectBlock(b) {
    this.sel = null;
    this.selBlock = b;
    if (this.panels) this.panel = "selection";
    this.request("details");
  }

  setPanel(p) {
    this.panel = p;
    this.request("details");
  }

  /** The segment map's offset range in bytes, or null for all. */
  setOffsets(m0, m1) {
    this.m0 = m0 === null ? null : Math.round(m0);
    this.m1 = m1 === null ? null : Math.round(m1);
    this.redraw();
  }

  showTip(tip, h, x, y) { showHitTip(this, tip, h, x, y); }

  // ---- one frame ---------------------------------------------------------

  async frame() {
    const f = this.frames;
    if (this.t0 === null) return; // no window yet: the work waits for one
    this.writeURL();
    this.draw();
    const loads = [];
    if (f.take("timeline")) loads.push(this.timeline.load());
    if (this.cursor !== null && f.take("map")) { f.pending.add("details"); loads.push(this.segmap.load()); }
    if (loads.length) {
      const done = await Promise.all(loads);
      if (this.cursor === null && this.timeline.usage && this.hooks.initialCursor) {
        this.cursor = this.hooks.initialCursor();
        this.request("map");
        return;
      }
      if (done.some(Boolean)) { this.draw(); this.firstPaint(); }
    }
    if (f.take("details")) this.hooks.details?.();
  }

  writeURL() {
    const p = new URLSearchParams();
    p.set("t0", Math.floor(this.t0));
    p.set("t1", Math.ceil(this.t1));
    if (!this.fixedCursor && this.cursor !== null) p.set("c", this.cursor);
    if (this.sel !== null) p.set("sel", this.sel);
    if (this.m0 !== null && this.m1 !== null) { p.set("m0", this.m0); p.set("m1", this.m1); }
    if (this.panels) p.set("panel", this.panel);
    const url = location.pathname + "?" + p.toString();
    if (url !== location.pathname + location.search) history.replaceState(null, "", url);
  }

  draw() {
    this.timeline.draw(this.pal);
    this.segmap.draw(this.pal);
    document.getElementById("window-label").textContent =
      fmtTime(this.t0 - this.firstUS) + " – " + fmtTime(this.t1 - this.firstUS) + " (" + fmtTime(this.t1 - this.t0) + ")";
    document.getElementById("cursor-label").textContent = this.hooks.cursorLabel(this.segmap.data);
  }

  // The first frame with both the timeline and the map drawn: marked for
  // the performance figures, and data-ready tells tests the page is whole.
  firstPaint() {
    if (this.stats.firstPaintMs !== null || !this.timeline.usage || !this.segmap.data) return;
    performance.mark("vramscope-first-paint");
    this.stats.firstPaintMs = performance.now();
    this.root.dataset.ready = "1";
  }
}
