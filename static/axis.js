// The event axis: every event the same width, as memory_viz draws a
// trace, so that a step of many events gets the room its events need
// however briefly it ran. Its unit is the event index: event seq spans
// [seq, seq + 1). What has a time (steps, incidents, search matches) is
// placed on it through knots (event index, time of that event): fine ones
// from the usage answer of the window on screen (its columns' first
// events), coarse ones for the whole trace (/seqtimes) elsewhere.
import { api } from "./common.js";

export class EventAxis {
  /** Reads the trace's coarse knots. */
  static async load(id) {
    const pairs = await api(`/api/traces/${id}/seqtimes?n=2000`);
    return new EventAxis(pairs.map(([s]) => s), pairs.map(([, t]) => t));
  }

  constructor(us, ts) {
    this.coarse = { us, ts };
    this.merged = null; // the coarse knots with the window's fine ones
    this.version = 0; // counts the fine knots set: what places a time changed
  }

  /**
   * The knots of the window on screen: column c begins at start + c *
   * width, with an event at time times[c]. They replace the coarse ones
   * over the window, so that the map stays monotone across its ends.
   */
  setFine(start, width, times) {
    const us = Array.from(times, (_, c) => start + c * width), ts = Array.from(times);
    const c = this.coarse, n = us.length;
    const before = c.us.findIndex((u, i) => u >= us[0] || c.ts[i] >= ts[0]);
    const after = c.us.findIndex((u, i) => u > us[n - 1] && c.ts[i] > ts[n - 1]);
    const head = before < 0 ? c.us.length : before, tail = after < 0 ? c.us.length : after;
    this.merged = {
      us: [...c.us.slice(0, head), ...us, ...c.us.slice(tail)],
      ts: [...c.ts.slice(0, head), ...ts, ...c.ts.slice(tail)],
    };
    this.version++;
  }

  /** The event index at which time t falls. */
  uOf(t) { const k = this.merged || this.coarse; return interpolate(k.ts, k.us, t); }

  /** The time of event index u. */
  tOf(u) { const k = this.merged || this.coarse; return interpolate(k.us, k.ts, u); }

  /** The events [e0, e1) of the times [t0, t1], exactly (the server's). */
  static async window(id, t0, t1) {
    const [a, b] = await Promise.all([t0 - 1, t1].map((t) => api(`/api/traces/${id}/seqat?t=${Math.round(t)}`)));
    return [a.seq + 1, b.seq + 1];
  }
}

// interpolate maps x through the knots (xs[i], ys[i]), xs not decreasing:
// linearly between the two around x (the first of equal ones), and past
// the ends at the slope of the whole.
function interpolate(xs, ys, x) {
  const n = xs.length;
  if (n === 0) return x;
  if (n === 1) return ys[0] + (x - xs[0]);
  const slope = (ys[n - 1] - ys[0]) / ((xs[n - 1] - xs[0]) || 1);
  if (x <= xs[0]) return ys[0] + (x - xs[0]) * slope;
  if (x >= xs[n - 1]) return ys[n - 1] + (x - xs[n - 1]) * slope;
  let lo = 0, hi = n - 1; // xs[lo] <= x < xs[hi]
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] <= x) lo = mid; else hi = mid;
  }
  const dx = xs[hi] - xs[lo];
  return dx > 0 ? ys[lo] + ((x - xs[lo]) / dx) * (ys[hi] - ys[lo]) : ys[lo];
}
