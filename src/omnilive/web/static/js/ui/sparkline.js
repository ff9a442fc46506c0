// Small live line charts for the admin page, drawn as inline SVG (no library):
// one or more series over the same samples, an optional guide line (the 1 s
// real-time line of unit latency), and the scale's top written in a corner.
// A null value (no unit in that sample) breaks its line instead of dropping to 0.

import { el } from '../lib/dom.js';

const SVG = 'http://www.w3.org/2000/svg';
const WIDTH = 240;
const HEIGHT = 56;

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  return node;
}

// Runs of consecutive values that are not null, as polyline point lists.
function segments(values, top, count) {
  const step = count > 1 ? WIDTH / (count - 1) : 0;
  const runs = [];
  let run = [];
  values.forEach((value, index) => {
    if (value === null || value === undefined) {
      if (run.length) runs.push(run);
      run = [];
      return;
    }
    const y = HEIGHT - (Math.min(value, top) / top) * (HEIGHT - 2) - 1;
    run.push(`${(index * step).toFixed(1)},${y.toFixed(1)}`);
  });
  if (run.length) runs.push(run);
  return runs.map((points) => (points.length === 1 ? [points[0], points[0]] : points).join(' '));
}

/**
 * A chart of `series` ([{name, values}], values oldest first) scaled to at
 * least `floor` (and to the guide, if any), as a <figure data-chart=key>.
 */
export function sparkline(key, caption, series, { floor = 1, guide = null, unit = '' } = {}) {
  const all = series.flatMap((s) => s.values).filter((v) => v !== null && v !== undefined);
  const top = Math.max(floor, guide ?? 0, ...all) * 1.05;
  const count = Math.max(...series.map((s) => s.values.length), 1);
  const chart = svg('svg', {
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    preserveAspectRatio: 'none',
    role: 'img',
    'aria-label': caption,
  });
  if (guide !== null) {
    const y = HEIGHT - (guide / top) * (HEIGHT - 2) - 1;
    chart.append(svg('line', { class: 'guide', x1: 0, x2: WIDTH, y1: y, y2: y }));
  }
  for (const s of series) {
    for (const points of segments(s.values, top, count)) {
      chart.append(svg('polyline', { class: `series ${s.name}`, points }));
    }
  }
  const latest = series.map((s) => {
    const value = s.values.at(-1);
    return `${s.label ?? s.name} ${value === null || value === undefined ? '—' : Math.round(value)}${unit}`;
  });
  return el(
    'figure',
    { class: 'spark', 'data-chart': key, 'data-points': count },
    el('figcaption', {}, el('span', {}, caption), el('span', { class: 'hint' }, latest.join(' · '))),
    chart,
  );
}
