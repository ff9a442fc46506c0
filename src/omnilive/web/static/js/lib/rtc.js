// The live pages' WebRTC transport (docs/webrtc.md): the microphone (and the
// camera, for omni) as tracks of one peer connection, the answer played from
// its audio track, the protocol's JSON messages on a data channel. With the
// answer on the same connection the browser cancels its echo, so the
// microphone can stay open while the model speaks. LiveRtc has LiveSocket's
// face, resuming included (a failed connection is offered again with the
// session's token); connectLive() tries it first and falls back to the
// WebSocket, saying so.

import { getOptional, request } from './api.js';
import { t } from './i18n.js';
import { notify } from '../ui/nav.js';
import { deliver, keepResumeFields, LiveSocket, parsed, retryWithin } from './socket.js';

const CONNECT_TIMEOUT_MS = 8000; // ICE and DTLS on a LAN take well under a second
const GATHER_TIMEOUT_MS = 2000; // host candidates come at once; STUN may take longer
// The camera's frame rate on the call: the server keeps the freshest frame for
// each second of the model's, so this bounds its age (200 ms).
const VIDEO_FPS = 5;
const CHANNEL = 'oai-events'; // OpenAI's name; the server takes any
// A connection that stays 'disconnected' this long is treated as failed: a
// browser takes up to ~30 s to call it so, the server's whole resume grace.
const STALL_MS = 3000;
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
   *          tracks?: MediaStreamTrack[], videoMaxSide?: number}} options
   *   videoMaxSide: the longest side of the camera's frames on the call (the
   *   server's frames are no larger: what is sent above it is only work);
   *   by default the camera's own
   */
  constructor(
    path,
    { params = {}, queue = null, onMessage = () => {}, onClose = () => {}, tracks = [], videoMaxSide = Infinity } = {},
  ) {
    this.path = path;
    this.params = params;
    this.queue = queue;
    this.onMessage = onMessage;
    this.onClose = onClose;
    this.tracks = tracks;
    this.videoMaxSide = videoMaxSide;
    this.pc = null;
    this.channel = null;
    this.callId = null;
    this.iceServers = [];
    this.wasOpen = false;
    this.closing = false; // the page closed it: no resume
    this.sent = 0;
    this.transport = 'webrtc';
    // As LiveSocket: the session's token and the last event's number, for a
    // new offer that continues the session when this connection is lost.
    this.resumeToken = null;
    this.graceMs = 0;
    this.lastSeq = 0;
    this.resumes = 0;
    this.steps = []; // the last call's [step, ms since its offer], for diagnostics
    this.audio = new Audio();
    this.audio.autoplay = true;
    window.omniliveRtc = this; // for tests: the live connection
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
    this.iceServers = config.ice_servers || [];
    await this.call({ ...this.params, seq: '1' });
    this.wasOpen = true;
    return this;
  }

  /** One peer connection: offer, answer, the channel open; then it is this call's. */
  async call(params) {
    const pc = new RTCPeerConnection({ iceServers: this.iceServers });
    const channel = pc.createDataChannel(CHANNEL);
    for (const track of this.tracks) {
      const streams = [new MediaStream([track])];
      if (track.kind === 'video') {
        // The model sees about a frame a second: more is work for both ends.
        // And it reads what is in them: short of bandwidth, the browser is to
        // keep the size (a new call starts low) and give up sharpness or frames.
        track.contentHint = 'detail';
        const { width = 0, height = 0 } = track.getSettings();
        const scaleResolutionDownBy = Math.max(1, Math.max(width, height) / this.videoMaxSide);
        const sendEncodings = [{ maxFramerate: VIDEO_FPS, scaleResolutionDownBy }];
        pc.addTransceiver(track, { direction: 'sendonly', streams, sendEncodings });
      } else pc.addTrack(track, ...streams);
    }
    if (!this.tracks.some((track) => track.kind === 'audio')) pc.addTransceiver('audio');
    pc.ontrack = (event) => {
      if (event.track.kind !== 'audio') return;
      this.audio.srcObject = new MediaStream([event.track]);
      this.audio.play().catch(() => {}); // started from the page's click
    };
    channel.onmessage = (event) => this.received(event.data);
    this.pc = pc;
    this.channel = channel;
    const open = opening(pc, channel);
    this.steps = [];
    const began = performance.now();
    const step = (name) => this.steps.push([name, Math.round(performance.now() - began)]);
    await pc.setLocalDescription(await pc.createOffer());
    await gathered(pc);
    step('gathered');
    const query = new URLSearchParams(params).toString();
    const response = await request('POST', query ? `${this.path}?${query}` : this.path, {
      body: pc.localDescription.sdp,
    });
    this.callId = (response.headers.get('Location') || '').split('/').pop() || null;
    await pc.setRemoteDescription({ type: 'answer', sdp: await response.text() });
    step('answered');
    open.arm();
    try {
      await open.promise;
    } finally {
      step(`${pc.iceConnectionState}/${channel.readyState}`);
    }
    // A channel that closes with the connection failing went with the network.
    const failing = () => ['failed', 'disconnected'].includes(pc.connectionState);
    channel.onclose = () => this.lost(pc, failing() ? 'failed' : 'closed');
    let stalled = null; // ICE 'disconnected' may mend by itself; failing to, it is lost
    pc.onconnectionstatechange = () => {
      clearTimeout(stalled);
      const state = pc.connectionState;
      if (state === 'failed' || state === 'closed') this.lost(pc, state);
      else if (state === 'disconnected') stalled = setTimeout(() => this.lost(pc, 'failed'), STALL_MS);
    };
  }

  received(data) {
    const message = parsed(data);
    if (message !== null && !keepResumeFields(this, message)) {
      deliver(message, this.queue, this.onMessage);
    }
  }

  /**
   * The peer connection ``pc`` ended. Closed by the page or the server (the
   * session is over), the page hears of it; failed (the network went), the
   * session is offered again with its token (docs/resume.md), as LiveSocket
   * resumes a dropped socket.
   */
  lost(pc, how = 'failed') {
    if (pc !== this.pc) return; // an old call, taken over by a resume
    if (how === 'failed' && !this.closing && this.resumeToken !== null) {
      this.resume();
      return;
    }
    this.closed();
  }

  async resume() {
    notify(t('live.reconnecting'), 'info');
    // Left open until a new call has the session: closed from here, a call
    // that still reaches the server would end the session, not suspend it.
    const lost = this.pc;
    this.pc = null; // what it still says is no longer heard
    const resumed = await retryWithin(this.graceMs, () => this.closing, async () => {
      this.pc?.close(); // an earlier try that did not connect
      const params = { seq: '1', resume_token: this.resumeToken, last_seq: this.lastSeq };
      await this.call({ ...this.params, ...params });
    });
    lost.close();
    if (resumed) {
      this.resumes += 1;
      notify(t('live.resumed'), 'ok');
      return;
    }
    this.pc?.close();
    this.pc = null;
    this.ended();
  }

  closed() {
    if (!this.pc) return;
    this.pc = null;
    this.ended();
  }

  ended() {
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
    this.closing = true;
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
 * The opening of ``channel``: ``promise`` resolves once it is open and rejects
 * when ICE fails or, from ``arm()`` on, when it takes too long. Listened for
 * from the offer on, so an open that comes early is never missed; the clock
 * starts at the answer, because the server's work before it is not the network's.
 */
function opening(pc, channel) {
  let arm = () => {};
  const promise = new Promise((resolve, reject) => {
    let timer = null;
    const settle = (done, value) => {
      clearTimeout(timer);
      done(value);
    };
    channel.addEventListener('open', () => settle(resolve), { once: true });
    pc.addEventListener('iceconnectionstatechange', () => {
      if (pc.iceConnectionState === 'failed') settle(reject, new Error(t('rtc.ice_failed')));
    });
    arm = () => {
      if (channel.readyState === 'open') settle(resolve);
      else timer = setTimeout(() => settle(reject, new Error(t('rtc.timeout'))), CONNECT_TIMEOUT_MS);
    };
  });
  promise.catch(() => {}); // a call given up before its answer is not an uncaught error
  return { promise, arm };
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
