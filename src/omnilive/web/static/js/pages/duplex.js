// Full duplex, audio (/audio_duplex) and omni (/omni, with the camera): every
// second the page sends one chunk (1 s of 16 kHz audio, plus one JPEG frame
// on omni) and gets one result: listen, or speak with text and audio. The
// AI's audio is played gap-free in arrival order; force-listen and pause
// interrupt it at once.

import { MicCapture } from '../audio/capture.js';
import { PcmPlayer } from '../audio/player.js';
import { newSessionId } from '../lib/api.js';
import { float32ToBase64 } from '../lib/b64.js';
import { Camera } from '../lib/camera.js';
import { $, el } from '../lib/dom.js';
import { onLangChange, t } from '../lib/i18n.js';
import { rememberSession } from '../lib/recent.js';
import { appendRecordingLink, openAndPrepare } from '../ui/live.js';
import { loadPersona } from '../ui/persona.js';
import { MetricsPanel } from '../ui/metrics.js';
import { initPage, isEnabled, notify, startPage } from '../ui/nav.js';
import { QueueView } from '../ui/queue.js';
import { VOICE_FIELDS, voiceFields } from '../ui/voices.js';

const PAGE = document.body.dataset.page; // 'omni' | 'audio_duplex'
const OMNI = PAGE === 'omni';
const SUBTITLE_HOLD_MS = 4000;
const SUBTITLE_CHARS = 140;

let socket = null;
let persona;
let session = null;
let aiState = 'idle';
let subtitleTimer = null;

// What the page saw, for diagnostics and the browser tests.
const log = { results: [], sent: 0, forceListenSent: 0, paused: false };
window.omniliveDuplex = log;

const queue = new QueueView($('#queue'), { onLeave: () => finish() });
const metrics = new MetricsPanel($('#metrics'));
// Results come once a second with some jitter: a 0.2 s lead keeps playback continuous.
const player = new PcmPlayer({ leadSeconds: 0.2 });
const camera = OMNI ? new Camera($('#preview')) : null;
const mic = new MicCapture({
  chunkSeconds: 1.0,
  onChunk: (samples) => sendChunk(samples),
  onLevel: (value) => $('#level')?.style.setProperty('--level', Math.min(1, value * 3).toFixed(2)),
});

const AI_STATES = {
  idle: 'duplex.state.idle',
  connecting: 'hd.state.connecting',
  queued: 'hd.state.queued',
  preparing: 'hd.state.preparing',
  listening: 'duplex.state.listening',
  speaking: 'duplex.state.speaking',
  paused: 'duplex.state.paused',
};

function setAiState(value) {
  aiState = value;
  $('#stage').dataset.ai = value;
  const label = $('#ai-state');
  label.textContent = t(AI_STATES[value]);
  label.hidden = value === 'idle' && OMNI;
  if ($('#indicator')) $('#indicator').dataset.state = value;
}

/** The longest side of the frames the model gets: larger in HD (two slices). */
function frameSide() {
  return session.hd ? 1280 : 640;
}

function sendChunk(samples) {
  if (!session?.prepared || session.paused || !socket?.open) return;
  const message = { type: 'audio_chunk', audio_base64: float32ToBase64(samples) };
  if (OMNI && session.vision) {
    const frame = camera.grab(frameSide());
    if (frame) message.frame_base64_list = [frame];
  }
  if (session.forceListen) {
    message.force_listen = true;
    log.forceListenSent += 1;
  }
  if (socket.send(message)) log.sent += 1;
}

function showSubtitle(text) {
  clearTimeout(subtitleTimer);
  const box = $('#subtitle');
  box.textContent = text.length > SUBTITLE_CHARS ? `…${text.slice(-SUBTITLE_CHARS)}` : text;
  box.classList.toggle('visible', Boolean(text));
}

function fadeSubtitle() {
  clearTimeout(subtitleTimer);
  subtitleTimer = setTimeout(() => showSubtitle(''), SUBTITLE_HOLD_MS);
}

function endTurn() {
  if (!session?.turn) return;
  session.turn.node.classList.remove('streaming');
  session.turn.node.dataset.done = 'true';
  session.turn = null;
  fadeSubtitle();
}

function onResult(result) {
  log.results.push({ unit: result.unit_index, is_listen: result.is_listen, text: result.text || '' });
  if (log.results.length > 600) log.results.shift();
  metrics.update(result);
  if (result.is_listen) {
    endTurn();
    if (!session.paused) setAiState('listening');
    return;
  }
  // Sent before force-listen or pause reached the server: not wanted any more.
  if (session.forceListen || session.paused) return;
  setAiState('speaking');
  if (result.text) {
    if (!session.turn) {
      const textNode = el('span', { class: 'text' });
      const node = el(
        'li',
        { class: 'turn ai streaming' },
        el('span', { class: 'who' }, t('live.ai')),
        textNode,
      );
      $('#transcript').append(node);
      session.turn = { node, textNode, text: '' };
    }
    session.turn.text += result.text;
    session.turn.textNode.textContent = session.turn.text;
    showSubtitle(session.turn.text);
  }
  if (result.audio_data) player.enqueue(result.audio_data);
  if (result.end_of_turn) endTurn();
}

function receive(message) {
  switch (message.type) {
    case 'queued':
    case 'queue_update':
      setAiState('queued');
      break;
    case 'queue_done':
      setAiState('preparing');
      break;
    case 'prepared':
      session.prepared = true;
      session.vision = Boolean(message.vision);
      if (OMNI && !session.vision) notify(t('duplex.no_vision'), 'info');
      if (message.recording_session_id) {
        session.recording = message.recording_session_id;
        rememberSession(message.recording_session_id, PAGE);
      }
      $('#pause').hidden = false;
      $('#force-listen').hidden = false;
      mic.reset(); // start the first unit now, not with audio from before the session
      setAiState('listening');
      break;
    case 'result':
      onResult(message);
      break;
    case 'paused':
      session.paused = true;
      log.paused = true;
      setAiState('paused');
      drawPause();
      break;
    case 'resumed':
      session.paused = false;
      log.paused = false;
      mic.reset();
      setAiState('listening');
      drawPause();
      break;
    case 'timeout':
      notify(t(message.reason === 'pause' ? 'duplex.pause_timeout' : 'duplex.idle_timeout'), 'info');
      break;
    case 'stopped':
      socket?.close();
      break;
    case 'error':
      // inference errors skip one unit and the session goes on; fatal ones close the socket
      notify(message.code === 'app_disabled' ? t('error.app_disabled') : message.error, 'error');
      break;
    default:
      break;
  }
}

async function buildPrepare() {
  const { prompt, systemAudio, voice } = await persona.resolve();
  const message = {
    type: 'prepare',
    mode: OMNI ? 'omni_duplex' : 'audio_duplex',
    system_prompt: prompt,
    ...voiceFields(voice, VOICE_FIELDS.duplex),
  };
  // The model hears a voice sample in its prompt (ref_audio) and speaks with the TTS voice.
  if (systemAudio.length) message.ref_audio_base64 = systemAudio[0];
  else if (voice.kind === 'stored') message.ref_audio_id = voice.id;
  if (OMNI && session.hd) message.max_slice_nums = 2;
  return message;
}

async function start() {
  if (socket) return;
  notify(null);
  player.unlock();
  $('#start').hidden = true;
  $('#stop').hidden = false;
  $('#transcript').replaceChildren();
  metrics.reset();
  log.results = [];
  session = {
    prepared: false,
    paused: false,
    forceListen: false,
    vision: false,
    hd: Boolean($('#hd')?.checked),
    turn: null,
  };
  drawForceListen();
  drawPause();
  setAiState('connecting');
  try {
    await Promise.all([mic.start(), camera?.start()]);
  } catch (error) {
    notify(t(OMNI ? 'error.camera' : 'error.mic', { error: error.message }), 'error');
    finish();
    return;
  }
  const prepare = await buildPrepare();
  const id = newSessionId(OMNI ? 'odx_' : 'adx_');
  const tracks = [...mic.stream.getAudioTracks(), ...(camera?.stream?.getVideoTracks() || [])];
  const params = { mode: OMNI ? 'omni' : 'audio' };
  // The slices tell a WebRTC call its frames' size before the prepare does,
  // and tell a call that resumes the session, which never sees the prepare.
  if (prepare.max_slice_nums) params.max_slice_nums = prepare.max_slice_nums;
  const live = await openAndPrepare(
    {
      // Two ids: a call that failed to connect may still hold its own for a moment.
      rtcPath: `/api/webrtc/duplex/${id}`,
      wsPath: `/ws/duplex/${newSessionId(OMNI ? 'odx_' : 'adx_')}`,
      params,
      videoMaxSide: frameSide(),
      queue,
      onMessage: receive,
      onClose: closed,
      tracks,
    },
    prepare,
  );
  if (!live || !session) {
    live?.close();
    finish();
    return;
  }
  socket = live;
}

function stop() {
  if (socket?.open && session?.prepared) {
    socket.send({ type: 'stop' });
    setTimeout(() => socket?.close(), 3000); // in case `stopped` never comes
  } else {
    finish();
  }
}

function togglePause() {
  if (!session?.prepared) return;
  if (session.paused) {
    socket.send({ type: 'resume' });
  } else {
    session.paused = true; // stop sending at once; the server confirms with `paused`
    player.flush();
    endTurn();
    socket.send({ type: 'pause' });
  }
  drawPause();
}

function toggleForceListen() {
  if (!session) return;
  session.forceListen = !session.forceListen;
  if (session.forceListen) {
    // The user wants the floor: the AI stops talking now, not after its queued audio.
    player.flush();
    endTurn();
    showSubtitle('');
  }
  drawForceListen();
}

function drawForceListen() {
  const button = $('#force-listen');
  const on = Boolean(session?.forceListen);
  button.setAttribute('aria-pressed', String(on));
  button.classList.toggle('active', on);
}

function drawPause() {
  const button = $('#pause');
  const paused = Boolean(session?.paused);
  button.dataset.i18n = paused ? 'duplex.resume' : 'duplex.pause';
  button.textContent = t(button.dataset.i18n);
  button.classList.toggle('active', paused);
}

function closed() {
  finish();
}

function finish() {
  const current = socket;
  socket = null;
  current?.close();
  mic.stop();
  camera?.stop();
  player.flush();
  queue.done();
  endTurn();
  if (session?.recording) appendRecordingLink($('#transcript'), session.recording);
  session = null;
  setAiState('idle');
  $('#start').hidden = false;
  for (const id of ['#stop', '#pause', '#force-listen']) $(id).hidden = true;
}

async function main() {
  const apps = await initPage(PAGE);
  $('#start').disabled = !isEnabled(apps, PAGE);
  setAiState('idle');
  onLangChange(() => {
    setAiState(aiState);
    drawPause();
  });
  persona = loadPersona(PAGE, OMNI ? 'prompt.omni' : 'prompt.voice');
  $('#start').addEventListener('click', start);
  $('#stop').addEventListener('click', stop);
  $('#pause').addEventListener('click', togglePause);
  $('#force-listen').addEventListener('click', toggleForceListen);
  $('#volume').addEventListener('input', () => player.setVolume(Number($('#volume').value)));
  if (OMNI) {
    $('#flip').addEventListener(
      'click',
      () => camera.running && camera.flip().catch((e) => notify(e.message, 'error')),
    );
    $('#fullscreen').addEventListener('click', () => {
      const stage = $('#stage');
      if (document.fullscreenElement) document.exitFullscreen();
      else stage.requestFullscreen?.().catch(() => {});
    });
  }
}

startPage(main);
