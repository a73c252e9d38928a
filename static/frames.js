// The frame scheduler: whatever asks for work during a frame, the page
// draws once, on the next animation frame. Work is named ("timeline",
// "map", "details", ...); a request adds its names to the pending set and
// the frame takes the ones it can do, so a name it cannot serve yet stays
// pending for a later frame.

export class FrameScheduler {
  /** @param {(s: FrameScheduler) => (void|Promise<void>)} run  one frame's work */
  constructor(run) {
    this.run = run;
    this.pending = new Set();
    this.frame = 0;
  }

  /** Ask for a frame that also does the named work. */
  request(...work) {
    for (const w of work) this.pending.add(w);
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.run(this);
    });
  }

  /** Whether name was pending; it no longer is. */
  take(name) {
    return this.pending.delete(name);
  }
}

/**
 * Samples keeps the last cap measurements (milliseconds) of a figure, so a
 * page left open for hours holds a bounded amount of them.
 */
export class Samples {
  constructor(cap = 1024) {
    this.cap = cap;
    this.buf = [];
    this.next = 0; // where the next sample goes once buf is full
  }

  push(v) {
    if (this.buf.length < this.cap) this.buf.push(v);
    else { this.buf[this.next] = v; this.next = (this.next + 1) % this.cap; }
  }

  get length() { return this.buf.length; }

  /** The samples, oldest first. */
  values() { return this.buf.slice(this.next).concat(this.buf.slice(0, this.next)); }

  clear() { this.buf = []; this.next = 0; }
}
