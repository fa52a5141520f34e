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
import {TrendsView} from './views/trends.js';

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

function summaryText(summary, host) {
  if (!summary) return 'No summary for this run (see the message below).';
  const bad = summary.first_bad_tensor;
  const several = (summary.hosts || []).length > 1;
  if (bad && bad.explanation) {
    const step = bad.step === null || bad.step === undefined ? '' : `At step ${bad.step}: `;
    return several ? `On host ${bad.host}: ${step}${bad.explanation}` : step + bad.explanation;
  }
  if (!summary.health_available) {
    return `Tensor debug mode ${summary.tensor_debug_mode} records no health; ` +
      'dump with tensor_debug_mode="FULL_HEALTH" to find NaN/∞.';
  }
  const masked = summary.alerts ? summary.alerts.MaskedNonFinite : 0;
  if (masked) {
    return `No NaN or ∞ reaches the loss, an output or an optimizer step (${masked} tensor` +
      `${masked === 1 ? '' : 's'} held masked values, such as attention-mask -inf).`;
  }
  return several ? `No NaN or ∞ found on any of the ${summary.hosts.length} hosts (shown: ${host}).` :
    'No NaN or ∞ found in this run.';
}

function runLabel(r) {
  if (!r.error) return r.run;
  return r.hosts.length ? `${r.run} (partly unreadable)` : `${r.run} (unreadable)`;
}

/**
 * The writer-status banner of a run: every note of its hosts' writers (history that may be lost:
 * ring-buffer eviction, a writer that did not close, records lost to a full disk), what of the
 * run could not be read, and the reader's other warnings folded under a count.
 */
function runNotes(info) {
  const statuses = Object.entries(info.writer_status || {});
  const several = statuses.length > 1;
  const notes = [];
  for (const [host, status] of statuses) {
    for (const note of (status && status.notes) || []) {
      notes.push(el('li', {class: 'tbn-writer-note', data: {role: 'writer-note', host},
        text: several ? `${host}: ${note}` : note}));
    }
  }
  // The notes are run warnings too (prefixed with their file set): listed once, above.
  const noteList = statuses.flatMap(([, s]) => (s && s.notes) || []);
  const warnings = (info.warnings || []).filter((w) => !noteList.some((n) => w.endsWith(n)));
  const more = (info.num_warnings || 0) - (info.warnings || []).length;
  return [
    info.error ? el('div', {class: 'tbn-run-error', data: {role: 'run-error'}, text: info.error}) : null,
    notes.length ? el('div', {class: 'tbn-writer-status', role: 'status', data: {role: 'writer-status'}},
      el('b', {text: 'History may be incomplete: '}), el('ul', {}, notes)) : null,
    warnings.length ? el('details', {class: 'tbn-run-warnings', data: {role: 'run-warnings'}},
      el('summary', {text: `${warnings.length + Math.max(more, 0)} reader warning` +
        `${warnings.length + Math.max(more, 0) === 1 ? '' : 's'}`}),
      el('ul', {}, warnings.map((w) => el('li', {text: w})))) : null,
  ].filter(Boolean);
}

/** Builds the page inside document.body and starts the app. */
export async function render() {
  const stylesheet = el('link', {rel: 'stylesheet', href: new URL('./style.css', import.meta.url).href});
  document.head.append(stylesheet);
  const runSelect = el('select', {class: 'tbn-select', 'aria-label': 'Run'});
  const hostSelect = el('select', {class: 'tbn-select', 'aria-label': 'Host/rank'});
  const summary = el('div', {class: 'tbn-summary', data: {summary: ''}});
  const banner = el('div', {class: 'tbn-banner'});
  const notes = el('div', {class: 'tbn-run-notes', data: {role: 'run-notes'}, hidden: 'true'});
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
  // Numerics over time: a view of its own, shown instead of the six panes.
  const trendsPane = pane('Numerics over time', 'trends');
  const trends = el('main', {class: 'tbn-trends', hidden: 'true'}, trendsPane.root);
  const viewButton = (view, text, title) => el('button', {type: 'button', class: 'tbn-view-button', text, title,
    data: {view}, 'aria-pressed': String(view === 'panes'), on: {click: () => shell.setView(view)}});
  const toggle = el('span', {class: 'tbn-field tbn-view-toggle', role: 'group', 'aria-label': 'View',
    data: {role: 'view-toggle'}},
  viewButton('panes', 'Debugger', 'Alerts, executions, graph, stack and source'),
  viewButton('trends', 'Trends', 'Numerics over time: headroom of each module per step'));
  const root = el('div', {class: 'tbn-root', data: {state: 'loading', view: 'panes'}},
    el('header', {class: 'tbn-header'},
      el('span', {class: 'tbn-brand', text: 'Numerics'}),
      el('label', {class: 'tbn-field'}, 'Run ', runSelect),
      el('label', {class: 'tbn-field'}, 'Host/rank ', hostSelect),
      toggle,
      summary),
    notes, banner, empty, grid, trends);
  setChildren(document.body, root);

  let app = null;
  let emptyOn = false;
  const applyView = () => {
    const view = root.dataset.view;
    grid.hidden = emptyOn || view !== 'panes';
    trends.hidden = emptyOn || view !== 'trends';
    for (const b of toggle.children) b.setAttribute('aria-pressed', String(b.dataset.view === view));
    shell.views.trends.setShown(!trends.hidden);
  };
  const shell = {
    root, banner,
    showEmpty(on) {
      emptyOn = on;
      empty.hidden = !on;
      for (const field of root.querySelectorAll('.tbn-field')) field.hidden = on;
      applyView();
    },
    /** Shows the six panes ('panes') or the Trends view ('trends'). */
    setView(view) {
      root.dataset.view = view;
      applyView();
    },
    setRuns(runs) {
      setChildren(runSelect, runs.map((r) => el('option', {value: r.run, text: runLabel(r),
        data: r.error ? {error: 'true'} : {}})));
    },
    setSelection(run, host, s) {
      runSelect.value = run;
      const info = app.runs.find((r) => r.run === run);
      const byHost = (s && s.alerts_by_host) || {};
      setChildren(hostSelect, (info ? info.hosts : [host]).map((h) => el('option', {value: h, text: h,
        data: byHost[h] ? {infnan: String(byHost[h].InfNan || 0)} : {}})));
      hostSelect.value = host;
    },
    setSummary(s, host) {
      summary.textContent = summaryText(s, host);
      summary.title = summary.textContent;
      const bad = s && s.first_bad_tensor;
      summary.classList.toggle('tbn-summary-bad', Boolean(bad));
      if (bad) summary.dataset.badHost = bad.host;
      else delete summary.dataset.badHost;
      if (bad && bad.step !== null && bad.step !== undefined) summary.dataset.badStep = String(bad.step);
      else delete summary.dataset.badStep;
    },
    setRunNotes(info) {
      const parts = runNotes(info);
      setChildren(notes, parts);
      notes.hidden = !parts.length;
    },
    filterCleared() {
      banner.replaceChildren(el('div', {class: 'tbn-note', text: 'Filter cleared to show the focused op.'}));
    },
    views: {},
  };
  const v = shell.views;
  app = new App(shell);
  v.alerts = new AlertsView(panes.alerts, {onType: (t) => app.focusAlertType(t), onStep: (d) => app.stepAlert(d),
    onHost: (h) => app.selectRun(runSelect.value, h)});
  v.timeline = new TimelineView(panes.timeline, {onSelect: (i) => app.selectExecution(i)});
  v.structure = new GraphStructureView(panes.structure, {onWalk: (op, dir) => app.walk(op, dir),
    onExecution: (i) => app.showExecution(i)});
  v.path = new PathView(pathStrip, {onHop: (hop) => app.focusHop(hop)});
  v.list = new GraphExecutionsView(panes.list, {
    onFocus: (i) => app.focusTrace(i, {fromList: true}),
    onFilter: (f) => app.setFilter(f),
    onStep: (step) => app.jumpToStep(step),
  });
  v.stack = new StackView(panes.stack, {onOpen: (f) => app.openFrame(f)});
  v.source = new SourceView(panes.source);
  // A trends cell clicked: the panes show that step's first trace (the app's "Go to step").
  v.trends = new TrendsView(trendsPane, {onStep: (step) => {
    shell.setView('panes');
    app.jumpToStep(step);
  }});
  shell.showEmpty(false);
  runSelect.addEventListener('change', () => {
    app.selectRun(runSelect.value);
  });
  hostSelect.addEventListener('change', () => app.selectRun(runSelect.value, hostSelect.value));
  await app.start();
}
