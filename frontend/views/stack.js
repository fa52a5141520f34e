// Stack Trace pane: the frames where the op was created; runs of framework frames (the server's
// per-frame `kind`) are folded; the model-code and user-code frames are marked.

import {el, errorText, message, revealIn, setChildren} from '../dom.js';
import {countNoun} from '../format.js';

const framework = (f) => f.kind === 'framework';
const MARKS = {source: 'model code', 'user-source': 'your code'};

export class StackView {
  /** @param {{onOpen: (frame) => void}} handlers */
  constructor(p, handlers) {
    this.pane = p;
    this.handlers = handlers;
    this.frames = [];
    this.marks = {source: -1, user: -1};
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

  /**
   * @param {object[]} frames stack_frames answer items (with `kind`).
   * @param {{source: number, user: number, open: number}} marks model.frameMarks: the frames to
   *   label "model code" and "your code"; `open` is selected.
   */
  show(frames, marks) {
    this.frames = frames;
    this.marks = marks;
    this.selected = marks.open;
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
      if (!framework(this.frames[i]) || this._kept(i)) {
        nodes.push(this._frame(i));
        i++;
        continue;
      }
      const runStart = i;
      while (i < this.frames.length && framework(this.frames[i]) && !this._kept(i)) i++;
      if (this.expanded.has(runStart)) {
        nodes.push(this._fold(runStart, i - runStart, true));
        for (let j = runStart; j < i; j++) nodes.push(this._frame(j));
      } else {
        nodes.push(this._fold(runStart, i - runStart, false));
      }
    }
    setChildren(this.pane.body, el('ol', {class: 'tbn-frames'}, nodes));
    // The opened frame is often the innermost, at the bottom of a long stack: bring it into view.
    const selected = this.pane.body.querySelector('.tbn-frame-selected');
    if (selected) revealIn(this.pane.body, selected);
  }

  /** A framework frame that stays in view: the selected or a marked one. */
  _kept(i) {
    return i === this.selected || i === this.marks.source || i === this.marks.user;
  }

  /** "user-source" for the user's innermost frame, "source" for model code that made the op. */
  _mark(i) {
    if (i === this.marks.user) return 'user-source';
    if (i === this.marks.source && this.frames[i].kind === 'model') return 'source';
    return null;
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
    if (framework(f)) cls.push('tbn-frame-framework');
    if (i === this.selected) cls.push('tbn-frame-selected');
    const mark = this._mark(i);
    const data = {file: f.file_path, line: String(f.lineno), kind: f.kind || ''};
    if (mark) {
      cls.push(`tbn-frame-mark-${mark}`);
      data.mark = mark;
    }
    return el('li', {class: cls.join(' '), data,
      title: `${f.file_path}:${f.lineno}${f.kind ? ` (${f.kind} code)` : ''}`, tabindex: '0',
      on: {click: () => this._open(i), keydown: (e) => e.key === 'Enter' && this._open(i)}},
    mark ? el('span', {class: 'tbn-frame-badge', text: MARKS[mark]}) : null,
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
