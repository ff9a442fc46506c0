// What the live voice pages (half-duplex, audio and omni duplex) do alike
// around their sessions: connect (WebRTC, else the WebSocket) with the
// session's prepare, and link the recording once the session is over.

import { el } from '../lib/dom.js';
import { t } from '../lib/i18n.js';
import { connectLive } from '../lib/rtc.js';
import { notify } from './nav.js';

/**
 * Connect and send the session's prepare. The server keeps a prepare sent
 * while queued and applies it once a worker is free, so it goes at once.
 * The open connection (LiveRtc or LiveSocket), or null with the error shown.
 * A fallback from WebRTC to the WebSocket is shown, and the session goes on.
 * @param {object} options  connectLive()'s  @param {object} prepare
 */
export async function openAndPrepare(options, prepare) {
  try {
    const live = await connectLive({ ...options, onFallback: (text) => notify(text, 'info') });
    // A function of the connection: what the session asks for may depend on the transport.
    live.send(typeof prepare === 'function' ? prepare(live) : prepare);
    return live;
  } catch (error) {
    notify(t('error.connect', { error: error.message }), 'error');
    return null;
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
