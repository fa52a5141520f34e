// The controller: loads runs, opens the selected run/host (summary, alert counts, the lists'
// sources) and hands what the views ask of the focus to that selection's Focus.

import {client, fetchRuns, fetchSummary} from './api.js';
import {errorText, message, setChildren} from './dom.js';
import {Focus} from './focus.js';
import {openingHost} from './model.js';

export class App {
  /** @param {object} shell what index.js built: root, selectors, summary, empty, views. */
  constructor(shell) {
    this.shell = shell;
    this.v = shell.views;
    this.token = 0;
    this.focus = null;
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
    if (this.focus) this.focus.close();
    this.focus = null;
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
    const api = client(run, host);
    const focus = new Focus(api, summaryOk, this.shell);
    this.focus = focus;
    this.v.trends.setSource(api);
    this._state('loading', {run, host});
    this.shell.setSelection(run, host, summaryOk);
    this.shell.setSummary(summaryOk, host);
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
    await Promise.all([this.v.list.setSource(focus.traces, false), this.v.timeline.setSource(focus.executions)]);
    if (token === this.token) this._state('ready');
  }
}

// What the views ask of the focus (wired in index.js) goes to the open run's Focus; while a run
// loads none is open, and the ask is dropped with the panes it would have filled.
const FOCUS_ASKS = ['focusAlertType', 'stepAlert', 'focusHop', 'focusTrace', 'showExecution',
  'selectExecution', 'walk', 'openFrame', 'jumpToStep', 'setFilter'];
for (const name of FOCUS_ASKS) {
  App.prototype[name] = function ask(...args) {
    return this.focus && this.focus[name](...args);
  };
}
