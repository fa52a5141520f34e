// Graph Executions pane: a virtualized list of graph execution traces (fixed row height,
// page-aligned fetches through a PageCache), a filter form, keyboard navigation.

import {chipNodes, el, errorText, frameScheduler, message, setChildren} from '../dom.js';
import {countNoun, healthChips, isBad} from '../format.js';
import {clampIndex, contentHeight, scrollTopForRow, visibleRange} from '../virtual_list.js';

export const ROW_HEIGHT = 22;

export class GraphExecutionsView {
  /**
   * @param {{root, body, status}} p the pane.
   * @param {{onFocus: (traceIndex: number) => void, onFilter: (filter|null) => void,
   *   onStep: (step: number) => void}} handlers
   *   filter = {opType, name, badOnly, step}; null clears it. onStep: "go to step" clicked.
   */
  constructor(p, handlers) {
    this.pane = p;
    this.handlers = handlers;
    this.cache = null;
    this.filtered = false;
    this.focusIndex = -1;
    this.inputRows = new Set();
    this.cursor = -1;
    this.schedule = frameScheduler(() => this._draw());
    this._form = this._buildForm();
    this.spacer = el('div', {class: 'tbn-vlist-spacer'});
    this.layer = el('div', {class: 'tbn-vlist-layer'});
    this.spacer.append(this.layer);
    this.scroller = el('div', {class: 'tbn-vlist', tabindex: '0', role: 'listbox',
      'aria-label': 'Graph executions', on: {scroll: () => this.schedule(), keydown: (e) => this._key(e)}},
    this.spacer);
    this.notice = el('div', {class: 'tbn-vlist-notice'});
    this.header = el('div', {class: 'tbn-row tbn-row-header'});
    setChildren(p.body, this._form, this.notice, this.header, this.scroller);
    new ResizeObserver(() => this.schedule()).observe(this.scroller);
  }

  _buildForm() {
    this.opTypeInput = el('input', {type: 'search', placeholder: 'op type', class: 'tbn-input',
      'aria-label': 'Filter by op type', size: '8'});
    this.nameInput = el('input', {type: 'search', placeholder: 'op name contains', class: 'tbn-input',
      'aria-label': 'Filter by op name', size: '16'});
    this.badOnlyInput = el('input', {type: 'checkbox', 'aria-label': 'Bad only'});
    // The training step: "Filter" keeps that step's traces, "Go" jumps to its first trace; the
    // focused row's step is shown here.
    this.stepInput = el('input', {type: 'text', inputmode: 'numeric', placeholder: 'step',
      class: 'tbn-input tbn-step-input', 'aria-label': 'Training step', size: '6'});
    const go = el('button', {type: 'button', class: 'tbn-button tbn-step-go', text: 'Go to step',
      title: 'Jump to the first trace and execution of this step (or the next marked one)',
      on: {click: () => {
        const step = this._step();
        if (step !== null) this.handlers.onStep(step);
      }}});
    const clear = el('button', {type: 'button', class: 'tbn-button', text: 'Clear', on: {click: () => {
      this.opTypeInput.value = '';
      this.nameInput.value = '';
      this.stepInput.value = '';
      this.badOnlyInput.checked = false;
      this.handlers.onFilter(null);
    }}});
    return el('form', {class: 'tbn-filter', on: {submit: (e) => {
      e.preventDefault();
      const filter = {opType: this.opTypeInput.value.trim(), name: this.nameInput.value.trim(),
        badOnly: this.badOnlyInput.checked, step: this._step()};
      if (this.stepInput.value.trim() && filter.step === null) return;
      const any = filter.opType || filter.name || filter.badOnly || filter.step !== null;
      this.handlers.onFilter(any ? filter : null);
    }}}, this.opTypeInput, this.nameInput,
    el('label', {class: 'tbn-check'}, this.badOnlyInput, 'bad only'),
    el('button', {type: 'submit', class: 'tbn-button', text: 'Filter'}), clear,
    this.stepInput, go);
  }

  /** The step typed in the step box as an integer; null (and marked invalid) otherwise. */
  _step() {
    const text = this.stepInput.value.trim();
    const ok = /^-?[0-9]{1,15}$/.test(text);
    this.stepInput.classList.toggle('tbn-input-invalid', Boolean(text) && !ok);
    return ok ? Number(text) : null;
  }

  /** Shows the step of the focused row in the step box (unmarked: left as typed). */
  showStep(step) {
    if (step === null || step === undefined) {
      delete this.pane.root.dataset.focusedStep;
      return;
    }
    this.pane.root.dataset.focusedStep = String(step);
    this.stepInput.value = String(step);
    this.stepInput.classList.remove('tbn-input-invalid');
  }

  reset() {
    this.cache = null;
    this.focusIndex = -1;
    this.inputRows = new Set();
    setChildren(this.layer);
    this.spacer.style.height = '0px';
    this._notice(message('loading', 'Loading graph executions…'));
  }

  /** Shows rows from a PageCache of trace digests (each with its trace `index`). */
  async setSource(cache, filtered) {
    this.cache = cache;
    this.filtered = filtered;
    this.cursor = -1;
    // Rows of the previous source must not pass for the new one's while it loads.
    setChildren(this.layer);
    this.scroller.scrollTop = 0;
    this._error = null;
    delete this.pane.root.dataset.error;
    this.pane.root.dataset.filtered = String(filtered);
    try {
      await cache.ensureTotal();
    } catch (err) {
      this.showError(err);
      return;
    }
    if (this.cache !== cache) return;
    this.pane.status.textContent = countNoun(cache.total, filtered ? 'match' : 'trace', filtered ? 'matches' : 'traces');
    this.pane.root.dataset.total = String(cache.total);
    // Wide enough for the largest index, so a million rows keep their columns.
    this.pane.root.style.setProperty('--tbn-index-w', `${String(cache.total).length + 1}ch`);
    this.withSteps = Boolean(cache.total && cache.get(0) && cache.get(0).step !== null &&
      cache.get(0).step !== undefined) || Boolean(this.hasSteps);
    this._setHeader(cache.total ? cache.get(0) : null);
    this._notice(cache.total === 0 ? (filtered ? 'No trace matches this filter.' :
      'This run has no graph execution traces (eager-only program, or NO_TENSOR mode).') : null);
    this.schedule();
  }

  /** Column titles; the chip columns follow the run's debug mode (from the first row). */
  _setHeader(first) {
    const chips = first ? healthChips(first.health) : [];
    setChildren(this.header, el('span', {class: 'tbn-row-index', text: '#'}),
      this.withSteps ? el('span', {class: 'tbn-row-step', text: 'step'}) : [],
      el('span', {class: 'tbn-row-name', text: 'op_name:slot'}), el('span', {class: 'tbn-row-type', text: 'op type'}),
      el('span', {class: 'tbn-chips'}, chips.map((c) => el('span', {class: `tbn-chip tbn-chip-head tbn-chip-${c.key}`,
        text: c.label}))));
  }

  /**
   * Marks the focused trace and its input rows; scrolls it to the middle when it is new (the input
   * rows arrive later, and the keyboard cursor may have moved on meanwhile) or `reveal` says so.
   */
  setFocus(traceIndex, inputRows, reveal = traceIndex !== this.focusIndex) {
    if (this.pane.root.dataset.stepNotFound !== undefined) {
      delete this.pane.root.dataset.stepNotFound;
      this._notice(null);
    }
    this.focusIndex = traceIndex;
    this.inputRows = new Set(inputRows);
    if (reveal && !this.filtered && this.cache && this.cache.total) {
      this.cursor = traceIndex;
      this._scrollTo(traceIndex, 'center');
    }
    this.schedule();
  }

  /** Says that no record carries `step` or a later one (the list stays as it is). */
  stepNotFound(step) {
    this.pane.root.dataset.stepNotFound = String(step);
    this._notice(message('empty', `No trace or execution is marked with step ${step} or a later one.`));
  }

  showError(err) {
    this._error = err;
    this.pane.root.dataset.error = 'true';
    const cache = this.cache;
    this._notice(message('error', errorText(err), null, {label: 'Retry', run: () => {
      if (this.cache === cache) this.setSource(cache, this.filtered);
    }}));
  }

  _notice(content) {
    setChildren(this.notice, content === null ? [] : [typeof content === 'string' ?
      message('empty', content) : content]);
  }

  _scrollTo(row, align) {
    const total = this.cache.total;
    this.scroller.scrollTop = scrollTopForRow(row, {align, scrollTop: this.scroller.scrollTop,
      viewportHeight: this.scroller.clientHeight, rowHeight: ROW_HEIGHT, total});
  }

  _draw() {
    const cache = this.cache;
    if (!cache || cache.total === null) return;
    const total = cache.total;
    this.spacer.style.height = `${contentHeight(total, ROW_HEIGHT)}px`;
    const {first, end, offset} = visibleRange({scrollTop: this.scroller.scrollTop,
      viewportHeight: this.scroller.clientHeight, rowHeight: ROW_HEIGHT, total});
    this.layer.style.transform = `translateY(${this.scroller.scrollTop + offset}px)`;
    // The header has no scrollbar: pad it by the list's so the chip columns line up.
    this.header.style.paddingRight = `${6 + this.scroller.offsetWidth - this.scroller.clientWidth}px`;
    const rows = [];
    let missing = false;
    for (let i = first; i < end; i++) {
      const d = cache.get(i);
      if (!d) missing = true;
      rows.push(this._row(i, d));
    }
    setChildren(this.layer, rows);
    this.pane.root.dataset.firstRow = String(first);
    this.pane.root.dataset.lastRow = String(end - 1);
    if (missing) {
      cache.ensure(first, end).then(() => {
        if (this._error) {
          this._error = null;
          delete this.pane.root.dataset.error;
          this._notice(null);
        }
        if (this.cache === cache) this.schedule();
      }, (err) => this.showError(err));
    }
  }

  _row(i, d) {
    const cls = ['tbn-row'];
    if (i === this.cursor) cls.push('tbn-row-cursor');
    if (!d) {
      return el('div', {class: cls.concat('tbn-row-loading').join(' '), data: {row: String(i)}},
        el('span', {class: 'tbn-row-name', text: `#${i} …`}));
    }
    const data = {row: String(i), index: String(d.index)};
    if (d.error) {
      // A record the server could not read: said in its row, its neighbours stay usable.
      return el('div', {class: cls.concat('tbn-row-error').join(' '), role: 'option',
        data: {...data, error: 'true'}, title: d.error},
      el('span', {class: 'tbn-row-index', text: d.index}),
      el('span', {class: 'tbn-row-name', text: `unreadable record: ${d.error}`}));
    }
    if (isBad(d.health)) cls.push('tbn-row-bad');
    if (d.index === this.focusIndex) {
      cls.push('tbn-row-focused');
      Object.assign(data, {focused: 'true', opType: d.op_type, opName: d.op_name});
    }
    if (this.inputRows.has(d.index)) {
      cls.push('tbn-row-input');
      data.inputOfFocus = 'true';
    }
    const name = `${d.op_name}:${d.output_slot}`;
    const marked = d.step !== null && d.step !== undefined;
    if (marked) data.step = String(d.step);
    return el('div', {class: cls.join(' '), role: 'option', data,
      title: `#${d.index} ${name} (${d.op_type}) in graph ${d.graph_name || d.graph_id}` +
        (marked ? ` at step ${d.step}` : ''),
      on: {click: () => {
        this.cursor = i;
        this.handlers.onFocus(d.index);
      }}},
    el('span', {class: 'tbn-row-index', text: d.index}),
    this.withSteps ? el('span', {class: 'tbn-row-step', text: marked ? String(d.step) : ''}) : [],
    // The name sits in an isolate so that the focused row, laid out right to left, clips its start
    // and keeps the end that names the layer and the op in view.
    el('span', {class: 'tbn-row-name'}, el('span', {class: 'tbn-row-name-text', text: name})),
    el('span', {class: 'tbn-row-type', text: d.op_type}),
    el('span', {class: 'tbn-chips'}, chipNodes(healthChips(d.health), false)));
  }

  _key(e) {
    if (!this.cache || !this.cache.total) return;
    const total = this.cache.total;
    const page = Math.max(1, Math.floor(this.scroller.clientHeight / ROW_HEIGHT) - 1);
    const moves = {ArrowDown: 1, ArrowUp: -1, PageDown: page, PageUp: -page};
    let next = this.cursor;
    if (e.key in moves) next = clampIndex((this.cursor < 0 ? 0 : this.cursor) + moves[e.key], total);
    else if (e.key === 'Home') next = 0;
    else if (e.key === 'End') next = total - 1;
    else if (e.key === 'Enter') {
      const d = this.cursor >= 0 && this.cache.get(this.cursor);
      if (d) this.handlers.onFocus(d.index);
      e.preventDefault();
      return;
    } else return;
    e.preventDefault();
    this.cursor = next;
    this._scrollTo(next, 'nearest');
    this.schedule();
  }
}
