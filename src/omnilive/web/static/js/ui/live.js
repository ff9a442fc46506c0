// What the live voice pages (half-duplex, audio and omni duplex) do alike
// around their sessions: open the socket with the session's prepare, and link
// the recording once the session is over.

import { el } from '../lib/dom.js';
import { t } from '../lib/i18n.js';
import { notify } from './nav.js';

/**
 * Connect and send the session's prepare. The server keeps a prepare sent
 * while queued and applies it once a worker is free, so it goes at once.
 * False, with the error shown, when the connection cannot be made.
 * @param {import('../lib/socket.js').LiveSocket} socket  @param {object} prepare
 */
export async function connectAndPrepare(socket, prepare) {
  try {
    await socket.connect();
    socket.send(prepare);
    return true;
  } catch (error) {
    notify(t('error.connect', { error: error.message }), 'error');
    return false;
  }
}

/** A last transcript line linking a finished session's recording (in a new tab). */
export function appendRecordingLink(transcript, recordingId) {
  const link = el(
    'a',
    { href: `/s/${encodeURIComponent(recordingId)}`, target: '_blank' },
    t('live.view_recording'),
  );
  transcript.append(el('li', { class: 'turn system' }, link));
}
