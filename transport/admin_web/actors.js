// The table of live actors: one page at a time (the server filters, sorts and cuts), so it
// stays the same size with 5,000 actors as with 5.

import { get } from "./api.js";
import { el, fill, duration, utc } from "./dom.js";

export const PAGE = 100;

// Column title, the API's sort key (null: not sortable), and how a row shows it.
const COLUMNS = [
  { title: "Person", sort: "person", cell: null },
  { title: "Conversation", sort: "conversation", cell: (r) => r.conversation.slice(0, 8) },
  { title: "State", sort: "state", cell: (r) => el("span", { class: `state state-${r.state}`, text: r.state }) },
  { title: "Idle", sort: "idle", cell: (r) => duration(r.idle_s), num: true },
  { title: "Age", sort: "age", cell: (r) => duration(r.age_s), num: true },
  { title: "Links", sort: "links", cell: (r) => r.links, num: true },
  { title: "Waiting", sort: "pending", cell: (r) => r.pending ?? "–", num: true },
  { title: "Window", sort: "window", cell: (r) => r.window ?? "–", num: true },
  { title: "Last activity", sort: null, cell: (r) => utc(r.last_activity) },
];

export class ActorTable {
  constructor(onOpen) {
    this.onOpen = onOpen;
    this.query = { q: "", state: "", sort: "idle", offset: 0 };
    this.selected = null;
    this.count = 0;
    this.head = document.getElementById("actors-head");
    this.body = document.getElementById("actors-body");
    this.info = document.getElementById("page-info");
    this.tally = document.getElementById("tally");
    this.previous = document.getElementById("previous");
    this.next = document.getElementById("next");
    this.#header();
  }

  #header() {
    fill(
      this.head,
      COLUMNS.map((column) => {
        const th = el("th", { class: column.num ? "num" : "", scope: "col" });
        if (!column.sort) {
          th.textContent = column.title;
          return th;
        }
        const button = el("button", { text: column.title, type: "button" });
        button.addEventListener("click", () => this.sortBy(column.sort));
        th.append(button);
        th.dataset.sort = column.sort;
        return th;
      }),
    );
  }

  /** Sort by this column; again to reverse. */
  sortBy(key) {
    this.query.sort = this.query.sort === key ? `-${key}` : key;
    this.query.offset = 0;
  }

  setFilter(q, state) {
    this.query.q = q.trim();
    this.query.state = state;
    this.query.offset = 0;
  }

  turnPage(step) {
    const offset = this.query.offset + step * PAGE;
    if (offset >= 0 && offset < Math.max(this.count, 1)) this.query.offset = offset;
  }

  async refresh() {
    const params = new URLSearchParams({ sort: this.query.sort, limit: PAGE, offset: this.query.offset });
    if (this.query.q) params.set("q", this.query.q);
    if (this.query.state) params.set("state", this.query.state);
    const page = await get(`/admin/actors?${params}`);
    if (page.count > 0 && page.offset >= page.count) {
      this.query.offset = Math.floor((page.count - 1) / PAGE) * PAGE; // the page emptied
      return this.refresh();
    }
    this.render(page);
    return page;
  }

  render(page) {
    this.count = page.count;
    const states = Object.entries(page.states).filter(([, n]) => n > 0);
    this.tally.textContent =
      `${page.total} live actor${page.total === 1 ? "" : "s"}` +
      (states.length ? `: ${states.map(([s, n]) => `${n} ${s}`).join(", ")}` : "");
    for (const th of this.head.children) {
      const key = th.dataset.sort;
      if (!key) continue;
      const order = this.query.sort === key ? "ascending" : this.query.sort === `-${key}` ? "descending" : null;
      if (order) th.setAttribute("aria-sort", order);
      else th.removeAttribute("aria-sort");
    }
    fill(this.body, page.actors.map((row) => this.#row(row)));
    if (!page.actors.length) {
      const empty = el("td", { text: page.total ? "No actor matches the filter" : "No live actors", colspan: COLUMNS.length });
      fill(this.body, [el("tr", {}, empty)]);
    }
    const first = page.count ? page.offset + 1 : 0;
    const last = page.offset + page.actors.length;
    this.info.textContent = `Rows ${first}–${last} of ${page.count}`;
    this.previous.disabled = page.offset === 0;
    this.next.disabled = last >= page.count;
  }

  #row(row) {
    const open = el("button", { class: "open", text: row.person.slice(0, 12), type: "button", title: row.person });
    open.addEventListener("click", () => this.onOpen(row.person));
    const cells = COLUMNS.map((column, i) => {
      const td = el("td", { class: column.num ? "num" : "" });
      td.append(i === 0 ? open : column.cell(row));
      return td;
    });
    const tr = el("tr", { class: row.person === this.selected ? "selected" : "" }, ...cells);
    tr.dataset.person = row.person;
    return tr;
  }
}
