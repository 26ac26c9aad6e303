// The app's start: the conversation view (the default), the memories view, settings, and
// the dot. Everything here is wiring; the protocol is phone.js, rendering conversation.js.

import { Conversation } from "./conversation.js";
import { $ } from "./dom.js";
import { Memories } from "./memories.js";
import { MAX_TEXT_CHARS, Phone } from "./phone.js";
import { schedule } from "./reminders.js";
import { sayWhatIsWithheld } from "./secure.js";
import { credentials, forgetConversation, read, write } from "./store.js";

const conversation = new Conversation($("log"), (streaming) => {
  $("stop").hidden = !streaming;
});
let shownOnce = false;

const phone = new Phone({ onEvent, onState: showState });

function onEvent(frame) {
  switch (frame.type) {
    case "welcome":
      if (frame.fresh || !shownOnce) conversation.restore(frame, phone.outbox);
      shownOnce = true;
      break;
    case "ack":
      conversation.acked(frame.id);
      break;
    case "reply.start":
      conversation.startReply(frame);
      break;
    case "reply.delta":
      conversation.delta(frame);
      break;
    case "reply.end":
      conversation.endReply(frame);
      break;
    case "reply_to":
      conversation.replyingTo(frame.id, frame.excerpt, frame.guessed);
      break;
    case "card":
      conversation.chip("card", frame.card);
      break;
    case "reminder":
      conversation.chip("reminder", frame.reminder);
      break;
    case "page":
      conversation.chip("page", { ...frame.page, id: String(frame.seq) });
      break;
    case "error":
      if (frame.id && !phone.outbox.some((item) => item.id === frame.id)) conversation.refused(frame.id, frame.message);
      else if (frame.code === "unauthorized") note(`Not accepted: ${frame.message}`);
      break;
    case "bye":
      if (frame.reason === "moved") break; // carried on elsewhere: the page reconnects at once
      note(frame.reason === "leave" ? "You ended the conversation." : "The conversation ended after a long pause.");
      break;
  }
}

// -- the dot ------------------------------------------------------------------------------

let countdown = null;

function showState(name, detail) {
  clearInterval(countdown);
  const dot = $("status");
  dot.dataset.state = { up: "up", connecting: "connecting" }[name] || "down";
  const words = $("status-text");
  if (name === "up") words.textContent = "Connected";
  else if (name === "connecting") words.textContent = "Connecting…";
  else if (name === "offline") words.textContent = "Offline";
  else if (name === "refused") words.textContent = `Not accepted: ${detail}`;
  else if (name === "waiting") {
    const tick = () => {
      words.textContent = `Reconnecting in ${Math.max(1, Math.ceil((detail - Date.now()) / 1000))} s`;
    };
    tick();
    countdown = setInterval(tick, 1000);
  }
}

// -- composing ----------------------------------------------------------------------------

function note(text) {
  $("composer-note").textContent = text;
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = $("message");
  const text = input.value.trim();
  if (!text) return;
  if ([...text].length > MAX_TEXT_CHARS) {
    note(`A message is limited to ${MAX_TEXT_CHARS} characters.`);
    return;
  }
  note("");
  const id = phone.say(text);
  conversation.say(id, text, { pending: true });
  input.value = "";
  input.focus();
});

$("stop").addEventListener("click", () => phone.interrupt());
addEventListener("resize", () => conversation.scroll()); // a turned phone still shows the latest

// -- views --------------------------------------------------------------------------------

const memories = new Memories();

for (const button of document.querySelectorAll("nav [data-view]")) {
  button.addEventListener("click", () => show(button.dataset.view));
}

function show(view) {
  for (const button of document.querySelectorAll("nav [data-view]")) {
    button.setAttribute("aria-pressed", String(button.dataset.view === view));
  }
  for (const name of ["chat", "memories", "settings"]) $(`${name}-view`).hidden = name !== view;
  if (view === "memories") memories.open();
  if (view === "settings") showIdentity();
  if (view === "chat") $("message").focus();
}

// -- settings -----------------------------------------------------------------------------

function showIdentity() {
  const { token } = credentials();
  $("identity-now").textContent = token
    ? "You are signed in with an account token."
    : "You are this device (its secret was made here, once, and stays here).";
  $("use-device").hidden = !token;
}

function switchIdentity(token) {
  write("token", token);
  forgetConversation();
  shownOnce = false;
  phone.restart();
  showIdentity();
}

$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("token").value.trim();
  if (!token) return;
  $("token").value = "";
  switchIdentity(token);
});
$("use-device").addEventListener("click", () => switchIdentity(null));
$("leave").addEventListener("click", () => phone.leave());
$("notifications").addEventListener("click", async () => {
  if (!("Notification" in window)) return;
  if ((await Notification.requestPermission()) === "granted") {
    for (const saved of read("chips", [])) if (saved.kind === "reminder") schedule(saved.data);
  }
});

sayWhatIsWithheld($("insecure"), $("notifications"));
conversation.waiting(phone.outbox);
phone.start();
