// English and Chinese. Static text is marked in the HTML with data-i18n
// (textContent), data-i18n-placeholder, data-i18n-title and data-i18n-label
// (aria-label); dynamic text calls t(). The choice is remembered in
// localStorage; the first visit follows the browser's language.

import en from './strings-en.js';
import zh from './strings-zh.js';

const KEY = 'omnilive.lang';
const DICTIONARIES = { en, zh };
const listeners = new Set();

function initial() {
  const stored = localStorage.getItem(KEY);
  if (stored && stored in DICTIONARIES) return stored;
  return (navigator.language || '').toLowerCase().startsWith('zh') ? 'zh' : 'en';
}

let current = initial();

export function lang() {
  return current;
}

/** The text of `key` in the current language, with {name} placeholders filled. */
export function t(key, vars = {}) {
  const text = DICTIONARIES[current][key] ?? en[key] ?? key;
  return text.replace(/\{(\w+)\}/g, (whole, name) => (name in vars ? String(vars[name]) : whole));
}

/** A server object's localized field: `name_zh` in Chinese when present. */
export function localized(item, field = 'name') {
  if (current === 'zh' && item[`${field}_zh`]) return item[`${field}_zh`];
  return item[field] ?? '';
}

/** Fill every marked element under `root`. */
export function translate(root = document) {
  for (const node of root.querySelectorAll('[data-i18n]')) node.textContent = t(node.dataset.i18n);
  for (const node of root.querySelectorAll('[data-i18n-placeholder]')) {
    node.placeholder = t(node.dataset.i18nPlaceholder);
  }
  for (const node of root.querySelectorAll('[data-i18n-title]')) node.title = t(node.dataset.i18nTitle);
  for (const node of root.querySelectorAll('[data-i18n-label]')) {
    node.setAttribute('aria-label', t(node.dataset.i18nLabel));
  }
  const title = document.querySelector('meta[name="page-title"]');
  if (title) document.title = `${t(title.content)} · omnilive`;
}

export function setLang(value) {
  if (!(value in DICTIONARIES) || value === current) return;
  current = value;
  localStorage.setItem(KEY, value);
  document.documentElement.lang = value === 'zh' ? 'zh-CN' : 'en';
  translate();
  for (const listener of listeners) listener(value);
}

/** Run `listener` after every language change (to redraw dynamic text). */
export function onLangChange(listener) {
  listeners.add(listener);
  return () => listeners.delete(listener);
}

document.documentElement.lang = current === 'zh' ? 'zh-CN' : 'en';
