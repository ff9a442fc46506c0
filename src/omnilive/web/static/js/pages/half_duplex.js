// Half-duplex voice: the microphone streams 0.5 s chunks, the server's VAD
// hears where the user's speech ends, and the model answers. While the answer
// plays, and for ECHO_GUARD_MS after, the microphone is held back so the
// model never hears its own voice (spec/half-duplex.md, phase 5).

import { MicCapture } from '../audio/capture.js';
import { PcmPlayer } from '../audio/player.js';
import { newSessionId } from '../lib/api.js';
import { float32ToBase64 } from '../lib/b64.js';
import { $, clock, el } from '../lib/dom.js';
import { onLangChange, t } from '../lib/i18n.js';
import { rememberSession } from '../lib/recent.js';
import { appendRecordingLink, openAndPrepare } from '../ui/live.js';
import { initPage, isEnabled, notify, startPage } from '../ui/nav.js';
import { loadPersona, systemContent } from '../ui/persona.js';
import { QueueView } from '../ui/queue.js';
import { VOICE_FIELDS, voiceFields } from '../ui/voices.js';

const ECHO_GUARD_MS = 800;
const INDICATOR_KEYS = {
  idle: 'hd.state.idle',
  connecting: 'hd.state.connecting',
  queued: 'hd.state.queued',
  preparing: 'hd.state.preparing',
  listening: 'hd.state.listening',
  user: 'hd.state.user',
  thinking: 'hd.state.thinking',
  speaking: 'hd.state.speaking',
};

let socket = null;
let persona;
let state = 'idle';
let session = null; // {timeoutS, lastSentAt, prepared, hold, bargeIn, turnDone, turns, current}
let countdown = null;
let resumeTimer = null;

const queue = new QueueView($('#queue'), { onLeave: () => finish() });
const player = new PcmPlayer({
  onStart: () => setState('speaking'),
  onIdle: () => maybeListen(),
});
const mic = new MicCapture({
  chunkSeconds: 0.5,
  onChunk: (samples) => sendChunk(samples),
  onLevel: (value) => $('#level').style.setProperty('--level', Math.min(1, value * 3).toFixed(2)),
});

function setState(value) {
  state = value;
  $('#indicator').dataset.state = value;
  $('#indicator-label').textContent = t(INDICATOR_KEYS[value]);
}

function sendChunk(samples) {
  // Held back while the answer is produced and played (echo), and before `prepared`.
  if (!session?.prepared || session.hold || !socket?.open) return;
  if (socket.send({ type: 'audio_chunk', audio_base64: float32ToBase64(samples) })) {
    session.lastSentAt = Date.now(); // the server's inactivity timer restarts with each chunk
  }
}

function drawRemaining() {
  if (!session?.prepared) {
    $('#remaining').textContent = '—';
    return;
  }
  const left = session.timeoutS - (Date.now() - session.lastSentAt) / 1000;
  $('#remaining').textContent = clock(left);
  $('#remaining').classList.toggle('warn', left < 20);
}

function addTurn(role, text = '') {
  const textNode = el('span', { class: 'text' }, text);
  const node = el(
    'li',
    { class: `turn ${role}` },
    el('span', { class: 'who' }, t(role === 'user' ? 'live.you' : 'live.ai')),
    textNode,
  );
  $('#transcript').append(node);
  node.scrollIntoView({ block: 'nearest' });
  return { node, textNode, text };
}

/** Hold the microphone back (or let it through again); over WebRTC its track goes silent. */
function holdMic(hold) {
  session.hold = hold;
  socket?.setMicOpen?.(!hold);
}

/** Listen again once the answer is complete, has finished playing, and the echo guard has passed. */
function maybeListen() {
  if (!session || !session.turnDone || player.playing) return;
  if (session.bargeIn) {
    setState('listening'); // the microphone was never held: nothing to drop
    return;
  }
  clearTimeout(resumeTimer);
  resumeTimer = setTimeout(() => {
    if (!session) return;
    holdMic(false);
    mic.reset(); // whatever the microphone caught meanwhile is the AI's echo
    setState('listening');
  }, ECHO_GUARD_MS);
}

/** The current answer is over (`how`: done or interrupted, marked on its turn). */
function endAnswer(how) {
  if (session.current) {
    session.current.node.classList.remove('streaming');
    session.current.node.dataset[how] = 'true';
  }
  session.current = null;
  session.turns += 1;
  $('#turns').textContent = String(session.turns);
  session.turnDone = true;
}

function receive(message) {
  switch (message.type) {
    case 'queued':
    case 'queue_update':
      setState('queued');
      break;
    case 'queue_done':
      setState('preparing');
      break;
    case 'prepared':
      session.prepared = true;
      session.timeoutS = message.timeout_s || session.timeoutS;
      session.lastSentAt = Date.now();
      if (message.recording_session_id) {
        rememberSession(message.recording_session_id, 'half_duplex');
        session.recording = message.recording_session_id;
      }
      setState('listening');
      break;
    case 'vad_state':
      if (!session.hold) setState(message.speaking ? 'user' : 'listening');
      break;
    case 'generating': {
      // Over WebRTC the browser cancels the answer's echo: the microphone stays
      // open and the user can speak over the answer (barge-in).
      if (!session.bargeIn) holdMic(true);
      session.turnDone = false;
      clearTimeout(resumeTimer);
      const seconds = (message.speech_duration_ms / 1000).toFixed(1);
      addTurn('user', t('hd.you_spoke', { seconds }));
      session.current = addTurn('ai');
      session.current.node.classList.add('streaming');
      setState('thinking');
      break;
    }
    case 'chunk':
      if (!session.current) session.current = addTurn('ai');
      if (message.text_delta) {
        session.current.text += message.text_delta;
        session.current.textNode.textContent = session.current.text;
      }
      if (message.audio_data) player.enqueue(message.audio_data);
      break;
    case 'turn_done':
      if (session.current) {
        session.current.textNode.textContent = message.text || session.current.text;
      }
      endAnswer('done');
      maybeListen();
      break;
    case 'interrupted':
      // The user spoke over the answer: it stops here (over WebRTC the server
      // drops what was queued on the track; here the player's queue goes).
      player.flush();
      endAnswer('interrupted');
      setState('user');
      break;
    case 'error':
      // A failed turn is rolled back and the session goes on; fatal errors close the socket.
      notify(message.code === 'app_disabled' ? t('error.app_disabled') : message.error, 'error');
      if (session.current) session.current.node.classList.add('failed');
      session.current = null;
      session.turnDone = true;
      maybeListen();
      break;
    case 'timeout':
      notify(t('hd.timed_out', { seconds: Math.round(message.elapsed_s) }), 'info');
      break;
    case 'stopped':
      socket?.close();
      break;
    default:
      break;
  }
}

async function start() {
  if (socket) return;
  notify(null);
  player.unlock(); // from the click: sound is allowed from here on
  setState('connecting');
  $('#start').hidden = true;
  $('#stop').hidden = false;
  $('#transcript').replaceChildren();
  $('#turns').textContent = '0';
  session = {
    timeoutS: Number($('#timeout').value) || 180,
    lastSentAt: Date.now(),
    prepared: false,
    hold: false,
    bargeIn: false,
    turnDone: true,
    turns: 0,
    current: null,
  };
  try {
    await mic.start(); // ask for the microphone first: no point queueing without one
  } catch (error) {
    notify(t('error.mic', { error: error.message }), 'error');
    finish();
    return;
  }
  const prepare = await buildPrepare();
  // Two ids: a call that failed to connect may still hold its own for a moment.
  const rtcPath = `/api/webrtc/half_duplex/${newSessionId('hd_')}`;
  const wsPath = `/ws/half_duplex/${newSessionId('hd_')}`;
  const options = { queue, onMessage: receive, onClose: closed, tracks: mic.stream.getAudioTracks() };
  const live = await openAndPrepare({ rtcPath, wsPath, ...options }, (connection) => {
    session.bargeIn = connection.transport === 'webrtc';
    return { ...prepare, config: { ...prepare.config, barge_in: session.bargeIn } };
  });
  if (!live || !session) {
    live?.close();
    finish();
    return;
  }
  socket = live;
  countdown = setInterval(drawRemaining, 500);
}

async function buildPrepare() {
  const { prompt, systemAudio, voice } = await persona.resolve();
  // Left empty, the server ends the turn by meaning, waiting longer for words
  // that sound unfinished; a number is the longest pause, whatever the words.
  const silence = $('#vad-silence').value;
  const message = {
    type: 'prepare',
    config: {
      vad: {
        threshold: Number($('#vad-threshold').value),
        ...(silence ? { min_silence_duration_ms: Number(silence) } : {}),
        min_speech_duration_ms: Number($('#vad-speech').value),
        speech_pad_ms: Number($('#vad-pad').value),
      },
      tts: { enabled: $('#tts').checked },
      session: { timeout_s: Number($('#timeout').value) || 180 },
    },
    ...voiceFields(voice, VOICE_FIELDS.half_duplex),
  };
  if (systemAudio.length) message.system_content = systemContent(prompt, systemAudio);
  else message.system_prompt = prompt;
  return message;
}

function stop() {
  if (socket?.open && session?.prepared) {
    socket.send({ type: 'stop' });
    // the server answers `stopped`; don't wait forever for it
    setTimeout(() => socket?.close(), 3000);
  } else {
    finish();
  }
}

function closed(event) {
  if (event.code === 1008 || event.code === 1013) notify(event.reason || t('error.closed'), 'error');
  finish();
}

function finish() {
  const current = socket;
  socket = null;
  current?.close();
  clearInterval(countdown);
  clearTimeout(resumeTimer);
  countdown = null;
  mic.stop();
  player.flush();
  queue.done();
  if (session?.recording) appendRecordingLink($('#transcript'), session.recording);
  session = null;
  setState('idle');
  $('#remaining').textContent = '—';
  $('#start').hidden = false;
  $('#stop').hidden = true;
}

async function main() {
  const apps = await initPage('half_duplex');
  $('#start').disabled = !isEnabled(apps, 'half_duplex');
  setState('idle');
  onLangChange(() => setState(state));
  persona = loadPersona('half_duplex', 'prompt.voice');
  $('#start').addEventListener('click', start);
  $('#stop').addEventListener('click', stop);
  $('#vad-threshold').addEventListener('input', () => {
    $('#vad-threshold-value').textContent = $('#vad-threshold').value;
  });
}

startPage(main);
