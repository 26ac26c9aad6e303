// Building the page from data. Text from the model or the person only ever becomes a text
// node (textContent): never markup, whatever it contains (`el`, shared with the live view).

export { el } from "./el.js";

export function $(id) {
  return document.getElementById(id);
}

/** Ask in a modal dialog; resolves true when the person confirms. */
export function confirmDialog(text, ok) {
  const dialog = $("confirm");
  $("confirm-text").textContent = text;
  $("confirm-ok").textContent = ok;
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
  });
}
