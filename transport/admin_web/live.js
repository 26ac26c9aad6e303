// The live view's entry point: the token form, then each part read again on its own tick
// (the actor open at most once a second), paused while the tab is hidden.

import { ApiError, get, token } from "./api.js";
import { ActorTable } from "./actors.js";
import { ActorDetail } from "./detail.js";
import { Charts } from "./metrics.js";
import { refreshSweeps } from "./sweeps.js";

const $ = (id) => document.getElementById(id);
const TICKS_MS = { actors: 2000, detail: 1000, metrics: 2000, sweeps: 5000 };
const REFUSED = "The admin API refused this token: check the --admin-token the server was started with.";

let timers = {};
let charts = null;
const table = new ActorTable((person) => openActor(person));
const detail = new ActorDetail(() => closeActor());
const parts = {
  actors: () => table.refresh(),
  detail: () => detail.refresh(),
  metrics: async () => charts.add(await get("/admin/metrics", { as: "text" }), performance.now()),
  sweeps: () => refreshSweeps(),
};

function setStatus(text) {
  $("status").textContent = text;
}

/** Run a part now, then again TICKS_MS after each run ends; a run asked for while one is
 * under way follows it (never two at once). */
function tick(name) {
  let timer = null;
  let busy = false;
  let again = false;
  let stopped = false;
  const run = async () => {
    clearTimeout(timer);
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    let going = true;
    try {
      await parts[name]();
      if (name === "actors") setStatus(`Live, updated ${new Date().toLocaleTimeString()}`);
    } catch (error) {
      going = failed(error);
    }
    busy = false;
    if (stopped || !going) return;
    if (again) {
      again = false;
      run();
    } else if (!document.hidden) {
      timer = setTimeout(run, TICKS_MS[name]);
    }
  };
  return {
    run,
    stop: () => {
      stopped = true;
      clearTimeout(timer);
    },
  };
}

/** Show a failure; false when it ends the session (the token was refused). */
function failed(error) {
  if (error instanceof ApiError && error.status === 401) {
    signOut(REFUSED);
    return false;
  }
  setStatus(`Trouble reading ${error.message || error}; trying again`);
  return true;
}

function start() {
  stop();
  charts = charts || new Charts($("charts"));
  $("login").hidden = true;
  $("view").hidden = false;
  $("sign-out").hidden = false;
  timers = Object.fromEntries(Object.keys(parts).map((name) => [name, tick(name)]));
  for (const timer of Object.values(timers)) timer.run();
}

function stop() {
  for (const timer of Object.values(timers)) timer.stop();
  timers = {};
}

function signOut(message = "") {
  stop();
  token.clear();
  closeActor();
  $("view").hidden = true;
  $("sign-out").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message;
  setStatus("Not signed in");
  $("token").focus();
}

function openActor(person) {
  detail.open(person);
  table.selected = person;
  for (const tr of $("actors-body").children) tr.classList.toggle("selected", tr.dataset.person === person);
  if (timers.detail) timers.detail.run();
  $("detail-title").scrollIntoView({ block: "nearest" });
}

function closeActor() {
  detail.close();
  table.selected = null;
  for (const tr of $("actors-body").children) tr.classList.remove("selected");
}

$("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  const given = $("token").value.trim();
  $("login-error").textContent = "";
  try {
    await get("/admin/actors?limit=1", { given });
  } catch (error) {
    $("login-error").textContent = error.status === 401 ? REFUSED : `The admin API did not answer: ${error.message}`;
    return;
  }
  token.set(given);
  $("token").value = "";
  start();
});

$("sign-out").addEventListener("click", () => signOut());

let typing = null;
const refilter = () => {
  table.setFilter($("filter").value, $("state").value);
  clearTimeout(typing);
  typing = setTimeout(() => timers.actors && timers.actors.run(), 200);
};
$("filter").addEventListener("input", refilter);
$("state").addEventListener("change", refilter);
$("actors-head").addEventListener("click", () => timers.actors && timers.actors.run());
$("previous").addEventListener("click", () => { table.turnPage(-1); timers.actors.run(); });
$("next").addEventListener("click", () => { table.turnPage(1); timers.actors.run(); });

document.addEventListener("visibilitychange", () => {
  if (!document.hidden && token.get()) start();
});

if (token.get()) start();
else signOut();
