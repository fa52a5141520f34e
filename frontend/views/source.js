// Source Code pane: a file as the dump snapshotted it, with line numbers, one line highlighted
// and centred.

import {el, errorText, message, setChildren} from '../dom.js';

// Past this many lines only a window around the highlighted line is built: TF snapshots its own
// files too, some thousands of lines long.
const MAX_LINES = 3000;

/** The end of a long path, which names the file; the whole path is in the title. */
function tail(path, keep = 70) {
  return path.length > keep ? '…' + path.slice(path.length - keep) : path;
}

export class SourceView {
  constructor(p) {
    this.pane = p;
    setChildren(p.body, message('empty', 'Click a stack frame to open its file here.'));
  }

  reset() {
    delete this.pane.root.dataset.file;
    delete this.pane.root.dataset.line;
    this.pane.status.textContent = '';
    setChildren(this.pane.body, message('empty', 'Click a stack frame to open its file here.'));
  }

  loading(path) {
    setChildren(this.pane.body, message('loading', `Loading ${path}…`));
  }

  /** @param {{file_path, host_name, lines}} file source_files/file answer; @param {number} line 1-based. */
  show(file, line) {
    const root = this.pane.root;
    root.dataset.file = file.file_path;
    root.dataset.line = String(line);
    this.pane.status.textContent = `${tail(file.file_path)}:${line}`;
    this.pane.status.title = `${file.host_name}:${file.file_path}`;
    const n = file.lines.length;
    const from = n > MAX_LINES ? Math.max(0, line - 1 - MAX_LINES / 2) : 0;
    const to = Math.min(n, from + MAX_LINES);
    const rows = [];
    let target = null;
    for (let i = from; i < to; i++) {
      const isTarget = i + 1 === line;
      const row = el('div', {class: isTarget ? 'tbn-src-line tbn-src-hit' : 'tbn-src-line',
        data: isTarget ? {line: String(line)} : null},
      el('span', {class: 'tbn-src-no', text: i + 1}), el('span', {class: 'tbn-src-text', text: file.lines[i]}));
      if (isTarget) target = row;
      rows.push(row);
    }
    const code = el('div', {class: 'tbn-src', role: 'region', 'aria-label': file.file_path}, rows);
    setChildren(this.pane.body, code);
    if (target) {
      // Centre the line in the pane once laid out; one-off, not a loop.
      requestAnimationFrame(() => {
        code.scrollTop = target.offsetTop - (code.clientHeight - target.offsetHeight) / 2;
      });
    } else {
      code.prepend(message('empty', `Line ${line} is not in the snapshot (${n} lines).`));
    }
  }

  /** The frame's file is not in the dump: say so with the path. */
  missing(frame) {
    const root = this.pane.root;
    root.dataset.file = frame.file_path;
    delete root.dataset.line;
    setChildren(this.pane.body, message('empty', `No snapshot of ${frame.file_path} in this dump.`,
      'The writer snapshots files it can read when the op is created.'));
  }

  showError(err) {
    setChildren(this.pane.body, message('error', errorText(err)));
  }
}
