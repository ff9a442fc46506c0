// The header every page shares: the brand, links to the pages (modes the
// administrator turned off are left out), and the language switch.

import { SIGNED_IN, forgetKey, getOptional, signInAgain, storedKey } from '../lib/api.js';
import { $, el, icon } from '../lib/dom.js';
import { lang, onLangChange, setLang, translate } from '../lib/i18n.js';
import { SIGN_IN_DECLINED } from '../lib/login.js';

export const MODES = ['turnbased', 'half_duplex', 'audio_duplex', 'omni'];

const LINKS = [
  { id: 'home', path: '/', key: 'nav.home' },
  { id: 'turnbased', path: '/turnbased', key: 'mode.turnbased' },
  { id: 'half_duplex', path: '/half_duplex', key: 'mode.half_duplex' },
  { id: 'audio_duplex', path: '/audio_duplex', key: 'mode.audio_duplex' },
  { id: 'omni', path: '/omni', key: 'mode.omni' },
  { id: 'admin', path: '/admin', key: 'nav.admin' },
];

let appsPromise = null;

/**
 * The enabled apps, [{id, name, name_zh, description, path, enabled}], or
 * null when the server has no app registry (then every mode is on).
 */
export function enabledApps() {
  appsPromise ??= getOptional('/api/apps', null)
    .then((body) => (body ? body.apps : null))
    .catch(() => null);
  return appsPromise;
}

export function isEnabled(apps, id) {
  return apps === null || apps.some((app) => app.id === id);
}

function render(header, active) {
  const links = LINKS.map((link) =>
    el('a', {
      href: link.path,
      'data-id': link.id,
      'data-i18n': link.key,
      class: link.id === active ? 'active' : null,
      'aria-current': link.id === active ? 'page' : null,
    }),
  );
  const switcher = el('button', {
    type: 'button',
    class: 'lang-switch',
    id: 'lang-switch',
    onclick: () => setLang(lang() === 'zh' ? 'en' : 'zh'),
  });
  const label = () => {
    // Each language is named in itself, so whoever cannot read the page can still find theirs.
    switcher.replaceChildren(icon('globe'), lang() === 'zh' ? 'English' : '中文');
  };
  label();
  onLangChange(label);
  header.replaceChildren(
    el('a', { class: 'brand', href: '/' }, el('span', { class: 'logo', 'aria-hidden': 'true' }), 'omnilive'),
    el('nav', { class: 'links', 'data-i18n-label': 'nav.label' }, links),
    switcher,
  );
  const offerSignOut = () => {
    if (storedKey() !== null && !header.querySelector('.sign-out')) header.append(signOutButton());
  };
  offerSignOut();
  window.addEventListener(SIGNED_IN, offerSignOut);
  window.addEventListener(SIGN_IN_DECLINED, () => {
    if (!header.querySelector('.sign-in')) header.append(signInButton());
  });
}

/** Shown after the key prompt was cancelled: the page did not load what needs a key. */
function signInButton() {
  return el('button', {
    type: 'button',
    class: 'sign-in primary',
    id: 'sign-in',
    'data-i18n': 'login.sign_in',
    onclick: signInAgain,
  });
}

/** Shown once the page has an API key: forgets it (and its tokens) and starts over. */
function signOutButton() {
  return el('button', {
    type: 'button',
    class: 'sign-out',
    id: 'sign-out',
    'data-i18n': 'login.sign_out',
    onclick: () => {
      forgetKey();
      location.reload();
    },
  });
}

/**
 * Set up the common parts of a page: the header, static translations, and
 * (when the server has an app registry) the mode links that are switched off.
 * Returns the enabled apps (null = all).
 */
export async function initPage(active) {
  const header = $('#site-header');
  if (header) {
    render(header, active);
    // On a phone the links scroll sideways: bring the current page's into view.
    header.querySelector('nav a.active')?.scrollIntoView({ block: 'nearest', inline: 'center' });
  }
  translate();
  // Settings panels sit beside the main card on wide screens and fold away on phones.
  if (window.matchMedia('(min-width: 900px)').matches) {
    for (const panel of document.querySelectorAll('details.settings')) panel.open = true;
  }
  const apps = await enabledApps();
  if (header) {
    for (const link of header.querySelectorAll('nav a')) {
      link.hidden = MODES.includes(link.dataset.id) && !isEnabled(apps, link.dataset.id);
    }
  }
  if (MODES.includes(active) && !isEnabled(apps, active)) {
    const banner = $('#notice');
    banner?.replaceChildren(el('span', { 'data-i18n': 'error.app_disabled' }));
    if (banner) {
      banner.className = 'notice error';
      banner.hidden = false;
      translate(banner);
    }
  }
  return apps;
}

/**
 * Run a page's main(): whatever it fails on (the server unreachable, a key
 * prompt cancelled) is said in the notice bar, not left as an uncaught error.
 */
export function startPage(main) {
  main().catch((error) => notify(error.message, 'error'));
}

/** Show a message in the page's notice bar (kind: info | error | ok); null hides it. */
export function notify(text, kind = 'info') {
  const banner = $('#notice');
  if (!banner) return;
  banner.hidden = !text;
  banner.className = `notice ${kind}`;
  banner.textContent = text || '';
}
