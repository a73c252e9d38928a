// The flame graph of the live memory at the cursor: an icicle, root at the
// top, each node as wide as the bytes under it (GET /api/traces/{id}/live
// gives the tree). Click a node to zoom to it and highlight its
// allocations on the timeline and the segment map; click the root to zoom
// out and clear; the wheel zooms around the pointer. Hover shows bytes,
// count and share.
import { el, fitCanvas, fmtBytes } from "./common.js";

const ROW = 18;

export class Flame {
  /**
   * @param {HTMLCanvasElement} canvas
   * @param {HTMLElement} tip
   * @param {object} view  the page state
   * @param {(node: object|null) => void} pick  called with the node clicked (null: the root)
   */
  constructor(canvas, tip, view, pick) {
    this.canvas = canvas;
    this.tip = tip;
    this.view = view;
    this.pick = pick;
    this.data = null;
    this.nodes = []; // every node drawn: {node, depth, off, parent}
    this.zoom = null; // {off, bytes, depth} of the node zoomed to
    this.selected = null; // the key path of the node picked
    this.hover = null;
    this.listen();
  }

  /** Shows a new answer; keeps the zoom and the pick where the same node is there. */
  set(data) {
    this.data = data;
    this.nodes = [];
    const visit = (node, depth, off, parent, path) => {
      const e = { node, depth, off, parent, path };
      this.nodes.push(e);
      let at = off;
      for (const c of node.children || []) {
        visit(c, depth + 1, at, e, path + "\u001f" + c.name + "\u001f" + c.kind);
        at += c.bytes;
      }
    };
    visit(data.tree, 0, 0, null, "");
    this.depth = this.nodes.reduce((m, e) => Math.max(m, e.depth), 0) + 1;
    const again = (path) => this.nodes.find((e) => e.path === path) || null;
    const z = this.zoom && again(this.zoom.path);
    this.zoom = z ? { path: z.path, off: z.off, bytes: z.node.bytes, depth: z.depth } : null;
    if (this.selected && !again(this.selected)) this.selected = null;
    this.draw();
  }

  /** The entry of the picked node, if it is in the answer. */
  selectedEntry() { return this.selected === null ? null : this.nodes.find((e) => e.path === this.selected) || null; }

  range() {
    const total = this.data?.tree.bytes || 1;
    return this.zoom ? [this.zoom.off, Math.max(1, this.zoom.bytes)] : [0, total];
  }

  xOf(off) { const [z0, zb] = this.range(); return ((off - z0) / zb) * this.cssW; }

  draw() {
    const wrap = this.canvas.parentElement.getBoundingClientRect();
    this.cssW = Math.max(200, Math.floor(wrap.width));
    const pal = this.view.pal;
    const ctx = fitCanvas(this.canvas, this.cssW, Math.max(ROW * 3, (this.depth || 1) * ROW));
    ctx.fillStyle = pal.panel;
    ctx.fillRect(0, 0, this.cssW, this.canvas.height);
    if (!this.data) return;
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    const zd = this.zoom?.depth ?? 0;
    const sel = this.selectedEntry();
    for (const e of this.nodes) {
      const n = e.node;
      let x0 = this.xOf(e.off), x1 = this.xOf(e.off + n.bytes);
      if (e.depth < zd) { // above the zoomed node: its ancestors, across
        if (!this.isAncestorOfZoom(e)) continue;
        x0 = 0; x1 = this.cssW;
      }
      if (x1 < 0 || x0 > this.cssW || x1 - x0 < 0.5) continue;
      x0 = Math.max(0, x0); x1 = Math.min(this.cssW, x1);
      const y = e.depth * ROW;
      ctx.fillStyle = this.color(n, pal);
      ctx.fillRect(x0, y, Math.max(0.5, x1 - x0 - 1), ROW - 1);
      if (x1 - x0 > 40) {
        ctx.fillStyle = "#1b1b1b";
        const text = n.name + " " + fmtBytes(n.bytes);
        ctx.save();
        ctx.beginPath(); ctx.rect(x0, y, x1 - x0 - 2, ROW); ctx.clip();
        ctx.fillText(text, x0 + 3, y + ROW / 2);
        ctx.restore();
      }
    }
    for (const [e, color, w] of [[this.hover, pal.fg, 1], [sel, pal.hl, 2]]) {
      if (!e) continue;
      const x0 = Math.max(0, this.xOf(e.off)), x1 = Math.min(this.cssW, this.xOf(e.off + e.node.bytes));
      ctx.strokeStyle = color;
      ctx.lineWidth = w;
      ctx.strokeRect(x0 + w / 2, e.depth * ROW + w / 2, Math.max(1, x1 - x0 - w), ROW - w);
    }
  }

  isAncestorOfZoom(e) { return !!this.zoom && (this.zoom.path === e.path || this.zoom.path.startsWith(e.path + "\u001f")); }

  /** A node's colour: its category's, or by kind of frame, shaded by its name so neighbours differ. */
  color(n, pal) {
    if (n.kind === "category") {
      const i = (this.data.categories || []).findIndex((c) => c.name === n.name);
      return pal.cats[i >= 0 ? i : pal.cats.length - 1];
    }
    let h = 0;
    for (let i = 0; i < n.name.length; i++) h = (h * 31 + n.name.charCodeAt(i)) | 0;
    const j = Math.abs(h) % 12;
    switch (n.kind) {
      case "user": return `hsl(${22 + j * 2.5}, 85%, ${62 + (j % 4) * 4}%)`;
      case "library": return `hsl(${198 + j * 2}, 60%, ${68 + (j % 4) * 4}%)`;
      case "native": case "recorder": return `hsl(0, 0%, ${66 + (j % 4) * 5}%)`;
      case "root": return `hsl(45, 20%, 78%)`;
    }
    return `hsl(0, 0%, 82%)`; // (no stack), (smaller)
  }

  hit(x, y) {
    const depth = Math.floor(y / ROW), zd = this.zoom?.depth ?? 0;
    for (const e of this.nodes) {
      if (e.depth !== depth) continue;
      if (depth < zd) { if (this.isAncestorOfZoom(e)) return e; continue; }
      if (x >= this.xOf(e.off) && x < this.xOf(e.off + e.node.bytes)) return e;
    }
    return null;
  }

  /** Picks a node: zooms to it (the root: zooms out) and highlights its allocations. */
  choose(e) {
    if (!e || e.depth === 0) {
      this.zoom = null;
      this.selected = null;
      this.pick(null);
    } else {
      this.zoom = { path: e.path, off: e.off, bytes: e.node.bytes, depth: e.depth };
      this.selected = e.path;
      this.pick(e.node);
    }
    this.draw();
  }

  /**
   * Picks a row of the table: the node holding exactly its blocks, or (a
   * stack that others extend) its blocks alone.
   */
  chooseRow(row) {
    const e = this.nodes.find((x) => x.depth > 0 && x.node.b0 === row.b0 && x.node.b1 === row.b1);
    if (e) { this.choose(e); return; }
    this.selected = null;
    this.pick(row);
    this.draw();
  }

  listen() {
    const cv = this.canvas;
    const pos = (ev) => { const r = cv.getBoundingClientRect(); return [ev.clientX - r.left, ev.clientY - r.top]; };
    cv.addEventListener("pointermove", (ev) => {
      const [x, y] = pos(ev);
      const e = this.hit(x, y);
      if (e !== this.hover) { this.hover = e; this.draw(); }
      this.showTip(e, x, y);
    });
    cv.addEventListener("pointerleave", () => { this.hover = null; this.tip.hidden = true; this.draw(); });
    cv.addEventListener("click", (ev) => { const [x, y] = pos(ev); this.choose(this.hit(x, y)); });
    cv.addEventListener("wheel", (ev) => {
      if (!this.data) return;
      ev.preventDefault();
      const [x] = pos(ev);
      const [z0, zb] = this.range();
      const total = this.data.tree.bytes || 1;
      const at = z0 + (x / this.cssW) * zb;
      const nb = Math.min(total, Math.max(total / 1e6, zb * Math.exp(Math.max(-1, Math.min(1, ev.deltaY * 0.002)))));
      const off = Math.max(0, Math.min(total - nb, at - (x / this.cssW) * nb));
      this.zoom = nb >= total ? null : { path: this.zoom?.path ?? "", off, bytes: nb, depth: this.zoom?.depth ?? 0 };
      this.draw();
    }, { passive: false });
  }

  showTip(e, x, y) {
    if (!e) { this.tip.hidden = true; return; }
    const n = e.node, total = this.data.tree.bytes || 1;
    const parent = e.parent?.node;
    const rows = [el("strong", {}, n.name), el("br"), fmtBytes(n.bytes) + " in " + n.count + " allocation" + (n.count === 1 ? "" : "s"), el("br"),
      (100 * n.bytes / total).toFixed(1) + " % of the live bytes" + (parent && parent !== this.data.tree ? ", " + (100 * n.bytes / Math.max(1, parent.bytes)).toFixed(1) + " % of its caller's" : "")];
    if (n.file) rows.push(el("br"), el("span", { class: "dim" }, n.file));
    this.tip.replaceChildren(...rows);
    const wrap = this.tip.parentElement.getBoundingClientRect();
    this.tip.style.left = Math.max(0, Math.min(x + 14, wrap.width - 300)) + "px";
    this.tip.style.top = y + 14 + "px";
    this.tip.hidden = false;
  }
}
