// Trends view: numerics over time (route `trends`, docs/http_api.md). One row per module in the
// order the series first saw it, one column per step bucket, each cell coloured by the headroom
// of its abs_max below the dtype's limit; growth alerts above the grid. A click on a cell asks the
// app to jump to that step; a click on an alert marks its module and step in the grid.
//
// The helpers exported before the class are pure (no DOM): `node --test` runs them.

import {el, errorText, message, revealIn, setChildren} from '../dom.js';
import {countNoun, formatStat} from '../format.js';

/** Headroom bands, in bits below the dtype's limit: a cell is the first band its bits fit. */
export const BANDS = [
  {band: 'red', upTo: 1, text: '≤ 1 bit'},
  {band: 'orange', upTo: 4, text: '≤ 4 bits'},
  {band: 'yellow', upTo: 8, text: '≤ 8 bits'},
  {band: 'green', upTo: Infinity, text: '> 8 bits'},
];
// Narrowest and widest column in px; the request asks for as many buckets as fit (between the
// column bounds), and a few columns widen to fill the width.
const CELL_PX = 10;
const WIDE_CELL_PX = 32;
const LABEL_PX = 300;
const MIN_COLUMNS = 20;
const MAX_COLUMNS = 400;

/**
 * The colour band of one cell.
 * @param {number|null} absMax the column's abs_max (null: the module has no summary there).
 * @param {number|null} bits its headroom_bits (null: the dtype has no limit, or abs_max is 0).
 * @param {number|null} nonfinite its count of -inf, +inf and NaN.
 * @returns {'nonfinite'|'absent'|'nolimit'|'red'|'orange'|'yellow'|'green'}
 */
export function headroomBand(absMax, bits, nonfinite) {
  if (nonfinite > 0) return 'nonfinite';
  if (absMax === null || absMax === undefined) return 'absent';
  if (bits === null || bits === undefined || !Number.isFinite(bits)) return 'nolimit';
  return BANDS.find((b) => bits <= b.upTo).band;
}

/** [5, 5] -> "step 5", [5, 9] -> "steps 5–9". */
export function spanLabel(span) {
  return span[0] === span[1] ? `step ${span[0]}` : `steps ${span[0]}–${span[1]}`;
}

/**
 * The column holding `step`: the last column whose span starts at or before it (a step between
 * two buckets belongs to the earlier one); 0 for a step before the first column, -1 for none.
 */
export function columnOf(spans, step) {
  let lo = 0;
  let hi = spans.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (spans[mid][0] <= step) lo = mid + 1;
    else hi = mid;
  }
  return spans.length ? Math.max(0, lo - 1) : -1;
}

/**
 * Columns between two step labels of the axis: labels of `labelPx` pixels on `cellPx` columns
 * must not touch, and fall on a round count of columns (1, 2, 5, 10, 20, 50, ...).
 */
export function tickEvery(cellPx, labelPx) {
  const need = Math.max(1, Math.ceil(labelPx / cellPx));
  for (let scale = 1; ; scale *= 10) {
    for (const m of [1, 2, 5]) if (m * scale >= need) return m * scale;
  }
}

/** How many columns to ask for: as many as fit `widthPx` beside the labels, within bounds. */
export function columnsFor(widthPx) {
  return Math.min(MAX_COLUMNS, Math.max(MIN_COLUMNS, Math.floor((widthPx - LABEL_PX) / CELL_PX)));
}

/** The width of each of `columns` columns filling `widthPx` beside the labels, within bounds. */
export function cellWidth(widthPx, columns) {
  const fit = Math.floor((widthPx - LABEL_PX) / Math.max(1, columns));
  return Math.min(WIDE_CELL_PX, Math.max(CELL_PX, fit));
}

/** A cell's tooltip: module, step(s), abs_max, dtype, headroom, non-finite count. */
export function cellTitle(module, span, absMax, bits, nonfinite) {
  const lines = [module.module, spanLabel(span)];
  if (absMax === null || absMax === undefined) lines.push(nonfinite > 0 ? 'no finite element' : 'no summary');
  else lines.push(`abs_max ${formatStat(absMax)}`);
  lines.push(`dtype ${module.dtype}` + (module.limit ? ` (limit ${formatStat(module.limit)})` : ''));
  if (bits !== null && bits !== undefined) lines.push(`headroom ${bits.toFixed(1)} bits`);
  if (nonfinite > 0) lines.push(`${nonfinite} non-finite (-inf, +inf or NaN)`);
  return lines.join('\n');
}

export class TrendsView {
  /**
   * @param {{root, body, status, tools}} p the pane.
   * @param {{onStep: (step: number) => void}} handlers onStep: a cell was clicked.
   */
  constructor(p, handlers) {
    this.pane = p;
    this.handlers = handlers;
    this.api = null;
    this.shown = false;
    this.loaded = null;
    this.token = 0;
    this.kindSelect = el('select', {class: 'tbn-select', 'aria-label': 'Series kind',
      on: {change: () => this.load(this.kindSelect.value)}});
    p.tools.append(el('label', {class: 'tbn-field'}, 'Kind ', this.kindSelect),
      el('button', {type: 'button', class: 'tbn-button', text: 'Reload', title: 'Read the series again',
        on: {click: () => this.load(this.kindSelect.value || null)}}));
    this.growth = el('div', {class: 'tbn-trend-growth', data: {role: 'growth'}});
    this.notice = el('div');
    this.scroller = el('div', {class: 'tbn-trend-scroll', on: {click: (e) => this._click(e)}});
    setChildren(p.body, this.growth, this._legend(), this.notice, this.scroller);
  }

  _legend() {
    const key = (band, text) => el('span', {class: 'tbn-trend-key'},
      el('span', {class: `tbn-trend-cell tbn-band-${band}`}), text);
    return el('div', {class: 'tbn-trend-legend'}, 'Headroom of abs_max below the dtype limit: ',
      BANDS.map((b) => key(b.band, b.text)), key('nonfinite', 'non-finite'), key('nolimit', 'no limit'),
      key('absent', 'no summary'));
  }

  reset() {
    this.api = null;
    this.loaded = null;
    this.token++;
    this.pane.status.textContent = '';
    this.pane.root.dataset.state = 'loading';
    setChildren(this.growth);
    setChildren(this.scroller);
    setChildren(this.notice, message('loading', 'Loading numerics over time…'));
  }

  /** The run/host client to read from; read now when the view is shown, else when it is. */
  setSource(api) {
    this.api = api;
    if (this.shown) this.load(null);
  }

  /** The view became visible (true) or hidden: a first show reads the series. */
  setShown(shown) {
    this.shown = shown;
    if (shown && this.api && !this.loaded) this.load(null);
  }

  /**
   * Reads one kind (null: "output" when the host has it, else its first kind) and draws it.
   * @returns {Promise<boolean>} whether it was drawn (false: failed, or overtaken).
   */
  async load(kind) {
    const api = this.api;
    if (!api) return false;
    const token = ++this.token;
    this.pane.root.dataset.state = 'loading';
    setChildren(this.notice, message('loading', 'Loading numerics over time…'));
    const maxSteps = columnsFor(this.scroller.clientWidth || this.pane.body.clientWidth || 1000);
    let data;
    try {
      data = await api.trends({kind: kind || 'output', stat: 'abs_max', maxSteps});
      if (!kind && data.kinds.length && !data.kinds.includes('output')) {
        data = await api.trends({kind: data.kinds[0], stat: 'abs_max', maxSteps});
      }
    } catch (err) {
      if (token !== this.token) return false;
      this.pane.root.dataset.state = 'error';
      setChildren(this.notice, message('error', errorText(err), null,
        {label: 'Retry', run: () => this.load(kind)}));
      return false;
    }
    if (token !== this.token) return false;
    this.loaded = data;
    this._draw(data);
    return true;
  }

  _draw(data) {
    const root = this.pane.root;
    root.dataset.kind = data.kind;
    root.dataset.columns = String(data.steps.length);
    root.dataset.bucket = String(data.bucket);
    setChildren(this.kindSelect, data.kinds.map((k) => el('option', {value: k, text: k})));
    this.kindSelect.value = data.kind;
    this.kindSelect.disabled = data.kinds.length < 2;
    this._drawGrowth(data.growth || []);
    if (!data.modules.length) {
      root.dataset.state = 'empty';
      this.pane.status.textContent = '';
      setChildren(this.scroller);
      setChildren(this.notice, data.kinds.length ?
        message('empty', `No ${data.kind} series on this host.`, 'Pick another kind.') :
        message('empty', 'No numerics over time for this host.',
          'Capture with enable_dump_debug_info(..., trends=True) to record per-module summaries each step.'));
      return;
    }
    const steps = data.step_span.length ? spanLabel([data.step_span[0][0], data.step_span.at(-1)[1]]) : '';
    this.pane.status.textContent = `${countNoun(data.modules.length, 'module')}, ${steps}` +
      (data.bucket > 1 ? ` (a column covers up to ${data.bucket} steps)` : '');
    setChildren(this.notice);
    const cellPx = cellWidth(this.scroller.clientWidth || 1000, data.steps.length);
    this.scroller.style.setProperty('--tbn-cell-w', `${cellPx}px`);
    const every = tickEvery(cellPx, 48);
    const axis = el('div', {class: 'tbn-trend-row tbn-trend-axis'},
      el('span', {class: 'tbn-trend-label', text: 'module \\ step'}),
      el('span', {class: 'tbn-trend-cells'}, data.steps.map((s, c) => el('span',
        {class: 'tbn-trend-tick', text: c % every === 0 ? String(s) : ''}))));
    setChildren(this.scroller, axis, data.modules.map((m) => this._row(m, data)));
    root.dataset.state = 'ready';
  }

  _row(m, data) {
    const cells = m.values.map((v, c) => {
      const bits = m.headroom_bits ? m.headroom_bits[c] : null;
      const bad = m.nonfinite ? m.nonfinite[c] : null;
      const band = headroomBand(v, bits, bad);
      return el('span', {class: `tbn-trend-cell tbn-band-${band}`, text: band === 'nonfinite' ? '!' : '',
        title: cellTitle(m, data.step_span[c], v, bits, bad),
        data: {col: String(c), step: String(data.step_span[c][0]), band}});
    });
    return el('div', {class: 'tbn-trend-row', data: {role: 'trend-row', module: m.module, dtype: m.dtype}},
      el('span', {class: 'tbn-trend-label', title: `${m.module} (${m.dtype})`},
        el('span', {class: 'tbn-trend-name'}, el('span', {class: 'tbn-row-name-text', text: m.module})),
        el('span', {class: 'tbn-trend-dtype', text: m.dtype})),
      el('span', {class: 'tbn-trend-cells'}, cells));
  }

  _drawGrowth(alerts) {
    this.pane.root.dataset.growth = String(alerts.length);
    setChildren(this.growth, alerts.map((a) => el('button', {type: 'button', class: 'tbn-trend-alert',
      data: {role: 'growth-alert', module: a.module, kind: a.series_kind, step: String(a.first_step)},
      title: 'Mark this module and its first step in the grid',
      on: {click: () => this.focusAlert(a)}}, el('b', {text: 'Overflow growth: '}), a.message)));
  }

  /** A growth alert clicked: shows its kind, marks its module's row and its first step's cell. */
  async focusAlert(alert) {
    if (this.loaded && this.loaded.kind !== alert.series_kind && !(await this.load(alert.series_kind))) return;
    for (const row of this.scroller.querySelectorAll('[data-highlighted]')) {
      row.classList.remove('tbn-trend-row-highlight');
      delete row.dataset.highlighted;
    }
    const row = [...this.scroller.querySelectorAll('[data-role=trend-row]')]
      .find((r) => r.dataset.module === alert.module);
    if (!row) return;
    row.classList.add('tbn-trend-row-highlight');
    row.dataset.highlighted = 'true';
    const col = columnOf(this.loaded.step_span, alert.first_step);
    const cell = row.querySelector(`[data-col="${col}"]`);
    if (cell) this._select(cell);
    revealIn(this.scroller, row);
  }

  _select(cell) {
    for (const old of this.scroller.querySelectorAll('[data-selected]')) {
      old.classList.remove('tbn-trend-cell-selected');
      delete old.dataset.selected;
    }
    cell.classList.add('tbn-trend-cell-selected');
    cell.dataset.selected = 'true';
    this.pane.root.dataset.selectedStep = cell.dataset.step;
    const left = cell.offsetLeft - this.scroller.scrollLeft;
    if (left < LABEL_PX || left > this.scroller.clientWidth) this.scroller.scrollLeft = cell.offsetLeft - LABEL_PX;
  }

  _click(e) {
    const cell = e.target.closest('.tbn-trend-cell[data-step]');
    if (!cell) return;
    this._select(cell);
    this.handlers.onStep(Number(cell.dataset.step));
  }
}
