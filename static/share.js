// Share: the page's URL already holds the whole view (window, cursor,
// selection, panel), so sharing stores that URL under a short unguessable
// token and shows /p/TOKEN, copied to the clipboard where the browser lets us.
import { el } from "./common.js";

/** Put a Share button for a view of trace traceID into the page header. */
export function initShare(traceID) {
  const theme = document.getElementById("theme");
  if (!theme) return;
  const btn = el("button", { type: "button", class: "btn", id: "share", title: "Store this exact view under a short link" }, "Share");
  const out = el("input", { id: "share-link", class: "share-link", readonly: true, hidden: true, "aria-label": "Link to this view" });
  const status = el("span", { id: "share-status", class: "dim", role: "status" });
  theme.before(btn, status, out);
  btn.addEventListener("click", async () => {
    btn.disabled = true;
    status.classList.remove("error");
    status.textContent = "Storing this view…";
    try {
      const res = await fetch("/api/permalinks", {
        method: "POST",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify({ trace: traceID, url: location.pathname + location.search }),
      });
      const body = await res.json().catch(() => null);
      if (!res.ok) throw new Error(body?.error || res.status + " " + res.statusText);
      out.value = location.origin + body.url;
      out.hidden = false;
      out.focus();
      out.select();
      status.textContent = "Link to this view:";
      navigator.clipboard?.writeText(out.value).then(() => { status.textContent = "Copied:"; }, () => {});
    } catch (e) {
      status.textContent = "Share failed: " + e.message;
      status.classList.add("error");
    } finally {
      btn.disabled = false;
    }
  });
}
