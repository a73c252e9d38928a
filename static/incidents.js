// A trace's OOM incidents on its view: a marker on the timeline at each,
// and a link to each incident page next to the legend.
import { api, el, fmtBytes } from "./common.js";

/** Fetch the incidents of view.id, set view.markers, add links after anchor, and return the incidents. */
export async function showIncidents(view, anchor) {
  const { incidents } = await api(`/api/traces/${view.id}/incidents`);
  if (!incidents.length) return incidents;
  view.markers = incidents.map((i) => ({ t: i.time_us, n: i.n }));
  const links = el("span", { class: "incident-links", id: "incident-links" }, "OOM:");
  for (const i of incidents) {
    links.append(el("a", { href: i.url, title: `Out of memory asking for ${fmtBytes(i.size)} at ${view.fmtT(i.time_us)}: why, and what would have avoided it` }, "incident " + i.n));
  }
  anchor.after(links);
  view.redraw();
  return incidents;
}
