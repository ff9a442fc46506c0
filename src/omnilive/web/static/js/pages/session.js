// The session viewer (/s/{id}): what the recording holds (meta.json), its
// merged replay with subtitles, the timeline of turns or units, a download of
// everything, and a comment.

import { getJSON, getOptional, httpUrl, prepareLinks, sendJSON } from '../lib/api.js';
import { $, clock, el, when } from '../lib/dom.js';
import { onLangChange, t } from '../lib/i18n.js';
import { initPage, notify, startPage } from '../ui/nav.js';
import { timelineRows } from '../ui/timeline.js';

const ID = document.querySelector('meta[name="session-id"]').content;
const BASE = `/api/sessions/${encodeURIComponent(ID)}`;

const FOLLOW_MS = 2000;

let meta = null;
let doc = null;

function asset(path) {
  return httpUrl(`${BASE}/assets/${path.split('/').map(encodeURIComponent).join('/')}`);
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return '—';
  return seconds < 60 ? `${seconds.toFixed(1)} s` : clock(seconds);
}

function drawMeta() {
  if (!meta) return;
  const mode = meta.app_type;
  const counts = meta.counts
    ? Object.entries(meta.counts)
        .map(([k, n]) => t(`viewer.count.${k}${n === 1 ? '_one' : ''}`, { n }))
        .join(', ')
    : null;
  const items = [
    [t('viewer.mode'), t(`mode.${mode}`)],
    [
      t('viewer.status'),
      el(
        'span',
        { class: `pill ${meta.status === 'ended' ? 'ok' : 'warn'}` },
        t(`viewer.status.${meta.status}`),
      ),
    ],
    [t('viewer.created'), when(meta.created_at)],
    [t('viewer.duration'), duration(meta.duration_s)],
    [t('viewer.worker'), meta.worker_id || '—'],
    counts ? [t('viewer.contents'), counts] : null,
    meta.title ? [t('viewer.title_field'), meta.title] : null,
  ].filter(Boolean);
  $('#meta').replaceChildren(...items.map(([k, v]) => el('div', {}, el('dt', {}, k), el('dd', {}, v))));
}

let drawnReplays = null;

function drawReplay() {
  const replays = meta?.replays || [];
  const box = $('#replay');
  const key = `${meta?.status} ${replays.join()}`;
  if (key === drawnReplays && box.hasChildNodes()) return; // keep a player that is playing
  drawnReplays = key;
  const vtt = replays.includes('subtitles.vtt') ? asset('subtitles.vtt') : null;
  const track = () =>
    el('track', { kind: 'subtitles', src: vtt, srclang: 'und', label: t('viewer.subtitles'), default: true });
  if (replays.includes('merged_replay.mp4')) {
    box.replaceChildren(
      el(
        'video',
        { controls: true, preload: 'metadata', class: 'replay', src: asset('merged_replay.mp4') },
        vtt ? track() : null,
      ),
    );
  } else if (replays.includes('merged_replay.wav')) {
    // <audio> does not draw subtitles: show the active cue of a hidden track instead.
    const caption = el('p', { class: 'subtitle visible replay-caption' });
    const audio = el(
      'audio',
      { controls: true, preload: 'metadata', src: asset('merged_replay.wav') },
      vtt ? track() : null,
    );
    if (vtt) {
      const text = audio.textTracks[0];
      if (text) {
        text.mode = 'hidden';
        text.addEventListener('cuechange', () => {
          caption.textContent = Array.from(text.activeCues || [], (cue) => cue.text).join(' ');
        });
      }
    }
    box.replaceChildren(audio, vtt ? caption : null, el('p', { class: 'hint' }, t('viewer.stereo_hint')));
  } else {
    box.replaceChildren(
      el('p', { class: 'hint' }, t(meta?.status === 'active' ? 'viewer.replay_pending' : 'viewer.no_replay')),
    );
  }
}

function drawTimeline() {
  const list = $('#timeline');
  if (!doc) {
    list.replaceChildren(el('li', { class: 'hint' }, t('viewer.no_timeline')));
    return;
  }
  const duplex = Array.isArray(doc.chunks);
  $('#only-speech-label').hidden = !duplex;
  const rows = timelineRows(doc, asset, { onlySpeech: $('#only-speech').checked });
  list.replaceChildren(...(rows.length ? rows : [el('li', { class: 'hint' }, t('viewer.empty'))]));
}

/** Done: ended, and its replays listed (they are made just after the end). */
function settled() {
  return meta && meta.status !== 'active' && Array.isArray(meta.replays);
}

async function load() {
  try {
    [meta, doc] = await Promise.all([getJSON(BASE), getOptional(`${BASE}/recording`, null)]);
  } catch (error) {
    notify(t('viewer.not_found', { error: error.message }), 'error');
    return false;
  }
  drawMeta();
  drawReplay();
  drawTimeline();
  return true;
}

async function saveComment(event) {
  event.preventDefault();
  const status = $('#comment-status');
  try {
    await sendJSON('POST', `${BASE}/comment`, { comment: $('#comment').value });
    status.textContent = t('viewer.saved');
  } catch (error) {
    status.textContent = error.message;
  }
}

async function main() {
  await initPage('session');
  try {
    await prepareLinks(); // the replays and the download are links: they carry a token
  } catch {
    // no key given: load() below says why nothing shows
  }
  $('#download').href = httpUrl(`${BASE}/download`);
  if (!(await load())) return;
  // A session still going on (or whose replays are being made) is followed until it settles.
  const follow = setInterval(async () => {
    if (settled() || !(await load())) clearInterval(follow);
  }, FOLLOW_MS);
  $('#only-speech').addEventListener('change', drawTimeline);
  $('#comment-form').addEventListener('submit', saveComment);
  try {
    $('#comment').value = (await getJSON(`${BASE}/comment`)).comment || '';
  } catch {
    // comments are optional
  }
  onLangChange(() => {
    drawMeta();
    drawReplay();
    drawTimeline();
  });
}

startPage(main);
