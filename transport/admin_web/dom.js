// Building the page's nodes: text always goes in as text (textContent), never as HTML
// (`el`, shared with the person's web app).

export { el } from "./el.js";

/** Replace a node's children with these. */
export function fill(node, children) {
  node.replaceChildren(...children);
}

/** "3s", "3m12s", "2h05m": as `stillhere inspect` shows durations. */
export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

/** An ISO time as "2026-11-29 12:10:32 UTC", or "–". */
export function utc(iso) {
  if (!iso) return "–";
  return new Date(iso).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

/** The time of day of an ISO time, "12:10:32" (UTC). */
export function clock(iso) {
  return iso ? new Date(iso).toISOString().slice(11, 19) : "–";
}
