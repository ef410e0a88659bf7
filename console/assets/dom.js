// Building DOM nodes from data without ever parsing data as HTML.

/**
 * An element: `h('a', { href: '#/x', class: 'link' }, 'text', child)`. Attributes
 * starting with `on` are listeners; `null`/`false` attributes and children are skipped.
 */
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith('on')) element.addEventListener(name.slice(2), value);
    else if (value === true) element.setAttribute(name, '');
    else element.setAttribute(name, String(value));
  }
  append(element, children);
  return element;
}

/** An SVG element, as `h` builds HTML ones. */
export function s(tag, attributes = {}, ...children) {
  const element = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === null || value === undefined || value === false) continue;
    element.setAttribute(name, String(value));
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces everything in `element` with `children`. */
export function replace(element, ...children) {
  element.replaceChildren();
  append(element, children);
}

/** A table with a caption, head row and body rows (each an array of cells). */
export function table(caption, headers, rows, { footer = null, testId = null } = {}) {
  // Focusable, so that a table wider than the screen scrolls from the keyboard too.
  return h('div', { class: 'table-wrap', tabindex: '0', role: 'region', 'aria-label': caption },
    h('table', { 'data-testid': testId },
      h('caption', {}, caption),
      h('thead', {}, h('tr', {}, headers.map((header) => h('th', { scope: 'col' }, header)))),
      h('tbody', {}, rows.map((row) => h('tr', {}, row.map((cell, index) =>
        index === 0 ? h('th', { scope: 'row' }, cell) : h('td', {}, cell))))),
      footer && h('tfoot', {}, h('tr', {}, footer.map((cell, index) =>
        index === 0 ? h('th', { scope: 'row' }, cell) : h('td', {}, cell)))),
    ));
}

/** A time as a `<time>` element, shown in UTC to the second. */
export function time(value) {
  if (!value) return '—';
  const shown = new Date(value).toISOString().slice(0, 19).replace('T', ' ');
  return h('time', { datetime: value }, `${shown} UTC`);
}

/** A status as text (the text carries the meaning; the colour only repeats it). */
export function statusBadge(status) {
  return h('span', { class: `status status-${String(status).toLowerCase()}` }, status);
}

/** A message for screen readers and eyes alike. */
export function notice(text, kind = 'info') {
  return h('p', { class: `notice notice-${kind}`, role: kind === 'error' ? 'alert' : 'status' }, text);
}
