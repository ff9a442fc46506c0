// The session viewer's timeline: one row per turn (chat, half-duplex) or per
// duplex unit, with its text, audio and pictures. Runs of listening units
// fold into one row, and audio players are made only when asked for, so
// sessions of thousands of units stay light.

import { el, icon } from '../lib/dom.js';
import { t } from '../lib/i18n.js';

function seconds(ms) {
  return `${(Math.max(0, ms || 0) / 1000).toFixed(1)} s`;
}

/** How long the model worked on a unit (prefill + generate), if recorded. */
function modelMs(timing) {
  if (!timing || (timing.prefill_ms == null && timing.generate_ms == null)) return null;
  return Math.round((timing.prefill_ms || 0) + (timing.generate_ms || 0));
}

/** A ▶ button that becomes an <audio> player on first use. */
function lazyAudio(url, label) {
  const button = el('button', { type: 'button', class: 'small play' }, icon('play'), label);
  button.addEventListener('click', () => {
    const audio = el('audio', { controls: true, src: url, preload: 'auto' });
    button.replaceWith(audio);
    audio.play().catch(() => {});
  });
  return button;
}

function turnRow(turn, asset) {
  const input = turn.input || {};
  const output = turn.output || {};
  const parts = [];
  for (const message of input.messages || []) {
    if (message.role !== 'user') continue;
    for (const item of message.content || []) {
      if (item.type === 'text') parts.push(el('p', {}, item.text));
      else if (item.type === 'image' && item.file)
        parts.push(el('img', { class: 'thumb', loading: 'lazy', src: asset(item.file), alt: '' }));
      else if (item.type === 'audio' && item.file)
        parts.push(lazyAudio(asset(item.file), t('viewer.user_audio')));
      else if (item.type === 'video' && item.file)
        parts.push(el('video', { class: 'thumb', controls: true, preload: 'none', src: asset(item.file) }));
    }
  }
  if (input.user_audio) {
    parts.push(
      lazyAudio(
        asset(input.user_audio),
        `${t('viewer.user_audio')} (${seconds(input.user_audio_duration_ms)})`,
      ),
    );
  }
  const status =
    turn.status && turn.status !== 'done' ? el('span', { class: 'pill warn' }, turn.status) : null;
  return el(
    'li',
    { class: 'entry turn-entry', 'data-index': turn.turn_index },
    el(
      'div',
      { class: 'entry-head' },
      el('strong', {}, t('viewer.turn', { n: (turn.turn_index ?? 0) + 1 })),
      el('span', { class: 'hint' }, seconds(turn.request_ts_ms)),
      status,
    ),
    el(
      'div',
      { class: 'entry-body' },
      el(
        'div',
        { class: 'side user' },
        el('span', { class: 'who' }, t('live.you')),
        parts.length ? parts : el('span', { class: 'hint' }, '—'),
      ),
      el(
        'div',
        { class: 'side ai' },
        el('span', { class: 'who' }, t('live.ai')),
        el('p', {}, output.text || '—'),
        output.audio
          ? lazyAudio(asset(output.audio), `${t('viewer.ai_audio')} (${seconds(output.audio_duration_ms)})`)
          : null,
      ),
    ),
  );
}

function unitRow(chunk, asset) {
  const result = chunk.result || {};
  const frames = chunk.user_frames || (chunk.user_frame ? [chunk.user_frame] : []);
  return el(
    'li',
    { class: `entry unit ${result.mode === 'SPEAK' ? 'speak' : 'listen'}`, 'data-index': chunk.index },
    el(
      'div',
      { class: 'entry-head' },
      el('strong', {}, t('viewer.unit', { n: chunk.index })),
      el('span', { class: 'hint' }, seconds(chunk.receive_ts_ms)),
      el(
        'span',
        { class: `pill ${result.mode === 'SPEAK' ? 'ok' : ''}` },
        t(result.mode === 'SPEAK' ? 'metrics.speak' : 'metrics.listen'),
      ),
      result.end_of_turn ? el('span', { class: 'pill' }, t('viewer.end_of_turn')) : null,
      chunk.dropped_before
        ? el('span', { class: 'pill warn' }, t('viewer.dropped', { n: chunk.dropped_before }))
        : null,
      modelMs(result.timing) !== null
        ? el('span', { class: 'hint' }, `${t('viewer.model_ms')} ${modelMs(result.timing)} ms`)
        : null,
    ),
    el(
      'div',
      { class: 'entry-body' },
      el(
        'div',
        { class: 'side user' },
        frames.map((f) => el('img', { class: 'thumb', loading: 'lazy', src: asset(f), alt: '' })),
        chunk.user_audio ? lazyAudio(asset(chunk.user_audio), t('viewer.user_audio')) : null,
      ),
      el(
        'div',
        { class: 'side ai' },
        result.text ? el('p', {}, result.text) : null,
        result.ai_audio
          ? lazyAudio(
              asset(result.ai_audio),
              `${t('viewer.ai_audio')} (${seconds(result.ai_audio_duration_ms)})`,
            )
          : null,
      ),
    ),
  );
}

/** Listening units between speaking ones, folded: "units 3–9 · listening". */
function listenRun(run, asset, onlySpeech) {
  if (!onlySpeech) return run.map((c) => unitRow(c, asset));
  const first = run[0].index;
  const lastIndex = run[run.length - 1].index;
  const label =
    run.length === 1
      ? t('viewer.listening_one', { n: first })
      : t('viewer.listening_run', { from: first, to: lastIndex, n: run.length });
  const row = el(
    'li',
    { class: 'entry folded' },
    el('button', { type: 'button', class: 'small ghost' }, label),
  );
  row.firstChild.addEventListener('click', () => row.replaceWith(...run.map((c) => unitRow(c, asset))));
  return [row];
}

/** The rows of a recording.json; `asset(path)` gives a file's URL. */
export function timelineRows(doc, asset, { onlySpeech = true } = {}) {
  if (Array.isArray(doc.turns)) return doc.turns.map((turn) => turnRow(turn, asset));
  const rows = [];
  let run = [];
  for (const chunk of doc.chunks || []) {
    if (chunk.result?.mode === 'SPEAK') {
      if (run.length) rows.push(...listenRun(run, asset, onlySpeech));
      run = [];
      rows.push(unitRow(chunk, asset));
    } else {
      run.push(chunk);
    }
  }
  if (run.length) rows.push(...listenRun(run, asset, onlySpeech));
  return rows;
}
