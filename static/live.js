// Live following for the trace page. follow(view) opens /ws/traces/{id};
// while the trace is live the timeline window grows with the newest event
// (from where it began: the whole trace, or its steps), the cursor (and so
// the segment map) sits on it, and a badge shows the event rate. Panning,
// zooming or moving the cursor stops following, to look back; the L key
// (or a click on the badge) follows again, sliding a window of the span
// the user chose. Each message is the whole tail state, so one that
// arrives late replaces those before it; the page asks for the next only
// when it has handled this one, so a slow page gets fewer, fresher updates
// instead of a backlog. Every message is also announced to the page as a
// "tail" event of the view (detail: the message), for the parts that grow
// with the trace (the event list, the steps). A stream that reads a sample
// of the job's entries gets a control to read the next N steps whole.

import { apiPost } from "./common.js";

const MIN_GAP_MS = 150; // at most ~6 updates a second, whatever the rate
const PROGRAM = { user: false }; // our moves, which do not stop following

function fmtRate(r) {
  if (r >= 1e6) return (r / 1e6).toFixed(1) + "M";
  if (r >= 1e3) return (r / 1e3).toFixed(1) + "k";
  return Math.round(r).toString();
}

/**
 * Follows the tail of view's trace. view is a PageState (pagestate.js): its
 * "move" events with detail.user stop following; the moves made here pass
 * {user: false}. Returns { stop, state } for tests and the console.
 */
export function follow(view, { badgeParent = document.getElementById("view"), key = "l" } = {}) {
  const badge = document.createElement("button");
  badge.type = "button";
  badge.className = "live-badge";
  badge.setAttribute("aria-live", "polite");
  badgeParent?.prepend(badge);

  // grow: the window keeps its start and grows to the newest event, until
  // the user moves it; after that, following slides the user's span.
  const state = { following: true, grow: true, status: "live", seq: -1, rate: 0, lastUS: null, updates: 0, stopped: false };
  let ws = null, retry = 250;

  const onMove = (e) => { if (e.detail.user) pause(); };
  view.addEventListener("move", onMove);

  function render() {
    badge.dataset.status = state.status;
    badge.dataset.following = state.following ? "1" : "0";
    if (state.status !== "live") badge.textContent = state.status;
    else if (state.following) badge.textContent = "● live · " + fmtRate(state.rate) + " events/s";
    else badge.textContent = "❚❚ paused · press " + key.toUpperCase() + " to follow";
    badge.title = state.following ? "following the newest events; pan or zoom to look back" : "follow the newest events (" + key.toUpperCase() + ")";
  }

  function pause() {
    if (!state.following) return;
    state.following = false;
    state.grow = false;
    render();
  }

  function jump() {
    if (state.lastUS === null) return;
    view.extendTo(state.lastUS);
    if (state.grow) {
      const t0 = Math.max(view.t0, view.fullT0);
      view.setWindow(t0, state.lastUS + Math.max(5, (state.lastUS - t0) * 0.02), PROGRAM);
    } else {
      const span = Math.max(10, view.t1 - view.t0);
      view.setWindow(state.lastUS - span * 0.95, state.lastUS + span * 0.05, PROGRAM);
    }
    view.setCursor(state.lastUS, PROGRAM);
  }

  // The first events of a trace the page opened empty: its time starts
  // at the first of them, not at 0.
  function firstEvents(m) {
    if (m.events <= 0 || view.lastSeq >= 0 || view.fullT0 === m.first_us) return;
    view.firstUS = view.fullT0 = m.first_us;
    view.fullT1 = Math.max(view.fullT1, m.first_us + 1);
    if (view.t0 < view.fullT0) { view.t0 = view.fullT0; view.t1 = Math.max(view.t1, view.fullT0 + 1); }
  }

  function resume() {
    state.following = true;
    render();
    jump();
  }

  function onKey(e) {
    if (e.key.toLowerCase() !== key || e.ctrlKey || e.metaKey || e.altKey) return;
    if (e.target instanceof HTMLInputElement || e.target instanceof HTMLTextAreaElement) return;
    e.preventDefault();
    state.following ? pause() : resume();
  }
  document.addEventListener("keydown", onKey);
  badge.addEventListener("click", () => (state.following ? pause() : resume()));

  // Entries of the job lost since the page was drawn: the page says so at
  // once; where, it says once reloaded (the note the server draws).
  function showLost(m) {
    const page = document.getElementById("view");
    if (!page || page.dataset.id !== view.id) return;
    const drawn = Number(document.getElementById("lost")?.dataset.gaps ?? 0);
    let note = document.getElementById("lost-live");
    if (!m.gaps || m.gaps <= drawn) {
      note?.remove();
      return;
    }
    if (!note) {
      note = document.createElement("p");
      note.id = "lost-live";
      note.className = "dropped";
      page.prepend(note);
    }
    const known = m.lost ? `: ${m.lost.toLocaleString("en-US")} known` : "";
    note.textContent = `Entries of the job were lost in ${m.gaps} ${m.gaps === 1 ? "gap" : "gaps"}${known}. Reload the page to see where.`;
  }

  function connect() {
    if (state.stopped) return;
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    ws = new WebSocket(`${proto}//${location.host}/ws/traces/${encodeURIComponent(view.id)}`);
    let last = 0;
    ws.onmessage = (ev) => {
      const m = JSON.parse(ev.data);
      if (m.type !== "tail") return;
      retry = 250;
      state.updates++;
      state.status = m.status;
      state.seq = m.seq;
      state.rate = m.rate;
      if (m.events > 0) state.lastUS = m.last_us;
      showLost(m);
      whole.show(m);
      firstEvents(m);
      view.extendTo(state.lastUS ?? m.last_us);
      view.dispatchEvent(new CustomEvent("tail", { detail: m }));
      if (state.following && m.events > 0) jump();
      render();
      // Ask for the next once this one is drawn, and not too soon.
      const wait = Math.max(0, MIN_GAP_MS - (performance.now() - last));
      setTimeout(() => requestAnimationFrame(() => {
        last = performance.now();
        if (ws && ws.readyState === WebSocket.OPEN) ws.send('{"type":"more"}');
      }), wait);
    };
    ws.onclose = () => {
      ws = null;
      // A live trace may come back (its job reconnects); a finished one
      // has nothing more to say.
      if (!state.stopped && state.status === "live") {
        setTimeout(connect, retry);
        retry = Math.min(retry * 2, 5000);
      }
    };
  }

  const whole = wholeSteps(view, badge);

  render();
  connect();
  return {
    state,
    resume,
    pause,
    stop() {
      state.stopped = true;
      document.removeEventListener("keydown", onKey);
      view.removeEventListener("move", onMove);
      ws?.close();
      badge.remove();
      whole.box.remove();
    },
  };
}

/**
 * The control that asks the job to read every entry of its next N steps
 * (POST /api/traces/{id}/complete), shown while a stream that reads a
 * sample of them is live; it says when the steps asked for are being
 * read, and how many reads whole the trace has.
 */
function wholeSteps(view, badge) {
  const input = Object.assign(document.createElement("input"), { type: "number", min: 1, max: 10000, value: 10, id: "whole-steps" });
  input.setAttribute("aria-label", "steps to read whole");
  const button = Object.assign(document.createElement("button"), { type: "button", className: "btn", id: "whole-ask", textContent: "Read every entry" });
  const note = Object.assign(document.createElement("span"), { className: "dim", id: "whole-note" });
  const box = document.createElement("span");
  box.className = "whole-steps";
  box.hidden = true;
  box.append(button, " of the next ", input, " steps ", note);
  badge.after(box);
  let asked = 0, whole = 0, failed = "";
  const say = () => {
    note.textContent = failed || (asked ? `reading the next ${asked} steps whole: the page shows them when they are over` :
      whole ? `${whole} ${whole === 1 ? "read" : "reads"} whole so far: their steps are marked complete` :
        "sampled: the job's entries are read in part, to keep its cost low");
    note.classList.toggle("error", !!failed);
  };
  button.addEventListener("click", async () => {
    failed = "";
    try {
      const r = await apiPost(`/api/traces/${encodeURIComponent(view.id)}/complete?steps=${Math.round(Number(input.value) || 10)}`);
      asked = Math.max(asked, r.steps);
    } catch (e) {
      failed = e.message;
    }
    say();
  });
  return {
    box,
    show(m) {
      box.hidden = !m.sampled || m.status !== "live";
      asked = m.asked || 0;
      whole = m.whole || 0;
      box.dataset.asked = String(asked);
      box.dataset.whole = String(whole);
      say();
    },
  };
}
