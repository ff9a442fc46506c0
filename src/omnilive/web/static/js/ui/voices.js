// The voice picker: the engine's default voice, voices stored on the server
// (GET /api/assets/ref_audio), a preset's own voice, or a new one uploaded
// from a file or recorded here (MediaRecorder, then uploaded; the server
// decodes and stores it). Sessions then name a stored voice by id instead of
// re-sending its audio. Engines that cannot clone voices say so here.

import { HttpError, getJSON, getOptional, request } from '../lib/api.js';
import { base64ToFloat32 } from '../lib/b64.js';
import { el, icon } from '../lib/dom.js';
import { onLangChange, t } from '../lib/i18n.js';
import { capabilities } from '../lib/status.js';

const MAX_RECORD_S = 20;

export class VoicePicker {
  /** @param {HTMLElement} root  an empty container */
  constructor(root) {
    this.root = root;
    this.voices = [];
    this.defaultVoice = null;
    this.presetVoice = null; // base64 float32 16 kHz from a preset
    this.storage = true; // does the server store voices?
    this.cloning = true;
    this.recorder = null;
    const id = `voice-${Math.random().toString(36).slice(2, 8)}`;
    this.select = el('select', { id, class: 'voice-select' });
    this.preview = el(
      'button',
      {
        type: 'button',
        class: 'small icon',
        'data-i18n-title': 'voice.preview',
        'data-i18n-label': 'voice.preview',
        onclick: () => this.play(),
      },
      icon('play'),
    );
    this.file = el('input', { type: 'file', accept: 'audio/*,.wav,.mp3,.ogg,.webm,.m4a', hidden: true });
    this.file.addEventListener('change', () => this.uploadFile());
    this.uploadButton = el('button', {
      type: 'button',
      class: 'small',
      'data-i18n': 'voice.upload',
      onclick: () => this.file.click(),
    });
    this.recordButton = el('button', {
      type: 'button',
      class: 'small',
      'data-i18n': 'voice.record',
      onclick: () => this.toggleRecording(),
    });
    this.status = el('span', { class: 'hint voice-status', role: 'status' });
    this.note = el('p', { class: 'hint no-cloning', hidden: true, 'data-i18n': 'voice.no_cloning' });
    root.classList.add('field', 'voice-picker');
    root.replaceChildren(
      el('label', { for: id, 'data-i18n': 'voice.label' }),
      el('div', { class: 'row' }, this.select, this.preview),
      el('div', { class: 'row actions' }, this.uploadButton, this.recordButton, this.file, this.status),
      this.note,
    );
    onLangChange(() => this.draw());
  }

  async load() {
    const caps = await capabilities();
    this.cloning = caps.voice_cloning !== false;
    const [defaults, stored] = await Promise.all([
      getOptional('/api/default_ref_audio', null).catch(() => null),
      getOptional('/api/assets/ref_audio', null).catch(() => null),
    ]);
    this.defaultVoice = defaults;
    this.storage = stored !== null;
    this.voices = stored?.ref_audios || [];
    this.draw();
  }

  draw(selected = this.select.value) {
    const options = [el('option', { value: 'default' }, this.defaultLabel())];
    if (this.presetVoice && this.cloning) options.push(el('option', { value: 'preset' }, t('voice.preset')));
    for (const voice of this.voices) {
      const seconds = voice.duration_s ? ` (${Number(voice.duration_s).toFixed(1)} s)` : '';
      options.push(el('option', { value: `id:${voice.id}` }, `${voice.name || voice.id}${seconds}`));
    }
    this.select.replaceChildren(...options);
    this.select.value = options.some((o) => o.value === selected) ? selected : 'default';
    // Without cloning every choice sounds the same, so there is nothing to choose.
    this.select.disabled = !this.cloning;
    this.note.hidden = this.cloning;
    this.uploadButton.hidden = !this.cloning || !this.storage;
    this.recordButton.hidden = !this.cloning || !this.storage || !window.MediaRecorder;
    this.preview.hidden = !this.cloning && !this.defaultVoice;
  }

  defaultLabel() {
    const d = this.defaultVoice;
    if (!d || !d.name) return t('voice.default');
    return `${t('voice.default')}: ${d.name}`;
  }

  /** A preset's voice (or null): offered, and chosen, while that preset is. */
  setPresetVoice(audio) {
    this.presetVoice = audio || null;
    this.draw(audio ? 'preset' : this.select.value === 'preset' ? 'default' : this.select.value);
  }

  /** Choose a stored voice by id or name (a preset's `voice`); false if unknown. */
  choose(idOrName) {
    const voice = this.voices.find((v) => v.id === idOrName || v.name === idOrName);
    if (!voice) return false;
    this.draw(`id:${voice.id}`);
    return true;
  }

  /** {kind: 'default'} | {kind: 'stored', id} | {kind: 'preset', audio} */
  get value() {
    const value = this.cloning ? this.select.value : 'default';
    if (value.startsWith('id:')) return { kind: 'stored', id: value.slice(3) };
    if (value === 'preset' && this.presetVoice) return { kind: 'preset', audio: this.presetVoice };
    return { kind: 'default' };
  }

  say(key, vars) {
    this.status.textContent = key ? t(key, vars) : '';
  }

  async upload(blob, name) {
    const form = new FormData();
    form.append('file', blob, blob.name || `${name}.webm`);
    form.append('name', name);
    this.say('voice.uploading');
    try {
      const body = await (await request('POST', '/api/assets/ref_audio', { body: form })).json();
      const created = body.voice || body;
      await this.load();
      if (created.id) this.draw(`id:${created.id}`);
      this.say('voice.saved');
    } catch (error) {
      this.say('voice.failed', { error: error.message });
    }
  }

  async uploadFile() {
    const file = this.file.files[0];
    this.file.value = '';
    if (file) await this.upload(file, file.name.replace(/\.[^.]+$/, ''));
  }

  async toggleRecording() {
    if (this.recorder) {
      this.recorder.stop();
      return;
    }
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    } catch (error) {
      this.say('voice.failed', { error: error.message });
      return;
    }
    const pieces = [];
    const recorder = new MediaRecorder(stream);
    this.recorder = recorder;
    recorder.ondataavailable = (event) => event.data.size && pieces.push(event.data);
    const limit = setTimeout(() => recorder.state === 'recording' && recorder.stop(), MAX_RECORD_S * 1000);
    recorder.onstop = async () => {
      clearTimeout(limit);
      stream.getTracks().forEach((track) => track.stop());
      this.recorder = null;
      this.recordButton.dataset.i18n = 'voice.record';
      this.recordButton.textContent = t('voice.record');
      this.recordButton.classList.remove('recording');
      const blob = new Blob(pieces, { type: recorder.mimeType || 'audio/webm' });
      const stamp = new Date().toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
      if (blob.size) await this.upload(blob, t('voice.recorded_name', { time: stamp }));
    };
    recorder.start();
    this.recordButton.dataset.i18n = 'voice.stop_recording';
    this.recordButton.textContent = t('voice.stop_recording');
    this.recordButton.classList.add('recording');
    this.say('voice.recording', { seconds: MAX_RECORD_S });
  }

  /** Listen to the chosen voice. */
  async play() {
    const value = this.value;
    try {
      if (value.kind === 'preset') return playPcm(base64ToFloat32(value.audio), 16000);
      if (value.kind === 'default') {
        const d = this.defaultVoice || (await getJSON('/api/default_ref_audio'));
        return playPcm(base64ToFloat32(d.base64), d.sample_rate || 16000);
      }
      const response = await request('GET', `/api/assets/ref_audio/${encodeURIComponent(value.id)}/audio`);
      // The server may answer with JSON (base64 PCM) or with the audio file itself.
      if ((response.headers.get('content-type') || '').includes('json')) {
        const body = await response.json();
        return playPcm(base64ToFloat32(body.base64), body.sample_rate || 16000);
      }
      const audio = new Audio(URL.createObjectURL(await response.blob()));
      await audio.play();
    } catch (error) {
      this.say('voice.failed', { error: error instanceof HttpError ? error.message : String(error) });
    }
  }
}

let previewContext = null;

function playPcm(samples, rate) {
  previewContext ??= new AudioContext();
  const buffer = previewContext.createBuffer(1, samples.length, rate);
  buffer.copyToChannel(samples, 0);
  const source = previewContext.createBufferSource();
  source.buffer = buffer;
  source.connect(previewContext.destination);
  source.start();
}

/**
 * How a voice choice goes into each protocol (stored voices by id, a preset's
 * voice as audio); `fields` is one of VOICE_FIELDS.
 */
export const VOICE_FIELDS = {
  chat: { id: 'ref_audio_id', audio: 'ref_audio_data' }, // inside `tts`
  half_duplex: { id: 'ref_audio_id', audio: 'ref_audio_base64' }, // in prepare
  duplex: { id: 'tts_ref_audio_id', audio: 'tts_ref_audio_base64' }, // in prepare
};

export function voiceFields(value, fields) {
  if (value.kind === 'stored') return { [fields.id]: value.id };
  if (value.kind === 'preset') return { [fields.audio]: value.audio };
  return {};
}
