// The trace list: upload by drag-and-drop or file and folder pickers with
// a progress bar (several files make a run), and delete with a second
// click to confirm.
import { initTheme, authHeader, askToken, apiDelete } from "./common.js";

initTheme();

const drop = document.getElementById("drop");
const file = document.getElementById("file");
const folder = document.getElementById("folder");
const progress = document.getElementById("progress");
const status = document.getElementById("upload-status");

function setStatus(text, isError) {
  if (!status) return;
  status.textContent = text;
  status.classList.toggle("error", !!isError);
}

/**
 * Upload to POST /api/traces with a progress bar and open what it made:
 * one file as a snapshot, several (or a folder) as the ranks of one run
 * named run, a multipart form of them.
 */
function upload(files, run) {
  const xhr = new XMLHttpRequest();
  const one = files.length === 1 && !run;
  const what = one ? files[0].name : `${files.length} files as run ${run}`;
  let body;
  if (one) {
    xhr.open("POST", "/api/traces?name=" + encodeURIComponent(files[0].name));
    xhr.setRequestHeader("Content-Type", "application/octet-stream");
    body = files[0];
  } else {
    xhr.open("POST", "/api/traces?run=" + encodeURIComponent(run));
    body = new FormData();
    // The names keep their folders (rank3/snapshot.pickle): the server
    // reads ranks from them.
    for (const f of files) body.append("file", f, f.relPath || f.webkitRelativePath || f.name);
  }
  for (const [k, v] of Object.entries(authHeader())) xhr.setRequestHeader(k, v);
  progress.hidden = false;
  progress.value = 0;
  setStatus("Uploading " + what + "…");
  xhr.upload.addEventListener("progress", (e) => {
    if (e.lengthComputable) progress.value = (100 * e.loaded) / e.total;
  });
  xhr.upload.addEventListener("load", () => { progress.value = 100; setStatus("Reading " + what + " on the server…"); });
  xhr.addEventListener("load", () => {
    let res = null;
    try { res = JSON.parse(xhr.responseText); } catch { /* not JSON */ }
    if (xhr.status === 201 && res && res.url) {
      setStatus("Stored " + res.traces.length + " trace(s). Opening…");
      location.assign(res.url);
      return;
    }
    progress.hidden = true;
    if (xhr.status === 401 && askToken()) { upload(files, run); return; }
    const msg = res && res.error ? res.error : xhr.status + " " + xhr.statusText;
    setStatus("Upload refused: " + msg, true);
  });
  xhr.addEventListener("error", () => { progress.hidden = true; setStatus("Upload failed: the connection broke.", true); });
  xhr.send(body);
}

/**
 * runName names a run of files: their folder's name, else what their
 * names share before a rank marker (job_rank0.pickle, job_rank1.pickle →
 * job), else "run".
 */
export function runName(files) {
  const path = files[0].relPath || files[0].webkitRelativePath || "";
  if (path.includes("/")) return path.split("/")[0];
  const names = files.map((f) => f.name);
  let common = names[0];
  for (const n of names) while (!n.startsWith(common)) common = common.slice(0, -1);
  common = common.replace(/([-_.]+(rank|r)?|rank)[-_.]*\d*$/i, "");
  return common || "run";
}

/** uploadMany uploads one file as a snapshot, several as a run. */
function uploadMany(files, fromFolder) {
  const list = [...files].filter((f) => !f.name.startsWith("."));
  if (list.length === 0) { setStatus("No files to upload.", true); return; }
  upload(list, list.length > 1 || fromFolder ? runName(list) : "");
}

/** filesOf reads what was dropped, folders walked, each file with its path. */
async function filesOf(dt) {
  const entries = [...dt.items].map((it) => it.webkitGetAsEntry && it.webkitGetAsEntry()).filter(Boolean);
  if (entries.length === 0 || !entries.some((e) => e.isDirectory)) return { files: [...dt.files], folder: false };
  const out = [];
  const walk = async (e) => {
    if (e.isFile) {
      const f = await new Promise((ok, fail) => e.file(ok, fail));
      f.relPath = e.fullPath.replace(/^\//, "");
      out.push(f);
      return;
    }
    const reader = e.createReader();
    for (;;) {
      const batch = await new Promise((ok, fail) => reader.readEntries(ok, fail));
      if (batch.length === 0) break;
      for (const c of batch) await walk(c);
    }
  };
  for (const e of entries) await walk(e);
  return { files: out, folder: true };
}

file?.addEventListener("change", () => { if (file.files.length) uploadMany(file.files, false); });
folder?.addEventListener("change", () => { if (folder.files.length) uploadMany(folder.files, true); });
drop?.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop?.addEventListener("dragleave", () => drop.classList.remove("over"));
drop?.addEventListener("drop", async (e) => {
  e.preventDefault();
  drop.classList.remove("over");
  try {
    const { files, folder } = await filesOf(e.dataTransfer);
    uploadMany(files, folder);
  } catch (err) {
    setStatus("Could not read what was dropped: " + err, true);
  }
});
drop?.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); file.click(); } });

// Delete buttons are found by the click, so rows swapped in by followLive
// have working ones.
const deleted = new Set(); // rows deleted here, which a list read before may still hold
document.querySelector("table.traces")?.addEventListener("click", async (e) => {
  const btn = e.target.closest("button.delete");
  if (!btn) return;
  if (btn.dataset.armed !== "1") {
    btn.dataset.armed = "1";
    btn.textContent = "Really delete?";
    btn.classList.add("armed");
    setTimeout(() => { btn.dataset.armed = ""; btn.textContent = "Delete"; btn.classList.remove("armed"); }, 4000);
    return;
  }
  btn.disabled = true;
  const url = btn.dataset.run ? "/api/runs/" + encodeURIComponent(btn.dataset.run) : "/api/traces/" + encodeURIComponent(btn.dataset.id);
  try {
    await apiDelete(url);
    const tr = btn.closest("tr");
    deleted.add(rowKey(tr));
    tr.remove();
    setStatus("Deleted " + btn.dataset.name + ".");
  } catch (e) {
    btn.disabled = false;
    setStatus("Could not delete " + btn.dataset.name + ": " + e.message, true);
  }
});

// While a trace on the list streams, its row grows (events, peaks) and at
// last ends: the page reads itself again every few seconds, while a row is
// live and the tab is shown, and swaps in the rows that changed. Rows that
// did not change stay as they are, as does a row whose delete is armed; a
// run keeps its ranks open.
const FOLLOW_MS = 3000;
const rows = document.querySelector("table.traces tbody");
const rowKey = (tr) => (tr.dataset.run ? "run " + tr.dataset.run : "trace " + tr.dataset.id);

/** readList reads the list as the server renders it now (null: it could not). */
function readList() {
  // An XHR document, not DOMParser: the page allows no markup from strings
  // (trusted types), and this is the server's own page, parsed inert.
  return new Promise((resolve) => {
    const xhr = new XMLHttpRequest();
    xhr.open("GET", location.href);
    xhr.responseType = "document";
    xhr.addEventListener("load", () => resolve(xhr.status === 200 ? xhr.response : null));
    xhr.addEventListener("error", () => resolve(null));
    xhr.send();
  });
}

async function refreshRows() {
  const doc = await readList();
  const fresh = doc?.querySelector("table.traces tbody");
  if (!fresh) return;
  const shown = new Map([...rows.children].map((tr) => [rowKey(tr), tr]));
  const kept = [...fresh.children].filter((tr) => !deleted.has(rowKey(tr)));
  rows.replaceChildren(...kept.map((tr) => {
    const was = shown.get(rowKey(tr));
    if (was) {
      if (was.querySelector("details")?.open) tr.querySelector("details")?.setAttribute("open", "");
      if (was.outerHTML === tr.outerHTML || was.querySelector("button.delete.armed, button.delete:disabled")) return was;
    }
    return document.importNode(tr, true);
  }));
  const range = doc.getElementById("list-range");
  if (range) document.getElementById("list-range").textContent = range.textContent;
}

// rows.dataset.following says a read is to come or under way; the reads
// made are counted for tests (window.vramscopeListReads).
window.vramscopeListReads = 0;
function followLive() {
  if (!rows) return;
  if (!rows.querySelector("tr[data-live]")) { delete rows.dataset.following; return; }
  rows.dataset.following = "";
  setTimeout(async () => {
    if (!document.hidden) { window.vramscopeListReads++; await refreshRows(); }
    followLive();
  }, FOLLOW_MS);
}
followLive();
