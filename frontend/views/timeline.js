// Python Execution Timeline pane: one box per execution (eager op or graph function call), paged
// through a PageCache; buttons and a slider move the window; a click shows the details.

import {chipNodes, el, errorText, frameScheduler, message, setChildren} from '../dom.js';
import {countNoun, healthChips, isBad, opInitial} from '../format.js';

const BOX_PX = 22;

export class TimelineView {
  /** @param {{onSelect: (index: number) => void}} handlers */
  constructor(p, handlers) {
    this.pane = p;
    this.handlers = handlers;
    this.cache = null;
    this.start = 0;
    this.selected = -1;
    this.inputs = new Set();
    this.schedule = frameScheduler(() => this._draw());
    const button = (text, title, fn) => el('button', {type: 'button', class: 'tbn-button', text, title,
      'aria-label': title, on: {click: fn}});
    this.slider = el('input', {type: 'range', class: 'tbn-slider', min: '0', max: '0', value: '0',
      'aria-label': 'Timeline position', on: {input: () => this.moveTo(Number(this.slider.value))}});
    this.position = el('span', {class: 'tbn-timeline-pos'});
    this.strip = el('div', {class: 'tbn-timeline-strip', role: 'list'});
    this.details = el('div', {class: 'tbn-exec-details'});
    this.notice = el('div');
    setChildren(p.body,
      el('div', {class: 'tbn-timeline-controls'},
        button('«', 'First executions', () => this.moveTo(0)),
        button('‹', 'Previous executions', () => this.moveTo(this.start - this.count())),
        this.slider,
        button('›', 'Next executions', () => this.moveTo(this.start + this.count())),
        button('»', 'Last executions', () => this.moveTo(Infinity)),
        this.position),
      this.notice, this.strip, this.details);
    new ResizeObserver(() => this.schedule()).observe(this.strip);
  }

  /** Boxes that fit the strip's width. */
  count() {
    return Math.max(1, Math.floor((this.strip.clientWidth || 400) / BOX_PX));
  }

  reset() {
    this.cache = null;
    this.selected = -1;
    this.inputs = new Set();
    delete this.pane.root.dataset.selected;
    setChildren(this.strip);
    setChildren(this.notice, message('loading', 'Loading executions…'));
    setChildren(this.details);
  }

  async setSource(cache) {
    this.cache = cache;
    this.start = 0;
    this.selected = -1;
    setChildren(this.details, message('empty', 'Click an execution to see its op, inputs and outputs.'));
    setChildren(this.notice);
    try {
      await cache.ensureTotal();
    } catch (err) {
      this.showError(err);
      return;
    }
    if (this.cache !== cache) return;
    this.pane.status.textContent = countNoun(cache.total, 'execution');
    this.pane.root.dataset.total = String(cache.total);
    this.slider.max = String(Math.max(0, cache.total - 1));
    setChildren(this.notice, cache.total ? [] : [message('empty', 'No executions in this run.')]);
    this.schedule();
  }

  moveTo(start) {
    if (!this.cache || !this.cache.total) return;
    const last = Math.max(0, this.cache.total - this.count());
    this.start = Math.max(0, Math.min(last, Math.floor(start === Infinity ? last : start)));
    this.schedule();
  }

  /** Puts execution `index` in the middle of the strip and selects it. */
  reveal(index) {
    this.selected = index;
    this.pane.root.dataset.selected = String(index);
    this.moveTo(index - Math.floor(this.count() / 2));
  }

  /** Marks the executions that produced the focused tensor's inputs (none: clears). */
  setInputs(indices) {
    this.inputs = new Set(indices);
    this.schedule();
  }

  showError(err) {
    const cache = this.cache;
    setChildren(this.notice, message('error', errorText(err), null, {label: 'Retry', run: () => {
      if (this.cache === cache) this.setSource(cache);
    }}));
  }

  _draw() {
    const cache = this.cache;
    if (!cache || !cache.total) return;
    const end = Math.min(cache.total, this.start + this.count());
    this.slider.value = String(this.start);
    const firstBox = cache.get(this.start);
    const step = firstBox && firstBox.step !== null && firstBox.step !== undefined ? ` · step ${firstBox.step}` : '';
    this.position.textContent = `${this.start}–${end - 1} of ${cache.total}${step}`;
    this.pane.root.dataset.start = String(this.start);
    const boxes = [];
    let missing = false;
    for (let i = this.start; i < end; i++) {
      const d = cache.get(i);
      if (!d) missing = true;
      boxes.push(this._box(i, d));
    }
    setChildren(this.strip, boxes);
    if (missing) {
      cache.ensure(this.start, end).then(() => {
        setChildren(this.notice);
        this.schedule();
      }, (err) => this.showError(err));
    }
  }

  _box(i, d) {
    const cls = ['tbn-exec'];
    if (!d) return el('span', {class: cls.concat('tbn-exec-loading').join(' '), text: '·'});
    if (d.error) {
      return el('span', {class: cls.concat('tbn-exec-error').join(' '), role: 'listitem', text: '!',
        title: `#${i} ${d.error}`, data: {execIndex: String(i), error: 'true'}});
    }
    if (isBad(d.health)) cls.push('tbn-exec-bad');
    if (i === this.selected) cls.push('tbn-exec-selected');
    const input = this.inputs.has(i);
    if (input) cls.push('tbn-exec-input');
    const name = d.op_type;
    const data = {execIndex: String(i), bad: String(isBad(d.health))};
    if (input) data.inputOfFocus = 'true';
    const marked = d.step !== null && d.step !== undefined;
    if (marked) data.step = String(d.step);
    return el('button', {type: 'button', class: cls.join(' '), role: 'listitem', text: opInitial(name),
      title: `#${i} ${name}${d.graph_id ? ' (graph function)' : ''}${marked ? ` · step ${d.step}` : ''}` +
        `${input ? ' · made an input of the focused op' : ''}`,
      data,
      on: {click: () => {
        this.selected = i;
        this.pane.root.dataset.selected = String(i);
        this.schedule();
        this.handlers.onSelect(i);
      }}});
  }

  /** Details of one full execution (execution/data item; `output_health` per output slot). */
  showDetails(exec) {
    const ids = exec.output_tensor_ids || [];
    const healths = exec.output_health || [];
    const outputs = Array.from({length: Math.max(ids.length, healths.length)}, (_, slot) => {
      const health = healths[slot];
      const id = slot < ids.length ? ` (tensor ${ids[slot]})` : '';
      return el('div', {class: 'tbn-exec-output', data: {slot: String(slot)}},
        el('span', {class: 'tbn-mono', text: `out ${slot}${id}`}),
        el('span', {class: 'tbn-chips'}, health ? chipNodes(healthChips(health)) : el('span', {class: 'tbn-muted', text: 'no health'})));
    });
    setChildren(this.details,
      el('div', {class: 'tbn-exec-head'}, el('b', {text: `#${exec.index} ${exec.op_type}`}),
        exec.graph_name ? ` graph ${exec.graph_name}` : '',
        exec.step === null || exec.step === undefined ? '' : ` · step ${exec.step}`,
        ` · ${exec.tensor_debug_mode}`),
      el('div', {class: 'tbn-mono tbn-muted', text: `inputs: ${(exec.input_tensor_ids || []).join(', ') || '–'}`}),
      outputs.length ? outputs : el('div', {class: 'tbn-muted', text: 'no outputs'}));
  }

  showDetailsError(err) {
    setChildren(this.details, message('error', errorText(err)));
  }
}
