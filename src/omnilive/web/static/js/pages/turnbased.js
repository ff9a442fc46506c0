// Turn-based chat: one /ws/chat request per question, with the whole
// conversation (the protocol is stateless), the answer's text streamed into
// the page and its speech played as it arrives.

import { MicCapture } from '../audio/capture.js';
import { PcmPlayer } from '../audio/player.js';
import { concatFloat32 } from '../lib/b64.js';
import { $, el } from '../lib/dom.js';
import { t } from '../lib/i18n.js';
import { rememberSession } from '../lib/recent.js';
import { LiveSocket } from '../lib/socket.js';
import { capabilities } from '../lib/status.js';
import { Attachments, attachmentPreview } from '../ui/attachments.js';
import { initPage, isEnabled, notify, startPage } from '../ui/nav.js';
import { loadPersona, systemContent } from '../ui/persona.js';
import { QueueView } from '../ui/queue.js';
import { VOICE_FIELDS, voiceFields } from '../ui/voices.js';

const history = []; // the conversation as the protocol carries it (without the system message)
const player = new PcmPlayer();
let socket = null;
let answer = null; // the bubble being streamed into: {node, text, audio, done}
let attachments;
let persona;
let enabled = true;

const queue = new QueueView($('#queue'), { onLeave: () => stop() });

function scrollDown() {
  const box = $('#messages');
  box.scrollTop = box.scrollHeight;
}

function bubble(role, ...children) {
  $('#messages .empty')?.remove();
  const node = el('div', { class: `msg ${role}` }, ...children);
  $('#messages').append(node);
  scrollDown();
  return node;
}

function busy(value) {
  $('#send').disabled = value || !enabled;
  $('#talk').disabled = value || !enabled;
  $('#stop').hidden = !value;
}

async function buildRequest() {
  const { prompt, systemAudio, voice } = await persona.resolve();
  const messages = [];
  if (prompt || systemAudio.length) {
    messages.push({
      role: 'system',
      content: systemAudio.length ? systemContent(prompt, systemAudio) : prompt,
    });
  }
  messages.push(...history);
  const voiceChoice = voiceFields(voice, VOICE_FIELDS.chat);
  const hasVideo = messages.some(
    (m) => Array.isArray(m.content) && m.content.some((i) => i.type === 'video'),
  );
  return {
    messages,
    streaming: true,
    generation: {
      max_new_tokens: Number($('#max-tokens').value) || 512,
      temperature: Number($('#temperature').value),
    },
    tts: {
      enabled: $('#tts').checked,
      ...(Object.keys(voiceChoice).length ? { mode: 'audio_assistant' } : {}),
      ...voiceChoice,
    },
    omni_mode: hasVideo,
  };
}

async function send() {
  const text = $('#input').value.trim();
  if (socket || (answer && !answer.done) || !enabled || (!text && attachments.empty)) return;
  const sent = attachments.take();
  const content = sent.length
    ? [...sent.map((e) => e.item), ...(text ? [{ type: 'text', text }] : [])]
    : text;
  $('#input').value = '';
  notify(null);
  bubble('user', attachmentPreview(sent), text ? el('p', {}, text) : null);
  player.unlock(); // inside the click: browsers allow sound from here on
  player.flush();
  const textNode = el('span', { class: 'text' });
  answer = { node: bubble('assistant streaming', textNode), textNode, text: '', done: false };
  busy(true);
  history.push({ role: 'user', content });
  const request = await buildRequest();
  if (answer.done) return; // stopped while the preset's audio loaded
  socket = new LiveSocket('/ws/chat', { queue, onMessage: receive, onClose: closed });
  try {
    await socket.connect();
    socket.send(request);
  } catch (error) {
    fail(t('error.connect', { error: error.message }));
  }
}

function receive(message) {
  if (!answer) return;
  switch (message.type) {
    case 'chunk':
      answer.node.dataset.chunks = String(Number(answer.node.dataset.chunks || 0) + 1);
      if (message.text_delta) {
        answer.text += message.text_delta;
        answer.textNode.textContent = answer.text;
        scrollDown();
      }
      if (message.audio_data) player.enqueue(message.audio_data);
      break;
    case 'done':
      answer.text = message.text ?? answer.text;
      answer.textNode.textContent = answer.text;
      if (message.audio_data) player.enqueue(message.audio_data);
      finish(message);
      break;
    case 'error':
      fail(message.code === 'app_disabled' ? t('error.app_disabled') : message.error);
      break;
    default:
      break; // prefill_done, queue messages
  }
}

function finish(done) {
  const { node } = answer;
  answer.done = true;
  node.classList.remove('streaming');
  node.dataset.done = 'true';
  history.push({ role: 'assistant', content: answer.text });
  const meta = [t('chat.tokens', { input: done.input_tokens ?? '?', output: done.generated_tokens ?? '?' })];
  const footer = el('div', { class: 'msg-meta' }, meta.join(' · '));
  if (done.recording_session_id) {
    rememberSession(done.recording_session_id, 'turnbased');
    footer.append(
      ' · ',
      el(
        'a',
        { href: `/s/${encodeURIComponent(done.recording_session_id)}`, target: '_blank' },
        t('chat.view_session'),
      ),
    );
  }
  node.append(footer);
  end();
}

function fail(text) {
  if (answer && !answer.done) {
    answer.node.classList.remove('streaming');
    answer.node.classList.add('failed');
    answer.node.append(el('div', { class: 'msg-meta error' }, text));
    history.pop(); // the question goes back unanswered: drop it so a retry is clean
  }
  notify(text, 'error');
  end();
}

function closed() {
  if (answer && !answer.done) fail(t('error.closed'));
  socket = null;
  busy(false);
}

function end() {
  answer = answer ? { ...answer, done: true } : null;
  const current = socket;
  socket = null;
  current?.close();
  busy(false);
}

/** Stop the answer: leaving the connection makes the server cancel it. */
function stop() {
  player.flush();
  if (answer && !answer.done) {
    answer.node.classList.remove('streaming');
    answer.node.append(el('div', { class: 'msg-meta' }, t('chat.stopped')));
    if (answer.text) history.push({ role: 'assistant', content: answer.text });
    else history.pop();
    answer.done = true;
  }
  end();
}

function newChat() {
  stop();
  history.length = 0;
  $('#messages').replaceChildren(
    el('p', { class: 'empty hint', 'data-i18n': 'chat.empty' }, t('chat.empty')),
  );
}

/** Push-to-talk: record while the button is held, then send what was said. */
function setupTalk() {
  const button = $('#talk');
  let pieces = [];
  let mic = null;
  let starting = null;
  const begin = async (event) => {
    event.preventDefault();
    if (mic || socket || !enabled) return;
    player.unlock();
    pieces = [];
    mic = new MicCapture({ chunkSeconds: 0.25, onChunk: (chunk) => pieces.push(chunk) });
    button.classList.add('recording');
    starting = mic.start().catch((error) => {
      notify(t('error.mic', { error: error.message }), 'error');
      mic = null;
      button.classList.remove('recording');
    });
  };
  const release = async () => {
    if (!mic) return;
    const current = mic;
    await starting;
    mic = null;
    button.classList.remove('recording');
    if (!current.running) return;
    pieces.push(await current.flush());
    await current.stop();
    const samples = concatFloat32(pieces);
    if (samples.length < 16000 * 0.3) {
      notify(t('chat.too_short'), 'info');
      return;
    }
    attachments.addAudio(samples);
    send();
  };
  button.addEventListener('pointerdown', begin);
  button.addEventListener('pointerup', release);
  button.addEventListener('pointerleave', release);
  button.addEventListener('pointercancel', release);
  button.addEventListener('contextmenu', (event) => event.preventDefault());
}

function setupDrop() {
  const zone = $('#chat');
  zone.addEventListener('dragover', (event) => {
    event.preventDefault();
    zone.classList.add('dropping');
  });
  zone.addEventListener('dragleave', () => zone.classList.remove('dropping'));
  zone.addEventListener('drop', (event) => {
    event.preventDefault();
    zone.classList.remove('dropping');
    attachments.addFiles([...event.dataTransfer.files]);
  });
}

async function main() {
  const apps = await initPage('turnbased');
  enabled = isEnabled(apps, 'turnbased');
  const caps = await capabilities();
  attachments = new Attachments($('#attachments'), {
    vision: caps.vision !== false,
    onError: (text) => notify(text, 'error'),
  });
  $('#file').accept = attachments.accept;
  persona = loadPersona('turnbased', 'prompt.chat');
  $('#composer').addEventListener('submit', (event) => {
    event.preventDefault();
    send();
  });
  $('#input').addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  $('#attach').addEventListener('click', () => $('#file').click());
  $('#file').addEventListener('change', async () => {
    await attachments.addFiles([...$('#file').files]);
    $('#file').value = '';
  });
  $('#stop').addEventListener('click', stop);
  $('#new-chat').addEventListener('click', newChat);
  $('#temperature').addEventListener('input', () => {
    $('#temperature-value').textContent = $('#temperature').value;
  });
  setupTalk();
  setupDrop();
  busy(false);
}

startPage(main);
