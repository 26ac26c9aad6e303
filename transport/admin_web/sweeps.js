// The supervisor's last sweeps, newest first.

import { get } from "./api.js";
import { el, fill, utc } from "./dom.js";

export async function refreshSweeps() {
  const history = await get("/admin/sweeps");
  const summary = `Every ${history.interval_s} s; ${history.sweeping ? "sweeping now" : "not sweeping now"}; ${history.replaced} failed actor${history.replaced === 1 ? "" : "s"} replaced since start`;
  document.getElementById("sweeps-summary").textContent = summary;
  const rows = history.sweeps.slice().reverse().map((s) =>
    el("tr", {}, ...[utc(s.at), s.archived, s.parked, s.live].map((v, i) => el("td", { class: i ? "num" : "", text: v }))),
  );
  fill(document.getElementById("sweeps-body"), rows.length ? rows : [el("tr", {}, el("td", { text: "No sweep yet", colspan: 4 }))]);
}
