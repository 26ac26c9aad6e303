// The person's side of protocol 1.1, as the reference client (client/phone.py) speaks it:
// reconnects by itself on the backoff schedule (at once when the browser comes back online
// or the tab is shown again), says hello with its conversation and how far it has read so
// the server replays what was missed, hands every stream event over once and in seq order,
// and keeps every say in an outbox in localStorage until its ack, resent with the same id
// after each reconnect and after a reload.

import { HOLD_MS, delayMs } from "./backoff.js";
import { Refused, Transient, openEventStream, openWebSocket } from "./link.js";
import { randomId, read, write } from "./store.js";

// After these the says not acked are sent again; any other error about a say refuses it.
const RESEND_CODES = new Set(["rate_limited", "internal_error", "conversation_ended", "hello_first"]);
const RESEND_AFTER_MS = 1000;
export const MAX_TEXT_CHARS = 4000;

export class Phone {
  /** `onEvent(frame, link)` gets welcomes, stream events, acks, errors and byes;
   * `onState(name, detail)` the dot: up, connecting, waiting (detail: when), offline, refused. */
  constructor({ onEvent, onState }) {
    this.onEvent = onEvent;
    this.onState = onState;
    this.conversation = read("conversation", null);
    // A fresh page has only what welcome.history holds: it asks for everything after the
    // last whole reply it saw, so a reply cut by the reload comes back from its start.
    this.lastSeq = read("turn_seq", 0);
    this.moved = false; // the last link ended with `bye` `moved`: reconnect at once
    this.outbox = read("outbox", []);
    this.link = null;
    this.sticky = null; // "sse" once WebSocket failed where the event stream worked
    this.stopped = false;
    this.wakeUp = () => {};
  }

  start() {
    addEventListener("online", () => this.wake());
    addEventListener("offline", () => this.link?.close()); // the link is stale: drop it now
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState !== "visible") return;
      this.link?.probe(); // the phone may have slept: a link that does not answer is dropped
      this.wake();
    });
    this.run();
  }

  /** Reconnect now, if waiting (a new identity, or the network is back). */
  wake() {
    this.wakeUp();
  }

  restart() {
    this.conversation = null;
    this.lastSeq = 0;
    this.outbox = [];
    this.link?.close();
    this.wake();
  }

  say(text) {
    const item = { id: randomId(), text };
    this.outbox.push(item);
    write("outbox", this.outbox);
    if (this.link !== null) this.send(this.link, item);
    return item.id;
  }

  async interrupt() {
    try {
      await this.link?.interrupt();
    } catch (failed) {
      if (!(failed instanceof Transient)) throw failed;
    }
  }

  async leave() {
    await this.link?.leave();
  }

  // -- the link loop ----------------------------------------------------------------------

  async run() {
    let attempt = 0;
    while (!this.stopped) {
      if (!navigator.onLine) {
        this.onState("offline");
        await this.sleep(null);
        continue;
      }
      this.onState("connecting");
      let upAt = null;
      try {
        upAt = await this.attempt();
      } catch (failed) {
        if (failed instanceof Refused) {
          this.onState("refused", failed.message);
          this.onEvent(failed.frame, null);
          await this.sleep(null); // until the credentials change
          attempt = 0;
          continue;
        }
      }
      if (upAt !== null && Date.now() - upAt >= HOLD_MS) attempt = 0;
      if (!navigator.onLine) continue;
      if (this.moved) {
        this.moved = false; // the server moved us (another node, or it stops): at once
        continue;
      }
      const delay = delayMs(attempt++);
      this.onState("waiting", Date.now() + delay);
      await this.sleep(delay);
    }
  }

  sleep(ms) {
    return new Promise((resolve) => {
      const timer = ms === null ? null : setTimeout(resolve, ms);
      this.wakeUp = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }

  /** One link: open it (WebSocket, else the event stream), serve it until it ends. */
  async attempt() {
    const hello = this.conversation ? { conversation: this.conversation, last_seq: this.lastSeq } : {};
    const handlers = { frame: (frame, link) => this.onFrame(frame, link) };
    let link;
    if (this.sticky === "sse") link = await openEventStream(hello, handlers);
    else {
      try {
        link = await openWebSocket(hello, handlers);
      } catch (failed) {
        if (failed instanceof Refused || !navigator.onLine) throw failed;
        link = await openEventStream(hello, handlers);
        this.sticky = "sse";
      }
    }
    if (!navigator.onLine) {
      link.close(); // went offline while connecting: this link would not last
      return null;
    }
    const upAt = Date.now();
    this.onWelcome(link.welcome, link);
    this.link = link;
    this.onState("up", link.kind);
    link.start();
    for (const item of this.outbox) this.send(link, item); // in order, same ids
    await link.closed;
    if (this.link === link) this.link = null;
    return upAt;
  }

  /** Send a say on `link`, after the says sent on it before (POSTs would race). */
  send(link, item) {
    link.queue = (link.queue || Promise.resolve()).then(() => this.deliver(link, item));
  }

  async deliver(link, item) {
    for (let failures = 0; this.outbox.includes(item) && !link.ended; failures++) {
      try {
        const answer = await link.say(item.id, item.text);
        if (answer?.type === "ack") this.acked(answer, link);
        else if (answer) this.onError(answer, link);
        return;
      } catch {
        await new Promise((resolve) => setTimeout(resolve, delayMs(failures))); // kept; again
      }
    }
  }

  // -- frames ----------------------------------------------------------------------------

  onWelcome(welcome, link) {
    if (typeof welcome.route === "string") write("route", welcome.route);
    const fresh = welcome.conversation !== this.conversation;
    if (fresh) {
      this.conversation = welcome.conversation;
      this.lastSeq = Number.isInteger(welcome.seq) ? welcome.seq : 0;
      write("conversation", this.conversation);
      write("turn_seq", this.lastSeq);
    }
    this.onEvent({ ...welcome, fresh }, link);
  }

  onFrame(frame, link) {
    if (link !== this.link) return;
    const { type, seq } = frame;
    if (type === "ack") {
      this.acked(frame, link);
      if (frame.repeat === true) return; // "stored", not an event of this stream
    }
    if (Number.isInteger(seq) && type !== "welcome") {
      if (seq <= this.lastSeq) return; // already shown
      this.lastSeq = seq;
      this.onEvent(frame, link);
      if (type === "reply.end") {
        link.confirm(seq);
        write("turn_seq", seq);
      }
    } else if (type === "error") this.onError(frame, link);
    else if (type !== "pong") {
      if (type === "bye") this.moved = frame.reason === "moved";
      this.onEvent(frame, link);
    }
  }

  acked(frame, link) {
    const before = this.outbox.length;
    this.outbox = this.outbox.filter((item) => item.id !== frame.id);
    if (this.outbox.length !== before) write("outbox", this.outbox);
    if (frame.repeat === true || frame.seq === undefined) this.onEvent({ ...frame, repeat: true }, link);
  }

  onError(frame, link) {
    if (frame.code === "conversation_ended") link.close();
    else if (RESEND_CODES.has(frame.code)) {
      setTimeout(() => {
        if (this.link === link) for (const item of this.outbox) this.send(link, item);
      }, RESEND_AFTER_MS);
    } else if (frame.id && this.outbox.some((item) => item.id === frame.id)) {
      this.outbox = this.outbox.filter((item) => item.id !== frame.id);
      write("outbox", this.outbox);
    }
    this.onEvent(frame, link);
  }
}
