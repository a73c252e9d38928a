// The timeline: reserved / allocated / active bytes (min/max per pixel
// column from the server) over memory_viz's stacked active-memory bands,
// on a time axis or an event axis (every event the same width; axis.js):
// its coordinate, u, is the page state's window unit, and what has a time
// is placed on it through the state (xOfTime). Allocations too small to
// draw one by one come folded into bands by group (their first user frame
// or stack), in their group's colour (or category's): the grey envelope
// behind shows only what no sample could tell apart. The lines are drawn
// over everything, and a line above or below the memory range shown is
// pinned to that edge with its value.
// Both axes zoom: the time window (wheel, drag, shift-drag) and the memory
// range (ctrl- or alt-wheel, or a shift-dragged rectangle); the server
// sends the bands at least a pixel tall in the visible range, at their
// exact place in the stack, with the allocated envelope behind them. Data
// is fetched per viewport in a binary form; while a fetch is in flight the
// last answer is redrawn at the new scale, so zooming never waits on the
// network. The bands and lines are drawn once per change of data or scale
// into a layer; hover, cursor and selection are drawn over it.
//
// Bands are coloured by allocation, or by category (the server's
// /bands/categories, in the same order), or replaced by stacked areas of
// the bytes of each category at instants of the window (/categories). Annotated steps shade the plot behind, phases mark a strip
// at its top; a click in the strip goes to that step's peak.
import { api, apiBinary, LatestFetch, fitCanvas, niceTicks, fmtBytes, fmtBytesShort, fillTextWithin } from "./common.js";

const AXIS_LEFT = 64, AXIS_BOTTOM = 22, TOP = 8, RIGHT = 12;
const STRIP = 12; // the phases' strip at the top of the plot, with the steps' labels
const PHASES = { forward: 3, backward: 2, optimizer: 1, zero_grad: 4, communication: 5 }; // colours: indexes into the category palette

/** The phases' legend: a swatch for each phase the regions have, in the strip's colours. */
export function phaseLegend(regions) {
  const seen = new Set(regions.map((r) => r.phase).filter((p) => p in PHASES));
  const keys = Object.keys(PHASES).filter((p) => seen.has(p));
  if (!keys.length) return [];
  const out = [document.createTextNode("phases:")];
  for (const p of keys) {
    const k = document.createElement("span");
    k.className = "key cat";
    const sw = document.createElement("i");
    sw.className = "sw sw-" + PHASES[p];
    k.append(sw, p.replace("_", " "));
    out.push(k);
  }
  return out;
}
const MIN_BYTES_SPAN = 4096;

/** The usage answer's binary form (see store/answers.go): "VSU2" on the event axis, with its columns' times. */
export function decodeUsage(buf) {
  const dv = new DataView(buf);
  const tag = dv.getUint32(0, true);
  if (tag !== 0x31555356 && tag !== 0x32555356) throw new Error("not a usage answer"); // "VSU1", "VSU2"
  const n = dv.getUint32(4, true);
  const f = new Float64Array(buf, 8, 2 + 7 * n + (tag === 0x32555356 ? n + 1 : 0));
  return { bucket_us: f[0], start_us: f[1], events: f.subarray(2, 2 + n),
    reserved: f.subarray(2 + n, 2 + 3 * n), allocated: f.subarray(2 + 3 * n, 2 + 5 * n), active: f.subarray(2 + 5 * n, 2 + 7 * n),
    times: tag === 0x32555356 ? f.subarray(2 + 7 * n) : null };
}

/** The bands answer's binary form (see store/answers.go). */
export function decodeBands(buf) {
  const dv = new DataView(buf);
  if (dv.getUint32(0, true) !== 0x32425356) throw new Error("not a bands answer"); // "VSB2"
  const u = (i) => dv.getUint32(4 + 4 * i, true);
  const w = u(0), nb = u(1), nr = u(2), nf = u(6), ng = u(7);
  const f = new Float64Array(buf, 40, 6 + w + 4 * nb + nr + 6 * nf);
  const i32 = new Uint32Array(buf, 40 + 8 * f.length, 4 * nb + 1 + nr + 5 * nf);
  const at = 6 + w, fat = at + 4 * nb + nr, iat = 4 * nb + 1 + nr;
  const out = {
    w, dropped: u(3), samples: u(4), dense: (u(5) & 1) !== 0, events: (u(5) & 2) !== 0,
    t0: f[0], t1: f[1], m0: f[2], m1: f[3], y_max: f[4], min_bytes: f[5],
    allocated: f.subarray(6, 6 + w), runOffs: f.subarray(at + 4 * nb, fat), runCols: i32.subarray(4 * nb + 1, iat), bands: new Array(nb),
    folds: new Array(nf),
    groups: JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 40 + 8 * f.length + 4 * i32.length, ng))),
  };
  for (let i = 0; i < nb; i++) {
    out.bands[i] = { i, seq: f[at + i], address: f[at + nb + i], size: f[at + 2 * nb + i], requested_size: f[at + 3 * nb + i],
      stack: i32[i], c0: i32[nb + i], c1: i32[2 * nb + i], r0: i32[3 * nb + i], r1: i32[3 * nb + i + 1] };
  }
  for (let i = 0; i < nf; i++) {
    const r = fat + 2 * nf;
    out.folds[i] = { i, offset: f[fat + i], size: f[fat + nf + i],
      c0: i32[iat + i], c1: i32[iat + nf + i], group: i32[iat + 2 * nf + i], count: i32[iat + 3 * nf + i],
      rep: { seq: f[r + i], address: f[r + nf + i], size: f[r + 2 * nf + i], requested_size: f[r + 3 * nf + i], stack: i32[iat + 4 * nf + i] } };
  }
  return out;
}

/** A string's hash (FNV-1a), for colours that stay with a name. */
function hashString(s) {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

export class Timeline {
  /**
   * @param {HTMLCanvasElement} canvas
   * @param {object} view  the page state (pagestate.js)
   */
  constructor(canvas, tip, view) {
    this.canvas = canvas;
    this.tip = tip;
    this.view = view;
    this.usage = null; // last usage answer with its window
    this.bands = null; // last bands answer
    this.bandCats = null; // the category of each band, when the view colours bands by category
    this.areas = null; // the bytes of each category at instants of the window, for stacked areas
    this.fetcher = new LatestFetch(view, "Timeline");
    this.brush = null; // {t0, t1, y0, y1} while shift-dragging
    this.hover = null;
    this.layer = document.createElement("canvas");
    this.layerKey = "";
    this.autoTop = MIN_BYTES_SPAN;
    this.cssH = 300;
    this.listen();
  }

  get plotW() { return Math.max(10, this.cssW - AXIS_LEFT - RIGHT); }
  get plotH() { return Math.max(10, this.cssH - AXIS_BOTTOM - TOP); }

  /** Sizes the canvas to its box: the full width, and height h (CSS px). */
  resize(h) {
    const box = this.canvas.parentElement.getBoundingClientRect();
    this.cssW = Math.max(200, Math.floor(box.width));
    if (h) this.cssH = Math.max(200, Math.round(h));
  }

  // The data's area: the plot below the phases' strip, when there is one,
  // so that nothing the strip covers is data.
  get dataTop() { const v = this.view; return TOP + (v.regions.length || v.metaMarks.length ? STRIP : 0); }
  get dataH() { return TOP + this.plotH - this.dataTop; }

  /** The x of u, a place on the window's axis (a time, or an event index). */
  xOf(u) { const v = this.view; return AXIS_LEFT + ((u - v.t0) / (v.t1 - v.t0)) * this.plotW; }
  /** The place on the window's axis at x. */
  tOf(x) { const v = this.view; return v.t0 + ((x - AXIS_LEFT) / this.plotW) * (v.t1 - v.t0); }
  /** The x of time t, on either axis. */
  xOfTime(t) { return this.xOf(this.view.uOfTime(t)); }

  /** The visible memory range: the view's, else 0 to the window's peak. */
  yRange() {
    const v = this.view;
    if (v.y1 !== null && v.y1 > v.y0) return [v.y0, v.y1];
    return [0, this.autoTop];
  }

  // autoTop is the top of the memory axis when it is not zoomed: the
  // window's peak reserved bytes and a margin.
  fitTop() {
    let m = this.bands?.y_max || 0;
    const u = this.usage;
    if (u) for (let i = 1; i < u.reserved.length; i += 2) m = Math.max(m, u.reserved[i]);
    this.autoTop = Math.max(MIN_BYTES_SPAN, m * 1.05); // a trace of nothing yet gets an axis of whole bytes
  }

  yOf(b) { const [y0, y1] = this.yRange(); return TOP + this.plotH - ((b - y0) / (y1 - y0)) * this.dataH; }
  bytesOf(y) { const [y0, y1] = this.yRange(); return y0 + ((TOP + this.plotH - y) / this.dataH) * (y1 - y0); }

  /** Fetch the data of the current window and memory range (stale requests are aborted). */
  async load() {
    const v = this.view;
    const t0 = Math.floor(v.t0), t1 = Math.max(Math.ceil(v.t1), Math.floor(v.t0) + 1);
    const w = Math.round(this.plotW);
    const h = Math.round(this.plotH);
    const base = `/api/traces/${v.id}`;
    const mem = v.y1 !== null && v.y1 > v.y0 ? `&m0=${Math.floor(v.y0)}&m1=${Math.ceil(v.y1)}` : "";
    const axis = v.axis === "event" ? "&axis=event" : "";
    const fold = v.group === "stack" ? "&fold=stack" : "";
    const mode = v.bandMode;
    const got = await this.fetcher.run((signal) => Promise.all([
      apiBinary(`${base}/usage?t0=${t0}&t1=${t1}&n=${w}${axis}&format=bin`, { signal }),
      apiBinary(`${base}/bands?t0=${t0}&t1=${t1}&w=${w}&h=${h}${mem}${axis}${fold}&format=bin`, { signal }),
      mode === "category" ? api(`${base}/bands/categories?t0=${t0}&t1=${t1}&w=${w}&h=${h}${mem}${axis}${fold}`, { signal }) : null,
      mode === "area" ? api(`${base}/categories?t0=${t0}&t1=${t1}&n=${Math.min(2000, Math.max(8, w))}${axis}`, { signal }) : null,
    ]));
    if (!got) return false;
    this.usage = { ...decodeUsage(got[0]), t0, t1 };
    if (this.usage.times) v.events?.setFine(this.usage.start_us, this.usage.bucket_us, this.usage.times);
    this.bands = decodeBands(got[1]);
    this.bandCats = got[2];
    this.areas = got[3] && { ...got[3], t0, t1 };
    this.fitTop();
    return true;
  }

  draw(pal) {
    const start = performance.now();
    const ctx = fitCanvas(this.canvas, this.cssW, this.cssH);
    const v = this.view;
    ctx.fillStyle = pal.panel;
    ctx.fillRect(0, 0, this.cssW, this.cssH);
    // The data layer is drawn again only for new data (or size, theme,
    // search); between an input and its answer the last layer is stretched
    // to the new scale, which costs one image copy per frame.
    const key = [this.cssW, this.cssH, pal.panel, v.bandMode].join();
    if (this.layerKey !== key || this.layerUsage !== this.usage || this.layerBands !== this.bands || this.layerMarks !== v.searchMarks || this.layerRegions !== v.regions) {
      const lctx = fitCanvas(this.layer, this.cssW, this.cssH);
      lctx.clearRect(0, 0, this.cssW, this.cssH);
      this.drawLayer(lctx, pal);
      this.layerKey = key;
      this.layerUsage = this.usage;
      this.layerBands = this.bands;
      this.layerMarks = v.searchMarks;
      this.layerRegions = v.regions;
      this.layerView = [v.t0, v.t1, ...this.yRange()];
    }
    const [t0, t1, y0, y1] = this.layerView;
    const [lo, hi] = this.yRange();
    const ax = (t1 - t0) / (v.t1 - v.t0), ay = (y1 - y0) / (hi - lo);
    const bx = AXIS_LEFT + ((t0 - v.t0) / (v.t1 - v.t0)) * this.plotW - AXIS_LEFT * ax;
    const by = TOP + this.plotH - ((y0 - lo) / (hi - lo)) * this.dataH - (TOP + this.plotH) * ay;
    ctx.save();
    ctx.beginPath();
    ctx.rect(AXIS_LEFT, TOP, this.plotW, this.plotH);
    ctx.clip();
    ctx.transform(ax, 0, 0, ay, bx, by);
    ctx.drawImage(this.layer, 0, 0, this.cssW, this.cssH);
    ctx.restore();
    this.drawAxes(ctx, pal);
    this.drawOverlay(ctx, pal);
    v.stats.drawMs.push(performance.now() - start);
    v.stats.timelineMs.push(performance.now() - start);
  }

  drawLayer(ctx, pal) {
    ctx.save();
    ctx.beginPath();
    ctx.rect(AXIS_LEFT, TOP, this.plotW, this.plotH);
    ctx.clip();
    this.drawSteps(ctx, pal);
    this.drawData(ctx, pal);
    this.drawUsage(ctx, pal);
    this.drawSearchMarks(ctx, pal);
    ctx.restore();
  }

  /** The memory's make-up, clipped to the plot: bands (or stacked areas) over the allocated envelope. */
  drawData(ctx, pal) {
    ctx.save();
    ctx.beginPath();
    ctx.rect(AXIS_LEFT, TOP, this.plotW, this.plotH);
    ctx.clip();
    if (this.view.bandMode === "area" && this.areas) this.drawCategoryAreas(ctx, pal);
    else this.drawBands(ctx, pal);
    ctx.restore();
  }

  // Steps: every other one shaded behind the data, each with its number
  // at the top where there is room.
  drawSteps(ctx, pal) {
    const steps = this.view.regions.filter((r) => r.step >= 0);
    ctx.fillStyle = pal.grid;
    ctx.globalAlpha = 0.45;
    for (const r of steps) {
      if (r.step % 2) continue;
      const x0 = this.xOfTime(r.start_us), x1 = this.xOfTime(r.end_us);
      if (x1 < AXIS_LEFT || x0 > AXIS_LEFT + this.plotW) continue;
      ctx.fillRect(x0, TOP, Math.max(1, x1 - x0), this.plotH);
    }
    ctx.globalAlpha = 1;
  }

  // The phases' strip and the user_metadata marks follow the window, not
  // a hover or the cursor (a long training run has tens of thousands of
  // regions, and a hover redraws 60 times a second). While the window
  // changes on every frame (a zoom, a drag) they are drawn straight onto
  // the canvas; the second frame of one window draws them into a layer of
  // their own, which the frames after it copy.
  drawPhasesLayer(ctx, pal) {
    const v = this.view;
    if (!v.regions.length && !v.metaMarks.length) return;
    const key = [v.t0, v.t1, this.cssW, this.cssH, v.axis, v.events?.version].join(); // a new answer places times anew on the event axis
    const same = (s) => s && s.key === key && s.pal === pal && s.regions === v.regions && s.marks === v.metaMarks;
    if (!same(this.phasesDrawn)) {
      if (!same(this.phasesSeen)) {
        this.phasesSeen = { key, pal, regions: v.regions, marks: v.metaMarks };
        this.drawPhases(ctx, pal);
        return;
      }
      this.phases ??= document.createElement("canvas");
      const pctx = fitCanvas(this.phases, this.cssW, this.cssH);
      pctx.clearRect(0, 0, this.cssW, this.cssH);
      pctx.save();
      pctx.beginPath();
      pctx.rect(AXIS_LEFT, TOP, this.plotW, this.plotH);
      pctx.clip();
      this.drawPhases(pctx, pal);
      pctx.restore();
      this.phasesDrawn = this.phasesSeen;
    }
    // Without user_metadata marks the layer is the strip alone: copy only it.
    const h = v.metaMarks.length ? this.cssH : TOP + STRIP, r = this.phases.width / this.cssW;
    ctx.drawImage(this.phases, 0, 0, this.phases.width, Math.round(h * r), 0, 0, this.cssW, Math.round(h * r) / r);
  }

  // Phases: a strip at the top of the plot, one colour per phase, and
  // the steps' numbers over it; where user_metadata changes, a dashed
  // line with the new text.
  drawPhases(ctx, pal) {
    const rs = this.view.regions, marks = this.view.metaMarks;
    if (!rs.length && !marks.length) return;
    ctx.fillStyle = pal.panel;
    ctx.globalAlpha = 0.8;
    ctx.fillRect(AXIS_LEFT, TOP, this.plotW, STRIP);
    ctx.globalAlpha = 1;
    ctx.lineWidth = 1; // drawn over a selection's wider outline, or into a layer of its own: the same lines
    for (const r of rs) {
      const x0 = this.xOfTime(r.start_us), x1 = this.xOfTime(r.end_us);
      if (x1 < AXIS_LEFT || x0 > AXIS_LEFT + this.plotW) continue;
      if (r.step >= 0) {
        ctx.strokeStyle = pal.dim;
        ctx.beginPath(); ctx.moveTo(Math.round(x0) + 0.5, TOP); ctx.lineTo(Math.round(x0) + 0.5, TOP + STRIP); ctx.stroke();
        continue;
      }
      const c = PHASES[r.phase];
      ctx.fillStyle = c !== undefined ? pal.cats[c] : pal.small;
      ctx.fillRect(x0, TOP + 2 + Math.min(r.depth, 2) * 2, Math.max(1, x1 - x0), 6);
    }
    ctx.font = "10px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    ctx.textAlign = "left";
    ctx.fillStyle = pal.fg;
    // Each step's label fits inside the step ("step N", else "N") or is
    // left out; it sits on the strip's colour so that neither the phases
    // nor the next step's start line run through it.
    let lastEnd = -Infinity;
    const right = AXIS_LEFT + this.plotW;
    for (const r of rs) {
      if (r.step < 0) continue;
      const x0 = Math.max(AXIS_LEFT, this.xOfTime(r.start_us)) + 3, x1 = Math.min(right, this.xOfTime(r.end_us)) - 2;
      if (x0 < lastEnd || x0 > right) continue;
      const label = ["step " + r.step, String(r.step)].find((l) => x0 + ctx.measureText(l).width <= x1);
      if (!label) continue;
      const w = ctx.measureText(label).width;
      ctx.fillStyle = pal.panel;
      ctx.fillRect(x0 - 2, TOP + 1, w + 4, STRIP - 2);
      ctx.fillStyle = pal.fg;
      ctx.fillText(label, x0, TOP + STRIP / 2);
      lastEnd = x0 + w + 6;
    }
    this.drawCompleteSteps(ctx, pal);
    ctx.strokeStyle = ctx.fillStyle = pal.dim;
    ctx.setLineDash([2, 3]);
    lastEnd = -Infinity;
    for (const m of marks) {
      const x = Math.round(this.xOfTime(m.time_us)) + 0.5;
      if (x < AXIS_LEFT || x > AXIS_LEFT + this.plotW) continue;
      ctx.beginPath(); ctx.moveTo(x, TOP); ctx.lineTo(x, TOP + this.plotH); ctx.stroke();
      const label = m.user_metadata || "(no user_metadata)";
      if (x + 3 > lastEnd) {
        ctx.fillText(label, x + 3, TOP + STRIP + 8);
        lastEnd = x + 3 + ctx.measureText(label).width + 6;
      }
    }
    ctx.setLineDash([]);
  }

  // In a trace that read a sample of the job's entries, the steps read
  // whole (no entry lost) are underlined in the strip.
  drawCompleteSteps(ctx, pal) {
    const v = this.view;
    if (!v.stepsSampled) return;
    ctx.fillStyle = pal.active;
    for (const s of v.steps) {
      if (!s.complete) continue;
      const x0 = this.xOf(s.start_us), x1 = this.xOf(s.end_us);
      if (x1 < AXIS_LEFT || x0 > AXIS_LEFT + this.plotW) continue;
      ctx.fillRect(x0, TOP + STRIP - 3, Math.max(2, x1 - x0), 3);
    }
  }

  /** The step whose label strip is under a point, or null. */
  stepAt(x, y) {
    if (y < TOP || y > TOP + STRIP || x < AXIS_LEFT || x > AXIS_LEFT + this.plotW) return null;
    const t = this.view.timeOfU(this.tOf(x));
    return this.view.regions.find((r) => r.step >= 0 && r.start_us <= t && t < r.end_us) || null;
  }

  // Stacked areas by category: the live bytes of each category at the
  // sampled instants (the server's /categories), bottom up in the
  // server's order, each sample standing for its share of the window.
  drawCategoryAreas(ctx, pal) {
    const a = this.areas, n = a.t.length;
    if (!n) return;
    const dt = (a.t1 - a.t0) / n;
    const [lo] = this.yRange();
    for (let i = 0; i < n; i++) {
      // Whole pixels, so that neighbouring samples meet without a seam.
      const x0 = Math.floor(this.xOf(a.t0 + i * dt)), x1 = Math.ceil(this.xOf(a.t0 + (i + 1) * dt));
      if (x1 < AXIS_LEFT || x0 > AXIS_LEFT + this.plotW) continue;
      let below = 0;
      for (let k = 0; k < a.bytes[i].length; k++) {
        const v = a.bytes[i][k];
        if (!v) continue;
        const yTop = this.yOf(below + v), yBottom = this.yOf(Math.max(lo, below));
        ctx.fillStyle = pal.cats[k];
        ctx.fillRect(x0, yTop, Math.max(1, x1 - x0), Math.max(0, yBottom - yTop));
        below += v;
      }
    }
  }

  drawOverlay(ctx, pal) {
    const v = this.view;
    ctx.save();
    ctx.beginPath();
    ctx.rect(AXIS_LEFT, TOP, this.plotW, this.plotH);
    ctx.clip();
    const b = this.bands;
    if (b && v.highlight) {
      for (const band of b.bands) if (v.highlighted(band.seq, band.address)) this.outlineBand(ctx, band, pal.hl, 1.5, true);
    }
    if (b) {
      const sel = v.sel, selAddr = v.selBlock?.addr;
      const selected = b.bands.find((x) => (sel !== null && x.seq === sel) || (x.seq < 0 && x.address === selAddr));
      if (selected) this.outlineBand(ctx, selected, pal.select, 2, true);
      if (this.hover?.band && this.hover.band !== selected) this.outlineBand(ctx, this.hover.band, pal.fg, 1);
    }
    this.drawPhasesLayer(ctx, pal);
    const cu = v.cursorU();
    if (cu !== null && cu !== undefined) {
      const x = Math.round(this.xOf(cu)) + 0.5;
      ctx.strokeStyle = pal.cursor;
      ctx.lineWidth = 1;
      ctx.setLineDash([4, 3]);
      ctx.beginPath(); ctx.moveTo(x, TOP); ctx.lineTo(x, TOP + this.plotH); ctx.stroke();
      ctx.setLineDash([]);
    }
    // Markers (OOM incidents): a solid line with a flag at the top.
    for (const m of v.markers || []) {
      const x = Math.round(this.xOfTime(m.t)) + 0.5;
      ctx.strokeStyle = ctx.fillStyle = pal.oom;
      ctx.lineWidth = 2;
      ctx.beginPath(); ctx.moveTo(x, TOP); ctx.lineTo(x, TOP + this.plotH); ctx.stroke();
      ctx.beginPath(); ctx.moveTo(x, TOP); ctx.lineTo(x + 9, TOP + 5); ctx.lineTo(x, TOP + 10); ctx.fill();
    }
    if (this.brush) {
      const { t0, t1, y0, y1 } = this.brush;
      const x0 = this.xOf(Math.min(t0, t1)), x1 = this.xOf(Math.max(t0, t1));
      ctx.fillStyle = pal.brush;
      if (Math.abs(this.yOf(y0) - this.yOf(y1)) > 8) {
        const ya = this.yOf(Math.max(y0, y1)), yb = this.yOf(Math.min(y0, y1));
        ctx.fillRect(x0, ya, x1 - x0, yb - ya);
      } else ctx.fillRect(x0, TOP, x1 - x0, this.plotH);
    }
    ctx.restore();
  }

  // The bands were laid out for the window they were fetched for; map
  // their columns to the current window's x. Rectangles of one colour go
  // into one path, filled once.
  drawBands(ctx, pal) {
    const b = this.bands;
    if (!b || b.events !== (this.view.axis === "event")) return; // an answer on the other axis
    const colW = (b.t1 - b.t0) / b.w;
    // An answer drawn at another scale than its own (while the next one is
    // on its way) can map far off the plot: coordinates are clamped to just
    // around it, and columns outside it skipped.
    const left = AXIS_LEFT - 2, right = AXIS_LEFT + this.plotW + 2, top = TOP - 2, bottom = TOP + this.plotH + 2;
    const xc = (c) => Math.max(left, Math.min(right, this.xOf(b.t0 + c * colW)));
    const yc = (v) => Math.max(top, Math.min(bottom, this.yOf(v)));
    const c0 = Math.max(0, Math.floor((this.view.t0 - b.t0) / colW) - 1), c1 = Math.min(b.w, Math.ceil((this.view.t1 - b.t0) / colW) + 1);
    const [lo, hi] = this.yRange();
    // The allocated envelope, one polygon: where no band is drawn,
    // allocations too small or too short to draw at this zoom.
    const env = new Path2D();
    const base = yc(Math.max(0, lo));
    env.moveTo(xc(c0), base);
    for (let c = c0; c < c1; c++) {
      const y = yc(b.allocated[c]);
      env.lineTo(xc(c), y);
      env.lineTo(xc(c + 1), y);
    }
    env.lineTo(xc(c1), base);
    env.closePath();
    ctx.fillStyle = pal.small;
    ctx.fill(env);
    // Bands colour by colour: a canvas fills many rectangles one by one
    // faster than as one path.
    // The colour follows the allocation's seq; those made before the trace
    // (all seq -1) by their address, so neighbours differ. By category, the
    // category's.
    const cats = this.view.bandMode !== "alloc" && this.bandCats?.band;
    const colors = cats ? pal.cats : pal.bands;
    const colorOf = cats ? (band) => cats[band.i] : (band) => (band.seq >= 0 ? band.seq : Math.floor(band.address / 512)) % colors.length;
    // Folded bands: their group's colour (a hash of its name, the same in
    // every answer), or their category's.
    const foldCats = cats && this.bandCats.fold;
    const groupColor = b.groups.map((g) => hashString(g) % colors.length);
    const foldColor = foldCats ? (f) => foldCats[f.i] : (f) => groupColor[f.group];
    for (let k = 0; k < colors.length; k++) {
      ctx.fillStyle = colors[k];
      for (const f of b.folds) {
        if (f.c1 < c0 || f.c0 >= c1 || f.offset >= hi || f.offset + f.size <= lo || foldColor(f) !== k) continue;
        const x0 = xc(f.c0), x1 = xc(f.c1 + 1);
        const y1 = yc(f.offset), y0 = yc(f.offset + f.size);
        ctx.fillRect(x0, y0, Math.max(1, x1 - x0), y1 - y0);
      }
    }
    for (let k = 0; k < colors.length; k++) {
      ctx.fillStyle = colors[k];
      for (const band of b.bands) {
        if (band.c1 < c0 || band.c0 >= c1 || colorOf(band) !== k) continue;
        for (let r = band.r0; r < band.r1; r++) {
          const off = b.runOffs[r], end = r + 1 < band.r1 ? b.runCols[r + 1] : band.c1 + 1;
          if (off >= hi || off + band.size <= lo || end <= c0 || b.runCols[r] >= c1) continue;
          const x0 = xc(b.runCols[r]), x1 = xc(end);
          const y1 = yc(off), y0 = yc(off + band.size);
          ctx.fillRect(x0, y0, Math.max(1, x1 - x0), Math.max(1, y1 - y0));
        }
      }
    }
  }

  // Outline a band as two step lines (its top and bottom edges), closed at
  // both ends; the selected one is also tinted.
  outlineBand(ctx, band, color, width, tint) {
    const b = this.bands;
    const colW = (b.t1 - b.t0) / b.w;
    const xc = (c) => this.xOf(b.t0 + c * colW);
    const end = xc(band.c1 + 1);
    const x1Of = (r) => (r + 1 < band.r1 ? xc(b.runCols[r + 1]) : end);
    const edge = (dy) => {
      ctx.beginPath();
      for (let r = band.r0; r < band.r1; r++) {
        const x0 = xc(b.runCols[r]), y = this.yOf(b.runOffs[r] + dy);
        if (r === band.r0) ctx.moveTo(x0, y); else ctx.lineTo(x0, y);
        ctx.lineTo(x1Of(r), y);
      }
      return ctx;
    };
    if (tint) {
      ctx.globalAlpha = 0.35;
      ctx.fillStyle = color;
      for (let r = band.r0; r < band.r1; r++) {
        const x0 = xc(b.runCols[r]), y1 = this.yOf(b.runOffs[r]), y0 = this.yOf(b.runOffs[r] + band.size);
        ctx.fillRect(x0, y0, Math.max(1, x1Of(r) - x0), Math.max(1, y1 - y0));
      }
      ctx.globalAlpha = 1;
    }
    ctx.strokeStyle = color;
    ctx.lineWidth = width;
    edge(0).stroke();
    edge(band.size).stroke();
    const first = b.runOffs[band.r0], last = b.runOffs[band.r1 - 1];
    ctx.beginPath();
    ctx.moveTo(xc(band.c0), this.yOf(first)); ctx.lineTo(xc(band.c0), this.yOf(first + band.size));
    ctx.moveTo(end, this.yOf(last)); ctx.lineTo(end, this.yOf(last + band.size));
    ctx.stroke();
  }

  drawUsage(ctx, pal) {
    const u = this.usage;
    if (!u || (u.times !== null) !== (this.view.axis === "event")) return; // none, or an answer on the other axis
    const n = u.events.length;
    const left = AXIS_LEFT - 2, right = AXIS_LEFT + this.plotW + 2, top = TOP - 2, bottom = TOP + this.plotH + 2;
    const xc = (t) => Math.max(left, Math.min(right, this.xOf(t)));
    const yc = (v) => Math.max(top, Math.min(bottom, this.yOf(v)));
    const i0 = Math.max(0, Math.floor((this.view.t0 - u.start_us) / u.bucket_us) - 1);
    const i1 = Math.min(n, Math.ceil((this.view.t1 - u.start_us) / u.bucket_us) + 1);
    const series = [["reserved", pal.reserved], ["active", pal.active], ["allocated", pal.allocated]];
    // Each series is its maximum per column, a one-pixel line (wider lines
    // cost ten times as much to draw), over a tint of the polygon between
    // its minimum and maximum, which shows how much it moved in a column.
    for (const [key, color] of series) {
      const mm = u[key];
      const line = new Path2D(), env = new Path2D();
      for (let i = i0; i < i1; i++) {
        const x0 = xc(u.start_us + i * u.bucket_us), x1 = xc(u.start_us + (i + 1) * u.bucket_us);
        const yHi = yc(mm[2 * i + 1]);
        if (i === i0) { line.moveTo(x0, yHi); env.moveTo(x0, yHi); } else { line.lineTo(x0, yHi); env.lineTo(x0, yHi); }
        line.lineTo(x1, yHi);
        env.lineTo(x1, yHi);
      }
      for (let i = i1 - 1; i >= i0; i--) {
        const yLo = yc(mm[2 * i]);
        env.lineTo(xc(u.start_us + (i + 1) * u.bucket_us), yLo);
        env.lineTo(xc(u.start_us + i * u.bucket_us), yLo);
      }
      env.closePath();
      ctx.fillStyle = ctx.strokeStyle = color;
      ctx.lineWidth = 1;
      ctx.globalAlpha = 0.3; // the bands stay visible under a busy series
      ctx.fill(env);
      ctx.globalAlpha = 1;
      ctx.stroke(line);
    }
    this.drawPinned(ctx, pal, series);
  }

  // A series wholly above (or below) the memory range shown is drawn
  // along that edge, dashed, with its greatest (least) value: a line is
  // never out of sight.
  drawPinned(ctx, pal, series) {
    const u = this.usage, v = this.view, n = u.events.length;
    const i0 = Math.max(0, Math.floor((v.t0 - u.start_us) / u.bucket_us)), i1 = Math.min(n, Math.ceil((v.t1 - u.start_us) / u.bucket_us));
    const [lo, hi] = this.yRange();
    let above = 0, below = 0;
    ctx.font = "10px system-ui, sans-serif";
    ctx.textAlign = "right";
    ctx.setLineDash([4, 3]);
    for (const [key, color] of series) {
      const mm = u[key];
      let least = Infinity, most = -Infinity;
      for (let i = i0; i < i1; i++) { least = Math.min(least, mm[2 * i]); most = Math.max(most, mm[2 * i + 1]); }
      if (!(most > -Infinity)) continue;
      let y, label;
      if (least > hi) {
        y = this.dataTop + 1.5 + 12 * above++;
        label = `${key} ${fmtBytesShort(least)}–${fmtBytesShort(most)}, above ↑`;
      } else if (most < lo) {
        y = TOP + this.plotH - 1.5 - 12 * below++;
        label = `${key} ${fmtBytesShort(least)}–${fmtBytesShort(most)}, below ↓`;
      } else continue;
      ctx.strokeStyle = ctx.fillStyle = color;
      ctx.beginPath(); ctx.moveTo(AXIS_LEFT, y); ctx.lineTo(AXIS_LEFT + this.plotW, y); ctx.stroke();
      const w = ctx.measureText(label).width, x = AXIS_LEFT + this.plotW - 4, ty = y + (least > hi ? 7 : -7);
      ctx.fillStyle = pal.panel;
      ctx.fillRect(x - w - 2, ty - 6, w + 4, 12);
      ctx.fillStyle = color;
      ctx.textBaseline = "middle";
      ctx.fillText(label, x, ty);
    }
    ctx.setLineDash([]);
  }

  // Search matches: a tick under the plot at each match's allocation time.
  drawSearchMarks(ctx, pal) {
    const marks = this.view.searchMarks;
    if (!marks?.length) return;
    ctx.fillStyle = pal.select;
    for (const t of marks) {
      const x = this.xOfTime(t);
      if (x < AXIS_LEFT || x > AXIS_LEFT + this.plotW) continue;
      ctx.fillRect(Math.round(x) - 1, TOP + this.plotH - 7, 2, 7);
    }
  }

  drawAxes(ctx, pal) {
    const v = this.view;
    const [lo, hi] = this.yRange();
    ctx.fillStyle = pal.fg;
    ctx.strokeStyle = pal.grid;
    ctx.lineWidth = 1;
    ctx.font = "11px system-ui, sans-serif";
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    // A narrow range high up (a zoomed memory axis) is labelled from a
    // base written once, since its ticks would all round to the same size.
    const ticks = niceTicks(lo, hi, Math.max(3, Math.floor(this.plotH / 50)), true);
    const base = hi - lo < hi / 50 && ticks.length ? ticks[0] : 0;
    this.memoryLabels = []; // as drawn, for tests
    for (const b of ticks) {
      const y = Math.round(this.yOf(b)) + 0.5;
      ctx.beginPath(); ctx.moveTo(AXIS_LEFT - 4, y); ctx.lineTo(AXIS_LEFT + this.plotW, y); ctx.stroke();
      this.memoryLabels.push(base && b !== base ? "+" + fmtBytesShort(b - base) : fmtBytesShort(b));
      ctx.fillText(this.memoryLabels.at(-1), AXIS_LEFT - 6, y);
    }
    if (base) {
      ctx.textAlign = "left";
      ctx.fillText("from " + fmtBytes(base), AXIS_LEFT + 4, TOP + 8);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    const y0 = TOP + this.plotH;
    ctx.beginPath(); ctx.moveTo(AXIS_LEFT, y0 + 0.5); ctx.lineTo(AXIS_LEFT + this.plotW, y0 + 0.5); ctx.stroke();
    const origin = v.axis === "event" ? 0 : v.firstUS;
    // Whole numbers: times are whole microseconds (or event indexes), and
    // finer ticks would repeat their labels ("0 µs 0 µs 1 µs").
    const times = niceTicks(v.t0 - origin, v.t1 - origin, Math.max(2, Math.floor(this.plotW / 110)), false, true).map((t) => t + origin);
    this.tickLabels = v.axis === "event" ? times.map((e) => "#" + e.toLocaleString("en-US")) : v.fmtTs(times, times.length > 1 ? times[1] - times[0] : v.t1 - v.t0);
    times.forEach((t, i) => {
      const x = Math.round(this.xOf(t)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, y0); ctx.lineTo(x, y0 + 4); ctx.stroke();
      fillTextWithin(ctx, this.tickLabels[i], x, y0 + 6, 2, this.cssW - 2);
    });
  }

  /** The band (or the allocated envelope) under a point, or null. */
  hit(x, y) {
    const b = this.bands;
    if (!b || b.events !== (this.view.axis === "event") || x < AXIS_LEFT || x > AXIS_LEFT + this.plotW || y < this.dataTop || y > TOP + this.plotH) return null;
    const t = this.tOf(x);
    const colW = (b.t1 - b.t0) / b.w;
    const c = Math.floor((t - b.t0) / colW);
    if (c < 0 || c >= b.w) return null;
    const bytes = this.bytesOf(y);
    // A dense window's column, in pixels (the tip says it is drawn at its peak).
    const wide = b.dense ? this.xOf(b.t0 + (c + 1) * colW) - this.xOf(b.t0 + c * colW) : 0;
    for (const band of b.bands) {
      if (c < band.c0 || c > band.c1 || bytes < 0) continue;
      let r = band.r0;
      while (r + 1 < band.r1 && b.runCols[r + 1] <= c) r++;
      const off = b.runOffs[r];
      if (bytes >= off && bytes < off + band.size) return { band, t, wide };
    }
    for (const f of b.folds) {
      if (c >= f.c0 && c <= f.c1 && bytes >= f.offset && bytes < f.offset + f.size) return { fold: f, group: b.groups[f.group], t, wide };
    }
    if (bytes >= 0 && bytes < b.allocated[c]) return { small: b.allocated[c], t, wide };
    return { t };
  }

  /** Zooms the memory axis by f around bytes at. */
  zoomMemory(at, f) {
    const [lo, hi] = this.yRange();
    const span = Math.max(MIN_BYTES_SPAN, (hi - lo) * f);
    const y0 = Math.max(0, at - ((at - lo) / (hi - lo)) * span);
    this.view.setMemory(y0, y0 + span);
  }

  listen() {
    const cv = this.canvas;
    const v = this.view;
    let drag = null;
    const pos = (e) => { const r = cv.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; };
    cv.addEventListener("wheel", (e) => {
      e.preventDefault();
      const [x, y] = pos(e);
      const f = Math.exp(Math.max(-1, Math.min(1, e.deltaY * 0.002)));
      if (e.ctrlKey || e.altKey || e.metaKey) this.zoomMemory(this.bytesOf(y), f);
      else v.zoomTime(this.tOf(x), f);
    }, { passive: false });
    cv.addEventListener("pointerdown", (e) => {
      const [x, y] = pos(e);
      cv.setPointerCapture(e.pointerId);
      const [y0, y1] = this.yRange();
      drag = { x0: x, y0: y, t0: v.t0, t1: v.t1, m0: y0, m1: y1, zoomedY: v.y1 !== null, brush: e.shiftKey, moved: false };
      if (drag.brush) this.brush = { t0: this.tOf(x), t1: this.tOf(x), y0: this.bytesOf(y), y1: this.bytesOf(y) };
    });
    cv.addEventListener("pointermove", (e) => {
      const [x, y] = pos(e);
      if (drag) {
        if (Math.abs(x - drag.x0) > 3 || Math.abs(y - drag.y0) > 3) drag.moved = true;
        if (drag.brush) {
          this.brush.t1 = this.tOf(x);
          this.brush.y1 = this.bytesOf(y);
          v.redraw();
        } else if (drag.moved) {
          const dt = ((x - drag.x0) / this.plotW) * (drag.t1 - drag.t0);
          v.setWindow(drag.t0 - dt, drag.t1 - dt);
          if (drag.zoomedY) {
            const dm = ((y - drag.y0) / this.plotH) * (drag.m1 - drag.m0);
            const m0 = Math.max(0, drag.m0 + dm);
            v.setMemory(m0, m0 + (drag.m1 - drag.m0));
          }
        }
        return;
      }
      v.hoverStart ??= performance.now();
      this.hover = this.hit(x, y);
      v.showTip(this.tip, this.hover, x, y, "timeline");
      v.redraw();
    });
    const end = (e) => {
      if (!drag) return;
      const [x, y] = pos(e);
      if (drag.brush) {
        const { t0, t1, y0, y1 } = this.brush;
        this.brush = null;
        if (Math.abs(this.xOf(t0) - this.xOf(t1)) > 3) v.setWindow(Math.min(t0, t1), Math.max(t0, t1));
        if (Math.abs(this.yOf(y0) - this.yOf(y1)) > 8) v.setMemory(Math.max(0, Math.min(y0, y1)), Math.max(y0, y1));
        v.redraw();
      } else if (!drag.moved && this.stepAt(x, y) && v.goToStep) {
        v.goToStep(this.stepAt(x, y));
      } else if (!drag.moved) {
        const h = this.hit(x, y);
        v.setCursorAt(this.tOf(x));
        const band = h && (h.band || h.fold?.rep); // a folded band: its largest allocation
        if (band) {
          if (band.seq >= 0) v.select(band.seq);
          else v.selectBlock({ addr: band.address, size: band.size, requested: band.requested_size, stack: band.stack, seq: -1 });
        }
      }
      drag = null;
    };
    cv.addEventListener("pointerup", end);
    cv.addEventListener("pointercancel", () => { drag = null; this.brush = null; });
    cv.addEventListener("pointerleave", () => { this.hover = null; v.showTip(this.tip, null); v.redraw(); });
    cv.addEventListener("keydown", (e) => {
      const span = v.t1 - v.t0, mid = (v.t0 + v.t1) / 2;
      const [lo, hi] = this.yRange();
      switch (e.key) {
        case "ArrowLeft": v.setWindow(v.t0 - span * 0.1, v.t1 - span * 0.1); break;
        case "ArrowRight": v.setWindow(v.t0 + span * 0.1, v.t1 + span * 0.1); break;
        case "+": case "=": v.zoomTime(mid, 0.8); break;
        case "-": case "_": v.zoomTime(mid, 1.25); break;
        case "PageUp": this.zoomMemory((lo + hi) / 2, 0.8); break;
        case "PageDown": this.zoomMemory((lo + hi) / 2, 1.25); break;
        case "0": v.resetWindow(); break;
        default: return;
      }
      e.preventDefault();
    });
  }
}
