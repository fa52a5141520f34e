// The controller: loads runs, owns the page caches of the selected run/host, and turns user
// actions (alert, row, timeline, graph walk, frame) into pane updates.

import {client, fetchRuns, fetchSummary} from './api.js';
import {CodePanes} from './code.js';
import {errorText, message, setChildren} from './dom.js';
import {executionOfTrace, findInputRows, findNearestTrace, inputSources, isFirstBad, openingHost} from './model.js';
import {PageCache} from './page_cache.js';

// At or below the server's page cap (1000 for digests and search), so one request fills a page.
const PAGE = 500;

export class App {
  /** @param {object} shell what index.js built: root, selectors, summary, empty, views. */
  constructor(shell) {
    this.shell = shell;
    this.v = shell.views;
    this.api = null;
    this.token = 0;
    this.code = null;
  }

  _state(state, extra = {}) {
    this.shell.root.dataset.state = state;
    Object.assign(this.shell.root.dataset, extra);
  }

  /** Loads the run list and selects the first run. */
  async start() {
    this._state('loading');
    let runs;
    try {
      runs = (await fetchRuns()).runs;
    } catch (err) {
      this._fail(err);
      return;
    }
    this.runs = runs;
    if (!runs.length) {
      this._state('empty');
      this.shell.showEmpty(true);
      return;
    }
    this.shell.setRuns(runs);
    await this.selectRun(runs[0].run);
  }

  _fail(err) {
    this._state('error');
    setChildren(this.shell.banner, message('error', errorText(err),
      'Check that TensorBoard is still running.', {label: 'Retry', run: () => this.start()}));
  }

  /**
   * Points every pane at one run and host; earlier in-flight answers are dropped. Without a host,
   * the run opens on the host of its first bad tensor (else its first host).
   */
  async selectRun(run, host = null) {
    const token = ++this.token;
    if (this.code) this.code.close();
    this.code = null;
    this.focus = null;
    this.at = null;
    this.alert = null;
    this.filter = null;
    this.summary = null;
    this.shell.showEmpty(false);
    setChildren(this.shell.banner);
    delete this.shell.root.dataset.focusedIndex;
    delete this.shell.root.dataset.host;
    this._state('loading', {run});
    for (const view of Object.values(this.v)) view.reset();
    const [summary, runs] = await Promise.all([
      fetchSummary(run).catch((err) => err), fetchRuns().then((r) => r.runs, () => null)]);
    if (token !== this.token) return;
    if (runs) this.runs = runs;
    const info = this.runs.find((r) => r.run === run) || {run, hosts: host ? [host] : []};
    this.shell.setRunNotes(info);
    if (summary instanceof Error) {
      // 4xx: this run's data cannot be summarized (the server names why); its lists may still be.
      if (!(summary.code >= 400 && summary.code < 500)) {
        this._fail(summary);
        return;
      }
      setChildren(this.shell.banner, message('error', errorText(summary),
        'Only what can be read is shown below; the server log has the details.'));
    }
    const summaryOk = summary instanceof Error ? null : summary;
    host = openingHost(info.hosts, summaryOk, host);
    if (host === null) {
      this._state('error', {run});
      if (!this.shell.banner.childElementCount) {
        setChildren(this.shell.banner, message('error', info.error || `Run ${run} has no readable file set.`));
      }
      return;
    }
    this.api = client(run, host);
    this.code = new CodePanes(this.api, this.v);
    this.v.trends.setSource(this.api);
    this._state('loading', {run, host});
    this.shell.setSelection(run, host, summaryOk);
    this.summary = summaryOk;
    this.shell.setSummary(summaryOk, host);
    const api = this.api;
    this.traces = new PageCache({pageSize: PAGE, fetchPage: (b, e) => api.traceDigests(b, e)});
    this.executions = new PageCache({pageSize: PAGE, fetchPage: (b, e) => api.executionDigests(b, e)});
    const steps = summaryOk && summaryOk.steps_by_host ? summaryOk.steps_by_host[host] : null;
    this.v.list.hasSteps = Boolean(steps && steps.count);
    this.v.alerts.setHosts(summaryOk ? summaryOk.alerts_by_host : null, host);
    let alerts = null;
    try {
      alerts = await api.alerts(0, 1);
    } catch (err) {
      if (token === this.token) this.v.alerts.showError(err);
    }
    if (token !== this.token) return;
    if (alerts) this.v.alerts.setCounts(alerts.counts || {}, info.hosts.length > 1 ? host : null);
    await Promise.all([this.v.list.setSource(this.traces, false), this.v.timeline.setSource(this.executions)]);
    if (token === this.token) this._state('ready');
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
    this.focus = null;
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
    const token = this.token;
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
    if (token !== this.token || !trace) return;
    this.focus = trace;
    this.v.list.showStep(trace.step);
    const sources = this._sources('graph_execution_trace', index);
    this.v.timeline.setInputs(sources.executions);
    // A row the user picked is already in view; anything else is brought to the middle.
    this.v.list.setFocus(index, [], !fromList);
    this.v.structure.loading(trace.op_name);
    this.v.stack.loading();
    executionOfTrace(this.executions, trace).then((e) => {
      if (e < 0 || token !== this.token) return;
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
    if (token !== this.token || this.focus !== trace) return;
    this.v.structure.show(info, trace.graph_name, sources.byName);
    const [rows] = await Promise.all([
      findInputRows(this.traces, index, trace.graph_id, info.inputs || []).catch((err) => {
        this.v.list.showError(err);
        return [];
      }),
      this.showStack(info.stack_frame_ids || [], at),
    ]);
    for (const row of sources.traces) if (!rows.includes(row)) rows.push(row);
    if (this.focus === trace) this.v.list.setFocus(index, rows);
  }

  /** Walks to an input (direction -1) or consumer (+1): nearest trace of it from the focus. */
  async walk(op, direction) {
    const from = this.focus;
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

  /** Shows the stack of the focus `at` (this.at when asked) and opens its model-code frame. */
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
    const api = this.api;
    try {
      const exec = (await api.executionData(index, index + 1)).items[0];
      if (exec && api === this.api) this.v.timeline.showDetails(exec);
      return exec || null;
    } catch (err) {
      if (api === this.api) this.v.timeline.showDetailsError(err);
      return null;
    }
  }

  /**
   * "Go to step": focuses the first trace of the first marked step at or after `step` (the
   * timeline follows it), or, when no trace carries such a step, shows the first execution of it.
   */
  async jumpToStep(step) {
    const api = this.api;
    let found;
    try {
      found = await api.findStep(step);
    } catch (err) {
      this.v.list.showError(err);
      return;
    }
    if (api !== this.api) return;
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
      if (this.focus) this.v.list.setFocus(this.focus.index, [...this.v.list.inputRows], true);
      return;
    }
    const api = this.api;
    const cache = new PageCache({pageSize: PAGE, fetchPage: (b, e) => api.search(b, e, filter)});
    await this.v.list.setSource(cache, true);
  }
}
