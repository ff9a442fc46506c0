// The admin page's list of stored voices, each with its length and age and
// a delete button (deleting is an administrator's action; sessions that
// already loaded a voice keep their copy).

import { getOptional, request } from '../lib/api.js';
import { el, when } from '../lib/dom.js';
import { t } from '../lib/i18n.js';

export class VoiceAdmin {
  /** @param {HTMLElement} root  a <table>  @param {(text: string, kind: string) => void} notify */
  constructor(root, notify) {
    this.root = root;
    this.notify = notify;
    this.voices = null; // null: this server stores no voices
  }

  async load() {
    const body = await getOptional('/api/assets/ref_audio', null).catch(() => null);
    this.voices = body ? body.ref_audios : null;
    this.draw();
  }

  async remove(voice) {
    if (!window.confirm(t('admin.voice_confirm', { name: voice.name || voice.id }))) return;
    try {
      await request('DELETE', `/api/assets/ref_audio/${encodeURIComponent(voice.id)}`);
      this.notify(t('admin.voice_deleted', { name: voice.name || voice.id }), 'ok');
    } catch (error) {
      this.notify(error.message, 'error');
    }
    await this.load();
  }

  draw() {
    const head = ['admin.col.voice', 'admin.col.length', 'admin.col.created', ''];
    const rows = (this.voices || []).map((voice) =>
      el(
        'tr',
        { 'data-voice': voice.id },
        el(
          'td',
          {},
          el('strong', {}, voice.name || '—'),
          el('div', { class: 'hint' }, el('code', {}, voice.id)),
        ),
        el('td', {}, voice.duration_s != null ? `${Number(voice.duration_s).toFixed(1)} s` : '—'),
        el('td', {}, when(voice.created_at)),
        el(
          'td',
          {},
          el(
            'button',
            { type: 'button', class: 'small danger', onclick: () => this.remove(voice) },
            t('admin.delete'),
          ),
        ),
      ),
    );
    const empty = this.voices === null ? 'admin.no_voice_store' : 'admin.no_voices';
    this.root.replaceChildren(
      el(
        'thead',
        {},
        el(
          'tr',
          {},
          head.map((key) => el('th', {}, key ? t(key) : '')),
        ),
      ),
      el(
        'tbody',
        {},
        rows.length ? rows : el('tr', {}, el('td', { colspan: head.length, class: 'empty hint' }, t(empty))),
      ),
    );
  }
}
