// What the app keeps on the device, in localStorage: the identity, the conversation it is in,
// how far it has read, the says not yet acked (the outbox), and the pages and reminders it
// was shown. Everything survives a reload; nothing here is ever sent anywhere but this server.

const PREFIX = "stillhere.";

export function read(name, fallback) {
  const raw = localStorage.getItem(PREFIX + name);
  if (raw === null) return fallback;
  try {
    return JSON.parse(raw);
  } catch {
    return fallback;
  }
}

export function write(name, value) {
  if (value === null || value === undefined) localStorage.removeItem(PREFIX + name);
  else localStorage.setItem(PREFIX + name, JSON.stringify(value));
}

/** Random bytes as base64url, from the Web Crypto API (works outside secure contexts too). */
export function randomId(bytes = 16) {
  const buffer = crypto.getRandomValues(new Uint8Array(bytes));
  return btoa(String.fromCharCode(...buffer)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

/** The credentials: the account token if one was pasted, else this device's secret, made once. */
export function credentials() {
  const token = read("token", null);
  if (token) return { token };
  let device = read("device", null);
  if (!device) {
    device = randomId(24); // 32 characters: the server wants at least 22
    write("device", device);
  }
  return { device };
}

export function authHeaders() {
  const creds = credentials();
  return creds.token ? { Authorization: `Bearer ${creds.token}` } : { "X-Stillhere-Device": creds.device };
}

/** Forget the conversation state (another person is speaking now: a token was set or cleared). */
export function forgetConversation() {
  for (const name of ["conversation", "last_seq", "turn_seq", "outbox", "pages", "reminders"]) write(name, null);
}
