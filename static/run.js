// The run page: every rank's memory over time as a heatmap (a row per
// rank and device, a column per time bucket, colour = the bucket's
// greatest allocated or reserved bytes), each row's peak outlined, OOMs
// flagged, and the ranks sorted by peak. A click on a cell opens that
// rank's trace at that time (at the peak event itself on the peak cell);
// a drag zooms into a time range. The series and the window are in the
// URL; the frame scheduler draws once per frame whatever asked.
import { api, el, fmtBytes, fmtTime, fmtTimes, fillTextWithin, initTheme, fitCanvas, niceTicks, queryNum, palette, apiDelete } from "./common.js";
import { FrameScheduler } from "./frames.js";

const root = document.getElementById("run");
const id = root.dataset.id;
let FULL = [Number(root.dataset.t0), Number(root.dataset.t1)]; // grows while a rank streams
const canvas = document.getElementById("heatmap");
const wrap = document.getElementById("heatmap-wrap");
const tip = document.getElementById("heatmap-tip");
const status = document.getElementById("status");
const LABEL_W = 150, AXIS_H = 22, MIN_ROW = 3, MAX_ROW = 26;

const q = new URLSearchParams(location.search);
const page = {
  series: q.get("series") === "reserved" ? "reserved" : "allocated",
  t0: queryNum(q, "t0") ?? FULL[0],
  t1: queryNum(q, "t1") ?? FULL[1],
  data: null, // the heatmap answer
  hover: null, // {row, col}
  drag: null, // {x0, x1} in canvas pixels
  rowH: MAX_ROW,
  colours: null,
};
if (!(page.t1 > page.t0)) [page.t0, page.t1] = FULL;

const frames = new FrameScheduler((f) => {
  if (f.take("draw")) draw();
});

// ---- the URL -------------------------------------------------------------

function saveURL() {
  const p = new URLSearchParams();
  if (page.series !== "allocated") p.set("series", page.series);
  if (page.t0 !== FULL[0] || page.t1 !== FULL[1]) { p.set("t0", Math.round(page.t0)); p.set("t1", Math.round(page.t1)); }
  const s = p.toString();
  history.replaceState(null, "", s ? "?" + s : location.pathname);
}

// ---- data ----------------------------------------------------------------

let loading = null;
async function load() {
  loading?.abort();
  const ac = new AbortController();
  loading = ac;
  const n = Math.max(16, Math.min(4000, Math.floor(plotWidth())));
  const started = performance.now();
  try {
    const h = await api(`/api/runs/${id}/heatmap?series=${page.series}&n=${n}&t0=${Math.floor(page.t0)}&t1=${Math.ceil(page.t1)}`, { signal: ac.signal });
    if (ac.signal.aborted) return;
    page.data = h;
    page.fetchMs = performance.now() - started;
    status.textContent = "";
    showPeaks();
    layout();
    frames.request("draw");
    followLive();
  } catch (e) {
    if (e.name !== "AbortError") status.textContent = "Heatmap: " + e.message;
  }
}

// While a rank still streams, the run grows: the page reads it again every
// few seconds, and a page showing the whole run follows its end.
const FOLLOW_MS = 3000;
let followTimer = 0;
function followLive() {
  clearTimeout(followTimer);
  if (!page.data.rows.some((r) => r.status === "live")) return;
  followTimer = setTimeout(async () => {
    try {
      const run = await api(`/api/runs/${id}`);
      let t0 = Infinity, t1 = -Infinity;
      for (const rk of run.ranks) {
        for (const t of rk.traces) {
          if (t.events > 0) { t0 = Math.min(t0, t.first_us); t1 = Math.max(t1, t.last_us); }
        }
      }
      const whole = page.t0 === FULL[0] && page.t1 === FULL[1];
      if (t1 >= t0) FULL = [t0, t1];
      if (whole) [page.t0, page.t1] = FULL;
    } catch {
      // the heatmap's own request says what is wrong
    }
    load();
  }, FOLLOW_MS);
}

function plotWidth() { return Math.max(100, wrap.clientWidth - LABEL_W - 8); }

// ---- geometry --------------------------------------------------------------

function layout() {
  const rows = page.data ? page.data.rows.length : 1;
  page.rowH = Math.max(MIN_ROW, Math.min(MAX_ROW, Math.floor(Math.min(640, window.innerHeight * 0.6) / rows)));
  fitCanvas(canvas, wrap.clientWidth, AXIS_H + rows * page.rowH + 6);
}

function xOf(t) { return LABEL_W + ((t - page.t0) / (page.t1 - page.t0)) * plotWidth(); }
function tOf(x) { return page.t0 + ((x - LABEL_W) / plotWidth()) * (page.t1 - page.t0); }

/** The row and column under canvas point (x, y), or null. */
function cellAt(x, y) {
  const h = page.data;
  if (!h || x < LABEL_W || y < AXIS_H) return null;
  const row = Math.floor((y - AXIS_H) / page.rowH);
  if (row >= h.rows.length) return null;
  const col = Math.floor((tOf(x) - h.start_us) / h.bucket_us);
  if (col < 0 || col >= h.rows[row].max.length) return null;
  return { row, col };
}

/** The middle of a row's peak cell, in canvas coordinates (the browser test clicks it). */
function peakPoint(row) {
  const h = page.data, r = h.rows[row];
  if (r.peak_us < 0) return null;
  const col = Math.floor((r.peak_us - h.start_us) / h.bucket_us);
  const t = h.start_us + (col + 0.5) * h.bucket_us;
  return { x: Math.min(Math.max(xOf(t), LABEL_W + 1), LABEL_W + plotWidth() - 1), y: AXIS_H + (row + 0.5) * page.rowH };
}

// ---- colours -------------------------------------------------------------

// viridis, by its published stops: perceptually even and readable in grey
const STOPS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
function colourMap() {
  const out = new Uint8ClampedArray(256 * 3);
  for (let i = 0; i < 256; i++) {
    const f = (i / 255) * (STOPS.length - 1), k = Math.min(STOPS.length - 2, Math.floor(f)), u = f - k;
    for (let c = 0; c < 3; c++) out[i * 3 + c] = STOPS[k][c] * (1 - u) + STOPS[k + 1][c] * u;
  }
  return out;
}
const CMAP = colourMap();

function scaleMax() {
  let m = 0;
  for (const r of page.data.rows) for (const v of r.max) if (v > m) m = v;
  return m || 1;
}

function showScale(max) {
  const box = document.getElementById("scale");
  const bar = el("span", { class: "scale-bar", style: null });
  bar.style.background = `linear-gradient(to right, ${STOPS.map((c) => `rgb(${c.join(",")})`).join(", ")})`;
  box.replaceChildren(el("span", { class: "dim" }, "0"), bar, el("span", { class: "dim" }, fmtBytes(max) + " " + page.series));
}

// ---- drawing ---------------------------------------------------------------

function draw() {
  const h = page.data;
  if (!h) return;
  const started = performance.now();
  const pal = palette();
  const rows = h.rows.length, rowH = page.rowH, W = wrap.clientWidth;
  const ctx = fitCanvas(canvas, W, AXIS_H + rows * rowH + 6);
  ctx.clearRect(0, 0, W, canvas.height);
  const max = scaleMax();
  showScale(max);

  // The cells: one pixel per bucket in an offscreen image, stretched.
  const cols = Math.max(...h.rows.map((r) => r.max.length), 1);
  const img = new ImageData(cols, rows);
  const px = img.data;
  for (let r = 0; r < rows; r++) {
    const m = h.rows[r].max;
    for (let c = 0; c < m.length; c++) {
      const k = Math.round((m[c] / max) * 255) * 3, o = (r * cols + c) * 4;
      px[o] = CMAP[k]; px[o + 1] = CMAP[k + 1]; px[o + 2] = CMAP[k + 2]; px[o + 3] = m[c] > 0 ? 255 : 40;
    }
  }
  const off = new OffscreenCanvas(cols, rows);
  off.getContext("2d").putImageData(img, 0, 0);
  ctx.imageSmoothingEnabled = false;
  const x0 = xOf(h.start_us), x1 = xOf(h.start_us + cols * h.bucket_us);
  ctx.save();
  ctx.beginPath();
  ctx.rect(LABEL_W, AXIS_H, plotWidth(), rows * rowH);
  ctx.clip();
  ctx.drawImage(off, x0, AXIS_H, x1 - x0, rows * rowH);

  // OOMs: a red line at the first one; peaks: the peak cell outlined.
  const colW = (x1 - x0) / cols;
  for (let r = 0; r < rows; r++) {
    const row = h.rows[r], y = AXIS_H + r * rowH;
    if (row.oom_seq >= 0) {
      ctx.fillStyle = pal.oom;
      ctx.fillRect(xOf(row.oom_us) - 1, y, 2, rowH);
    }
    if (row.peak_us >= 0) {
      const col = Math.floor((row.peak_us - h.start_us) / h.bucket_us);
      const px0 = x0 + col * colW;
      ctx.lineWidth = 2;
      ctx.strokeStyle = pal.select;
      ctx.strokeRect(px0 - 1, y + 1, Math.max(colW, 3) + 2, Math.max(rowH - 2, 1));
    }
  }
  if (page.hover) {
    const { row, col } = page.hover;
    ctx.lineWidth = 1;
    ctx.strokeStyle = pal.cursor;
    ctx.strokeRect(x0 + col * colW - 0.5, AXIS_H + row * rowH + 0.5, Math.max(colW, 2) + 1, rowH - 1);
  }
  if (page.drag) {
    ctx.fillStyle = pal.brush;
    const a = Math.min(page.drag.x0, page.drag.x1), b = Math.max(page.drag.x0, page.drag.x1);
    ctx.fillRect(a, AXIS_H, b - a, rows * rowH);
  }
  ctx.restore();

  // Row labels: rank and device; the highest peak and OOMs stand out.
  const top = topRow();
  ctx.font = `${Math.min(12, Math.max(9, rowH - 2))}px system-ui, sans-serif`;
  ctx.textBaseline = "middle";
  const every = Math.ceil(11 / rowH); // label every row only when they fit
  for (let r = 0; r < rows; r++) {
    const row = h.rows[r];
    if (r % every && r !== top && row.oom_seq < 0) continue;
    ctx.fillStyle = row.oom_seq >= 0 ? pal.oom : r === top ? pal.fg : pal.dim;
    const label = `rank ${row.rank} · cuda:${row.device}` + (row.oom_seq >= 0 ? " OOM" : "") + (r === top ? " ▲" : "");
    ctx.fillText(label, 4, AXIS_H + (r + 0.5) * rowH);
  }

  // Time axis.
  ctx.fillStyle = pal.dim;
  ctx.strokeStyle = pal.grid;
  ctx.textBaseline = "alphabetic";
  ctx.font = "11px system-ui, sans-serif";
  // Round numbers of the time since the run began, the labels' origin.
  page.ticks = niceTicks(page.t0 - FULL[0], page.t1 - FULL[0], Math.max(2, Math.floor(plotWidth() / 110)), false, true);
  const labels = fmtTimes(page.ticks, page.ticks.length > 1 ? page.ticks[1] - page.ticks[0] : page.t1 - page.t0);
  page.ticks.forEach((t, i) => {
    const x = xOf(t + FULL[0]);
    ctx.fillRect(x, AXIS_H - 5, 1, 5);
    fillTextWithin(ctx, labels[i], x + 2 + ctx.measureText(labels[i]).width / 2, AXIS_H - 8, 0, LABEL_W + plotWidth() + 6);
  });
  const ends = fmtTimes([page.t0 - FULL[0], page.t1 - FULL[0]], (page.t1 - page.t0) / 100);
  document.getElementById("window-label").textContent = `${ends[0]} – ${ends[1]} of the run · ${fmtTime(h.bucket_us)} per column`;
  page.drawMs = performance.now() - started;
}

/** The row that peaked highest. */
function topRow() {
  let best = -1;
  page.data.rows.forEach((r, i) => { if (best < 0 || r.peak_bytes > page.data.rows[best].peak_bytes) best = i; });
  return best;
}

// ---- the peaks list ----------------------------------------------------------

/** Where a row's trace opens: at its peak event, or at time t. */
function traceURL(row, t) {
  const h = page.data, span = Math.max(16 * h.bucket_us, 1000);
  const c = t ?? row.peak_us;
  const p = new URLSearchParams({ t0: Math.floor(c - span / 2), t1: Math.ceil(c + span / 2) });
  if (t === undefined && row.peak_seq >= 0) p.set("e", row.peak_seq);
  else p.set("c", Math.round(c));
  return `/traces/${row.trace}?${p}`;
}

const STATUS_TIPS = {
  live: "still streaming: its figures grow, and the page follows them",
  incomplete: "its stream ended before the job said it was done: the trace stops there",
  failed: "the job failed while it was recorded",
};

function showPeaks() {
  const list = document.getElementById("peaks");
  const rows = page.data.rows.map((r, i) => ({ r, i })).sort((a, b) => b.r.peak_bytes - a.r.peak_bytes);
  const top = rows.length ? rows[0].r.peak_bytes || 1 : 1;
  list.replaceChildren(...rows.map(({ r }, k) => {
    const bar = el("span", { class: "peak-bar" });
    bar.style.width = (100 * r.peak_bytes / top).toFixed(1) + "%";
    const name = `rank ${r.rank} · cuda:${r.device}`;
    const link = r.peak_us >= 0 ? el("a", { href: traceURL(r), title: "open this rank at its peak" }, name) : el("span", {}, name);
    return el("li", { class: k === 0 ? "highest" : null, "data-trace": r.trace },
      link, " ", el("span", { class: "num" }, fmtBytes(r.peak_bytes)),
      k === 0 ? el("span", { class: "badge" }, "highest") : null,
      // A rank still streaming, or one whose stream ended early, is not a
      // whole trace: say so beside its peak.
      r.status !== "complete" ? el("span", { class: "badge status " + r.status, title: STATUS_TIPS[r.status] ?? "" }, r.status) : null,
      r.oom_seq >= 0 ? el("a", { class: "badge oom", href: `/traces/${r.trace}/incidents/1`, title: "why it ran out of memory" }, `OOM ×${r.oom_count}`) : null,
      el("span", { class: "peak-track" }, bar));
  }));
}

// ---- input -------------------------------------------------------------------

function pointer(e) {
  const b = canvas.getBoundingClientRect();
  return { x: e.clientX - b.left, y: e.clientY - b.top };
}

canvas.addEventListener("pointermove", (e) => {
  const p = pointer(e);
  if (page.drag) {
    page.drag.x1 = Math.max(LABEL_W, Math.min(p.x, LABEL_W + plotWidth()));
    frames.request("draw");
    return;
  }
  const cell = cellAt(p.x, p.y);
  page.hover = cell;
  canvas.style.cursor = cell ? "pointer" : "default";
  if (!cell) { tip.hidden = true; frames.request("draw"); return; }
  const h = page.data, row = h.rows[cell.row], t = h.start_us + cell.col * h.bucket_us;
  tip.replaceChildren(el("strong", {}, `rank ${row.rank} · cuda:${row.device}`), el("br"),
    `${fmtTime(t - FULL[0])} – ${fmtTime(t + h.bucket_us - FULL[0])}: up to ${fmtBytes(row.max[cell.col])} ${page.series}`,
    el("br"), el("span", { class: "dim" }, "peak " + fmtBytes(row.peak_bytes) + (row.oom_seq >= 0 ? " · ran out of memory" : "")));
  tip.hidden = false;
  tip.style.left = Math.min(p.x + 14, wrap.clientWidth - 260) + "px";
  tip.style.top = p.y + 14 + "px";
  frames.request("draw");
});
canvas.addEventListener("pointerleave", () => { page.hover = null; tip.hidden = true; frames.request("draw"); });
canvas.addEventListener("pointerdown", (e) => {
  const p = pointer(e);
  if (p.x < LABEL_W) return;
  page.drag = { x0: p.x, x1: p.x };
  canvas.setPointerCapture(e.pointerId);
});
canvas.addEventListener("pointerup", (e) => {
  const p = pointer(e), d = page.drag;
  page.drag = null;
  if (d && Math.abs(d.x1 - d.x0) > 4) { // a drag: zoom to it
    const a = tOf(Math.min(d.x0, d.x1)), b = tOf(Math.max(d.x0, d.x1));
    setWindow(a, b);
    return;
  }
  const cell = cellAt(p.x, p.y);
  if (!cell) return;
  const h = page.data, row = h.rows[cell.row], t = h.start_us + (cell.col + 0.5) * h.bucket_us;
  const onPeak = row.peak_us >= h.start_us + cell.col * h.bucket_us && row.peak_us < h.start_us + (cell.col + 1) * h.bucket_us;
  location.assign(onPeak ? traceURL(row) : traceURL(row, t));
});
canvas.addEventListener("keydown", (e) => { if (e.key === "0") setWindow(...FULL); });
document.getElementById("reset").addEventListener("click", () => setWindow(...FULL));

function setWindow(a, b) {
  page.t0 = Math.max(FULL[0], a);
  page.t1 = Math.min(FULL[1], Math.max(b, page.t0 + 1));
  saveURL();
  load();
}

for (const btn of document.querySelectorAll("[data-series]")) {
  btn.addEventListener("click", () => {
    page.series = btn.dataset.series;
    for (const b of document.querySelectorAll("[data-series]")) b.setAttribute("aria-pressed", String(b === btn));
    saveURL();
    load();
  });
  btn.setAttribute("aria-pressed", String(btn.dataset.series === page.series));
}

document.getElementById("compare-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const a = document.getElementById("compare-a").value, b = document.getElementById("compare-b").value;
  location.assign(`/compare/${a}/${b}`);
});

// Delete asks twice, and for the token when the server wants one.
const del = document.getElementById("delete-run");
del.addEventListener("click", async () => {
  if (del.dataset.armed !== "1") {
    del.dataset.armed = "1";
    del.textContent = "Really delete the run?";
    setTimeout(() => { del.dataset.armed = ""; del.textContent = "Delete run"; }, 4000);
    return;
  }
  try {
    await apiDelete(`/api/runs/${id}`);
    location.assign("/");
  } catch (e) {
    status.textContent = "Could not delete the run: " + e.message;
  }
});

let resizeTimer = 0;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(load, 150);
});
initTheme(() => frames.request("draw"));

// For tests and the console: the answer, figures and where peaks are.
window.runPage = { page, peakPoint, topRow: () => topRow() };
load();
