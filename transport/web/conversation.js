// The conversation as the person sees it: their says, the assistant's replies as they
// stream, "↩ replying to …", and chips for cards, reminders and pages. Every message is
// keyed by its id (a say's client id, a reply's id), so whatever arrives twice (history and
// replay after a reload, a resend's repeated ack) updates the one message, never adds one.
// Chips sit in a row just after the reply they were shown with (a card names it, `reply`;
// a reminder or a page comes within its reply's seqs), whatever order they arrive in.

import { $, el } from "./dom.js";
import { schedule } from "./reminders.js";
import { read, write } from "./store.js";

const NAMES = { card: "Remembered", reminder: "Reminder", page: "Page" };

export class Conversation {
  constructor(log, onStreaming) {
    this.log = log;
    this.onStreaming = onStreaming; // (is a reply streaming?) for the Stop button
    this.says = new Map();
    this.replies = new Map(); // reply id -> {node, text, done}
    this.current = null; // the reply that chips arriving now belong to
  }

  // -- says ------------------------------------------------------------------------------

  say(id, text, { pending = false, at = null } = {}) {
    let node = this.says.get(id);
    if (node === undefined) {
      node = el(
        "div",
        { class: "message person", "data-say": id },
        el("span", { class: "text", text }),
        el("span", { class: "meta" }),
      );
      this.says.set(id, node);
      this.log.append(node);
    }
    node.classList.toggle("pending", pending);
    node.querySelector(".meta").textContent = pending ? "Not sent yet" : at ? time(at) : "";
    this.scroll(); // with its meta line: the newest line is never left under the message box
    return node;
  }

  acked(id) {
    this.mark(id, "Sent");
  }

  refused(id, message) {
    this.mark(id, `Not sent: ${message}`)?.classList.add("failed");
  }

  /** A say's meta line, now that the server answered it. */
  mark(id, words) {
    const node = this.says.get(id);
    if (node === undefined) return undefined;
    node.classList.remove("pending");
    node.querySelector(".meta").textContent = words;
    this.scroll();
    return node;
  }

  replyingTo(id, excerpt, guessed) {
    const node = this.says.get(id);
    if (node === undefined || node.querySelector(".replying-to")) return;
    const words = `↩ replying to “${excerpt}”${guessed ? " (a guess)" : ""}`;
    node.prepend(el("span", { class: "replying-to", text: words }));
    this.scroll();
  }

  // -- replies ---------------------------------------------------------------------------

  startReply(frame) {
    this.current = frame.reply;
    if (this.replies.has(frame.reply)) return;
    const node = el(
      "div",
      { class: "message assistant", "data-reply": frame.reply },
      frame.follow_on ? el("span", { class: "meta", text: "Follow-on" }) : null,
      el("span", { class: "text" }),
      el("span", { class: "meta end" }),
    );
    this.replies.set(frame.reply, { node, text: "", done: false });
    this.append(node);
    const chips = this.chipsFor(frame.reply);
    if (chips) node.after(chips); // shown before their reply was (a reload mid-reply)
    this.streaming();
  }

  delta(frame) {
    const reply = this.replies.get(frame.reply);
    if (reply === undefined || reply.done) return;
    reply.text += frame.text;
    reply.node.querySelector(".text").textContent = reply.text;
    this.scroll();
  }

  endReply(frame) {
    if (!this.replies.has(frame.reply)) this.startReply(frame);
    const reply = this.replies.get(frame.reply);
    reply.done = true;
    reply.text = frame.text;
    reply.node.querySelector(".text").textContent = frame.text;
    reply.node.classList.toggle("cut", frame.interrupted === true);
    const meta = reply.node.querySelector(".end");
    if (frame.interrupted) meta.textContent = "Stopped";
    else if (frame.error) meta.textContent = `The assistant could not answer (${frame.error})`;
    this.streaming();
    this.scroll();
  }

  streaming() {
    this.onStreaming([...this.replies.values()].some((reply) => !reply.done));
  }

  // -- chips -----------------------------------------------------------------------------

  /**
   * A chip beside the reply `reply` (a card's own `reply` first). One shown again with
   * another reply (a memory reinforced) moves there. A reply not on the page yet gets its
   * row at the end, or, `earlier` (a welcome's card of a reply before its history), at the
   * start; the row moves beside the reply when it comes.
   */
  chip(kind, data, reply = this.current, { keep = true, earlier = false } = {}) {
    const key = chipKey({ kind, data });
    const shownWith = data.reply || reply || "";
    const shown = this.log.querySelector(`[data-chip="${CSS.escape(key)}"]`);
    if (shown?.parentElement.dataset.reply === shownWith) return;
    if (shown) this.unchip(shown);
    const label = kind === "page" ? data.title : kind === "reminder" ? `${data.text} (${data.due})` : data.text;
    const what = el("span", { class: "what", text: NAMES[kind] });
    const chip =
      kind === "page"
        ? el("button", { type: "button", class: "chip", "data-chip": key, onclick: () => openPage(data) }, what, " ", label)
        : el("span", { class: "chip", "data-chip": key }, what, " ", label);
    let row = this.chipsFor(shownWith);
    if (!row) {
      row = el("div", { class: "chips", role: "group", "aria-label": "Shown with this reply", "data-reply": shownWith });
      const after = this.replies.get(shownWith)?.node;
      if (after) after.after(row);
      else if (earlier) this.log.prepend(row);
      else this.append(row);
    }
    row.append(chip);
    this.scroll();
    if (keep) write("chips", [...read("chips", []).filter((saved) => chipKey(saved) !== key), { kind, data, reply: shownWith }]);
    if (kind === "reminder" && !shown) schedule(data);
  }

  chipsFor(reply) {
    return this.log.querySelector(`.chips[data-reply="${CSS.escape(reply)}"]`);
  }

  unchip(chip) {
    const row = chip.parentElement;
    chip.remove();
    if (!row.children.length) row.remove();
  }

  // -- whole conversations ---------------------------------------------------------------

  /** A welcome that starts this page's view of a conversation: its history, its cards. */
  restore(welcome, outbox) {
    this.log.replaceChildren();
    this.says.clear();
    this.replies.clear();
    if (welcome.resumed === false) write("chips", []);
    for (const item of welcome.history || []) {
      if (item.role === "user") {
        const id = item.id || `history-${this.says.size}`;
        this.say(id, item.text, { at: item.at });
        if (item.reply_to) this.replyingTo(id, item.reply_to.excerpt, item.reply_to.guessed);
      } else {
        const reply = item.reply || `history-${this.replies.size}`;
        this.endReply({ reply, text: item.text, interrupted: item.interrupted === true, follow_on: item.follow_on === true });
      }
    }
    this.current = null;
    // The welcome's cards last: where they were shown is the server's word.
    for (const saved of read("chips", [])) this.chip(saved.kind, saved.data, saved.reply, { keep: false, earlier: true });
    for (const card of welcome.cards || []) this.chip("card", card, null, { earlier: true });
    this.waiting(outbox);
  }

  /** The says still in the outbox, at the end: shown from the start, link or no link. */
  waiting(outbox) {
    for (const item of outbox) this.say(item.id, item.text, { pending: true });
  }

  append(node) {
    this.log.append(node);
    this.scroll();
  }

  scroll() {
    this.log.scrollTop = this.log.scrollHeight;
  }
}

/** A chip's key, kept or not: one chip per card, reminder or page. */
function chipKey({ kind, data }) {
  return `${kind}:${data.id || data.title}`;
}

function time(iso) {
  const at = new Date(iso);
  return Number.isNaN(at.getTime()) ? "" : at.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

export function openPage(page) {
  $("page-title").textContent = page.title;
  $("page-body").textContent = page.body;
  $("page-sheet").showModal();
}
