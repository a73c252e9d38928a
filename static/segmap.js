// The segment map: the address space at the cursor time, one row per
// segment (address order). x is the byte offset inside a segment, on one
// scale for all rows so their sizes compare; the wheel zooms into an
// offset range. Blocks are coloured by state, the largest free block is
// marked, and the selected allocation is outlined as on the timeline, as
// are the highlighted ones (a frame picked in the flame graph). The
// segments of private pools (CUDA graphs, MemPools) come after the default
// pools', each pool under a heading of its own, as their blocks serve only
// that pool's requests.
import { api, LatestFetch, fitCanvas, fmtAddr, fmtBytesShort, niceTicks, fillTextWithin } from "./common.js";

const LABEL = 170, ROW = 18, GAP = 4, TOP = 20, RIGHT = 8;
const SEG = 7, BLK = 6; // columns of the flat arrays

export class SegMap {
  constructor(canvas, tip, view) {
    this.canvas = canvas;
    this.tip = tip;
    this.view = view;
    this.data = null;
    this.fetcher = new LatestFetch(view, "Segment map");
    this.hover = null;
    this.listen();
  }

  resize() {
    const box = this.canvas.parentElement.getBoundingClientRect();
    this.cssW = Math.max(200, Math.floor(box.width));
    const rows = this.rows ? this.rows.length : 0;
    this.cssH = Math.max(120, Math.min(6000, TOP + rows * (ROW + GAP) + GAP));
  }

  /**
   * The rows, top to bottom: {seg: offset in d.segments} for a segment,
   * {pool: "owner, id"} for a private pool's heading. The default pools'
   * segments first, in address order, then each private pool's.
   */
  layoutRows(d) {
    const poolOf = new Map((d.pools || []).map(([addr, owner, id]) => [addr, `${owner}, ${id}`]));
    const rows = [], apart = new Map();
    for (let i = 0; i < d.segments.length; i += SEG) {
      const p = poolOf.get(d.segments[i]);
      if (p === undefined) rows.push({ seg: i });
      else {
        if (!apart.has(p)) apart.set(p, []);
        apart.get(p).push({ seg: i });
      }
    }
    for (const p of [...apart.keys()].sort()) rows.push({ pool: p }, ...apart.get(p));
    return rows;
  }

  get plotW() { return Math.max(10, this.cssW - LABEL - RIGHT); }

  /** Largest segment size: the default offset range. */
  maxSize() {
    const s = this.data?.segments || [];
    let m = 0;
    for (let i = 0; i < s.length; i += SEG) m = Math.max(m, s[i + 1]);
    return Math.max(m, 512);
  }

  range() {
    const v = this.view;
    const full = this.maxSize();
    let m0 = v.m0 ?? 0, m1 = v.m1 ?? full;
    if (!(m1 > m0)) { m0 = 0; m1 = full; }
    return [m0, m1];
  }

  xOf(off) { const [m0, m1] = this.range(); return LABEL + ((off - m0) / (m1 - m0)) * this.plotW; }
  offOf(x) { const [m0, m1] = this.range(); return m0 + ((x - LABEL) / this.plotW) * (m1 - m0); }

  async load() {
    const v = this.view;
    // layoutSeq (an incident's oom event) pins the map to one event; a
    // cursor set to an event shows the map right after it.
    const seq = v.layoutSeq ?? v.cursorSeq;
    const at = seq != null ? "seq=" + seq : "t=" + Math.round(v.cursor);
    const d = await this.fetcher.run((signal) => api(`/api/traces/${v.id}/layout?${at}`, { signal }));
    if (!d) return false;
    this.data = d;
    this.rows = this.layoutRows(d);
    return true;
  }

  draw(pal) {
    const start = performance.now();
    this.resize();
    // Frames that change nothing here (a hover on the timeline) skip it.
    const v = this.view;
    const key = [this.cssW, this.cssH, v.m0, v.m1, v.sel, this.hover?.index, pal.panel, v.pinned.size].join();
    if (this.drawn === this.data && this.drawnKey === key && this.drawnHighlight === v.highlight) return;
    this.drawnHighlight = v.highlight;
    this.drawn = this.data;
    this.drawnKey = key;
    const ctx = fitCanvas(this.canvas, this.cssW, this.cssH);
    ctx.fillStyle = pal.panel;
    ctx.fillRect(0, 0, this.cssW, this.cssH);
    const d = this.data;
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    if (!d) return;
    if (d.segment_count === 0) {
      ctx.fillStyle = pal.dim;
      ctx.fillText("No memory reserved at this time.", LABEL, TOP + ROW);
      return;
    }
    const [m0, m1] = this.range();
    // Offset axis.
    ctx.fillStyle = pal.dim;
    ctx.textAlign = "center";
    for (const o of niceTicks(m0, m1, Math.max(2, Math.floor(this.plotW / 120)), true)) {
      const x = this.xOf(o);
      fillTextWithin(ctx, "+" + fmtBytesShort(o), x, TOP / 2, 2, this.cssW - 2);
    }
    const segs = d.segments, blks = d.blocks, sel = this.view.sel;
    const largest = d.largest_free_address;
    const pinned = this.view.pinned; // addresses of split segments whose live blocks are marked
    let selRect = null, largestRect = null, hoverRect = null;
    const hlRects = [];
    for (let r = 0; r < this.rows.length; r++) {
      const y = TOP + GAP + r * (ROW + GAP);
      if (this.rows[r].pool !== undefined) {
        ctx.fillStyle = pal.fg;
        ctx.textAlign = "left";
        ctx.fillText(`Private pool (${this.rows[r].pool}): a CUDA graph's or MemPool's, serving only its own requests`, 4, y + ROW / 2);
        ctx.fillStyle = pal.dim;
        ctx.fillRect(0, y - GAP / 2, this.cssW, 1);
        continue;
      }
      const i = this.rows[r].seg;
      const addr = segs[i], size = segs[i + 1], first = segs[i + 5], count = segs[i + 6];
      const pins = pinned?.has(addr);
      ctx.fillStyle = pal.fg;
      ctx.textAlign = "left";
      ctx.fillText(fmtAddr(addr), 4, y + ROW / 2);
      ctx.fillStyle = pal.dim;
      ctx.textAlign = "right";
      ctx.fillText(fmtBytesShort(size) + (segs[i + 4] ? " exp" : ""), LABEL - 6, y + ROW / 2);
      ctx.save();
      ctx.beginPath();
      ctx.rect(LABEL, y - 2, this.plotW, ROW + 4);
      ctx.clip();
      // Sub-pixel blocks merge into the pixel they fall in: draw each run
      // of blocks in the same pixel once, in the colour of the busiest state.
      let px = -1, pxState = -1;
      for (let b = first; b < first + count; b++) {
        const k = b * BLK;
        const off = blks[k] - addr, bsize = blks[k + 1], state = blks[k + 3];
        if (off + bsize < m0 || off > m1) continue;
        const x0 = this.xOf(off), x1 = this.xOf(off + bsize);
        const w = x1 - x0;
        if (state === 1 && this.view.highlighted(blks[k + 4], blks[k])) hlRects.push([x0, y, Math.max(1, w), ROW]);
        if (w < 1) {
          const p = Math.floor(x0);
          if (p === px && (state === 0 || state === pxState)) continue;
          px = p; pxState = state;
        }
        ctx.fillStyle = state !== 0 && pins ? pal.pin : state === 1 ? pal.allocated : state === 2 ? pal.pending : pal.free;
        ctx.fillRect(x0, y, Math.max(1, w - (w > 4 ? 1 : 0)), ROW);
        if (state === 0 && blks[k] === largest) largestRect = [x0, y, Math.max(1, w), ROW];
        if (blks[k + 4] === sel && sel !== null && state !== 0) selRect = [x0, y, Math.max(1, w), ROW];
        if (this.hover && this.hover.index === b) hoverRect = [x0, y, Math.max(1, w), ROW];
      }
      ctx.restore();
    }
    if (largestRect) {
      const [x, y, w, h] = largestRect;
      ctx.strokeStyle = pal.largest;
      ctx.lineWidth = 2;
      ctx.strokeRect(x + 1, y + 1, Math.max(1, w - 2), h - 2);
      ctx.fillStyle = pal.largest;
      ctx.beginPath(); ctx.moveTo(x, y - 1); ctx.lineTo(x + 8, y - 1); ctx.lineTo(x, y + 7); ctx.fill();
    }
    if (hlRects.length) {
      ctx.fillStyle = ctx.strokeStyle = pal.hl;
      ctx.lineWidth = 2;
      for (const [x, y, w, h] of hlRects) {
        ctx.globalAlpha = 0.35;
        ctx.fillRect(x, y, w, h);
        ctx.globalAlpha = 1;
        ctx.strokeRect(x + 1, y + 1, Math.max(1, w - 2), h - 2);
      }
    }
    if (hoverRect) { ctx.strokeStyle = pal.fg; ctx.lineWidth = 1; ctx.strokeRect(...hoverRect); }
    if (selRect) {
      const [x, y, w, h] = selRect;
      ctx.strokeStyle = pal.select;
      ctx.lineWidth = 3;
      ctx.strokeRect(x - 1, y - 1, w + 2, h + 2);
    }
    this.view.stats.drawMs.push(performance.now() - start);
    this.view.stats.segmapMs.push(performance.now() - start);
  }

  /** Canvas coordinates of the middle of block index b (for tests and keyboard use). */
  blockCenter(b) {
    const d = this.data, segs = d.segments, blks = d.blocks;
    for (let r = 0; r < this.rows.length; r++) {
      const i = this.rows[r].seg;
      if (i !== undefined && b >= segs[i + 5] && b < segs[i + 5] + segs[i + 6]) {
        const off = blks[b * BLK] - segs[i] + blks[b * BLK + 1] / 2;
        return { x: this.xOf(off), y: TOP + GAP + r * (ROW + GAP) + ROW / 2 };
      }
    }
    return null;
  }

  /** The block under a point: {index, addr, size, requested, state, seq, stack}. */
  hit(x, y) {
    const d = this.data;
    if (!d || x < LABEL) return null;
    const r = Math.floor((y - TOP - GAP / 2) / (ROW + GAP));
    const segs = d.segments, blks = d.blocks;
    if (r < 0 || r >= this.rows.length || this.rows[r].seg === undefined) return null;
    const i = this.rows[r].seg;
    const addr = segs[i], first = segs[i + 5], count = segs[i + 6];
    const off = this.offOf(x);
    const slack = (this.offOf(x + 1) - off) / 2; // half a pixel: thin blocks stay hoverable
    let lo = first, hi = first + count - 1;
    while (lo < hi) { // last block starting at or before off
      const mid = (lo + hi + 1) >> 1;
      if (blks[mid * BLK] - addr <= off + slack) lo = mid; else hi = mid - 1;
    }
    const k = lo * BLK;
    if (off < blks[k] - addr - slack || off > blks[k] - addr + blks[k + 1] + slack) return null;
    return { index: lo, addr: blks[k], size: blks[k + 1], requested: blks[k + 2], state: blks[k + 3], seq: blks[k + 4], stack: blks[k + 5], segment: addr };
  }

  listen() {
    const cv = this.canvas;
    const v = this.view;
    let drag = null;
    const pos = (e) => { const r = cv.getBoundingClientRect(); return [e.clientX - r.left, e.clientY - r.top]; };
    cv.addEventListener("wheel", (e) => {
      if (!this.data) return;
      e.preventDefault();
      const [x] = pos(e);
      const f = Math.exp(Math.max(-1, Math.min(1, e.deltaY * 0.002)));
      const [m0, m1] = this.range();
      const at = this.offOf(x);
      const span = Math.max(512, (m1 - m0) * f);
      const n0 = Math.max(0, at - ((at - m0) / (m1 - m0)) * span);
      v.setOffsets(n0, Math.min(this.maxSize(), n0 + span));
    }, { passive: false });
    cv.addEventListener("pointerdown", (e) => {
      const [x, y] = pos(e);
      cv.setPointerCapture(e.pointerId);
      const [m0, m1] = this.range();
      drag = { x0: x, y0: y, m0, m1, moved: false };
    });
    cv.addEventListener("pointermove", (e) => {
      const [x, y] = pos(e);
      if (drag) {
        if (Math.abs(x - drag.x0) > 3) drag.moved = true;
        if (drag.moved) {
          const d = ((x - drag.x0) / this.plotW) * (drag.m1 - drag.m0);
          const span = drag.m1 - drag.m0;
          const n0 = Math.max(0, Math.min(this.maxSize() - span, drag.m0 - d));
          v.setOffsets(n0, n0 + span);
        }
        return;
      }
      this.hover = this.hit(x, y);
      v.showTip(this.tip, this.hover ? { block: this.hover } : null, x, y, "segmap");
      v.redraw();
    });
    cv.addEventListener("pointerup", (e) => {
      if (drag && !drag.moved) {
        const [x, y] = pos(e);
        const h = this.hit(x, y);
        if (h && h.state !== 0 && h.seq >= 0) v.select(h.seq);
        else if (h && h.state !== 0) v.selectBlock(h);
      }
      drag = null;
    });
    cv.addEventListener("pointercancel", () => { drag = null; });
    cv.addEventListener("pointerleave", () => { this.hover = null; v.showTip(this.tip, null); v.redraw(); });
    cv.addEventListener("keydown", (e) => {
      const [m0, m1] = this.range();
      const span = m1 - m0, full = this.maxSize();
      switch (e.key) {
        case "ArrowLeft": { const n0 = Math.max(0, m0 - span * 0.1); v.setOffsets(n0, n0 + span); break; }
        case "ArrowRight": { const n0 = Math.min(full - span, m0 + span * 0.1); v.setOffsets(n0, n0 + span); break; }
        case "+": case "=": v.setOffsets(m0 + span * 0.1, m1 - span * 0.1); break;
        case "-": v.setOffsets(Math.max(0, m0 - span * 0.125), Math.min(full, m1 + span * 0.125)); break;
        case "0": v.setOffsets(null, null); break;
        default: return;
      }
      e.preventDefault();
    });
  }
}

