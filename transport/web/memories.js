// The memories view: the person's memories found by search or filters, a page at a time;
// a selection (checkboxes, shift-click ranges, everything matching) muted, unmuted or
// forgotten in ONE request; a memory marked wrong with the one that corrects it; a memory
// said again, each time listed and one split back out as a memory of its own (a wrong
// merge undone); the clean-up sheet (a dry run first, then a confirmation); rules; open
// threads.

import { api } from "./api.js";
import { $, confirmDialog, el } from "./dom.js";

const PAGE = 50;
const ALL_PAGE = 500; // "select all matching" reads the ids in pages this big

export class Memories {
  constructor() {
    this.shown = []; // memories on this page
    this.selected = new Set();
    this.anchor = null; // the last checkbox clicked, for shift-click ranges
    this.cursors = [null]; // the cursor of each page seen, to go back
    this.page = 0;
    this.next = null;
    this.scores = null; // memory id -> its match score while a search is shown
    $("memory-filters").addEventListener("submit", (event) => {
      event.preventDefault();
      this.search();
    });
    $("memories-next").addEventListener("click", () => this.turn(1));
    $("memories-prev").addEventListener("click", () => this.turn(-1));
    $("select-all").addEventListener("click", () => this.guard(() => this.selectAll()));
    $("select-none").addEventListener("click", () => this.select([], false, true));
    $("mute-selected").addEventListener("click", () => this.guard(() => this.bulk("mute")));
    $("unmute-selected").addEventListener("click", () => this.guard(() => this.bulk("unmute")));
    $("forget-selected").addEventListener("click", () => this.guard(() => this.bulk("forget")));
    $("cleanup").addEventListener("submit", (event) => {
      event.preventDefault();
      this.guard(() => this.cleanup(true));
    });
    $("cleanup-confirm").addEventListener("click", () => this.guard(() => this.cleanup(false)));
    $("rule-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.guard(() => this.addRule());
    });
  }

  open() {
    this.guard(async () => {
      await Promise.all([this.search(), this.rules(), this.threads()]);
    });
  }

  async guard(work) {
    try {
      await work();
    } catch (failed) {
      $("memory-note").textContent = `That did not work: ${failed.message}`;
    }
  }

  filters(limit = PAGE) {
    const query = new URLSearchParams({ status: $("memory-status").value, limit: String(limit) });
    if ($("memory-type").value) query.set("type", $("memory-type").value);
    return query;
  }

  // -- finding ---------------------------------------------------------------------------

  async search() {
    this.cursors = [null];
    this.page = 0;
    this.select([], false, true);
    await this.load();
  }

  async turn(step) {
    this.page += step;
    await this.guard(() => this.load());
  }

  async load() {
    const q = $("memory-q").value.trim();
    if (q) {
      const found = await api("GET", `/v1/memories/search?${new URLSearchParams({ q, limit: "50" })}`);
      const status = $("memory-status").value.split(",");
      const type = $("memory-type").value;
      this.scores = new Map(found.results.map((result) => [result.memory.id, result.score]));
      this.shown = found.results
        .map((result) => result.memory)
        .filter((memory) => status.includes(memory.status) && (!type || memory.type === type));
      this.next = null;
    } else {
      const query = this.filters();
      const cursor = this.cursors[this.page];
      if (cursor) query.set("cursor", cursor);
      const page = await api("GET", `/v1/memories?${query}`);
      this.scores = null;
      this.shown = page.memories;
      this.next = page.next_cursor;
      this.cursors[this.page + 1] = page.next_cursor;
    }
    this.render();
  }

  render() {
    const list = $("memory-list");
    list.replaceChildren(
      ...this.shown.map((memory, index) => {
        const box = el("input", { type: "checkbox", "data-id": memory.id });
        box.checked = this.selected.has(memory.id);
        box.addEventListener("click", (event) => this.clicked(index, box.checked, event.shiftKey));
        return el(
          "li",
          {},
          el("label", {}, box, el("span", {}, el("span", { text: memory.text }), " ", el("span", { class: "kind", text: this.kind(memory) }))),
          memory.mention_count > 1
            ? el("button", { type: "button", onclick: () => this.guard(() => this.mentions(memory)), "aria-label": `Said again: ${memory.text}` }, `Said ${memory.mention_count}×…`)
            : null,
          el("button", { type: "button", onclick: () => this.correct(memory), "aria-label": `Mark wrong: ${memory.text}` }, "Wrong…"),
        );
      }),
    );
    if (this.shown.length === 0) list.append(el("li", { text: this.scores ? "Nothing found." : "Nothing here." }));
    $("memories-prev").disabled = this.page === 0;
    $("memories-next").disabled = !this.next;
    $("memories-page").textContent = this.next || this.page ? `Page ${this.page + 1}` : "";
  }

  /** A memory's type and status, and how well it matched when searched for. */
  kind(memory) {
    const score = this.scores?.get(memory.id);
    const match = score === undefined ? "" : ` · match ${score.toFixed(2)}`;
    return `${memory.type} · ${memory.status}${match}`;
  }

  // -- selecting -------------------------------------------------------------------------

  clicked(index, checked, shift) {
    const from = shift && this.anchor !== null ? Math.min(this.anchor, index) : index;
    const to = shift && this.anchor !== null ? Math.max(this.anchor, index) : index;
    this.select(this.shown.slice(from, to + 1).map((memory) => memory.id), checked);
    this.anchor = index;
  }

  select(ids, on, reset = false) {
    if (reset) this.selected.clear();
    for (const id of ids) {
      if (on) this.selected.add(id);
      else this.selected.delete(id);
    }
    for (const box of $("memory-list").querySelectorAll("input[type=checkbox]")) {
      box.checked = this.selected.has(box.dataset.id);
    }
    const count = this.selected.size;
    $("selection-count").textContent = `${count} selected`;
    for (const id of ["mute-selected", "unmute-selected", "forget-selected"]) $(id).disabled = count === 0;
  }

  /** Every memory matching the search or the filters, not only this page. */
  async selectAll() {
    if ($("memory-q").value.trim()) {
      this.select(this.shown.map((memory) => memory.id), true);
      return;
    }
    const ids = [];
    let cursor = null;
    do {
      const query = this.filters(ALL_PAGE);
      if (cursor) query.set("cursor", cursor);
      const page = await api("GET", `/v1/memories?${query}`);
      ids.push(...page.memories.map((memory) => memory.id));
      cursor = page.next_cursor;
    } while (cursor);
    this.select(ids, true);
  }

  // -- acting ----------------------------------------------------------------------------

  async bulk(action) {
    const ids = [...this.selected];
    const many = `${ids.length} ${ids.length === 1 ? "memory" : "memories"}`;
    const words = {
      mute: [`Mute ${many}? The assistant will not bring them up.`, `Mute ${many}`],
      unmute: [`Unmute ${many}?`, `Unmute ${many}`],
      forget: [`Forget ${many} for good? This cannot be undone.`, `Forget ${many}`],
    }[action];
    if (!(await confirmDialog(...words))) return;
    const body = { action, ids, ...(action === "forget" ? { confirm: "forget" } : {}) };
    const done = await api("POST", "/v1/memories/bulk", body);
    $("memory-note").textContent = `${done.changed} of ${done.asked} ${action === "forget" ? "forgotten" : `${action}d`}.`;
    this.select([], false, true);
    await this.load();
  }

  async correct(memory) {
    const others = this.shown.filter((other) => other.id !== memory.id);
    if (others.length === 0) {
      $("memory-note").textContent = "Find the memory that is right first, so both are listed.";
      return;
    }
    $("correct-wrong").textContent = `Wrong: ${memory.text}`;
    $("correct-by").replaceChildren(...others.map((other) => el("option", { value: other.id, text: other.text })));
    const dialog = $("correct");
    dialog.returnValue = "";
    dialog.showModal();
    await new Promise((resolve) => dialog.addEventListener("close", resolve, { once: true }));
    if (dialog.returnValue !== "ok") return;
    await api("POST", `/v1/memories/${memory.id}/erroneous`, { corrected_by: $("correct-by").value });
    $("memory-note").textContent = "Marked as wrong; the right one is kept with it.";
    await this.load();
  }

  /** Each time the memory was said again; one wrongly counted in it can be split out. */
  async mentions(memory) {
    const { mentions } = await api("GET", `/v1/memories/${memory.id}`);
    $("mentions-of").textContent = memory.text;
    $("mention-list").replaceChildren(
      ...mentions.map((mention) =>
        el(
          "li",
          {},
          el("span", { text: mention.text }),
          " ",
          el("span", { class: "kind", text: mention.split_into ? "split out" : mention.decided_by }),
          mention.split_into
            ? null
            : el("button", { type: "button", "aria-label": `Split out: ${mention.text}`, onclick: () => this.guard(() => this.split(memory, mention)) }, "Split out"),
        ),
      ),
    );
    if (mentions.length === 0) $("mention-list").append(el("li", { text: "Never said again." }));
    $("mentions").showModal();
  }

  async split(memory, mention) {
    await api("POST", `/v1/memories/${memory.id}/split`, { mention: mention.id });
    $("mentions").close();
    $("memory-note").textContent = "Split out as a memory of its own.";
    await this.load();
  }

  cleanupBody() {
    const categories = [...document.querySelectorAll("#cleanup input[name=category]:checked")].map((box) => box.value);
    const tz = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
    return { categories, scope: $("cleanup-scope").value, tz };
  }

  async cleanup(dryRun) {
    const body = this.cleanupBody();
    if (body.categories.length === 0) {
      $("cleanup-summary").textContent = "Choose what to clean up.";
      $("cleanup-preview").hidden = false;
      return;
    }
    if (dryRun) {
      const preview = await api("POST", "/v1/memories/cleanup", { ...body, dry_run: true });
      $("cleanup-preview").hidden = false;
      $("cleanup-summary").textContent = `${preview.count} ${preview.count === 1 ? "memory" : "memories"} would be forgotten.`;
      $("cleanup-list").replaceChildren(...preview.memories.map((memory) => el("li", { text: `${memory.text} (${memory.type})` })));
      $("cleanup-confirm").hidden = preview.count === 0;
      $("cleanup-confirm").textContent = `Forget ${preview.count} ${preview.count === 1 ? "memory" : "memories"}`;
      return;
    }
    const done = await api("POST", "/v1/memories/cleanup", { ...body, confirm: "cleanup" });
    $("cleanup-summary").textContent = `${done.count} ${done.count === 1 ? "memory" : "memories"} forgotten.`;
    $("cleanup-list").replaceChildren();
    $("cleanup-confirm").hidden = true;
    await this.load();
  }

  // -- rules and threads -----------------------------------------------------------------

  async rules() {
    const { rules } = await api("GET", "/v1/rules");
    $("rule-list").replaceChildren(
      ...rules.map((rule) =>
        el(
          "li",
          {},
          el("span", { text: rule.text }),
          el("button", { type: "button", "aria-label": `Remove rule: ${rule.text}`, onclick: () => this.guard(() => this.removeRule(rule.id)) }, "Remove"),
        ),
      ),
    );
  }

  async addRule() {
    const input = $("rule-text");
    await api("POST", "/v1/rules", { text: input.value });
    input.value = "";
    await this.rules();
  }

  async removeRule(id) {
    await api("DELETE", `/v1/rules/${encodeURIComponent(id)}`);
    await this.rules();
  }

  async threads() {
    const { threads } = await api("GET", "/v1/threads");
    $("thread-list").replaceChildren(
      ...threads.map((thread) => el("li", {}, el("span", { text: thread.text }), el("span", { class: "kind", text: thread.by === "person" ? "you" : "assistant" }))),
    );
    if (threads.length === 0) $("thread-list").append(el("li", { text: "No open threads." }));
  }
}
