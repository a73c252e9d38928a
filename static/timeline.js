// The timeline: reserved / allocated / active bytes (min/max per pixel
// column from the server) over memory_viz's stacked active-memory bands.
// Data is fetched per viewport; while a fetch is in flight the last answer
// is redrawn at the new scale, so zooming never waits on the network.
import { api, LatestFetch, fitCanvas, niceTicks, fmtBytesShort, fmtTime } from "./common.js";

const AXIS_LEFT = 64, AXIS_BOTTOM = 22, TOP = 8, RIGHT = 8;

export class Timeline {
  /**
   * @param {HTMLCanvasElement} canvas
   * @param {object} view  the shared view (t0, t1, cursor, sel, ...) and its callbacks
   */
  constructor(canvas, tip, view) {
    this.canvas = canvas;
    this.tip = tip;
    this.view = view;
    this.usage = null; // last usage answer with its window
    this.bands = null; // last bands answer
    this.fetcher = new LatestFetch(view, "Timeline");
    this.brush = null; // [tA, tB] while shift-dragging
    this.hover = null;
    this.listen();
  }

  get plotW() { return Math.max(10, this.cssW - AXIS_LEFT - RIGHT); }
  get plotH() { return Math.max(10, this.cssH - AXIS_BOTTOM - TOP); }

  resize() {
    const box = this.canvas.parentElement.getBoundingClientRect();
    this.cssW = Math.max(200, Math.floor(box.width));
    this.cssH = 300;
  }

  xOf(t) { const v = this.view; return AXIS_LEFT + ((t - v.t0) / (v.t1 - v.t0)) * this.plotW; }
  tOf(x) { const v = this.view; return v.t0 + ((x - AXIS_LEFT) / this.plotW) * (v.t1 - v.t0); }

  /** Fetch the data of the current window (stale requests are aborted). */
  async load() {
    const v = this.view;
    const t0 = Math.floor(v.t0), t1 = Math.max(Math.ceil(v.t1), Math.floor(v.t0) + 1);
    const w = Math.round(this.plotW), h = Math.round(this.plotH);
    const base = `/api/traces/${v.id}`;
    const got = await this.fetcher.run((signal) => Promise.all([
      api(`${base}/usage?t0=${t0}&t1=${t1}&n=${w}`, { signal }),
      api(`${base}/bands?t0=${t0}&t1=${t1}&w=${w}&h=${h}`, { signal }),
    ]));
    if (!got) return false;
    this.usage = { ...got[0], t0, t1 };
    this.bands = got[1];
    return true;
  }

  draw(pal) {
    const start = performance.now();
    const ctx = fitCanvas(this.canvas, this.cssW, this.cssH);
    const v = this.view;
    ctx.fillStyle = pal.panel;
    ctx.fillRect(0, 0, this.cssW, this.cssH);
    const yMax = this.yMax();
    const yOf = (b) => TOP + this.plotH - (b / yMax) * this.plotH;

    ctx.save();
    ctx.beginPath();
    ctx.rect(AXIS_LEFT, TOP, this.plotW, this.plotH);
    ctx.clip();
    this.drawBands(ctx, pal, yOf);
    this.drawUsage(ctx, pal, yOf);
    // Cursor and brush.
    if (v.cursor !== null && v.cursor !== undefined) {
      const x = Math.round(this.xOf(v.cursor)) + 0.5;
      ctx.strokeStyle = pal.cursor;
      ctx.lineWidth = 1;
      ctx.setLineDash([4, 3]);
      ctx.beginPath(); ctx.moveTo(x, TOP); ctx.lineTo(x, TOP + this.plotH); ctx.stroke();
      ctx.setLineDash([]);
    }
    // Markers (OOM incidents): a solid line with a flag at the top.
    for (const m of v.markers || []) {
      const x = Math.round(this.xOf(m.t)) + 0.5;
      ctx.strokeStyle = ctx.fillStyle = pal.oom;
      ctx.lineWidth = 2;
      ctx.beginPath(); ctx.moveTo(x, TOP); ctx.lineTo(x, TOP + this.plotH); ctx.stroke();
      ctx.beginPath(); ctx.moveTo(x, TOP); ctx.lineTo(x + 9, TOP + 5); ctx.lineTo(x, TOP + 10); ctx.fill();
    }
    if (this.brush) {
      const [a, b] = this.brush;
      const x0 = this.xOf(Math.min(a, b)), x1 = this.xOf(Math.max(a, b));
      ctx.fillStyle = pal.brush;
      ctx.fillRect(x0, TOP, x1 - x0, this.plotH);
    }
    ctx.restore();
    this.drawAxes(ctx, pal, yMax, yOf);
    v.stats.drawMs.push(performance.now() - start);
    v.stats.timelineMs.push(performance.now() - start);
  }

  yMax() {
    let m = this.bands?.y_max || 0;
    const u = this.usage;
    if (u) for (let i = 1; i < u.reserved.length; i += 2) m = Math.max(m, u.reserved[i]);
    return Math.max(1, m) * 1.05;
  }

  // The bands were laid out for the window they were fetched for; map
  // their columns to the current window's x.
  drawBands(ctx, pal, yOf) {
    const b = this.bands;
    if (!b) return;
    const colW = (b.t1 - b.t0) / b.w;
    const xc = (c) => this.xOf(b.t0 + c * colW);
    // The folded small allocations: one area at the bottom.
    ctx.fillStyle = pal.small;
    for (let c = 0; c < b.w; c++) {
      const s = b.small[c];
      if (!s) continue;
      const x0 = xc(c), x1 = xc(c + 1);
      const y = yOf(s);
      ctx.fillRect(x0, y, Math.max(1, x1 - x0), yOf(0) - y);
    }
    const colors = pal.bands;
    const sel = this.view.sel;
    let selected = null;
    for (let i = 0; i < b.bands.length; i++) {
      const band = b.bands[i];
      ctx.fillStyle = colors[((band.seq % colors.length) + colors.length) % colors.length];
      const runs = band.runs;
      for (let r = 0; r < runs.length; r += 2) {
        const c0 = runs[r], c1 = r + 2 < runs.length ? runs[r + 2] : band.c1 + 1;
        const x0 = xc(c0), x1 = xc(c1);
        const y1 = yOf(runs[r + 1]), y0 = yOf(runs[r + 1] + band.size);
        ctx.fillRect(x0, y0, Math.max(1, x1 - x0), Math.max(1, y1 - y0));
      }
      if (band.seq === sel) selected = band;
    }
    if (selected) this.outlineBand(ctx, selected, xc, yOf, pal.select, 2, true);
    if (this.hover && this.hover.band && this.hover.band !== selected) this.outlineBand(ctx, this.hover.band, xc, yOf, pal.fg, 1);
  }

  // Outline a band as two step lines (its top and bottom edges), closed at
  // both ends; the selected one is also tinted.
  outlineBand(ctx, band, xc, yOf, color, width, tint) {
    const runs = band.runs, end = xc(band.c1 + 1);
    const edge = (dy) => {
      ctx.beginPath();
      for (let r = 0; r < runs.length; r += 2) {
        const x0 = xc(runs[r]), x1 = r + 2 < runs.length ? xc(runs[r + 2]) : end;
        const y = yOf(runs[r + 1] + dy);
        if (r === 0) ctx.moveTo(x0, y); else ctx.lineTo(x0, y);
        ctx.lineTo(x1, y);
      }
      return ctx;
    };
    if (tint) {
      ctx.globalAlpha = 0.35;
      ctx.fillStyle = color;
      for (let r = 0; r < runs.length; r += 2) {
        const x0 = xc(runs[r]), x1 = r + 2 < runs.length ? xc(runs[r + 2]) : end;
        const y1 = yOf(runs[r + 1]), y0 = yOf(runs[r + 1] + band.size);
        ctx.fillRect(x0, y0, Math.max(1, x1 - x0), Math.max(1, y1 - y0));
      }
      ctx.globalAlpha = 1;
    }
    ctx.strokeStyle = color;
    ctx.lineWidth = width;
    edge(0).stroke();
    edge(band.size).stroke();
    const first = runs[1], last = runs[runs.length - 1];
    ctx.beginPath();
    ctx.moveTo(xc(band.c0), yOf(first)); ctx.lineTo(xc(band.c0), yOf(first + band.size));
    ctx.moveTo(end, yOf(last)); ctx.lineTo(end, yOf(last + band.size));
    ctx.stroke();
  }

  drawUsage(ctx, pal, yOf) {
    const u = this.usage;
    if (!u) return;
    const n = u.events.length;
    const series = [["reserved", pal.reserved], ["active", pal.active], ["allocated", pal.allocated]];
    for (const [key, color] of series) {
      const mm = u[key];
      ctx.strokeStyle = color;
      ctx.fillStyle = color;
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      for (let i = 0; i < n; i++) {
        const x0 = this.xOf(u.start_us + i * u.bucket_us), x1 = this.xOf(u.start_us + (i + 1) * u.bucket_us);
        const yLo = yOf(mm[2 * i]), yHi = yOf(mm[2 * i + 1]);
        if (i === 0) ctx.moveTo(x0, yHi); else ctx.lineTo(x0, yHi);
        ctx.lineTo(x1, yHi);
        // Where a column's min and max differ, draw its envelope.
        if (yLo - yHi >= 1) ctx.fillRect(x0, yHi, Math.max(1, x1 - x0), yLo - yHi);
      }
      ctx.stroke();
    }
  }

  drawAxes(ctx, pal, yMax, yOf) {
    const v = this.view;
    ctx.fillStyle = pal.fg;
    ctx.strokeStyle = pal.grid;
    ctx.lineWidth = 1;
    ctx.font = "11px system-ui, sans-serif";
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (const b of niceTicks(0, yMax, 5, true)) {
      const y = Math.round(yOf(b)) + 0.5;
      ctx.beginPath(); ctx.moveTo(AXIS_LEFT - 4, y); ctx.lineTo(AXIS_LEFT + this.plotW, y); ctx.stroke();
      ctx.fillText(fmtBytesShort(b), AXIS_LEFT - 6, y);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    const y0 = TOP + this.plotH;
    ctx.beginPath(); ctx.moveTo(AXIS_LEFT, y0 + 0.5); ctx.lineTo(AXIS_LEFT + this.plotW, y0 + 0.5); ctx.stroke();
    const origin = v.firstUS;
    for (const t of niceTicks(v.t0 - origin, v.t1 - origin, Math.max(2, Math.floor(this.plotW / 110)))) {
      const x = Math.round(this.xOf(t + origin)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, y0); ctx.lineTo(x, y0 + 4); ctx.stroke();
      ctx.fillText(fmtTime(t), x, y0 + 6);
    }
  }

  /** The band (or the small band) under a point, or null. */
  hit(x, y) {
    const b = this.bands;
    if (!b || x < AXIS_LEFT || x > AXIS_LEFT + this.plotW || y < TOP || y > TOP + this.plotH) return null;
    const t = this.tOf(x);
    const c = Math.floor((t - b.t0) / ((b.t1 - b.t0) / b.w));
    if (c < 0 || c >= b.w) return null;
    const yMax = this.yMax();
    const bytes = ((TOP + this.plotH - y) / this.plotH) * yMax;
    for (const band of b.bands) {
      if (c < band.c0 || c > band.c1) continue;
      const runs = band.runs;
      let off = runs[1];
      for (let r = 0; r < runs.length && runs[r] <= c; r += 2) off = runs[r + 1];
      if (bytes >= off && bytes < off + band.size) return { band, t };
    }
    if (bytes >= 0 && bytes < b.small[c]) return { small: b.small[c], t };
    return { t };
  }

  listen() {
    const cv = this.canvas;
    const v = this.view;
    let drag = null;
    const pos = (e) => { const r = cv.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; };
    cv.addEventListener("wheel", (e) => {
      e.preventDefault();
      const [x] = pos(e);
      const f = Math.exp(Math.max(-1, Math.min(1, e.deltaY * 0.002)));
      v.zoomTime(this.tOf(x), f);
    }, { passive: false });
    cv.addEventListener("pointerdown", (e) => {
      const [x, y] = pos(e);
      cv.setPointerCapture(e.pointerId);
      drag = { x0: x, y0: y, t0: v.t0, t1: v.t1, brush: e.shiftKey, moved: false };
      if (drag.brush) this.brush = [this.tOf(x), this.tOf(x)];
    });
    cv.addEventListener("pointermove", (e) => {
      const [x, y] = pos(e);
      if (drag) {
        if (Math.abs(x - drag.x0) > 3) drag.moved = true;
        if (drag.brush) {
          this.brush[1] = this.tOf(x);
          v.redraw();
        } else if (drag.moved) {
          const dt = ((x - drag.x0) / this.plotW) * (drag.t1 - drag.t0);
          v.setWindow(drag.t0 - dt, drag.t1 - dt);
        }
        return;
      }
      this.hover = this.hit(x, y);
      v.showTip(this.tip, this.hover, x, y, "timeline");
      v.redraw();
    });
    const end = (e) => {
      if (!drag) return;
      const [x, y] = pos(e);
      if (drag.brush) {
        const [a, b] = this.brush;
        this.brush = null;
        if (Math.abs(this.xOf(a) - this.xOf(b)) > 3) v.setWindow(Math.min(a, b), Math.max(a, b));
        else v.redraw();
      } else if (!drag.moved) {
        const h = this.hit(x, y);
        v.setCursor(this.tOf(x));
        if (h && h.band) v.select(h.band.seq);
      }
      drag = null;
    };
    cv.addEventListener("pointerup", end);
    cv.addEventListener("pointercancel", () => { drag = null; this.brush = null; });
    cv.addEventListener("pointerleave", () => { this.hover = null; v.showTip(this.tip, null); v.redraw(); });
    cv.addEventListener("keydown", (e) => {
      const span = v.t1 - v.t0, mid = (v.t0 + v.t1) / 2;
      switch (e.key) {
        case "ArrowLeft": v.setWindow(v.t0 - span * 0.1, v.t1 - span * 0.1); break;
        case "ArrowRight": v.setWindow(v.t0 + span * 0.1, v.t1 + span * 0.1); break;
        case "+": case "=": case "ArrowUp": v.zoomTime(mid, 0.8); break;
        case "-": case "_": case "ArrowDown": v.zoomTime(mid, 1.25); break;
        case "0": v.resetWindow(); break;
        default: return;
      }
      e.preventDefault();
    });
  }
}
