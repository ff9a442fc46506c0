// The live pages' WebRTC transport (docs/webrtc.md): the microphone (and the
// camera, for omni) as tracks of one peer connection, the answer played from
// its audio track, the protocol's JSON messages on a data channel. With the
// answer on the same connection the browser cancels its echo, so the
// microphone can stay open while the model speaks. LiveRtc has LiveSocket's
// face; connectLive() tries it first and falls back to the WebSocket, saying so.

import { getOptional, request } from './api.js';
import { t } from './i18n.js';
import { deliver, LiveSocket } from './socket.js';

const CONNECT_TIMEOUT_MS = 8000; // ICE and DTLS on a LAN take well under a second
const GATHER_TIMEOUT_MS = 2000; // host candidates come at once; STUN may take longer
const CHANNEL = 'oai-events'; // OpenAI's name; the server takes any
// Browsers send data-channel messages of at most 256 KiB; larger ones (a
// prepare with a voice) go as binary fragments: [1 = more follow | 0 = last] + UTF-8.
const FRAGMENT_BYTES = 64 * 1024;

/** ?transport=websocket|webrtc on the page's URL pins one (tests, debugging). */
function wantedTransport() {
  return new URLSearchParams(location.search).get('transport');
}

function gathered(pc) {
  if (pc.iceGatheringState === 'complete') return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, GATHER_TIMEOUT_MS);
    pc.addEventListener('icegatheringstatechange', () => {
      if (pc.iceGatheringState === 'complete') {
        clearTimeout(timer);
        resolve();
      }
    });
  });
}

export class LiveRtc {
  /**
   * @param {string} path  the signalling path, e.g. '/api/webrtc/half_duplex/hd_...'
   * @param {{params?: object, queue?: object, onMessage?: Function, onClose?: Function,
   *          tracks?: MediaStreamTrack[]}} options
   */
  constructor(path, { params = {}, queue = null, onMessage = () => {}, onClose = () => {}, tracks = [] } = {}) {
    this.path = path;
    this.params = params;
    this.queue = queue;
    this.onMessage = onMessage;
    this.onClose = onClose;
    this.tracks = tracks;
    this.pc = null;
    this.channel = null;
    this.callId = null;
    this.wasOpen = false;
    this.sent = 0;
    this.transport = 'webrtc';
    this.audio = new Audio();
    this.audio.autoplay = true;
  }

  get open() {
    return this.channel !== null && this.channel.readyState === 'open';
  }

  /** Bytes accepted by send() but not yet on the network. */
  get backlog() {
    return this.channel ? this.channel.bufferedAmount : 0;
  }

  async connect() {
    const config = await getOptional('/api/webrtc/config', { enabled: false });
    if (!config.enabled) throw new Error(t('rtc.off'));
    const pc = new RTCPeerConnection({ iceServers: config.ice_servers || [] });
    this.pc = pc;
    for (const track of this.tracks) pc.addTrack(track, new MediaStream([track]));
    if (!this.tracks.some((track) => track.kind === 'audio')) pc.addTransceiver('audio');
    pc.ontrack = (event) => {
      if (event.track.kind !== 'audio') return;
      this.audio.srcObject = new MediaStream([event.track]);
      this.audio.play().catch(() => {}); // started from the page's click
    };
    const channel = pc.createDataChannel(CHANNEL);
    this.channel = channel;
    channel.onmessage = (event) => deliver(event.data, this.queue, this.onMessage);
    await pc.setLocalDescription(await pc.createOffer());
    await gathered(pc);
    const query = new URLSearchParams(this.params).toString();
    const target = query ? `${this.path}?${query}` : this.path;
    const response = await request('POST', target, { body: pc.localDescription.sdp });
    this.callId = (response.headers.get('Location') || '').split('/').pop() || null;
    await pc.setRemoteDescription({ type: 'answer', sdp: await response.text() });
    await this.opened();
    this.wasOpen = true;
    channel.onclose = () => this.closed();
    pc.onconnectionstatechange = () => {
      if (pc.connectionState === 'failed' || pc.connectionState === 'closed') this.closed();
    };
    return this;
  }

  opened() {
    return new Promise((resolve, reject) => {
      const fail = (why) => {
        clearTimeout(timer);
        reject(new Error(why));
      };
      const timer = setTimeout(() => fail(t('rtc.timeout')), CONNECT_TIMEOUT_MS);
      this.channel.onopen = () => {
        clearTimeout(timer);
        resolve();
      };
      this.pc.oniceconnectionstatechange = () => {
        if (this.pc.iceConnectionState === 'failed') fail(t('rtc.ice_failed'));
      };
    });
  }

  closed() {
    if (!this.pc) return;
    this.pc = null;
    this.queue?.done();
    this.onClose({ code: 1000, reason: '' });
  }

  /**
   * Audio goes on the track: an audio_chunk is not sent, only counted as sent;
   * its force_listen travels alone, marking the server's next chunk.
   */
  send(message) {
    if (!this.open) return false;
    if (message.type !== 'audio_chunk') this.sendText(JSON.stringify(message));
    else if (message.force_listen) {
      this.channel.send(JSON.stringify({ type: 'audio_chunk', audio_base64: '', force_listen: true }));
    }
    this.sent += 1;
    return true;
  }

  sendText(text) {
    if (text.length < FRAGMENT_BYTES / 4) {
      this.channel.send(text);
      return;
    }
    const bytes = new TextEncoder().encode(text);
    for (let start = 0; start < bytes.length || start === 0; start += FRAGMENT_BYTES) {
      const part = bytes.subarray(start, start + FRAGMENT_BYTES);
      const fragment = new Uint8Array(part.length + 1);
      fragment[0] = start + FRAGMENT_BYTES < bytes.length ? 1 : 0;
      fragment.set(part, 1);
      this.channel.send(fragment);
    }
  }

  /** Hold the microphone back (silence on the track) or let it through. */
  setMicOpen(open) {
    for (const track of this.tracks) if (track.kind === 'audio') track.enabled = open;
  }

  /** Close; as with a WebSocket, onClose follows (once it was open). */
  close() {
    const pc = this.pc;
    if (!pc) return;
    if (this.callId && !this.wasOpen) {
      // Never connected: the server's half of the call would wait for its timeout.
      request('POST', `/v1/realtime/calls/${this.callId}/hangup`).catch(() => {});
    }
    this.channel?.close();
    pc.close();
    this.audio.srcObject = null;
    if (this.wasOpen) setTimeout(() => this.closed(), 0);
    else this.pc = null;
  }
}

/**
 * Connect over WebRTC, or over the WebSocket when WebRTC cannot connect (the
 * page is told why through `onFallback`). Resolves to the open connection.
 */
export async function connectLive({ rtcPath, wsPath, params = {}, tracks = [], onFallback, ...options }) {
  const wanted = wantedTransport();
  if (wanted !== 'websocket' && window.RTCPeerConnection && tracks.length) {
    const rtc = new LiveRtc(rtcPath, { params, tracks, ...options });
    try {
      await rtc.connect();
      document.body.dataset.transport = 'webrtc';
      return rtc;
    } catch (error) {
      rtc.close();
      if (wanted === 'webrtc') throw error;
      onFallback?.(t('rtc.fallback', { error: error.message }));
    }
  }
  const socket = new LiveSocket(wsPath, { params, ...options });
  await socket.connect();
  socket.transport = 'websocket';
  document.body.dataset.transport = 'websocket';
  return socket;
}
