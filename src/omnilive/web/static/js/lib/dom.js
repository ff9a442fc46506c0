// Tiny DOM helpers: pages build their dynamic parts with el() instead of
// innerHTML so that nothing the server or a user sends is parsed as markup.

import { t } from './i18n.js';

export function $(selector, root = document) {
  return root.querySelector(selector);
}

export function $$(selector, root = document) {
  return Array.from(root.querySelectorAll(selector));
}

/**
 * el('button', {class: 'primary', onclick: fn, 'data-i18n': 'start'}, 'Start')
 * Attributes starting with "on" become listeners; `text` sets textContent;
 * null / false attributes are left out.
 */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') {
      node.addEventListener(key.slice(2), value);
    } else if (key === 'text') {
      node.textContent = value;
    } else if (key === 'class') {
      node.className = value;
    } else if (value === true) {
      node.setAttribute(key, '');
    } else {
      node.setAttribute(key, String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  // Elements marked for translation start out in the current language.
  const { i18n, i18nTitle, i18nLabel } = node.dataset;
  if (i18n && !node.hasChildNodes()) node.textContent = t(i18n);
  if (i18nTitle) node.title = t(i18nTitle);
  if (i18nLabel) node.setAttribute('aria-label', t(i18nLabel));
  return node;
}

const SVG = 'http://www.w3.org/2000/svg';

/** An icon of /static/icons.svg (a sprite, so no icon depends on the system's emoji font). */
export function icon(name) {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', 'i');
  svg.setAttribute('aria-hidden', 'true');
  const use = document.createElementNS(SVG, 'use');
  use.setAttribute('href', `/static/icons.svg#${name}`);
  svg.append(use);
  return svg;
}

/** m:ss (or h:mm:ss) for a number of seconds. */
export function clock(seconds) {
  const s = Math.max(0, Math.round(seconds));
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const rest = String(s % 60).padStart(2, '0');
  return h ? `${h}:${String(m).padStart(2, '0')}:${rest}` : `${m}:${rest}`;
}

/** A local date and time for an ISO string or epoch seconds. */
export function when(value) {
  if (value === null || value === undefined || value === '') return '—';
  const date = typeof value === 'number' ? new Date(value * 1000) : new Date(value);
  return Number.isNaN(date.getTime()) ? String(value) : date.toLocaleString();
}

export function show(node, visible) {
  node.hidden = !visible;
}
