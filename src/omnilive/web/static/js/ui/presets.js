// The preset picker: who the assistant is, per mode (GET /api/presets). A
// preset fills the system prompt and may bring audio (a voice sample in the
// system prompt, a TTS voice), fetched only when the preset is used. Servers
// without presets hide the picker.

import { getJSON, getOptional } from '../lib/api.js';
import { el } from '../lib/dom.js';
import { localized, onLangChange, t } from '../lib/i18n.js';

let catalogPromise = null;
// The listing is keyed by the reference's folder names, which differ from our
// mode names for half-duplex only.
const LISTING_KEY = { half_duplex: 'half_duplex_audio' };

function catalog() {
  catalogPromise ??= getOptional('/api/presets', {}).catch(() => ({}));
  return catalogPromise;
}

export class PresetPicker {
  /**
   * @param {HTMLElement} root  an empty container
   * @param {string} mode  turnbased | half_duplex | audio_duplex | omni
   * @param {{onChange?: (preset|null) => void}} options
   */
  constructor(root, mode, { onChange = () => {} } = {}) {
    this.root = root;
    this.mode = mode;
    this.onChange = onChange;
    this.presets = [];
    this.audioCache = new Map();
    this.select = el('select', { id: `preset-${mode}`, class: 'preset-select' });
    this.select.addEventListener('change', () => this.onChange(this.selected));
    root.classList.add('field');
    root.hidden = true;
    root.replaceChildren(
      el('label', { for: this.select.id, 'data-i18n': 'preset.label' }, t('preset.label')),
      this.select,
    );
    onLangChange(() => this.draw());
  }

  /** Load the mode's presets; selects the first one (and reports it). */
  async load() {
    const all = await catalog();
    this.presets = [...(all[LISTING_KEY[this.mode] || this.mode] || [])].sort((a, b) => (a.order ?? 0) - (b.order ?? 0));
    this.root.hidden = this.presets.length === 0;
    this.draw();
    if (this.presets.length) {
      this.select.value = this.presets[0].id;
      this.onChange(this.selected);
    }
    return this.presets;
  }

  draw() {
    const value = this.select.value;
    this.select.replaceChildren(
      el('option', { value: '' }, t('preset.custom')),
      ...this.presets.map((p) => el('option', { value: p.id }, localized(p))),
    );
    this.select.value = value;
  }

  /** The chosen preset, or null for a custom prompt. */
  get selected() {
    return this.presets.find((p) => p.id === this.select.value) || null;
  }

  /** Forget the preset once the user edits the prompt by hand. */
  clear() {
    this.select.value = '';
  }

  /**
   * The chosen preset's audio: {system_audio: [b64...], voice_audio: b64|null}, from
   * the server's {system_content_audio: [{data}], ref_audio: {data}}.
   */
  async audio() {
    const preset = this.selected;
    if (!preset || !(preset.has_audio || preset.ref_audio)) return { system_audio: [], voice_audio: null };
    if (!this.audioCache.has(preset.id)) {
      const path = `/api/presets/${encodeURIComponent(this.mode)}/${encodeURIComponent(preset.id)}/audio`;
      this.audioCache.set(preset.id, getJSON(path));
    }
    try {
      const body = await this.audioCache.get(preset.id);
      return {
        system_audio: (body.system_content_audio || []).map((clip) => clip.data).filter(Boolean),
        voice_audio: body.ref_audio?.data || null,
      };
    } catch (error) {
      this.audioCache.delete(preset.id);
      throw error;
    }
  }
}
