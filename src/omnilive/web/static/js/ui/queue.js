// Waiting in the queue: position, queue length and a countdown from the
// server's estimate. The estimate is refreshed by every queue_update; between
// updates the countdown runs down on its own once a second.

import { clock, el } from '../lib/dom.js';
import { onLangChange, t } from '../lib/i18n.js';

export class QueueView {
  /** @param {HTMLElement} root  @param {{onLeave?: () => void}} options */
  constructor(root, { onLeave = null } = {}) {
    this.root = root;
    this.root.classList.add('queue');
    this.root.hidden = true;
    this.root.setAttribute('role', 'status');
    this.text = el('span', { class: 'queue-text' });
    this.eta = el('strong', { class: 'queue-eta' });
    const leave = onLeave
      ? el(
          'button',
          { type: 'button', class: 'small', 'data-i18n': 'queue.leave', onclick: onLeave },
          t('queue.leave'),
        )
      : null;
    this.root.replaceChildren(
      el('span', { class: 'spinner', 'aria-hidden': 'true' }),
      this.text,
      this.eta,
      leave,
    );
    this.state = null;
    this.timer = null;
    onLangChange(() => this.draw());
  }

  /** A queued / queue_update message (or its realtime twin). */
  update(message) {
    this.state = {
      position: message.position,
      length: message.queue_length ?? null,
      deadline: Date.now() + (message.estimated_wait_s ?? 0) * 1000,
    };
    this.root.hidden = false;
    this.root.dataset.position = String(message.position);
    this.timer ??= setInterval(() => this.draw(), 1000);
    this.draw();
  }

  draw() {
    if (!this.state) return;
    const { position, length, deadline } = this.state;
    this.text.textContent =
      length !== null ? t('queue.position_of', { position, length }) : t('queue.position', { position });
    const left = (deadline - Date.now()) / 1000;
    this.eta.textContent = left > 0.5 ? t('queue.eta', { time: clock(left) }) : t('queue.soon');
  }

  /** Out of the queue (served, left, or the connection closed). */
  done() {
    clearInterval(this.timer);
    this.timer = null;
    this.state = null;
    this.root.hidden = true;
    delete this.root.dataset.position;
  }
}
