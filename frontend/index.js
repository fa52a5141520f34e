// Entry point: TensorBoard's plugin_entry.html imports this module and calls render().

import {App} from './app.js';
import {el, pane, setChildren} from './dom.js';
import {AlertsView} from './views/alerts.js';
import {GraphExecutionsView} from './views/graph_executions.js';
import {GraphStructureView} from './views/graph_structure.js';
import {PathView} from './views/path.js';
import {SourceView} from './views/source.js';
import {StackView} from './views/stack.js';
import {TimelineView} from './views/timeline.js';

const TORCH_SNIPPET = 'from tb_numerics_plugin import torch as tbn; ' +
  'tbn.enable_dump_debug_info("/tmp/dump", tensor_debug_mode="FULL_HEALTH")';
const TF_SNIPPET = 'tf.debugging.experimental.enable_dump_debug_info("/tmp/dump", ' +
  'tensor_debug_mode="FULL_HEALTH", circular_buffer_size=-1)';

function emptyState() {
  return el('div', {class: 'tbn-empty', data: {empty: 'true'}},
    el('h2', {text: 'No numerics dump in this logdir yet'}),
    el('p', {text: 'Add one line to your PyTorch training script:'}),
    el('pre', {class: 'tbn-snippet', text: TORCH_SNIPPET}),
    el('p', {text: 'or, in TensorFlow:'}),
    el('pre', {class: 'tbn-snippet', text: TF_SNIPPET}),
    el('p', {text: 'Run it, then start TensorBoard with --logdir /tmp/dump and reload this page.'}));
}

function summaryText(summary) {
  const bad = summary.first_bad_tensor;
  if (bad && bad.explanation) return bad.explanation;
  if (!summary.health_available) {
    return `Tensor debug mode ${summary.tensor_debug_mode} records no health; ` +
      'dump with tensor_debug_mode="FULL_HEALTH" to find NaN/∞.';
  }
  const masked = summary.alerts ? summary.alerts.MaskedNonFinite : 0;
  if (masked) {
    return `No NaN or ∞ reaches the loss, an output or an optimizer step (${masked} tensor` +
      `${masked === 1 ? '' : 's'} held masked values, such as attention-mask -inf).`;
  }
  return 'No NaN or ∞ found in this run.';
}

/** Builds the page inside document.body and starts the app. */
export async function render() {
  const stylesheet = el('link', {rel: 'stylesheet', href: new URL('./style.css', import.meta.url).href});
  document.head.append(stylesheet);
  const runSelect = el('select', {class: 'tbn-select', 'aria-label': 'Run'});
  const hostSelect = el('select', {class: 'tbn-select', 'aria-label': 'Host/rank'});
  const summary = el('div', {class: 'tbn-summary', data: {summary: ''}});
  const banner = el('div', {class: 'tbn-banner'});
  const empty = emptyState();
  const panes = {
    alerts: pane('Alerts', 'alerts'),
    timeline: pane('Python Execution Timeline', 'timeline'),
    structure: pane('Graph Structure', 'structure'),
    list: pane('Graph Executions', 'graph-executions'),
    source: pane('Source Code', 'source'),
    stack: pane('Stack Trace', 'stack'),
  };
  // The propagation path strip sits above the Graph Structure pane's body.
  const pathStrip = el('nav', {class: 'tbn-path', 'aria-label': 'NaN/∞ propagation path', hidden: 'true'});
  panes.structure.root.insertBefore(pathStrip, panes.structure.body);
  const grid = el('main', {class: 'tbn-grid'},
    panes.alerts.root,
    el('div', {class: 'tbn-middle'}, panes.timeline.root, panes.structure.root),
    panes.list.root, panes.source.root, panes.stack.root);
  const root = el('div', {class: 'tbn-root', data: {state: 'loading'}},
    el('header', {class: 'tbn-header'},
      el('span', {class: 'tbn-brand', text: 'Numerics'}),
      el('label', {class: 'tbn-field'}, 'Run ', runSelect),
      el('label', {class: 'tbn-field'}, 'Host/rank ', hostSelect),
      summary),
    banner, empty, grid);
  setChildren(document.body, root);

  let app = null;
  const shell = {
    root, banner,
    showEmpty(on) {
      empty.hidden = !on;
      grid.hidden = on;
      for (const field of root.querySelectorAll('.tbn-field')) field.hidden = on;
    },
    setRuns(runs) {
      setChildren(runSelect, runs.map((r) => el('option', {value: r.run, text: r.run})));
    },
    setSelection(run, host) {
      runSelect.value = run;
      const info = app.runs.find((r) => r.run === run);
      setChildren(hostSelect, (info ? info.hosts : [host]).map((h) => el('option', {value: h, text: h})));
      hostSelect.value = host;
    },
    setSummary(s) {
      summary.textContent = summaryText(s);
      summary.title = summary.textContent;
      summary.classList.toggle('tbn-summary-bad', Boolean(s.first_bad_tensor));
    },
    filterCleared() {
      banner.replaceChildren(el('div', {class: 'tbn-note', text: 'Filter cleared to show the focused op.'}));
    },
    views: {},
  };
  const v = shell.views;
  app = new App(shell);
  v.alerts = new AlertsView(panes.alerts, {onType: (t) => app.focusAlertType(t), onStep: (d) => app.stepAlert(d)});
  v.timeline = new TimelineView(panes.timeline, {onSelect: (i) => app.selectExecution(i)});
  v.structure = new GraphStructureView(panes.structure, {onWalk: (op, dir) => app.walk(op, dir),
    onExecution: (i) => app.showExecution(i)});
  v.path = new PathView(pathStrip, {onHop: (hop) => app.focusHop(hop)});
  v.list = new GraphExecutionsView(panes.list, {
    onFocus: (i) => app.focusTrace(i, {fromList: true}),
    onFilter: (f) => app.setFilter(f),
  });
  v.stack = new StackView(panes.stack, {onOpen: (f) => app.openFrame(f)});
  v.source = new SourceView(panes.source);
  shell.showEmpty(false);
  runSelect.addEventListener('change', () => {
    const info = app.runs.find((r) => r.run === runSelect.value);
    app.selectRun(info.run, info.hosts[0]);
  });
  hostSelect.addEventListener('change', () => app.selectRun(runSelect.value, hostSelect.value));
  await app.start();
}
