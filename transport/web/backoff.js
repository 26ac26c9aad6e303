// The reconnect schedule of the reference client (client/backoff.py): 1, 2, 4, 8, then
// 15 s at most, each spread by ±20 % jitter so that many phones do not come back at once.

export const HOLD_MS = 5000; // a link up this long was a real one: the schedule starts over

export function delayMs(attempt, jitter = 0.2) {
  const base = Math.min(15, 2 ** Math.max(0, attempt));
  const spread = 1 - jitter + Math.random() * 2 * jitter;
  return Math.min(15000, base * spread * 1000);
}
