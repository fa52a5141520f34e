// Alerts pane: alert types with counts; a click focuses the type's first alert; next/previous
// walk the alerts in order.

import {el, errorText, message, setChildren} from '../dom.js';
import {countNoun} from '../format.js';

const LABELS = {InfNan: 'NaN/∞', OverflowHeadroom: 'Overflow headroom',
  MaskedNonFinite: 'Masked NaN/∞'};
// Quiet categories: listed and countable, shown apart and greyed, never an alarm.
const QUIET = new Set(['MaskedNonFinite']);

/** Alarms among a counts object (every type but the quiet ones). */
function alarmTotal(counts) {
  return Object.entries(counts || {}).reduce((n, [t, c]) => n + (QUIET.has(t) ? 0 : c), 0);
}

export class AlertsView {
  /**
   * @param {{onType: (type: string) => void, onStep: (direction: 'next'|'prev') => void,
   *   onHost: (host: string) => void}} handlers
   */
  constructor(p, handlers) {
    this.pane = p;
    this.handlers = handlers;
    this.hosts = el('div', {class: 'tbn-alert-hosts', data: {role: 'host-counts'}});
    this.list = el('div', {class: 'tbn-alert-types'});
    this.current = el('div', {class: 'tbn-alert-current'});
    this.prev = el('button', {type: 'button', class: 'tbn-button', text: '◀ Previous', disabled: 'true',
      on: {click: () => handlers.onStep('prev')}});
    this.next = el('button', {type: 'button', class: 'tbn-button', text: 'Next ▶', disabled: 'true',
      on: {click: () => handlers.onStep('next')}});
    setChildren(p.body, this.hosts, this.list, el('div', {class: 'tbn-alert-nav'}, this.prev, this.next),
      this.current);
  }

  reset() {
    delete this.pane.root.dataset.alertIndex;
    delete this.pane.root.dataset.alertKind;
    delete this.pane.root.dataset.alertRoot;
    this.prev.disabled = true;
    this.next.disabled = true;
    setChildren(this.hosts);
    setChildren(this.list);
    setChildren(this.current, message('loading', 'Loading alerts…'));
  }

  /**
   * Alarm counts of each host of a multi-host run (the summary's `alerts_by_host`), so that the
   * host holding the NaN/∞ is named; a click opens that host. Nothing for a single host.
   * @param {Object<string, Object<string, number>>|null} byHost
   * @param {string} current the host shown.
   */
  setHosts(byHost, current) {
    const hosts = Object.keys(byHost || {});
    if (hosts.length < 2) {
      setChildren(this.hosts);
      return;
    }
    setChildren(this.hosts, el('span', {class: 'tbn-hint', text: 'Alerts per host:'}), hosts.map((h) => {
      const n = alarmTotal(byHost[h]);
      return el('button', {type: 'button',
        class: `tbn-host-count${h === current ? ' tbn-host-current' : ''}${n ? ' tbn-host-bad' : ''}`,
        data: {host: h, count: String(n), infnan: String(byHost[h].InfNan || 0)},
        'aria-pressed': String(h === current), title: h === current ? 'Shown now' : `Open host ${h}`,
        on: {click: () => { if (h !== current) this.handlers.onHost(h); }}},
      el('span', {class: 'tbn-mono', text: h}), ` ${countNoun(n, 'alert')}`);
    }));
  }

  /**
   * @param {Object<string, number>} counts the `counts` of the alerts route.
   * @param {string|null} host the host they are of, named when the run has several.
   */
  setCounts(counts, host = null) {
    const types = Object.keys(counts).filter((t) => t === 'InfNan' || counts[t] > 0);
    const alarms = types.filter((t) => !QUIET.has(t));
    const total = alarmTotal(counts);
    const on = host ? ` on ${host}` : '';
    this.pane.status.textContent = (total ? countNoun(total, 'alert') : 'no alerts') + on;
    const quiet = (type) => QUIET.has(type);
    const rows = alarms.concat(types.filter(quiet)).map((type) => el('button', {type: 'button',
      class: `tbn-alert-type${quiet(type) ? ' tbn-alert-type-quiet' :
        counts[type] ? ' tbn-alert-type-active' : ''}`,
      data: {alertType: type, count: String(counts[type])}, disabled: counts[type] ? null : 'true',
      title: quiet(type) ? 'Non-finite values that never reach the loss, an output or an optimizer ' +
        'step (attention masks, skipped loss-scaler steps): not an alarm' :
        counts[type] ? `Focus the first ${LABELS[type] || type} alert` : 'None found',
      on: {click: () => this.handlers.onType(type)}},
    el('span', {class: 'tbn-alert-label', text: LABELS[type] || type}),
    el('span', {class: 'tbn-alert-count', text: counts[type]})));
    setChildren(this.list, rows);
    if (!total && counts.MaskedNonFinite) {
      setChildren(this.current, message('empty', 'No NaN or ∞ reaches the loss, an output or an optimizer step.',
        `${countNoun(counts.MaskedNonFinite, 'tensor')} held masked values; click the greyed category to see them.`));
    } else if (!total) {
      setChildren(this.current, message('empty', `No NaN or ∞ in any traced tensor${on}.`,
        'Graph Executions lists every traced tensor; filter it to inspect a layer.'));
    } else {
      setChildren(this.current, message('empty', 'Click an alert type to go to its first alert.'));
    }
  }

  /**
   * Shows the focused alert (an alert object) and enables stepping.
   * @param {object|null} root the summary's first bad tensor when the alert is it: said so, with
   *   what its NaN/∞ reach.
   */
  setCurrent(alert, root = null) {
    this.pane.root.dataset.alertIndex = String(alert.index);
    this.pane.root.dataset.alertKind = alert.kind;
    this.pane.root.dataset.alertRoot = String(Boolean(root));
    this.prev.disabled = false;
    this.next.disabled = false;
    for (const row of this.list.children) {
      row.classList.toggle('tbn-alert-type-selected', row.dataset.alertType === alert.alert_type);
    }
    const where = alert.kind === 'execution' ? 'execution' : 'trace';
    setChildren(this.current,
      el('div', {class: 'tbn-alert-where'}, el('b', {text: `${LABELS[alert.alert_type] || alert.alert_type}`}),
        ` at ${where} #${alert.index}`),
      el('div', {class: 'tbn-mono', text: alert.op_name ?
        alert.op_name + (alert.output_slot === null || alert.output_slot === undefined ? '' : `:${alert.output_slot}`) :
        alert.op_type}),
      el('div', {class: 'tbn-alert-message', text: alert.message || ''}),
      root ? el('div', {class: 'tbn-hint', data: {role: 'alert-root'},
        text: 'The first bad tensor: the root of the NaN/∞ that propagate' +
          `${root.sink ? ` (path end: ${root.sink})` : ''}. Next and previous walk the alerts in order.`}) : null);
  }

  /** No further alert in that direction: said in the pane, the current one stays. */
  setEdge(direction) {
    const text = direction === 'next' ? 'This is the last alert.' : 'This is the first alert.';
    const note = message('empty', text);
    note.classList.add('tbn-alert-edge');
    const old = this.current.querySelector('.tbn-alert-edge');
    if (old) old.replaceWith(note);
    else this.current.append(note);
  }

  showError(err) {
    setChildren(this.current, message('error', errorText(err)));
  }
}
