// The state of a page that shows a trace through a timeline and a segment
// map (the trace view and the incident page): the time window, the cursor,
// the selection and the map's offset range. It is kept in the URL's query
// string, rewritten with history.replaceState on every change, so a reload
// or a copied link restores it; one frame scheduler redraws and reloads
// what a change needs.
//
// The view also holds the timeline's memory range (y0, y1; null for the
// whole), the cursor as an event (e) when it was set to one, the search
// text (q), whether stacks show every frame (frames=all), how the live
// memory at the cursor is grouped (g) and how the timeline colours its
// bands (bands). A highlight (the allocations of a frame picked in the
// flame graph) is outlined on the timeline and the segment map.
//
// The window is in the units of the time axis (microseconds) or, with
// axis=event, of the event axis (event indexes: every event the same
// width; axis.js). The cursor is a time, or an event (e), on either.
//
// Moves of the window or the cursor are announced as "move" events whose
// detail says {kind: "window"|"cursor", user}. The page's own moves (such
// as following a live trace) pass {user: false}, so listeners can tell the
// user's moves from the program's.
import { el, queryNum, fmtTime, fmtTimes, initTheme, palette } from "./common.js";
import { FrameScheduler, Samples } from "./frames.js";
import { Timeline } from "./timeline.js";
import { SegMap } from "./segmap.js";
import { EventAxis } from "./axis.js";
import { madeLoader, showHitTip, stackLoader } from "./tips.js";

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
    this.lastUS = Math.max(o.fullT1, this.firstUS + 1); // the times the cursor can take
    // The event axis, where the page offers it (data-event-axis) and the
    // URL asks for it; its knots load before the first frame (start).
    this.axis = root.dataset.eventAxis === "1" && q.get("axis") === "event" ? "event" : "time";
    this.events = null;
    this.setFullRange();
    this.t0 = queryNum(q, "t0");
    this.t1 = queryNum(q, "t1");
    this.noTime = root.dataset.noTime === "1"; // times are event indexes
    this.y0 = queryNum(q, "y0");
    this.y1 = queryNum(q, "y1");
    if (!(this.y1 > this.y0) || this.y0 < 0) this.y0 = this.y1 = null;
    this.fixedCursor = o.cursor !== undefined;
    this.cursor = this.fixedCursor ? o.cursor : queryNum(q, "c");
    this.cursorSeq = this.fixedCursor ? null : queryNum(q, "e"); // the cursor's event, when set to one
    this.q = q.get("q") || "";
    this.allFrames = q.get("frames") === "all";
    this.group = ["frame", "stack", "category"].includes(q.get("g")) ? q.get("g") : "frame";
    this.bandMode = ["alloc", "category", "area"].includes(q.get("bands")) ? q.get("bands") : "alloc";
    this.highlight = null; // {seqs: Set, addrs: Set, label}: allocations to outline
    this.regions = []; // annotated regions (steps, phases) from /steps
    this.steps = []; // the steps with their peaks
    this.metaMarks = []; // where the events' user_metadata changes
    this.searchMarks = null; // times of the search's matches
    this.searchSeqs = null; // their seqs, outlined on the timeline
    this.layoutSeq = o.layoutSeq ?? null;
    this.sel = queryNum(q, "sel");
    this.selBlock = null; // a block allocated before the trace began (no alloc event)
    this.selInfo = null; // the selected allocation's details, once loaded
    this.m0 = queryNum(q, "m0");
    this.m1 = queryNum(q, "m1");
    this.panels = o.panels || null;
    this.panel = this.panels ? (this.panels.includes(q.get("panel")) ? q.get("panel") : o.panel) : null;
    this.markers = o.markers || [];
    this.pinned = new Set(); // segments whose live blocks are drawn as pinning them
    // Figures for the performance test and the console: fetch and draw
    // times, a zoom or pan step (from the input to the drawn answer) and a
    // hover (from the pointer's move to the drawn frame).
    this.stats = {
      fetchMs: new Samples(), drawMs: new Samples(), timelineMs: new Samples(), segmapMs: new Samples(),
      stepMs: new Samples(), hoverMs: new Samples(),
      firstPaintMs: null,
      clear() { for (const s of [this.fetchMs, this.drawMs, this.timelineMs, this.segmapMs, this.stepMs, this.hoverMs]) s.clear(); },
    };
    this.stepStart = null; // when the window or memory range first changed since the last drawn answer
    this.hoverStart = null;
    this.hooks = o;
    this.frames = new FrameScheduler(() => this.frame());
    this.pal = palette();
    this.stackOf = stackLoader(this.id);
    this.madeOf = madeLoader(this.id);

    this.errBox = el("p", { class: "error", role: "alert", hidden: true });
    root.prepend(this.errBox);
    this.timeline = new Timeline(document.getElementById("timeline"), document.getElementById("timeline-tip"), this);
    this.segmap = new SegMap(document.getElementById("segmap"), document.getElementById("segmap-tip"), this);
  }

  /** The window's whole range on the current axis: the trace's times, or its events. */
  setFullRange() {
    const d = this.root.dataset;
    if (this.axis === "event") [this.fullT0, this.fullT1] = [Number(d.firstSeq), Number(d.lastSeq) + 1];
    else [this.fullT0, this.fullT1] = [this.firstUS, this.lastUS];
  }

  /** The place of time t on the current axis. */
  uOfTime(t) { return this.axis === "event" && this.events ? this.events.uOf(t) : t; }

  /** The time at place u of the current axis. */
  timeOfU(u) { return this.axis === "event" && this.events ? this.events.tOf(u) : u; }

  /** The cursor's place on the current axis (null for none): on the event axis, the middle of its event. */
  cursorU() {
    if (this.axis === "event") {
      const seq = this.cursorSeq ?? this.segmap.data?.seq;
      if (seq !== null && seq !== undefined) return seq + 0.5;
    }
    return this.cursor === null ? null : this.uOfTime(this.cursor);
  }

  /**
   * Switches the axis ("time" or "event"), keeping the same stretch of the
   * trace in the window.
   */
  async setAxis(a) {
    if (a === this.axis || (a === "event" && this.root.dataset.eventAxis !== "1")) return;
    this.events ??= await EventAxis.load(this.id);
    const t0 = this.timeOfU(this.t0), t1 = this.timeOfU(this.t1); // on the event axis, from the window's own knots
    const [u0, u1] = a === "event" ? await EventAxis.window(this.id, t0, t1) : [t0, t1];
    this.axis = a;
    this.setFullRange();
    this.setWindow(u0, Math.max(u1, u0 + 1));
    this.dispatchEvent(new CustomEvent("axis"));
  }

  /** Shows the times [t0, t1] on the current axis. */
  showTimes(t0, t1) { this.setWindow(this.uOfTime(t0), this.uOfTime(t1)); }

  /** Wires the theme, the reset button and resizing; call once the page's hooks are ready. */
  start() {
    if (this.axis === "event") {
      EventAxis.load(this.id).then((a) => { this.events = a; }, (e) => {
        this.error("The event axis: " + e.message);
        this.axis = "time"; // the window's event indexes cannot be placed in time: the whole trace
        this.setFullRange();
        if (this.t0 !== null) this.setWindow(this.fullT0, this.fullT1);
        this.dispatchEvent(new CustomEvent("axis"));
      }).finally(() => this.redraw());
    }
    initTheme(() => { this.pal = palette(); this.redraw(); this.dispatchEvent(new CustomEvent("theme")); });
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

  /**
   * Sizes the canvases and panels to the window: the timeline takes about a
   * third of its height (a little less above the live-memory panel), the
   * panels below the rest.
   */
  layout() {
    const share = this.root.querySelector("#live-panel") ? 0.28 : 0.34;
    this.timeline.resize(Math.min(560, Math.max(220, innerHeight * share)));
    this.segmap.resize();
    const lower = this.root.querySelector(".lower");
    if (lower) {
      const top = lower.getBoundingClientRect().top + scrollY;
      this.root.style.setProperty("--lower-h", Math.max(320, innerHeight - top - 16) + "px");
    }
  }

  /** A time of the trace as shown: "#N" when times are event indexes. */
  fmtT(t) {
    if (t === null || t === undefined) return "–"; // no cursor yet
    return this.noTime ? "#" + Math.round(t) : fmtTime(t - this.firstUS);
  }

  /** Times of the trace in one unit, with the decimals step needs (see fmtTimes). */
  fmtTs(list, step) {
    return this.noTime ? list.map((t) => "#" + Math.round(t)) : fmtTimes(list.map((t) => t - this.firstUS), step);
  }

  /** A span of time as shown. */
  fmtDur(d) { return this.noTime ? Math.round(d) + (Math.round(d) === 1 ? " event" : " events") : fmtTime(d); }

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
    this.stepStart ??= performance.now();
    this.request("timeline");
    this.moved("window", user);
  }

  /** Scales the window by f around time at. */
  zoomTime(at, f, opts) { this.setWindow(at - (at - this.t0) * f, at + (this.t1 - at) * f, opts); }

  resetWindow() {
    const h = this.hooks.home ? this.hooks.home() : [this.fullT0, this.fullT1];
    this.y0 = this.y1 = null;
    if (h) this.setWindow(h[0], h[1]);
  }

  /** Shows the memory range [y0, y1) on the timeline; null, null for the whole. */
  setMemory(y0, y1) {
    if (y0 === null || !(y1 > y0)) this.y0 = this.y1 = null;
    else { this.y0 = Math.max(0, Math.round(y0)); this.y1 = Math.round(y1); }
    this.stepStart ??= performance.now();
    this.request("timeline");
  }

  /** Grows the trace's time range (a live trace). */
  extendTo(t) {
    if (t > this.lastUS) this.lastUS = t;
    if (this.axis === "time" && t > this.fullT1) this.fullT1 = t;
  }

  setCursor(t, { user = true } = {}) {
    if (this.fixedCursor) return;
    this.cursor = Math.round(Math.max(this.firstUS, Math.min(this.lastUS, t)));
    this.cursorSeq = null;
    this.request("map");
    this.moved("cursor", user);
  }

  /** Puts the cursor at place u of the current axis: on the event axis, right after the event there. */
  setCursorAt(u, opts) {
    if (this.axis !== "event") { this.setCursor(u, opts); return; }
    const d = this.root.dataset;
    this.setCursorSeq(Math.max(Number(d.firstSeq) - 1, Math.min(Number(d.lastSeq), Math.floor(u))), undefined, opts);
  }

  /** Puts the cursor right after event seq (its time is known once the map loads, or given as t). */
  setCursorSeq(seq, t, { user = true } = {}) {
    if (this.fixedCursor) return;
    this.cursorSeq = Math.max(-1, Math.round(seq));
    if (t !== undefined && t !== null) this.cursor = t;
    this.request("map");
    this.moved("cursor", user);
  }

  /** Shows every frame of stacks (true) or only the Python ones. */
  setAllFrames(all) {
    this.allFrames = all;
    this.request("details");
  }

  select(seq) {
    this.sel = seq;
    this.selBlock = null;
    this.selInfo = null;
    if (this.panels) this.panel = "selection";
    this.request("details");
  }

  selectBlock(b) {
    this.sel = null;
    this.selBlock = b;
    this.selInfo = null;
    if (this.panels) this.panel = "selection";
    this.request("details");
  }

  clearSelection() {
    this.sel = null;
    this.selBlock = null;
    this.selInfo = null;
    this.timeline.brush = null;
    this.setHighlight(null);
    this.request("details");
  }

  /** Outlines a set of allocations ({seqs, addrs, label}; null for none) on the timeline and the map. */
  setHighlight(h) {
    this.highlight = h;
    this.dispatchEvent(new CustomEvent("highlight"));
    this.redraw();
  }

  /** Whether the highlight holds the allocation of alloc seq at addr (seq -1: made before the trace). */
  highlighted(seq, addr) {
    const h = this.highlight;
    return !!h && (seq >= 0 ? h.seqs.has(seq) : h.addrs.has(addr));
  }

  /** How the timeline colours its bands: alloc, category or area (stacked areas by category). */
  setBandMode(m) {
    this.bandMode = m;
    this.request("timeline");
  }

  /** The selected allocation's band in the timeline's last answer, or null. */
  selectedBand() {
    const b = this.timeline.bands;
    if (!b || (this.sel === null && !this.selBlock)) return null;
    return b.bands.find((x) => (this.sel !== null ? x.seq === this.sel : x.seq < 0 && x.address === this.selBlock.addr)) || null;
  }

  /**
   * Zooms both axes onto the selected allocation: its lifetime (known from
   * the selection panel, else from its band) and the memory it spans in
   * the window shown; the whole trace when nothing is selected.
   */
  fitSelection() {
    const band = this.selectedBand(), info = this.selInfo;
    if (!band && !info) { this.resetWindow(); return; }
    let t0, t1;
    if (info && this.axis === "event") {
      t0 = Math.max(this.fullT0, info.seq);
      t1 = info.free_seq >= 0 ? info.free_seq + 1 : this.fullT1;
    } else if (info) {
      t0 = info.alloc_us < this.fullT0 ? this.fullT0 : info.alloc_us;
      t1 = info.free_us > this.fullT1 ? this.fullT1 : info.free_us;
    } else {
      const b = this.timeline.bands, colW = (b.t1 - b.t0) / b.w;
      t0 = b.t0 + band.c0 * colW;
      t1 = b.t0 + (band.c1 + 1) * colW;
    }
    const pad = Math.max(5, (t1 - t0) * 0.15);
    this.setWindow(t0 - pad, t1 + pad);
    if (band) {
      const b = this.timeline.bands;
      let lo = Infinity, hi = 0;
      for (let r = band.r0; r < band.r1; r++) { lo = Math.min(lo, b.runOffs[r]); hi = Math.max(hi, b.runOffs[r] + band.size); }
      const m = Math.max(4096, (hi - lo) * 0.5);
      this.setMemory(Math.max(0, lo - m), hi + m);
    }
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
    if (this.t0 === null || (this.axis === "event" && !this.events)) return; // no window (or axis) yet: the work waits for it
    this.writeURL();
    this.draw();
    if (this.hoverStart !== null) {
      this.stats.hoverMs.push(performance.now() - this.hoverStart);
      this.hoverStart = null;
    }
    const loads = [];
    let step = null;
    if (f.take("timeline")) {
      step = this.stepStart;
      loads.push(this.timeline.load());
    }
    let map = false;
    if ((this.cursor !== null || this.cursorSeq !== null) && f.take("map")) {
      f.pending.add("details");
      loads.push(this.segmap.load());
      map = true;
    }
    if (loads.length) {
      const done = await Promise.all(loads);
      const d = this.segmap.data;
      if (map && this.cursorSeq !== null && d && d.seq === this.cursorSeq) this.cursor = d.t;
      if (map) this.hooks.mapLoaded?.(d);
      if (this.cursor === null && this.timeline.usage && this.hooks.initialCursor) {
        this.cursor = this.hooks.initialCursor();
        this.request("map");
        return;
      }
      if (done.some(Boolean)) { this.draw(); this.firstPaint(); }
      if (step !== null && done[0]) {
        this.stats.stepMs.push(performance.now() - step);
        if (this.stepStart === step) this.stepStart = null;
      }
    }
    if (f.take("details")) this.hooks.details?.();
  }

  writeURL() {
    const p = new URLSearchParams();
    p.set("t0", Math.floor(this.t0));
    p.set("t1", Math.ceil(this.t1));
    if (!this.fixedCursor && this.cursor !== null) p.set("c", this.cursor);
    if (this.cursorSeq !== null) p.set("e", this.cursorSeq);
    if (this.sel !== null) p.set("sel", this.sel);
    if (this.m0 !== null && this.m1 !== null) { p.set("m0", this.m0); p.set("m1", this.m1); }
    if (this.y1 !== null) { p.set("y0", this.y0); p.set("y1", this.y1); }
    if (this.panels) p.set("panel", this.panel);
    if (this.q) p.set("q", this.q);
    if (this.allFrames) p.set("frames", "all");
    if (this.group !== "frame") p.set("g", this.group);
    if (this.bandMode !== "alloc") p.set("bands", this.bandMode);
    if (this.axis !== "time") p.set("axis", this.axis);
    const url = location.pathname + "?" + p.toString();
    if (url !== location.pathname + location.search) history.replaceState(null, "", url);
  }

  draw() {
    this.timeline.draw(this.pal);
    this.segmap.draw(this.pal);
    document.getElementById("window-label").textContent = this.windowLabel();
    document.getElementById("cursor-label").textContent = this.hooks.cursorLabel(this.segmap.data);
  }

  /** The window as the page's label says it: its two ends in one unit, and its span. */
  windowLabel() {
    if (this.noEvents) return "no events";
    if (this.axis === "event") {
      const e0 = Math.max(this.fullT0, Math.ceil(this.t0)), e1 = Math.min(this.fullT1, Math.floor(this.t1)) - 1;
      return `events #${e0} – #${e1} (${Math.max(0, e1 - e0 + 1)} events)`;
    }
    return this.fmtTs([this.t0, this.t1], (this.t1 - this.t0) / 200).join(" – ") + " (" + this.fmtDur(this.t1 - this.t0) + ")";
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
