// Home: the engine in use and what it can do, a card per enabled mode, and
// this browser's recent sessions.

import { $, el, icon, when } from '../lib/dom.js';
import { localized, onLangChange, t } from '../lib/i18n.js';
import { forgetSessions, recentSessions } from '../lib/recent.js';
import { serverStatus } from '../lib/status.js';
import { MODES, initPage, startPage } from '../ui/nav.js';

const PAGE_PATHS = {
  turnbased: '/turnbased',
  half_duplex: '/half_duplex',
  audio_duplex: '/audio_duplex',
  omni: '/omni',
};
const ICONS = {
  turnbased: 'chat',
  half_duplex: 'turns',
  audio_duplex: 'duplex',
  omni: 'camera',
  realtime: 'bolt',
};

let apps = null;
let status = null;

function yesNo(value) {
  return el('span', { class: `chip ${value ? 'yes' : 'no'}` }, value ? '✓' : '✗');
}

function drawEngine() {
  const card = $('#engine');
  if (!status) {
    card.replaceChildren(el('p', { class: 'error' }, t('home.unreachable')));
    return;
  }
  const caps = status.capabilities || {};
  const ready = status.status === 'ready';
  const byState = status.workers?.by_state || {};
  const rows = [
    [t('home.cap.vision'), yesNo(caps.vision)],
    [t('home.cap.voice_cloning'), yesNo(caps.voice_cloning)],
    [t('home.cap.audio_output'), yesNo(caps.audio_output)],
    [t('home.cap.inputs'), (caps.input_modalities || []).map((m) => t(`modality.${m}`)).join(' · ') || '—'],
    [t('home.cap.context'), caps.context_length ? String(caps.context_length) : '—'],
    [t('home.workers'), `${byState.idle || 0} / ${status.workers?.total ?? 0} ${t('home.idle')}`],
    [t('home.queue'), String(status.queue_length ?? 0)],
  ];
  card.replaceChildren(
    el(
      'div',
      { class: 'engine-head' },
      el('span', { class: 'hint' }, t('home.engine')),
      el('strong', { id: 'engine-name', class: 'engine-name' }, status.engine || '—'),
      el('span', { class: `pill ${ready ? 'ok' : 'warn'}` }, ready ? t('home.ready') : t('home.not_ready')),
    ),
    el(
      'dl',
      { class: 'facts' },
      rows.flatMap(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]),
    ),
  );
}

function modeList() {
  if (apps !== null) return apps;
  // No app registry on this server: every mode is on.
  return [...MODES, 'realtime'].map((id) => ({ id, path: PAGE_PATHS[id] }));
}

function drawModes() {
  const caps = status?.capabilities || {};
  const cards = modeList().map((app) => {
    const known = app.id in PAGE_PATHS;
    const name = app.name ? localized(app) : t(`mode.${app.id}`);
    const description =
      known || app.id === 'realtime' ? t(`mode.${app.id}.about`) : localized(app, 'description');
    const warning = app.id === 'omni' && status && caps.vision === false ? t('home.omni_blind') : null;
    const body = [
      el('span', { class: 'mode-icon' }, icon(ICONS[app.id] || 'chat')),
      el('h3', {}, name),
      el('p', {}, description),
      warning ? el('p', { class: 'hint warn' }, warning) : null,
    ];
    if (known)
      return el('a', { class: 'card mode-card', href: PAGE_PATHS[app.id], 'data-mode': app.id }, body);
    // Modes without a page here (the Realtime API) are for programs: show the endpoint.
    return el(
      'div',
      { class: 'card mode-card api', 'data-mode': app.id },
      body,
      app.id === 'realtime' ? el('code', {}, '/v1/realtime?mode=video') : null,
    );
  });
  $('#modes').replaceChildren(...cards);
}

function drawRecent() {
  const list = recentSessions();
  $('#forget').hidden = list.length === 0;
  $('#recent').replaceChildren(
    ...(list.length
      ? list.map((item) =>
          el(
            'li',
            {},
            el('a', { href: `/s/${encodeURIComponent(item.id)}` }, t(`mode.${item.mode}`)),
            el('span', { class: 'hint' }, when(item.at / 1000)),
            el('code', { class: 'hint' }, item.id),
          ),
        )
      : [el('li', { class: 'empty hint' }, t('home.no_recent'))]),
  );
}

function draw() {
  drawEngine();
  drawModes();
  drawRecent();
}

async function main() {
  [apps, status] = await Promise.all([initPage('home'), serverStatus()]);
  $('#forget').addEventListener('click', () => {
    forgetSessions();
    drawRecent();
  });
  draw();
  onLangChange(draw);
}

startPage(main);
