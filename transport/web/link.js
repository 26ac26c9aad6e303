// One link to the server, over WebSocket or over the event stream plus POSTs, behind one
// small interface (client/links.py does the same in Python): `open*` resolves with the
// link once the welcome came, then `start()` delivers the frames that follow, in order.

import { authHeaders, credentials, read } from "./store.js";

const OPEN_TIMEOUT_MS = 10000;
const READ_TIMEOUT_MS = 45000; // the server comments every 15 s on an event stream
const PING_EVERY_MS = 20000; // a WebSocket gone silent is noticed by its missing pong
const PROBE_MS = 5000;

/** The server refused the credentials: retrying with the same ones cannot help. */
export class Refused extends Error {
  constructor(frame) {
    super(frame.message || "unauthorized");
    this.frame = frame;
  }
}

function parse(raw) {
  try {
    const frame = JSON.parse(raw);
    return frame && typeof frame.type === "string" ? frame : null;
  } catch {
    return null;
  }
}

class Link {
  constructor(welcome, handlers) {
    this.welcome = welcome;
    this.handlers = handlers;
    this.started = false;
    this.early = [];
    this.ended = false;
    this.closed = new Promise((resolve) => (this.resolveClosed = resolve));
  }

  start() {
    this.started = true;
    for (const frame of this.early.splice(0)) this.handlers.frame(frame, this);
  }

  deliver(frame) {
    if (this.ended) return; // a link we let go of may still hear a frame or two
    if (this.started) this.handlers.frame(frame, this);
    else this.early.push(frame);
  }

  end() {
    if (this.ended) return;
    this.ended = true;
    this.resolveClosed();
  }
}

class WebSocketLink extends Link {
  kind = "ws";

  constructor(ws, welcome, handlers) {
    super(welcome, handlers);
    this.ws = ws;
    this.heard = Date.now();
    this.pinger = setInterval(() => this.keepAlive(), PING_EVERY_MS);
  }

  keepAlive() {
    if (Date.now() - this.heard > PING_EVERY_MS * 1.5) this.close();
    else this.send({ type: "ping" });
  }

  /** Is the link still alive after the phone slept? A pong must come within PROBE_MS. */
  probe() {
    const asked = Date.now();
    this.send({ type: "ping" });
    setTimeout(() => {
      if (this.heard < asked) this.close();
    }, PROBE_MS);
  }

  send(frame) {
    if (!this.ended && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(frame));
  }

  async say(id, text) {
    this.send({ type: "say", id, text });
    return null; // the answer comes as a frame
  }

  async interrupt() {
    this.send({ type: "interrupt" });
  }

  async leave() {
    this.send({ type: "leave" });
  }

  confirm(seq) {
    this.send({ type: "ack", seq });
  }

  close() {
    clearInterval(this.pinger);
    this.ws.close();
    this.end();
  }
}

/** `path` with the person's routing key (the last welcome's `route`) as `r`: a load balancer
 * hashing on it sends the page to the node that has the conversation (docs/protocol.md). */
function routed(path) {
  const url = new URL(path, location.href);
  const route = read("route", null);
  if (route) url.searchParams.set("r", route);
  return url;
}

function socketUrl() {
  const url = routed("/v1/ws");
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url.href;
}

export function openWebSocket(hello, handlers) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(socketUrl());
    let link = null;
    const timer = setTimeout(() => {
      ws.close();
      reject(new Error("no welcome in time"));
    }, OPEN_TIMEOUT_MS);
    ws.onopen = () => ws.send(JSON.stringify({ type: "hello", v: 1, ...credentials(), ...hello }));
    ws.onmessage = (message) => {
      const frame = parse(message.data);
      if (frame === null) return;
      if (link !== null) {
        link.heard = Date.now();
        link.deliver(frame);
      } else if (frame.type === "welcome") {
        clearTimeout(timer);
        link = new WebSocketLink(ws, frame, handlers);
        resolve(link);
      } else if (frame.type === "error" && frame.code === "unauthorized") {
        clearTimeout(timer);
        reject(new Refused(frame));
      }
    };
    ws.onclose = () => {
      clearTimeout(timer);
      if (link === null) reject(new Error("the WebSocket closed before its welcome"));
      else {
        clearInterval(link.pinger);
        link.end();
      }
    };
  });
}

/** `data:` lines of an event stream, one frame per event (comments and ids skipped). */
class StreamParser {
  buffer = "";

  feed(text) {
    this.buffer += text.replace(/\r\n?/g, "\n");
    const frames = [];
    let end;
    while ((end = this.buffer.indexOf("\n\n")) >= 0) {
      const block = this.buffer.slice(0, end);
      this.buffer = this.buffer.slice(end + 2);
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      const frame = data ? parse(data) : null;
      if (frame !== null) frames.push(frame);
    }
    return frames;
  }
}

export class Transient extends Error {}

async function post(path, body) {
  let response;
  try {
    response = await fetch(routed(path), {
      method: "POST",
      headers: { ...authHeaders(), "Content-Type": "application/json" },
      body: JSON.stringify(body),
      cache: "no-store",
    });
  } catch (failed) {
    throw new Transient(String(failed));
  }
  if (response.status >= 500 || response.status === 429) throw new Transient(`HTTP ${response.status}`);
  return response.json().catch(() => ({ type: "error", code: `http_${response.status}`, message: "not JSON" }));
}

class EventStreamLink extends Link {
  kind = "sse";

  constructor(controller, welcome, handlers) {
    super(welcome, handlers);
    this.controller = controller;
  }

  async pump(reader, parser) {
    try {
      for (;;) {
        const timer = setTimeout(() => this.close(), READ_TIMEOUT_MS);
        const { value, done } = await reader.read();
        clearTimeout(timer);
        if (done) break;
        for (const frame of parser.feed(value)) this.deliver(frame);
      }
    } catch {
      // aborted or broken: the link is over either way
    }
    this.end();
  }

  say(id, text) {
    return post("/v1/say", { id, text, conversation: this.welcome.conversation });
  }

  async interrupt() {
    await post("/v1/interrupt", {});
  }

  async leave() {
    this.deliver(await post("/v1/leave", {}));
  }

  confirm() {} // the next stream's last_seq confirms

  probe() {} // the server comments every 15 s: READ_TIMEOUT_MS notices a silent stream

  close() {
    this.controller.abort();
    this.end();
  }
}

export async function openEventStream(hello, handlers) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), OPEN_TIMEOUT_MS);
  const url = routed("/v1/events");
  if (hello.conversation) url.searchParams.set("conversation", hello.conversation);
  if (Number.isInteger(hello.last_seq)) url.searchParams.set("last_seq", String(hello.last_seq));
  try {
    const response = await fetch(url, {
      headers: { ...authHeaders(), Accept: "text/event-stream" },
      signal: controller.signal,
      cache: "no-store",
    });
    if (response.status === 401) throw new Refused(await response.json());
    if (!response.ok || response.body === null) throw new Error(`HTTP ${response.status}`);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = new StreamParser();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) throw new Error("the event stream ended before its welcome");
      const frames = parser.feed(value);
      const at = frames.findIndex((frame) => frame.type === "welcome");
      if (at < 0) continue;
      const link = new EventStreamLink(controller, frames[at], handlers);
      for (const frame of frames.slice(at + 1)) link.deliver(frame);
      link.pump(reader, parser);
      return link;
    }
  } catch (failed) {
    controller.abort();
    throw failed;
  } finally {
    clearTimeout(timer);
  }
}
