// Admin: the last minutes as small live charts (per worker its slots in use,
// unit latency and dropped chunks; the queue's length and wait), each duplex
// session's context (how full, how many units let go), workers and their states, the queue (with cancel) and running sessions, modes on/off,
// and the wait-estimate settings. Refreshed every two seconds while the tab
// is visible.

import { HttpError, getJSON, getStatus, request, sendJSON } from '../lib/api.js';
import { $, el, when } from '../lib/dom.js';
import { localized, onLangChange, t } from '../lib/i18n.js';
import { initPage, notify, startPage } from '../ui/nav.js';
import { sparkline } from '../ui/sparkline.js';
import { VoiceAdmin } from '../ui/voice-admin.js';

const REFRESH_MS = 2000;
const ETA_FIELDS = [
  ['chat_s', 'admin.eta.chat_s', 1],
  ['half_duplex_s', 'admin.eta.half_duplex_s', 1],
  ['audio_duplex_s', 'admin.eta.audio_duplex_s', 1],
  ['omni_duplex_s', 'admin.eta.omni_duplex_s', 1],
  ['ema_alpha', 'admin.eta.ema_alpha', 0.05],
  ['ema_min_samples', 'admin.eta.ema_min_samples', 1],
  ['overrun_floor_s', 'admin.eta.overrun_floor_s', 1],
];

const last = { status: null, workers: [], queue: null, apps: null, eta: null, live: null };
const REAL_TIME_MS = 1000; // a duplex unit is one second of audio

function table(node, headers, rows, emptyKey) {
  node.replaceChildren(
    el(
      'thead',
      {},
      el(
        'tr',
        {},
        headers.map((key) => el('th', {}, t(key))),
      ),
    ),
    el(
      'tbody',
      {},
      rows.length
        ? rows
        : el('tr', {}, el('td', { colspan: headers.length, class: 'empty hint' }, t(emptyKey))),
    ),
  );
}

function drawSummary() {
  const s = last.status;
  if (!s) return;
  const items = [
    [t('home.engine'), s.engine || '—'],
    [t('admin.state'), s.status],
    [t('home.workers'), `${s.workers?.total ?? 0}`],
    [t('admin.slots'), `${s.workers?.slots_busy ?? 0} / ${s.workers?.slots_total ?? 0}`],
    [t('home.queue'), `${s.queue_length} / ${s.max_queue_size}`],
    [t('admin.uptime'), `${Math.round(s.uptime_s ?? 0)} s`],
  ];
  $('#summary').replaceChildren(...items.map(([k, v]) => el('div', {}, el('dt', {}, k), el('dd', {}, v))));
}

function drawWorkers() {
  const rows = last.workers.map((w) =>
    el(
      'tr',
      { 'data-worker': w.worker_id },
      el('td', {}, el('strong', {}, w.worker_id), el('div', { class: 'hint' }, w.url || '')),
      el('td', {}, el('span', { class: `pill state-${w.status}` }, w.status)),
      el('td', {}, `${w.slots_busy ?? 0} / ${w.slots ?? 1}`),
      el(
        'td',
        {},
        w.current_session_id ? el('code', {}, w.current_session_id) : '—',
        w.current_request_type ? el('div', { class: 'hint' }, w.current_request_type) : null,
      ),
      el('td', {}, String(w.total_requests ?? 0)),
      el('td', {}, w.avg_inference_time_ms != null ? `${Math.round(w.avg_inference_time_ms)} ms` : '—'),
      el('td', {}, String(w.restarts ?? 0)),
      el('td', {}, w.pid ?? '—'),
    ),
  );
  table(
    $('#workers'),
    [
      'admin.col.worker',
      'admin.col.status',
      'admin.col.slots',
      'admin.col.session',
      'admin.col.requests',
      'admin.col.avg',
      'admin.col.restarts',
      'admin.col.pid',
    ],
    rows,
    'admin.no_workers',
  );
}

// The samples of GET /api/admin/live (oldest first) as charts: the queue, then
// one group per worker that any sample shows.
function drawLive() {
  const root = $('#live');
  const samples = last.live?.samples ?? [];
  const column = (pick) => samples.map(pick);
  const queue = el(
    'div',
    { class: 'live-grid', 'data-live': 'queue' },
    sparkline('queue_length', t('admin.live.queue_length'), [
      { name: 'length', label: t('admin.live.now'), values: column((s) => s.queue_length) },
    ]),
    sparkline(
      'queue_wait',
      t('admin.live.queue_wait'),
      [{ name: 'wait', label: t('admin.live.now'), values: column((s) => s.queue_wait_s) }],
      { unit: ' s' },
    ),
  );
  const ids = [...new Set(samples.flatMap((s) => Object.keys(s.workers)))].sort();
  const workers = ids.map((id) => {
    const of = (pick) => column((s) => (s.workers[id] ? pick(s.workers[id]) : null));
    const slots = Math.max(1, ...of((w) => w.slots).filter((v) => v !== null));
    return el(
      'div',
      { class: 'live-worker', 'data-worker': id },
      el('h3', {}, id),
      el(
        'div',
        { class: 'live-grid' },
        sparkline(
          'slots',
          t('admin.live.slots', { slots }),
          [{ name: 'busy', label: t('admin.live.now'), values: of((w) => w.slots_busy) }],
          { floor: slots },
        ),
        sparkline(
          'latency',
          t('admin.live.latency'),
          [
            { name: 'p50', values: of((w) => w.p50_ms) },
            { name: 'p95', values: of((w) => w.p95_ms) },
          ],
          { guide: REAL_TIME_MS, unit: ' ms' },
        ),
        sparkline('dropped', t('admin.live.dropped'), [
          { name: 'dropped', label: t('admin.live.now'), values: of((w) => w.dropped) },
        ]),
      ),
    );
  });
  root.replaceChildren(queue, ...workers);
  root.dataset.samples = String(samples.length);
  // The ring holds five minutes: past them its length stays, its newest moves.
  root.dataset.newest = String(samples.at(-1)?.t ?? 0);
}

// Each duplex session's context as its last unit left it (GET /api/admin/live's
// contexts): a long call shows its window filling and letting units go.
function drawContexts() {
  const rows = (last.live?.contexts ?? []).map((c) =>
    el(
      'tr',
      { 'data-session': c.session_id },
      el('td', {}, el('code', {}, c.session_id)),
      el('td', {}, c.worker_id),
      el('td', {}, `${c.kv_cache_length} / ${c.context_capacity ?? '—'}`),
      el(
        'td',
        {},
        c.fill === null
          ? '—'
          : [el('meter', { min: 0, max: 1, value: c.fill }), ` ${Math.round(c.fill * 100)} %`],
      ),
      el('td', {}, String(c.evicted_units)),
    ),
  );
  table(
    $('#contexts'),
    ['admin.col.session', 'admin.col.worker', 'admin.col.context', 'admin.col.fill', 'admin.col.evicted'],
    rows,
    'admin.no_contexts',
  );
}

async function cancel(ticket) {
  try {
    await request('DELETE', `/api/queue/${encodeURIComponent(ticket)}`);
    notify(t('admin.cancelled', { ticket }), 'ok');
  } catch (error) {
    notify(error.message, 'error');
  }
  refresh();
}

function drawQueue() {
  const q = last.queue;
  if (!q) return;
  const rows = q.items.map((item) =>
    el(
      'tr',
      { 'data-ticket': item.ticket_id },
      el('td', {}, String(item.position)),
      el('td', {}, item.request_type),
      el('td', {}, el('code', {}, item.session_id || item.ticket_id)),
      el('td', {}, `${Math.round(item.wait_elapsed_s)} s`),
      el('td', {}, `${Math.round(item.estimated_wait_s)} s`),
      el(
        'td',
        {},
        el(
          'button',
          { type: 'button', class: 'small danger', onclick: () => cancel(item.ticket_id) },
          t('admin.cancel'),
        ),
      ),
    ),
  );
  table(
    $('#queue-table'),
    ['admin.col.position', 'admin.col.type', 'admin.col.session', 'admin.col.waiting', 'admin.col.eta', ''],
    rows,
    'admin.queue_empty',
  );
  const running = q.running_tasks.map((task) =>
    el(
      'tr',
      {},
      el('td', {}, task.worker_id),
      el('td', {}, task.request_type),
      el('td', {}, el('code', {}, task.session_id), task.suspended ? ` (${t('admin.suspended')})` : ''),
      el('td', {}, `${Math.round(task.elapsed_s)} s`),
      el('td', {}, `${Math.round(task.estimated_remaining_s)} s`),
    ),
  );
  table(
    $('#running'),
    ['admin.col.worker', 'admin.col.type', 'admin.col.session', 'admin.col.elapsed', 'admin.col.remaining'],
    running,
    'admin.none_running',
  );
}

async function toggleApp(app, enabled) {
  try {
    await sendJSON('PUT', `/api/admin/apps/${encodeURIComponent(app.id)}`, { enabled });
    notify(t(enabled ? 'admin.app_on' : 'admin.app_off', { name: localized(app) || app.id }), 'ok');
  } catch (error) {
    notify(error.message, 'error');
  }
  await loadApps();
}

function drawApps() {
  const list = $('#apps');
  if (last.apps === null) {
    list.replaceChildren(el('li', { class: 'hint' }, t('admin.no_app_registry')));
    return;
  }
  list.replaceChildren(
    ...last.apps.map((app) => {
      const input = el('input', {
        type: 'checkbox',
        role: 'switch',
        'data-app': app.id,
        checked: Boolean(app.enabled),
      });
      input.addEventListener('change', () => toggleApp(app, input.checked));
      return el(
        'li',
        {},
        el(
          'label',
          { class: 'switch' },
          input,
          el('span', { class: 'track', 'aria-hidden': 'true' }),
          el('span', {}, localized(app) || t(`mode.${app.id}`)),
          el('code', { class: 'hint' }, app.path || ''),
        ),
      );
    }),
  );
}

function drawEta() {
  const eta = last.eta;
  if (!eta) return;
  const form = $('#eta');
  const fields = ETA_FIELDS.map(([key, label, step]) =>
    el(
      'div',
      { class: 'field' },
      el(
        'label',
        { for: `eta-${key}` },
        t(label),
        eta.effective_baselines_s && key.endsWith('_s') && key.replace(/_s$/, '') in eta.effective_baselines_s
          ? el(
              'span',
              { class: 'hint' },
              ` (${t('admin.eta.effective')} ${eta.effective_baselines_s[key.replace(/_s$/, '')]} s)`,
            )
          : null,
      ),
      el('input', { id: `eta-${key}`, name: key, type: 'number', step, min: 0, value: eta[key] }),
    ),
  );
  form.replaceChildren(
    ...fields,
    el('div', { class: 'row' }, el('button', { type: 'submit', class: 'primary' }, t('admin.save'))),
  );
}

async function saveEta(event) {
  event.preventDefault();
  const changes = {};
  for (const [key] of ETA_FIELDS) {
    const input = $(`#eta-${key}`);
    const value = Number(input.value);
    if (input.value !== '' && value !== last.eta[key]) changes[key] = value;
  }
  if (!Object.keys(changes).length) return;
  try {
    last.eta = await sendJSON('PUT', '/api/config/eta', changes);
    drawEta();
    notify(t('admin.saved'), 'ok');
  } catch (error) {
    notify(error.message, 'error');
  }
}

async function loadApps() {
  try {
    last.apps = (await getJSON('/api/admin/apps')).apps;
  } catch (error) {
    if (!(error instanceof HttpError && error.status === 404)) notify(error.message, 'error');
    last.apps = null;
  }
  drawApps();
}

async function refresh() {
  try {
    const [status, workers, queueBody, live] = await Promise.all([
      getStatus(),
      getJSON('/workers'),
      getJSON('/api/queue'),
      getJSON('/api/admin/live'),
    ]);
    Object.assign(last, { status, workers: workers.workers, queue: queueBody, live });
    drawSummary();
    drawLive();
    drawContexts();
    drawWorkers();
    drawQueue();
    $('#summary').dataset.updated = when(Date.now() / 1000);
  } catch (error) {
    notify(t('admin.refresh_failed', { error: error.message }), 'error');
  }
}

async function main() {
  await initPage('admin');
  $('#eta').addEventListener('submit', saveEta);
  const voices = new VoiceAdmin($('#voices'), notify);
  await Promise.all([
    refresh(),
    loadApps(),
    voices.load(),
    getJSON('/api/config/eta').then((eta) => {
      last.eta = eta;
      drawEta();
    }),
  ]);
  setInterval(() => {
    if ($('#auto-refresh').checked && document.visibilityState === 'visible') refresh();
  }, REFRESH_MS);
  onLangChange(() => {
    drawSummary();
    drawLive();
    drawContexts();
    drawWorkers();
    drawQueue();
    drawApps();
    drawEta();
    voices.draw();
  });
}

startPage(main);
