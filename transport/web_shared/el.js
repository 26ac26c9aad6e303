// One element built from data, for the person's web app and the live view alike (each
// server serves this file beside its own). Text, from the model, a person or an actor, only
// ever becomes a text node (textContent): never markup, whatever it contains.

/**
 * `el("td", { class: "num", text: 3, colspan: 4, onclick: f }, child, ...)`: `class`,
 * `text`, `on…` listeners, other attributes (true: present; false, null, undefined: left
 * out); then the children, nodes or strings (null and undefined skipped).
 */
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
