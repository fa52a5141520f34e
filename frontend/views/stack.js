// Stack Trace pane: the frames where the op was created; runs of framework frames are folded.

import {el, errorText, message, setChildren} from '../dom.js';
import {countNoun, isFrameworkFrame} from '../format.js';

export class StackView {
  /** @param {{onOpen: (frame) => void}} handlers */
  constructor(p, handlers) {
    this.pane = p;
    this.handlers = handlers;
    this.frames = [];
    this.expanded = new Set();
    setChildren(p.body, message('empty', 'Focus a graph execution to see where its op was created.'));
  }

  reset() {
    this.frames = [];
    this.pane.status.textContent = '';
    setChildren(this.pane.body, message('empty', 'Focus a graph execution to see where its op was created.'));
  }

  loading() {
    setChildren(this.pane.body, message('loading', 'Loading stack…'));
  }

  /** @param {object[]} frames stack_frames answer items; @param {number} selected frame to mark. */
  show(frames, selected) {
    this.frames = frames;
    this.selected = selected;
    this.expanded = new Set();
    this.pane.status.textContent = countNoun(frames.length, 'frame');
    this._draw();
  }

  select(i) {
    this.selected = i;
    this._draw();
  }

  _draw() {
    if (!this.frames.length) {
      setChildren(this.pane.body, message('empty', 'The dump holds no stack for this op.'));
      return;
    }
    const nodes = [];
    let i = 0;
    while (i < this.frames.length) {
      if (!isFrameworkFrame(this.frames[i].file_path) || i === this.selected) {
        nodes.push(this._frame(i));
        i++;
        continue;
      }
      const runStart = i;
      while (i < this.frames.length && isFrameworkFrame(this.frames[i].file_path) && i !== this.selected) i++;
      if (this.expanded.has(runStart)) {
        nodes.push(this._fold(runStart, i - runStart, true));
        for (let j = runStart; j < i; j++) nodes.push(this._frame(j));
      } else {
        nodes.push(this._fold(runStart, i - runStart, false));
      }
    }
    setChildren(this.pane.body, el('ol', {class: 'tbn-frames'}, nodes));
  }

  _fold(start, n, open) {
    return el('li', {class: 'tbn-frame-fold'}, el('button', {type: 'button', class: 'tbn-link',
      text: `${open ? '▾' : '▸'} ${n} framework frame${n > 1 ? 's' : ''}`,
      on: {click: () => {
        if (open) this.expanded.delete(start);
        else this.expanded.add(start);
        this._draw();
      }}}));
  }

  _frame(i) {
    const f = this.frames[i];
    const base = f.file_path.split(/[\\/]/).pop();
    const cls = ['tbn-frame'];
    if (isFrameworkFrame(f.file_path)) cls.push('tbn-frame-framework');
    if (i === this.selected) cls.push('tbn-frame-selected');
    return el('li', {class: cls.join(' '), data: {file: f.file_path, line: String(f.lineno)},
      title: `${f.file_path}:${f.lineno}`, tabindex: '0',
      on: {click: () => this._open(i), keydown: (e) => e.key === 'Enter' && this._open(i)}},
    el('span', {class: 'tbn-frame-func', text: f.func}),
    el('span', {class: 'tbn-frame-loc', text: `${base}:${f.lineno}`}),
    f.code ? el('div', {class: 'tbn-frame-code tbn-mono', text: f.code}) : null);
  }

  _open(i) {
    this.select(i);
    this.handlers.onOpen(this.frames[i]);
  }

  showError(err) {
    setChildren(this.pane.body, message('error', errorText(err)));
  }
}
