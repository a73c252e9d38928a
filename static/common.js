// Shared helpers: units, theme, DOM building (text only, never HTML from
// data), and a JSON fetch that surfaces the server's {"error"} text.

const UNITS = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

/**
 * Bytes in binary units: 512 B, 1.50 KiB, 80.00 GiB, rounded half up as
 * the server's gpu.FormatBytes rounds (a browser test holds them equal).
 */
export function fmtBytes(n) {
  if (n === undefined || n === null || !isFinite(n)) return "–";
  const neg = n < 0;
  n = Math.abs(n);
  if (n < 1024) return (neg ? "-" : "") + Math.round(n) + " B";
  let i = -1;
  while (n >= 1024 && i < UNITS.length - 1) { n /= 1024; i++; }
  return (neg ? "-" : "") + n.toFixed(2) + " " + UNITS[i];
}

/** Short byte labels for axes: 1.5 GiB. */
export function fmtBytesShort(n) {
  if (n < 1024) return Math.round(n) + " B";
  let i = -1;
  while (n >= 1024 && i < UNITS.length - 1) { n /= 1024; i++; }
  return (n >= 100 ? n.toFixed(0) : n >= 10 ? n.toFixed(1) : n.toFixed(2).replace(/\.?0+$/, "")) + " " + UNITS[i];
}

/** Microseconds as a readable time. */
export function fmtTime(us) {
  if (us === undefined || us === null || !isFinite(us)) return "–";
  const a = Math.abs(us);
  if (a < 1000) return us.toFixed(0) + " µs";
  if (a < 1e6) return (us / 1e3).toFixed(a < 1e4 ? 2 : 1) + " ms";
  if (a < 6e8) return (us / 1e6).toFixed(a < 1e7 ? 3 : 2) + " s";
  return (us / 6e7).toFixed(2) + " min";
}

/**
 * Times in one unit, the unit fmtTime gives the largest of them (minutes
 * give way to seconds when step is under a hundredth of a minute), with
 * the decimals that step, the least difference to show, needs: an axis's
 * ticks, a window's two ends ("8.45 min – 15.99 min", never "507.09 s –
 * 15.99 min").
 */
export function fmtTimes(list, step) {
  const a = Math.max(...list.map((t) => Math.abs(t)));
  let [div, unit] = a < 1000 ? [1, "µs"] : a < 1e6 ? [1e3, "ms"] : a < 6e8 ? [1e6, "s"] : [6e7, "min"];
  if (unit === "min" && step < 6e5) [div, unit] = [1e6, "s"];
  const d = step > 0 ? Math.max(0, Math.min(6, Math.ceil(-Math.log10(step / div) - 1e-9))) : 0;
  return list.map((t) => (t / div).toFixed(unit === "µs" ? 0 : d) + " " + unit);
}

/**
 * Draws text centred on x, moved in as far as it must to stay within
 * [lo, hi]: the labels at an axis's ends are never cut by the canvas.
 */
export function fillTextWithin(ctx, text, x, y, lo, hi) {
  const w = ctx.measureText(text).width;
  const align = ctx.textAlign;
  ctx.textAlign = "left";
  ctx.fillText(text, Math.max(lo, Math.min(hi - w, x - w / 2)), y);
  ctx.textAlign = align;
}

/**
 * Where the state right after event seq stands: seq -1 is before the
 * first event, or, in a snapshot of no events, its one state.
 */
export function afterEvent(seq, noEvents) {
  if (seq >= 0) return "right after event " + seq;
  return noEvents ? "the snapshot's state (no events recorded)" : "before the first event";
}

export function fmtAddr(a) { return "0x" + Math.round(a).toString(16); }

/** el("td", {class: "x"}, "text", child) builds an element; strings become text nodes. */
export function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

/** A definition list of [term, value] pairs. */
export function dl(pairs) {
  const d = el("dl", { class: "facts" });
  for (const [k, v] of pairs) d.append(el("dt", {}, k), el("dd", {}, v));
  return d;
}

/** An error from the API, carrying the HTTP status. */
export class APIError extends Error {
  constructor(status, msg) { super(msg); this.status = status; }
}

/** fetch, rejecting a failed answer with the server's error text. */
async function fetchOK(url, init) {
  const res = await fetch(url, init);
  if (!res.ok) {
    let msg = res.status + " " + res.statusText;
    try { const j = await res.json(); if (j && j.error) msg = j.error; } catch { /* not JSON */ }
    throw new APIError(res.status, msg);
  }
  return res;
}

/** fetch JSON (or text with {text: true}); rejects with the server's error text. */
export async function api(url, opts = {}) {
  const res = await fetchOK(url, { signal: opts.signal, method: opts.method || "GET", headers: { Accept: "application/json" } });
  if (res.status === 204) return null;
  return opts.text ? res.text() : res.json();
}

/** fetch a binary answer as an ArrayBuffer; rejects as api does. */
export async function apiBinary(url, opts = {}) {
  return (await fetchOK(url, { signal: opts.signal })).arrayBuffer();
}

/**
 * One request at a time for a part of the page: a new run aborts the one
 * before, so a stale answer never lands. run(fetch) gives fetch an abort
 * signal and resolves to its answer, or to null when it was superseded or
 * failed; failures are shown through view.error with the part's label, and
 * the time of each answer goes to view.stats.fetchMs.
 */
export class LatestFetch {
  constructor(view, label) { this.view = view; this.label = label; this.ac = null; this.failed = null; }

  async run(fetch) {
    this.ac?.abort();
    const ac = new AbortController();
    this.ac = ac;
    const started = performance.now();
    try {
      const r = await fetch(ac.signal);
      if (ac.signal.aborted) return null;
      this.view.stats.fetchMs.push(performance.now() - started);
      this.failed = null;
      return r;
    } catch (e) {
      if (e.name !== "AbortError") {
        this.failed = e.message; // the last answer failed: panels say so instead of waiting
        this.view.error(this.label + ": " + e.message);
      }
      return null;
    }
  }
}

// A server that listens beyond loopback needs its token for writes: asked
// for once on a 401, kept for the tab's session.
const TOKEN_KEY = "vramscope-token";

/** The Authorization header of a write, when a token was given. */
export function authHeader() {
  const t = sessionStorage.getItem(TOKEN_KEY);
  return t ? { Authorization: "Bearer " + t } : {};
}

/** Ask for the token; whether one was given. */
export function askToken() {
  const t = prompt("This vramscope server needs its token (printed when it started) for uploads and deletes:");
  if (t) sessionStorage.setItem(TOKEN_KEY, t.trim());
  return !!t;
}

/** DELETE url, asking for the token once on a 401; rejects as api does. */
export async function apiDelete(url) {
  const send = () => fetchOK(url, { method: "DELETE", headers: authHeader() });
  try {
    await send();
  } catch (e) {
    if (e.status !== 401 || !askToken()) throw e;
    await send();
  }
}

/** POST to url, asking for the token once on a 401; the answer's JSON. */
export async function apiPost(url) {
  const send = () => fetchOK(url, { method: "POST", headers: { Accept: "application/json", ...authHeader() } });
  let res;
  try {
    res = await send();
  } catch (e) {
    if (e.status !== 401 || !askToken()) throw e;
    res = await send();
  }
  return res.json();
}

const THEME_KEY = "vramscope-theme";

/** The theme in force: the saved choice, else the system's. */
export function currentTheme() {
  const t = document.documentElement.dataset.theme;
  if (t) return t;
  return matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
}

/** Wire the theme button; onChange runs after every switch. */
export function initTheme(onChange) {
  const saved = localStorage.getItem(THEME_KEY);
  if (saved === "dark" || saved === "light") document.documentElement.dataset.theme = saved;
  const btn = document.getElementById("theme");
  const label = () => { if (btn) btn.textContent = currentTheme() === "dark" ? "Light theme" : "Dark theme"; };
  label();
  btn?.addEventListener("click", () => {
    const next = currentTheme() === "dark" ? "light" : "dark";
    document.documentElement.dataset.theme = next;
    localStorage.setItem(THEME_KEY, next);
    label();
    onChange?.();
  });
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => { label(); onChange?.(); });
}

/** CSS custom properties, read once per theme for the canvases. */
export function palette() {
  const s = getComputedStyle(document.documentElement);
  const v = (n) => s.getPropertyValue(n).trim();
  return {
    bg: v("--bg"), panel: v("--panel"), fg: v("--fg"), dim: v("--dim"), grid: v("--grid"),
    reserved: v("--reserved"), allocated: v("--allocated"), active: v("--active"),
    small: v("--small"), pending: v("--pending"), free: v("--free"), largest: v("--largest"),
    select: v("--select"), cursor: v("--cursor"), brush: v("--brush"),
    pin: v("--pin"), oom: v("--error"), hl: v("--hl"),
    bands: v("--bands").split(",").map((x) => x.trim()),
    cats: Array.from({ length: 9 }, (_, i) => v("--cat-" + i)), // one per category, in the server's order
  };
}

/** A canvas sized to its box at the device pixel ratio; returns its 2D context in CSS pixels. */
export function fitCanvas(canvas, cssW, cssH) {
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(1, Math.round(cssW * dpr)), h = Math.max(1, Math.round(cssH * dpr));
  if (canvas.width !== w || canvas.height !== h) {
    canvas.width = w; canvas.height = h;
    canvas.style.width = cssW + "px"; canvas.style.height = cssH + "px";
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return ctx;
}

/** Round numbers for an axis between lo and hi, about n of them (whole numbers when integer). */
export function niceTicks(lo, hi, n, binary, integer) {
  const span = hi - lo;
  if (!(span > 0)) return [];
  let step;
  if (binary) {
    step = Math.pow(2, Math.ceil(Math.log2(span / n)));
  } else {
    const raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const f = raw / mag;
    step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
  }
  if (integer) step = Math.max(1, Math.round(step));
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) out.push(v);
  return out;
}

/** The number in query parameter k of q, or null when absent or not a number. */
export function queryNum(q, k) {
  const s = q.get(k);
  if (s === null || s === "") return null;
  const v = Number(s);
  return isFinite(v) ? v : null;
}
