// Building the page from data. Text from the model or the person only ever becomes a text
// node (textContent): never markup, whatever it contains.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === false || value === null || value === undefined) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

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
