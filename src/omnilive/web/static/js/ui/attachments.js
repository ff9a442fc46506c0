// Chat attachments: files (picked, dropped or recorded) turned into the
// chat protocol's content items, shown as removable chips until sent.

import { decodeTo16k } from '../audio/decode.js';
import { blobToBase64, float32ToBase64 } from '../lib/b64.js';
import { el, icon } from '../lib/dom.js';
import { t } from '../lib/i18n.js';

const WARN_BYTES = 48 * 1024 * 1024; // under the server's 64 MiB message limit, with room for base64

export class Attachments {
  /** @param {HTMLElement} root  @param {{vision: boolean, onError: (string) => void}} options */
  constructor(root, { vision = true, onError = () => {} } = {}) {
    this.root = root;
    this.vision = vision;
    this.onError = onError;
    this.items = []; // {kind, label, item, url?}
  }

  get accept() {
    return this.vision ? 'image/*,audio/*,video/*' : 'audio/*';
  }

  get empty() {
    return this.items.length === 0;
  }

  /** Add files of any supported kind; the others are refused with a message. */
  async addFiles(files) {
    for (const file of files) {
      try {
        await this.addFile(file);
      } catch (error) {
        this.onError(t('chat.attach_failed', { name: file.name, error: error.message }));
      }
    }
  }

  async addFile(file) {
    if (file.size > WARN_BYTES) throw new Error(t('chat.too_large'));
    const kind = file.type.split('/')[0];
    if ((kind === 'image' || kind === 'video') && !this.vision) throw new Error(t('chat.no_vision'));
    if (kind === 'image') {
      this.push({
        kind,
        label: file.name,
        url: URL.createObjectURL(file),
        item: { type: 'image', data: await blobToBase64(file) },
      });
    } else if (kind === 'video') {
      this.push({
        kind,
        label: file.name,
        item: { type: 'video', data: await blobToBase64(file), stack_frames: 1 },
      });
    } else if (kind === 'audio') {
      this.addAudio(await decodeTo16k(file), file.name);
    } else {
      throw new Error(t('chat.unsupported_file'));
    }
  }

  /** 16 kHz float32 speech (a push-to-talk recording or a decoded file). */
  addAudio(samples, label = t('chat.voice_message')) {
    const seconds = (samples.length / 16000).toFixed(1);
    this.push({
      kind: 'audio',
      label: `${label} (${seconds} s)`,
      item: { type: 'audio', data: float32ToBase64(samples), sample_rate: 16000 },
    });
  }

  push(entry) {
    this.items.push(entry);
    this.draw();
  }

  /** The content items, and the chips' previews for the sent message; clears the list. */
  take() {
    const taken = this.items;
    this.items = [];
    this.draw();
    return taken;
  }

  draw() {
    this.root.hidden = this.items.length === 0;
    this.root.replaceChildren(
      ...this.items.map((entry, index) =>
        el(
          'span',
          { class: `chip attachment ${entry.kind}` },
          entry.url ? el('img', { src: entry.url, alt: '' }) : icon(ICON[entry.kind]),
          el('span', { class: 'name' }, entry.label),
          el(
            'button',
            {
              type: 'button',
              class: 'remove',
              'aria-label': t('chat.remove'),
              onclick: () => {
                this.items.splice(index, 1);
                this.draw();
              },
            },
            '×',
          ),
        ),
      ),
    );
  }
}

const ICON = { image: 'camera', audio: 'mic', video: 'camera' };

/** The chip-like preview of sent attachments inside a message bubble. */
export function attachmentPreview(entries) {
  if (!entries.length) return null;
  return el(
    'div',
    { class: 'sent-attachments' },
    entries.map((entry) =>
      entry.url
        ? el('img', { src: entry.url, alt: entry.label, class: 'thumb' })
        : el('span', { class: 'chip' }, icon(ICON[entry.kind]), entry.label),
    ),
  );
}
