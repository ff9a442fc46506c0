// The duplex metrics panel: how fast each unit came back (wall_clock_ms,
// from the chunk's arrival at the server to its result), how full the
// model's context is, and how many chunks the server dropped because the
// model fell behind real time.

import { el } from '../lib/dom.js';
import { onLangChange, t } from '../lib/i18n.js';

const WINDOW = 30; // units averaged

const FIELDS = [
  ['units', 'metrics.units'],
  ['latency', 'metrics.latency'],
  ['average', 'metrics.average'],
  ['kv', 'metrics.kv'],
  ['dropped', 'metrics.dropped'],
  ['decision', 'metrics.decision'],
];

export class MetricsPanel {
  constructor(root) {
    this.root = root;
    this.values = {};
    this.labels = {};
    root.classList.add('metrics');
    root.replaceChildren(
      ...FIELDS.map(([key, label]) => {
        this.labels[key] = el('dt', {}, t(label));
        this.values[key] = el('dd', { 'data-metric': key }, '—');
        return el('div', {}, this.labels[key], this.values[key]);
      }),
    );
    onLangChange(() => {
      for (const [key, label] of FIELDS) this.labels[key].textContent = t(label);
      this.draw();
    });
    this.reset();
  }

  reset() {
    this.units = 0;
    this.latencies = [];
    this.last = null;
    this.draw();
  }

  /** One `result` message. */
  update(result) {
    this.units += 1;
    if (typeof result.wall_clock_ms === 'number') {
      this.latencies.push(result.wall_clock_ms);
      if (this.latencies.length > WINDOW) this.latencies.shift();
    }
    this.last = result;
    this.draw();
  }

  draw() {
    const last = this.last;
    const set = (key, text, warn = false) => {
      this.values[key].textContent = text;
      this.values[key].classList.toggle('warn', warn);
    };
    set('units', String(this.units));
    if (!last) {
      for (const key of ['latency', 'average', 'kv', 'dropped', 'decision']) set(key, '—');
      return;
    }
    const average = this.latencies.reduce((a, b) => a + b, 0) / (this.latencies.length || 1);
    // A unit slower than the 1 s it covers means the model falls behind real time.
    set(
      'latency',
      last.wall_clock_ms != null ? `${Math.round(last.wall_clock_ms)} ms` : '—',
      last.wall_clock_ms > 1000,
    );
    set('average', this.latencies.length ? `${Math.round(average)} ms` : '—', average > 1000);
    set('kv', last.kv_cache_length != null ? String(last.kv_cache_length) : '—');
    const dropped = last.dropped_chunks_total ?? 0;
    set('dropped', String(dropped), dropped > 0);
    set('decision', t(last.is_listen ? 'metrics.listen' : 'metrics.speak'));
  }
}
