// One actor's detail: its state, window, waiting messages, cards, stream position and the
// context traces of its last turns, read again at each tick while it is open.

import { get } from "./api.js";
import { el, fill, duration, utc, clock } from "./dom.js";

const $ = (id) => document.getElementById(id);

export class ActorDetail {
  constructor(onClose) {
    this.person = null;
    this.section = $("detail");
    $("close-detail").addEventListener("click", () => onClose());
  }

  open(person) {
    this.person = person;
    this.section.hidden = false;
    $("detail-title").textContent = `Actor ${person.slice(0, 12)}`;
    $("detail-gone").textContent = "";
  }

  close() {
    this.person = null;
    this.section.hidden = true;
  }

  async refresh() {
    const person = this.person;
    if (!person) return;
    let actor;
    let traced;
    try {
      [actor, traced] = await Promise.all([
        get(`/admin/actors/${person}`),
        get(`/admin/actors/${person}/turns`),
      ]);
    } catch (error) {
      if (error.code !== "unknown_person") throw error;
      if (person === this.person) $("detail-gone").textContent = "This conversation is no longer live (ended or parked).";
      return;
    }
    if (person !== this.person) return; // another actor was opened meanwhile
    $("detail-gone").textContent = "";
    this.#fields(actor);
    fill($("detail-window"), turns(actor.window, "The window is empty"));
    fill($("detail-pending"), turns(actor.pending, "No message waiting"));
    fill($("detail-cards"), (actor.cards || []).map((c) => el("li", {}, el("span", { class: "role", text: c.kind }), c.text)));
    if (!actor.cards || !actor.cards.length) fill($("detail-cards"), [el("li", { class: "muted", text: "No cards" })]);
    const traces = traced.turns.slice().reverse().map(trace);
    fill($("detail-traces"), traces.length ? traces : [el("li", { class: "muted", text: "No turn traced yet" })]);
  }

  #fields(actor) {
    const stream = actor.stream;
    const notes = [actor.during_reply && "told messages came during its reply", actor.after_interrupt && "told its reply was cut off"].filter(Boolean);
    const rows = [
      ["Person", actor.person],
      ["Conversation", actor.conversation],
      ["State", actor.state],
      ["Started", `${utc(actor.started_at)} (${duration(actor.age_s)} ago)`],
      ["Last activity", `${utc(actor.last_activity)} (${duration(actor.idle_s)} idle)`],
      ["Speaker", actor.speaker ? `${actor.speaker} (since ${utc(actor.speaker_at)})` : "the owner"],
      ["Next turn", notes.length ? notes.join("; ") : "no notes"],
      ["Mood", typeof actor.fondness === "number" ? `fondness ${actor.fondness.toFixed(2)} (0 to 1)` : "fondness not set yet"],
      ["Stream", `seq ${stream.last_seq}, ${stream.buffered} events buffered`],
      ["Links", stream.links.length ? stream.links.join(", ") : "none"],
    ];
    fill($("detail-fields"), rows.flatMap(([name, value]) => [el("dt", { text: name }), el("dd", { text: value })]));
  }
}

function turns(list, empty) {
  if (!list || !list.length) return [el("li", { class: "muted", text: list ? empty : "The actor did not answer" })];
  return list.map((t) =>
    el(
      "li",
      {},
      el("span", { class: "muted", text: `${clock(t.at)} ` }),
      el("span", { class: "role", text: t.role }),
      t.text,
      t.interrupted ? el("span", { class: "muted", text: " (cut off)" }) : "",
    ),
  );
}

/** One turn's trace, as `stillhere inspect --turns` prints it. */
function trace(t) {
  const m = t.memories;
  const ids = (list) => list.map((id) => id.slice(0, 8)).join(" ");
  const timings = Object.entries(t.timings_ms)
    .map(([source, ms]) => `${source} ${ms === null ? "kept" : `${ms.toFixed(1)} ms`}`)
    .join(", ");
  const lines = [
    `context ${t.context_chars} chars, ${t.conversations.length} conversations (${t.exchanges} turns word for word), ${t.rules} rules`,
    `memories working ${m.working.length}${m.working.length ? `: ${ids(m.working)}` : ""}; recent ${m.recent.length}${m.recent.length ? `: ${ids(m.recent)}` : ""}; sample ${m.sample.length}${m.sample.length ? `: ${ids(m.sample)}` : ""}`,
    `sources ${timings || "none"}`,
    `problems ${t.problems.length ? t.problems.join("; ") : "none"}`,
    ...t.notes.map((note) => `note ${note.replaceAll("\n", " / ")}`),
    ...t.tools.map((tool) => `tool ${tool}`),
  ];
  if (t.error) lines.push(`error ${t.error}`);
  const answering = t.answering.length ? `, answering ${t.answering.join(", ")}` : "";
  return el(
    "li",
    {},
    el("strong", { text: `${clock(t.at)} reply ${t.reply.slice(0, 8)}${answering}` }),
    el("p", { class: "trace-lines", text: lines.join("\n") }),
  );
}
