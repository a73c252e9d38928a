// The trace list: upload by drag-and-drop or file picker with a progress
// bar, and delete with a second click to confirm.
import { initTheme, authHeader, askToken } from "./common.js";

initTheme();

const drop = document.getElementById("drop");
const file = document.getElementById("file");
const progress = document.getElementById("progress");
const status = document.getElementById("upload-status");

function setStatus(text, isError) {
  if (!status) return;
  status.textContent = text;
  status.classList.toggle("error", !!isError);
}


/** Upload one file to POST /api/traces; on success open its trace. */
function upload(f) {
  const xhr = new XMLHttpRequest();
  xhr.open("POST", "/api/traces?name=" + encodeURIComponent(f.name));
  xhr.setRequestHeader("Content-Type", "application/octet-stream");
  for (const [k, v] of Object.entries(authHeader())) xhr.setRequestHeader(k, v);
  progress.hidden = false;
  progress.value = 0;
  setStatus("Uploading " + f.name + "…");
  xhr.upload.addEventListener("progress", (e) => {
    if (e.lengthComputable) progress.value = (100 * e.loaded) / e.total;
  });
  xhr.upload.addEventListener("load", () => { progress.value = 100; setStatus("Reading " + f.name + " on the server…"); });
  xhr.addEventListener("load", () => {
    let body = null;
    try { body = JSON.parse(xhr.responseText); } catch { /* not JSON */ }
    if (xhr.status === 201 && body && body.url) {
      setStatus("Stored " + body.traces.length + " trace(s). Opening…");
      location.assign(body.url);
      return;
    }
    progress.hidden = true;
    if (xhr.status === 401 && askToken()) { upload(f); return; }
    const msg = body && body.error ? body.error : xhr.status + " " + xhr.statusText;
    setStatus("Upload refused: " + msg, true);
  });
  xhr.addEventListener("error", () => { progress.hidden = true; setStatus("Upload failed: the connection broke.", true); });
  xhr.send(f);
}

file?.addEventListener("change", () => { if (file.files.length) upload(file.files[0]); });
drop?.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop?.addEventListener("dragleave", () => drop.classList.remove("over"));
drop?.addEventListener("drop", (e) => {
  e.preventDefault();
  drop.classList.remove("over");
  if (e.dataTransfer.files.length) upload(e.dataTransfer.files[0]);
});
drop?.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); file.click(); } });

for (const btn of document.querySelectorAll("button.delete")) {
  btn.addEventListener("click", async () => {
    if (btn.dataset.armed !== "1") {
      btn.dataset.armed = "1";
      btn.textContent = "Really delete?";
      btn.classList.add("armed");
      setTimeout(() => { btn.dataset.armed = ""; btn.textContent = "Delete"; btn.classList.remove("armed"); }, 4000);
      return;
    }
    btn.disabled = true;
    const del = () => fetch("/api/traces/" + encodeURIComponent(btn.dataset.id), { method: "DELETE", headers: authHeader() });
    let res = await del();
    if (res.status === 401 && askToken()) res = await del();
    if (res.ok) {
      btn.closest("tr").remove();
      setStatus("Deleted " + btn.dataset.name + ".");
    } else {
      let msg = res.status + "";
      try { msg = (await res.json()).error; } catch { /* keep status */ }
      btn.disabled = false;
      setStatus("Could not delete " + btn.dataset.name + ": " + msg, true);
    }
  });
}
