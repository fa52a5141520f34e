// Propagation path strip, above the Graph Structure: how the first bad tensor's NaN/∞ travel
// from their root to what they reach (the summary's `first_bad_tensor.path` and `sink`), one chip
// per hop, each a link that focuses it.

import {el, revealIn, setChildren} from '../dom.js';
import {badCounts, healthSummary, shortScopedName} from '../format.js';
import {hopOf, pathWindow} from '../model.js';

// What each sink word means, for the last chip's tooltip (docs/report.md).
const SINKS = {
  'model output': 'the output of the top-level model call',
  'optimizer step': 'an optimizer step',
  'never read': 'a value nothing read afterwards (the loss, or a result left unused)',
  'untraced reader': 'an op that was not traced (its result is unknown)',
  'analysis limit': 'the limit of the lineage analysis',
};

export class PathView {
  /**
   * @param {HTMLElement} strip the element the strip fills (hidden while there is no path).
   * @param {{onHop: (hop: object) => void}} handlers a hop clicked: focus its trace/execution.
   */
  constructor(strip, handlers) {
    this.strip = strip;
    this.handlers = handlers;
    this.reset();
  }

  reset() {
    this.firstBad = null;
    this.current = -1;
    this.expanded = false;
    this.strip.hidden = true;
    delete this.strip.dataset.current;
    delete this.strip.dataset.sink;
    setChildren(this.strip);
  }

  /**
   * Shows the path when `focus` ({host, kind, index}) is one of its hops; hides it otherwise.
   * @param {object|null} firstBad the summary's `first_bad_tensor`.
   */
  show(firstBad, focus) {
    const current = hopOf(firstBad, focus);
    if (current < 0) {
      this.strip.hidden = true;
      this.current = -1;
      delete this.strip.dataset.current;
      return;
    }
    if (firstBad !== this.firstBad) this.expanded = false;
    this.firstBad = firstBad;
    this.current = current;
    this._draw();
  }

  _draw() {
    const fb = this.firstBad;
    const hops = fb.path;
    const n = hops.length;
    // A focused hop in the folded middle unfolds it: the strip always shows where one is.
    const win = pathWindow(n, {expanded: this.expanded});
    const expanded = win.hidden && win.head.length <= this.current && this.current < n - win.tail.length ?
      pathWindow(n, {expanded: true}) : win;
    const nodes = [el('span', {class: 'tbn-path-title', text: 'NaN/∞ path'})];
    const arrow = () => el('span', {class: 'tbn-path-arrow', text: '→'});
    expanded.head.forEach((i, k) => nodes.push(k ? arrow() : null, this._hop(hops[i], i)));
    if (expanded.hidden) {
      nodes.push(arrow(), el('button', {type: 'button', class: 'tbn-link tbn-path-more',
        data: {role: 'path-more'}, text: `… ${expanded.hidden} more`,
        title: 'Show every hop of the path',
        on: {click: () => {
          this.expanded = true;
          this._draw();
        }}}));
    }
    for (const i of expanded.tail) nodes.push(arrow(), this._hop(hops[i], i));
    nodes.push(arrow(), el('span', {class: 'tbn-path-sink', data: {role: 'path-sink'}, text: fb.sink,
      title: `The NaN/∞ reach ${SINKS[fb.sink] || fb.sink}`}));
    this.strip.dataset.current = String(this.current);
    this.strip.dataset.sink = fb.sink;
    this.strip.hidden = false;
    setChildren(this.strip, nodes);
    const current = this.strip.querySelector('.tbn-hop-current');
    if (current) revealIn(this.strip, current);
  }

  _hop(hop, position) {
    const current = position === this.current;
    const what = hop.kind === 'execution' ? `execution #${hop.index}` : `trace #${hop.index}`;
    return el('button', {type: 'button', class: `tbn-hop${current ? ' tbn-hop-current' : ''}`,
      data: {role: 'hop', hop: String(position), kind: hop.kind, index: String(hop.index),
        opName: hop.op_name},
      title: `${position ? `hop ${position}` : 'root'}: ${hop.op_name}:${hop.output_slot} (${hop.op_type}), ` +
        `${what}: ${healthSummary(hop.health)}`,
      'aria-current': current ? 'true' : null,
      on: {click: () => this.handlers.onHop(hop)}},
    el('span', {class: 'tbn-hop-name', text: shortScopedName(hop.op_name)}),
    el('span', {class: 'tbn-chip tbn-chip-bad tbn-hop-health', data: {role: 'hop-health'},
      text: badCounts(hop.health) || 'no counts'}));
  }
}
