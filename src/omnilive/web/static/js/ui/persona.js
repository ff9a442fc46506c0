// Who the assistant is on a mode page: the preset picker, the system prompt
// box and the voice picker, wired together (choosing a preset fills the
// prompt and offers its voice). Pages turn the result into their protocol's
// fields.

import { $ } from '../lib/dom.js';
import { onLangChange, t } from '../lib/i18n.js';
import { notify } from './nav.js';
import { PresetPicker } from './presets.js';
import { VoicePicker } from './voices.js';

export class Persona {
  /**
   * @param {{mode: string, presetRoot: HTMLElement, prompt: HTMLTextAreaElement,
   *          voiceRoot: HTMLElement, defaultPromptKey: string}} options
   */
  constructor({ mode, presetRoot, prompt, voiceRoot, defaultPromptKey }) {
    this.prompt = prompt;
    this.defaultPromptKey = defaultPromptKey;
    this.voice = new VoicePicker(voiceRoot);
    this.presets = new PresetPicker(presetRoot, mode, { onChange: (preset) => this.usePreset(preset) });
    this.touched = false; // has the user written their own prompt?
    prompt.addEventListener('input', () => {
      this.touched = true;
    });
    // The default prompt follows the language until the user writes their own.
    onLangChange(() => {
      if (!this.touched && !this.presets.selected) this.prompt.value = t(this.defaultPromptKey);
    });
  }

  async load() {
    this.prompt.value = t(this.defaultPromptKey);
    await this.voice.load();
    await this.presets.load();
  }

  async usePreset(preset) {
    if (!preset) {
      this.voice.setPresetVoice(null);
      return;
    }
    this.prompt.value = preset.system_prompt || '';
    this.touched = false;
    if (preset.voice && this.voice.choose(preset.voice)) return;
    try {
      const audio = await this.presets.audio();
      if (this.presets.selected === preset) this.voice.setPresetVoice(audio.voice_audio);
    } catch {
      this.voice.setPresetVoice(null); // the preset still works, in the default voice
    }
  }

  /**
   * Everything a session needs: {prompt, systemAudio: [base64 16 kHz float32],
   * voice: VoicePicker.value}.
   */
  async resolve() {
    let systemAudio = [];
    // A preset's audio is a voice sample: useless to an engine that cannot clone voices.
    if (this.presets.selected?.has_audio && this.voice.cloning) {
      try {
        systemAudio = (await this.presets.audio()).system_audio;
      } catch {
        systemAudio = [];
      }
    }
    return { prompt: this.prompt.value.trim(), systemAudio, voice: this.voice.value };
  }
}

/** A system prompt with a preset's audio items, as chat / half-duplex content lists take it. */
export function systemContent(prompt, systemAudio) {
  return [{ type: 'text', text: prompt }, ...systemAudio.map((data) => ({ type: 'audio', data }))];
}

/**
 * The page's persona (preset, prompt and voice pickers), loading; the body
 * gets data-ready once the pickers are filled (the browser tests wait for it).
 * @param {string} mode  @param {string} defaultPromptKey
 */
export function loadPersona(mode, defaultPromptKey) {
  const persona = new Persona({
    mode,
    presetRoot: $('#preset'),
    prompt: $('#system-prompt'),
    voiceRoot: $('#voice'),
    defaultPromptKey,
  });
  persona
    .load()
    .catch((error) => notify(error.message, 'error'))
    .finally(() => {
      document.body.dataset.ready = 'true';
    });
  return persona;
}
