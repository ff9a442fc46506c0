// The API key prompt of a server that has keys. api.js opens it when the
// server answers 401 (no key, or a key it no longer accepts) or 403 to a
// key without the admin role; the page's request then goes on with the key.

import { el } from './dom.js';
import { t } from './i18n.js';

let pending = null; // one prompt at a time: requests that fail together wait on the same one
// Once the user cancels, the page's other requests fail quietly instead of
// asking again; the header then offers to sign in (see ui/nav.js).
let declined = false;

/** Fired on window when the user cancels the prompt. */
export const SIGN_IN_DECLINED = 'omnilive-sign-in-declined';

/**
 * Ask for a key. `reason` is a strings key: 'login.needed', 'login.rejected'
 * or 'login.admin'. Resolves to {key, remember}, or null when the user
 * cancels (now or earlier on this page, unless `again` is set).
 */
export function askForKey(reason, { again = false } = {}) {
  if (declined && !again) return Promise.resolve(null);
  pending ??= showPrompt(reason).then((answer) => {
    pending = null;
    declined = answer === null;
    if (declined) window.dispatchEvent(new Event(SIGN_IN_DECLINED));
    return answer;
  });
  return pending;
}

function showPrompt(reason) {
  return new Promise((resolve) => {
    const input = el('input', {
      type: 'password',
      id: 'login-key',
      name: 'key',
      required: true,
      autocomplete: 'current-password',
      spellcheck: 'false',
      'data-i18n-placeholder': 'login.placeholder',
    });
    input.placeholder = t('login.placeholder');
    const remember = el('input', { type: 'checkbox', id: 'login-remember' });
    const form = el(
      'form',
      { method: 'dialog' },
      el('h2', { 'data-i18n': 'login.title' }),
      el('p', { class: `login-reason ${reason === 'login.needed' ? '' : 'warn'}`, 'data-i18n': reason }),
      el('label', { for: 'login-key', class: 'field-label', 'data-i18n': 'login.key' }),
      input,
      el('label', { class: 'check' }, remember, el('span', { 'data-i18n': 'login.remember' })),
      el(
        'div',
        { class: 'row end' },
        el('button', { type: 'button', id: 'login-cancel', value: 'cancel', 'data-i18n': 'login.cancel' }),
        el('button', { type: 'submit', id: 'login-submit', class: 'primary', value: 'ok', 'data-i18n': 'login.submit' }),
      ),
    );
    const dialog = el('dialog', { class: 'login card', id: 'login' }, form);
    const close = (answer) => {
      dialog.close();
      dialog.remove();
      resolve(answer);
    };
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      const key = input.value.trim();
      if (key) close({ key, remember: remember.checked });
    });
    form.querySelector('#login-cancel').addEventListener('click', () => close(null));
    dialog.addEventListener('cancel', (event) => {
      event.preventDefault(); // Escape: the same as the cancel button
      close(null);
    });
    document.body.append(dialog);
    dialog.showModal();
    input.focus();
  });
}
