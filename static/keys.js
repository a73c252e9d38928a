// Keys of the trace view and the incident page, as in Perfetto: W/S zoom
// the time window, A/D pan it, F fits the selection, Esc clears it, 0
// resets; ↑/↓ step the cursor event by event where the page has events.
// "?" (or the Keys button) opens a list of every key and gesture. Keys are
// ignored while typing in a field.
import { el } from "./common.js";

const MOUSE = [
  ["Wheel", "zoom the time axis around the pointer"],
  ["Ctrl/Alt + wheel", "zoom the memory axis around the pointer"],
  ["Drag", "pan (both axes once the memory axis is zoomed)"],
  ["Shift + drag", "zoom to a rectangle (a window, and a memory range when it is tall)"],
  ["Click", "move the cursor; select the allocation under it"],
];

/**
 * Wires the page-wide keys of view. extra lists more [key, description,
 * action] rows (action(e) returns false to let the key through).
 */
export function initKeys(view, extra = []) {
  const keys = [
    ["W", "zoom in (time)", () => view.zoomTime(focus(view), 0.7)],
    ["S", "zoom out (time)", () => view.zoomTime(focus(view), 1 / 0.7)],
    ["A", "pan left", () => pan(view, -0.2)],
    ["D", "pan right", () => pan(view, 0.2)],
    ["F", "fit the selection (or the whole trace)", () => view.fitSelection()],
    ["0", "reset both axes", () => view.resetWindow()],
    ["Esc", "clear the selection; close this list", () => { if (!help.hidden) help.hidden = true; else view.clearSelection(); }],
    ...extra,
    ["?", "show or hide this list", () => { help.hidden = !help.hidden; }],
  ];
  const help = el("div", { class: "help", id: "help", role: "dialog", "aria-label": "Keys", hidden: true },
    el("h2", {}, "Keys"),
    table(keys.map(([k, d]) => [k, d])),
    el("h3", {}, "Mouse"),
    table(MOUSE),
    el("p", { class: "dim" }, "Press ? or Esc to close."));
  help.addEventListener("click", (e) => { if (e.target === help) help.hidden = true; });
  document.body.append(help);
  document.getElementById("keys")?.addEventListener("click", () => { help.hidden = !help.hidden; });
  const byKey = new Map(keys.map(([k, , a]) => [k === "Esc" ? "escape" : k.toLowerCase(), a]));
  byKey.set("arrowup", byKey.get("↑"));
  byKey.set("arrowdown", byKey.get("↓"));
  document.addEventListener("keydown", (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    const t = e.target;
    if (t instanceof HTMLInputElement || t instanceof HTMLTextAreaElement || t instanceof HTMLSelectElement) {
      if (e.key === "Escape") t.blur();
      return;
    }
    const a = byKey.get(e.key.toLowerCase());
    if (!a || a(e) === false) return;
    e.preventDefault();
  });
  return help;
}

function table(rows) {
  const t = el("table", { class: "keys" });
  for (const [k, d] of rows) t.append(el("tr", {}, el("th", {}, el("kbd", {}, k)), el("td", {}, d)));
  return t;
}

// Zooms center on the cursor when it is in the window, else the middle.
function focus(v) {
  const c = v.cursorU ? v.cursorU() : v.cursor;
  return c !== null && c >= v.t0 && c <= v.t1 ? c : (v.t0 + v.t1) / 2;
}

function pan(v, f) {
  const d = (v.t1 - v.t0) * f;
  v.setWindow(v.t0 + d, v.t1 + d);
}
