// Graph Structure pane: the focused op in bold, its inputs above and consumers below; each is
// clickable to walk the graph.

import {el, errorText, message, setChildren} from '../dom.js';
import {healthSummary, isBad as isBadHealth} from '../format.js';
import {flatConsumers} from '../model.js';

export class GraphStructureView {
  /**
   * @param {{onWalk: (op: {op_name, op_type}, direction: -1|1) => void,
   *   onExecution: (index: number) => void}} handlers
   */
  constructor(p, handlers) {
    this.pane = p;
    this.handlers = handlers;
    setChildren(p.body, message('empty', 'Focus a graph execution to see its op here.'));
  }

  reset() {
    delete this.pane.root.dataset.opName;
    this.pane.status.textContent = '';
    setChildren(this.pane.body, message('empty', 'Focus a graph execution to see its op here.'));
  }

  /** The focus is an execution (an eager op or a graph call): it has no op in a graph to show. */
  execution(index, opType) {
    delete this.pane.root.dataset.opName;
    this.pane.status.textContent = '';
    setChildren(this.pane.body, message('empty', `Execution #${index}${opType ? ` ${opType}` : ''} is not an op ` +
      'of a graph: its inputs and outputs are in the timeline above.'));
  }

  loading(opName) {
    setChildren(this.pane.body, message('loading', `Loading ${opName}…`));
  }

  /**
   * @param {object} info op_info answer; @param {string} graphName for the heading.
   * @param {Map<string, object>} sources inputs with a known source by "op:slot"
   *   (model.inputSources); an execution source adds a line that selects that execution.
   */
  show(info, graphName, sources = new Map()) {
    this.pane.root.dataset.opName = info.op_name;
    this.pane.status.textContent = graphName ? `graph ${graphName}` : '';
    const link = (op, slotText, direction, role) => el('button', {type: 'button', class: 'tbn-op-link',
      data: {opName: op.op_name, role}, title: `Go to ${op.op_name}`,
      on: {click: () => this.handlers.onWalk(op, direction)}},
    el('span', {class: 'tbn-mono', text: op.op_name + slotText}),
    el('span', {class: 'tbn-op-type', text: op.op_type || '?'}));
    const inputs = (info.inputs || []).map((op) => {
      const known = sources.get(`${op.op_name}:${op.output_slot}`);
      const from = known && known.source.kind === 'execution' ? this._valueFrom(known) : null;
      return [link(op, `:${op.output_slot}`, -1, 'input'), from];
    });
    // TF does not trace a function's arguments inside it: say where the value comes from instead.
    const argNote = (info.inputs || []).some((op) => op.op_type === 'Placeholder' &&
      !sources.has(`${op.op_name}:${op.output_slot}`)) ?
      el('div', {class: 'tbn-hint', text: 'Placeholder inputs are function arguments: their values ' +
        'come from the calling execution (see the timeline), so they have no row in the list.'}) : null;
    const consumers = flatConsumers(info).map((op) => link(op, '', 1, 'consumer'));
    setChildren(this.pane.body,
      el('div', {class: 'tbn-op-group'}, el('div', {class: 'tbn-op-group-title', text: `Inputs (${inputs.length})`}),
        inputs.length ? inputs.flat() : el('div', {class: 'tbn-muted', text: 'none (a source op)'}), argNote),
      el('div', {class: 'tbn-op-focus', data: {opName: info.op_name}},
        el('b', {class: 'tbn-mono', text: info.op_name}), el('span', {class: 'tbn-op-type', text: info.op_type}),
        el('div', {class: 'tbn-muted', text: `${info.num_outputs} output(s) · ${info.device_name || 'device ?'}`})),
      el('div', {class: 'tbn-op-group'}, el('div', {class: 'tbn-op-group-title', text: `Consumers (${consumers.length})`}),
        consumers.length ? consumers : el('div', {class: 'tbn-muted', text: 'none (a graph output)'})));
  }

  /** "value from execution #18 __forward_model_219 output 0: finite, 823 zeros of 1000". */
  _valueFrom(input) {
    const src = input.source;
    return el('button', {type: 'button', class: 'tbn-op-link tbn-input-source',
      data: {role: 'input-source', execIndex: String(src.index)},
      title: `Show execution #${src.index} in the timeline: the function argument's value came from it`,
      on: {click: () => this.handlers.onExecution(src.index)}},
    el('span', {class: 'tbn-muted', text: '↳ value from'}), ' ',
    el('span', {class: 'tbn-mono', text: `execution #${src.index} ${src.op_type} output ${src.output_slot}:`}), ' ',
    el('span', {class: isBadHealth(input.health) ? 'tbn-input-source-bad' : 'tbn-op-type',
      text: healthSummary(input.health)}));
  }

  showError(err) {
    setChildren(this.pane.body, message('error', errorText(err)));
  }

  /** A walk that found no trace of the op: said, not silently ignored. */
  note(text) {
    this.pane.body.append(message('empty', text));
  }
}
