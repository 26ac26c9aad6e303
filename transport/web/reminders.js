// Reminders arrive with their time in words ("tomorrow", "on Thursday", "at 5pm"): the app
// reads the common ones and, when the person allowed notifications, shows one at that time
// while the app is open. A time it cannot read is still shown as a chip, in the words given.

const DAYS = ["sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday"];
const MORNING = 9;

/** The moment `due` names, or null. */
export function dueAt(due, now = new Date()) {
  const words = due.toLowerCase();
  const at = new Date(now);
  const clock = words.match(/\bat (\d{1,2})(?::(\d{2}))?\s*(am|pm)?\b/);
  let hour = MORNING;
  let minute = 0;
  if (clock) {
    const given = Number(clock[1]);
    // "at 5" without am or pm is an afternoon; "at 12" is noon
    const afternoon = clock[3] === "pm" || (!clock[3] && (given < 8 || given === 12));
    hour = (given % 12) + (afternoon ? 12 : 0);
    minute = Number(clock[2] || 0);
  }
  const later = words.match(/\bin (\d+) (minute|hour|day)s?\b/);
  if (later) {
    const unit = { minute: 60e3, hour: 3600e3, day: 86400e3 }[later[2]];
    return new Date(now.getTime() + Number(later[1]) * unit);
  }
  at.setSeconds(0, 0);
  if (/\btomorrow\b/.test(words)) {
    at.setDate(at.getDate() + 1);
    at.setHours(hour, minute);
    return at;
  }
  if (/\btonight\b/.test(words)) {
    at.setHours(clock ? hour : 20, minute);
    return at;
  }
  const day = DAYS.findIndex((name) => words.includes(name));
  if (day >= 0) {
    at.setDate(at.getDate() + (((day - at.getDay() + 6) % 7) + 1));
    at.setHours(hour, minute);
    return at;
  }
  if (clock) {
    at.setHours(hour, minute);
    if (at <= now) at.setDate(at.getDate() + 1);
    return at;
  }
  return null;
}

const scheduled = new Set();

/** Show a notification for `reminder` when it is due, if the person allowed it. */
export function schedule(reminder) {
  if (!("Notification" in window) || Notification.permission !== "granted") return;
  const when = dueAt(reminder.due || "");
  if (when === null || scheduled.has(reminder.id)) return;
  const wait = when.getTime() - Date.now();
  if (wait < 0 || wait > 2 ** 31 - 1) return;
  scheduled.add(reminder.id);
  setTimeout(() => new Notification("Reminder", { body: reminder.text, tag: reminder.id }), wait);
}
