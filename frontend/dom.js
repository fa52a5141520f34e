// DOM building helpers: elements from createElement/textContent only, never HTML strings.

/**
 * el('div', {class: 'tbn-x', text: 'hi', title: 't', data: {file: 'a'}, on: {click: f}}, ...kids)
 * Attributes other than class/text/data/on are set with setAttribute.
 */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null) continue;
    if (key === 'class') node.className = value;
    else if (key === 'text') node.textContent = String(value);
    else if (key === 'data') Object.assign(node.dataset, value);
    else if (key === 'on') for (const [ev, fn] of Object.entries(value)) node.addEventListener(ev, fn);
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/**
 * Returns schedule(): draw() runs once on the next animation frame, however many
 * times schedule() is called before then (scroll and resize bursts).
 */
export function frameScheduler(draw) {
  let pending = 0;
  return () => {
    if (pending) return;
    pending = requestAnimationFrame(() => {
      pending = 0;
      draw();
    });
  };
}

/** Replaces a node's children. */
export function setChildren(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
}

/** A pane: a titled box whose body views own. */
export function pane(title, name) {
  const status = el('span', {class: 'tbn-pane-status'});
  const tools = el('span', {class: 'tbn-pane-tools'});
  const body = el('div', {class: 'tbn-pane-body'});
  const root = el('section', {class: `tbn-pane tbn-pane-${name}`, data: {pane: name}},
    el('header', {class: 'tbn-pane-title'}, el('span', {text: title}), status, tools), body);
  return {root, body, status, tools};
}

/**
 * A message filling a pane body: kind 'empty' (nothing to show yet, with a hint), 'loading', or
 * 'error' (red, role=alert so it is never mistaken for an empty list). `action` ({label, run})
 * adds a button, e.g. Retry.
 */
export function message(kind, text, hint, action) {
  return el('div', {class: `tbn-message tbn-message-${kind}`, role: kind === 'error' ? 'alert' : null,
    data: {message: kind}}, el('div', {text}), hint ? el('div', {class: 'tbn-hint', text: hint}) : null,
  action ? el('button', {type: 'button', class: 'tbn-button tbn-retry', text: action.label,
    on: {click: action.run}}) : null);
}

/** The text shown for any failure: ApiError's one-line description or the error's message. */
export function errorText(err) {
  return err && typeof err.describe === 'function' ? err.describe() : String(err && err.message || err);
}

/**
 * Health chips as spans (classes tbn-chip-bad / -muted / -plain). Unlabelled chips are fixed-width
 * cells under a column header, which keeps nine of them in a list row.
 */
export function chipNodes(chips, labelled = true) {
  return chips.map((c) => el('span', {class: `tbn-chip tbn-chip-${c.tone} tbn-chip-${c.key}`,
    title: c.title, data: {chip: c.key}},
  labelled ? el('span', {class: 'tbn-chip-label', text: c.label}) : null, c.text));
}

/**
 * Scrolls `container` (only it: never the page or TensorBoard's frame, as scrollIntoView may) so
 * that `node`, one of its descendants, is in view.
 */
export function revealIn(container, node) {
  const top = node.getBoundingClientRect().top - container.getBoundingClientRect().top;
  if (top < 0 || top + node.offsetHeight > container.clientHeight) {
    container.scrollTop += top - Math.max(0, (container.clientHeight - node.offsetHeight) / 2);
  }
}
