// The focus of one run and host: which alert, trace or execution the panes show, the Graph
// Executions filter, and the page caches a focus is found in. Moving the focus moves the panes
// together (list, timeline, Graph Structure, path strip, Stack Trace, Source Code). The app makes
// one per selection and closes the old one, whose late answers are then dropped.

import {CodePanes} from './code.js';
import {executionOfTrace, findInputRows, findNearestTrace, inputSources, isFirstBad} from './model.js';
import {PageCache} from './page_cache.js';

// At or below the server's page cap (1000 for digests and search), so one request fills a page.
const PAGE = 500;

export class Focus {
  /**
   * @param {object} api the api.js client of the run and host.
   * @param {object|null} summary the run's summary; null when the server could not summarize it.
   * @param {object} shell what index.js built: root, views, filterCleared().
   */
  constructor(api, summary, shell) {
    this.api = api;
    this.summary = summary;
    this.shell = shell;
    this.v = shell.views;
    this.code = new CodePanes(api, this.v);
    this.traces = new PageCache({pageSize: PAGE, fetchPage: (b, e) => api.traceDigests(b, e)});
    this.executions = new PageCache({pageSize: PAGE, fetchPage: (b, e) => api.executionDigests(b, e)});
    this.trace = null;
    this.at = null;
    this.alert = null;
    this.filter = null;
    this.closed = false;
  }

  close() {
    this.closed = true;
    this.code.close();
  }

  /**
   * Alert type clicked: focus its first alert. For NaN/∞ that is the root of the first
   * propagating lineage (the summary's first bad tensor), which need not come first in index
   * order; next/previous then walk the alerts in order from there.
   */
  async focusAlertType(type) {
    try {
      const root = type === 'InfNan' ? await this._rootAlert() : null;
      if (root) {
        await this.focusAlert(root);
        return;
      }
      const page = await this.api.alerts(0, 1, type);
      if (page.items.length) await this.focusAlert(page.items[0]);
    } catch (err) {
      this.v.alerts.showError(err);
    }
  }

  /** The InfNan alert of the summary's first bad tensor on this host, or null. */
  async _rootAlert() {
    const fb = this._firstBad();
    if (!fb || fb.host !== this.api.host) return null;
    const {alert} = await this.api.nextAlert(fb.index - 1, 'next', fb.kind, 'InfNan');
    if (alert && alert.kind === fb.kind && alert.index === fb.index) return alert;
    return {alert_type: 'InfNan', kind: fb.kind, index: fb.index, host: fb.host, op_name: fb.op_name,
      op_type: fb.op_type, output_slot: fb.output_slot, message: fb.explanation};
  }

  _firstBad() {
    return this.summary ? this.summary.first_bad_tensor : null;
  }

  /** Marks where the focus sits on the first bad tensor's path (the strip hides off the path). */
  _at(kind, index) {
    this.at = {host: this.api.host, kind, index};
    this.v.path.show(this._firstBad(), this.at);
  }

  /** A hop of the path strip clicked: focus its trace, or show its execution. */
  async focusHop(hop) {
    if (hop.kind === 'execution') await this.focusExecution(hop.index);
    else await this.focusTrace(hop.index);
  }

  /**
   * Focuses an execution (an eager op or a graph call): the timeline marks its inputs' producers,
   * moves there and selects it; Stack Trace and Source Code follow. The list and Graph
   * Structure drop the previous trace: an execution has no op in a graph.
   */
  async focusExecution(index) {
    this.trace = null;
    delete this.shell.root.dataset.focusedIndex;
    this.v.list.setFocus(-1, [], false);
    this._at('execution', index);
    const at = this.at;
    this.v.timeline.setInputs(this._sources('execution', index).executions);
    this.v.timeline.reveal(index);
    this.v.stack.loading();
    this.v.structure.execution(index);
    const exec = await this.selectExecution(index);
    if (!exec || this.at !== at) return;
    this.v.structure.execution(index, exec.op_type);
    await this.showStack(exec.stack_frame_ids || [], at);
  }

  /** Next/previous alert from the current one (or from the start). */
  async stepAlert(direction) {
    const cur = this.alert;
    const kind = cur ? cur.kind : 'graph_execution_trace';
    const index = cur ? cur.index : -1;
    try {
      const {alert} = await this.api.nextAlert(index, direction, kind, cur ? cur.alert_type : undefined);
      if (alert) await this.focusAlert(alert);
      else this.v.alerts.setEdge(direction);
    } catch (err) {
      this.v.alerts.showError(err);
    }
  }

  async focusAlert(alert) {
    this.alert = alert;
    const root = isFirstBad(this._firstBad(), {host: this.api.host, kind: alert.kind, index: alert.index});
    this.v.alerts.setCurrent(alert, root ? this._firstBad() : null);
    if (alert.kind === 'execution') await this.focusExecution(alert.index);
    else await this.focusTrace(alert.index);
  }

  /** Known sources of the inputs of a focused trace or execution (model.inputSources). */
  _sources(kind, index) {
    return inputSources(this._firstBad(), {host: this.api.host, kind, index});
  }

  /** Shows an execution in the timeline: moves there, selects it and shows its details. */
  async showExecution(index) {
    this.v.timeline.reveal(index);
    await this.selectExecution(index);
  }

  /**
   * Focuses one graph execution trace: the list scrolls to it and marks its inputs, the timeline
   * moves to its execution, and Graph Structure, Stack Trace and Source Code follow.
   */
  async focusTrace(index, {fromList = false} = {}) {
    const api = this.api;
    // A focus from elsewhere must show its row; a filter may hide it, so it goes.
    if (this.filter && !fromList) {
      this.shell.filterCleared();
      await this.setFilter(null);
    }
    this.shell.root.dataset.focusedIndex = String(index);
    this._at('graph_execution_trace', index);
    const at = this.at;
    let trace;
    try {
      trace = (await api.traceData(index, index + 1)).items[0];
    } catch (err) {
      this.v.list.showError(err);
      return;
    }
    if (this.closed || !trace) return;
    this.trace = trace;
    this.v.list.showStep(trace.step);
    const sources = this._sources('graph_execution_trace', index);
    this.v.timeline.setInputs(sources.executions);
    // A row the user picked is already in view; anything else is brought to the middle.
    this.v.list.setFocus(index, [], !fromList);
    this.v.structure.loading(trace.op_name);
    this.v.stack.loading();
    executionOfTrace(this.executions, trace).then((e) => {
      if (e < 0 || this.closed) return;
      this.v.timeline.reveal(e);
      this.selectExecution(e);
    }, (err) => this.v.timeline.showError(err));
    let info;
    try {
      info = await api.opInfo(trace.graph_id, trace.op_name);
    } catch (err) {
      this.v.structure.showError(err);
      this.v.stack.showError(err);
      return;
    }
    if (this.closed || this.trace !== trace) return;
    this.v.structure.show(info, trace.graph_name, sources.byName);
    const [rows] = await Promise.all([
      findInputRows(this.traces, index, trace.graph_id, info.inputs || []).catch((err) => {
        this.v.list.showError(err);
        return [];
      }),
      this.showStack(info.stack_frame_ids || [], at),
    ]);
    for (const row of sources.traces) if (!rows.includes(row)) rows.push(row);
    if (this.trace === trace) this.v.list.setFocus(index, rows);
  }

  /** Walks to an input (direction -1) or consumer (+1): nearest trace of it from the focus. */
  async walk(op, direction) {
    const from = this.trace;
    if (!from) return;
    const target = {graphId: from.graph_id, opName: op.op_name, slot: direction < 0 ? op.output_slot : null};
    try {
      const row = await findNearestTrace(this.traces, from.index, target, direction);
      if (row >= 0) await this.focusTrace(row);
      else this.v.structure.note(`${op.op_name} has no trace near this one (not instrumented, or further away than the scan).`);
    } catch (err) {
      this.v.structure.showError(err);
    }
  }

  /** Shows the stack of the focus `at` and opens its model-code frame while `at` is still the focus. */
  async showStack(ids, at) {
    const fb = this._firstBad();
    await this.code.showStack(ids, isFirstBad(fb, at) ? fb : null, () => this.at === at);
  }

  /** A stack frame clicked: opens its file at its line. */
  openFrame(frame) {
    return this.code.openFrame(frame);
  }

  /**
   * Shows an execution's details in the timeline pane.
   * @returns {Promise<object|null>} the execution/data item; null when it failed (said in the pane).
   */
  async selectExecution(index) {
    try {
      const exec = (await this.api.executionData(index, index + 1)).items[0];
      if (exec && !this.closed) this.v.timeline.showDetails(exec);
      return exec || null;
    } catch (err) {
      if (!this.closed) this.v.timeline.showDetailsError(err);
      return null;
    }
  }

  /**
   * "Go to step": focuses the first trace of the first marked step at or after `step` (the
   * timeline follows it), or, when no trace carries such a step, shows the first execution of it.
   */
  async jumpToStep(step) {
    let found;
    try {
      found = await this.api.findStep(step);
    } catch (err) {
      this.v.list.showError(err);
      return;
    }
    if (this.closed) return;
    const trace = found.graph_execution_trace;
    const exec = found.execution;
    if (trace) await this.focusTrace(trace.index);
    else if (exec) await this.focusExecution(exec.index);
    else this.v.list.stepNotFound(step);
  }

  /** Filter from the list's form; null shows every trace again. */
  async setFilter(filter) {
    this.filter = filter;
    if (!filter) {
      await this.v.list.setSource(this.traces, false);
      if (this.trace) this.v.list.setFocus(this.trace.index, [...this.v.list.inputRows], true);
      return;
    }
    const api = this.api;
    const cache = new PageCache({pageSize: PAGE, fetchPage: (b, e) => api.search(b, e, filter)});
    await this.v.list.setSource(cache, true);
  }
}
