// The Predict page of two traces: the page itself is drawn by the server;
// while the prediction runs, it reads itself again every 2 s.
import { initTheme } from "./common.js";

initTheme();

if (document.getElementById("predict")?.dataset.running === "1") {
  setTimeout(() => location.reload(), 2000);
}
