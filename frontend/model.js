// Navigation questions answered over paged lists. Pure (no DOM): takes PageCache-like objects
// ({pageSize, total, ensure, ensureTotal, get}), so node tests run them on fake data.

/** How far the list is scanned for an op's producer or consumer before giving up. */
export const SCAN_LIMIT = 5000;

/**
 * Nearest trace of an op, scanning from `from` (exclusive) backwards (`direction` -1) or
 * forwards (+1) through at most `limit` rows, a page at a time.
 * @param {{graphId: string, opName: string, slot?: number|null}} target slot null = any slot.
 * @returns {Promise<number>} the trace index, or -1.
 */
export async function findNearestTrace(cache, from, target, direction, limit = SCAN_LIMIT) {
  const total = await cache.ensureTotal();
  const matches = (d) => d && d.op_name === target.opName && d.graph_id === target.graphId &&
    (target.slot === null || target.slot === undefined || d.output_slot === target.slot);
  let i = from + direction;
  const stop = direction < 0 ? Math.max(-1, from - limit - 1) : Math.min(total, from + limit + 1);
  while (i !== stop && i >= 0 && i < total) {
    const pageStart = Math.floor(i / cache.pageSize) * cache.pageSize;
    await cache.ensure(pageStart, pageStart + cache.pageSize);
    const pageEnd = pageStart + cache.pageSize;
    for (; i !== stop && i >= pageStart && i < pageEnd && i < total; i += direction) {
      if (matches(cache.get(i))) return i;
    }
  }
  return -1;
}

/**
 * The rows holding the focused op's inputs: for each input, the nearest trace of its producer
 * before the focused row in the same graph (the value this execution consumed).
 * @param {{op_name: string, output_slot: number}[]} inputs as in op_info's `inputs`.
 * @returns {Promise<number[]>} trace indices found (inputs that were never traced, such as
 *   placeholders TF does not instrument, have no row).
 */
export async function findInputRows(cache, focusIndex, graphId, inputs, limit = SCAN_LIMIT) {
  const rows = [];
  for (const input of inputs) {
    const row = await findNearestTrace(cache, focusIndex,
      {graphId, opName: input.op_name, slot: input.output_slot}, -1, limit);
    if (row >= 0 && !rows.includes(row)) rows.push(row);
  }
  return rows;
}

/**
 * First index whose row satisfies a monotonic predicate (false...false, true...true), by
 * binary search; each probe loads at most one page.
 * @returns {Promise<number>} `total` when no row satisfies it.
 */
export async function lowerBound(cache, predicate) {
  let lo = 0;
  let hi = await cache.ensureTotal();
  while (lo < hi) {
    const mid = Math.floor((lo + hi) / 2);
    await cache.ensure(mid, mid + 1);
    if (predicate(cache.get(mid))) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

/**
 * The execution (timeline entry) a graph trace ran in: executions are recorded when they finish,
 * so it is the first one whose wall time is not before the trace's; the last one otherwise.
 * @returns {Promise<number>} -1 for an empty timeline.
 */
export async function executionAtTime(cache, wallTime) {
  const total = await cache.ensureTotal();
  if (!total) return -1;
  const i = await lowerBound(cache, (d) => d.wall_time >= wallTime);
  return Math.min(i, total - 1);
}

/** How far from the wall-time guess executionOfTrace looks for the trace's graph call. */
export const CALL_SCAN = 32;

/**
 * The execution (timeline entry) of a graph trace: the nearest one to the wall-time guess
 * (executionAtTime) that called the trace's graph or an outer one (`graph_id` in the trace's
 * `graph_ids`). torch writes a graph call's Execution when the call starts, TF when it ends
 * (and without a graph_id): without a match the wall-time guess stands.
 * @param {{wall_time: number, graph_ids?: string[]}} trace a graph_execution/data item.
 * @returns {Promise<number>} -1 for an empty timeline.
 */
export async function executionOfTrace(cache, trace, limit = CALL_SCAN) {
  const guess = await executionAtTime(cache, trace.wall_time);
  const graphs = new Set(trace.graph_ids || []);
  if (guess < 0 || !graphs.size) return guess;
  const lo = Math.max(0, guess - limit);
  const hi = Math.min(cache.total, guess + limit + 1);
  await cache.ensure(lo, hi);
  for (let step = 0; step <= limit; step++) {
    for (const i of step ? [guess - step, guess + step] : [guess]) {
      const d = i >= lo && i < hi ? cache.get(i) : null;
      if (d && d.graph_id && graphs.has(d.graph_id)) return i;
    }
  }
  return guess;
}

/**
 * Index of a frame's file in `source_files/list`: by host and path, as the dump names them;
 * the frame's own file_index when the list has no such entry.
 * @returns {number} -1 when the dump holds no snapshot of that file.
 */
export function sourceIndexOf(files, frame) {
  const hit = files.find((f) => f.file_path === frame.file_path && f.host_name === frame.host_name);
  if (hit) return hit.index;
  const byIndex = files.find((f) => f.index === frame.file_index && f.file_path === frame.file_path);
  return byIndex ? byIndex.index : -1;
}

/** Consumers of all output slots, flattened and de-duplicated by op name. */
export function flatConsumers(opInfo) {
  const seen = new Set();
  const out = [];
  for (const slotConsumers of opInfo.consumers || []) {
    for (const c of slotConsumers) {
      if (seen.has(c.op_name)) continue;
      seen.add(c.op_name);
      out.push(c);
    }
  }
  return out;
}

/**
 * Where the focused tensor's inputs came from, as the summary's first bad tensor says
 * (`first_bad_tensor.inputs[i].source`, docs/report.md). Only that tensor carries sources.
 * @param {object|null} firstBad the summary's `first_bad_tensor`.
 * @param {{host: string, kind: string, index: number}} focus the focused trace or execution.
 * @returns {{byName: Map<string, object>, executions: number[], traces: number[]}} inputs with
 *   a known source by name ("probs:0"), and the execution/trace indices those sources name;
 *   empty when the focus is not the first bad tensor.
 */
export function inputSources(firstBad, focus) {
  const out = {byName: new Map(), executions: [], traces: []};
  if (!isFirstBad(firstBad, focus)) return out;
  for (const input of firstBad.inputs || []) {
    const src = input.source;
    if (!src) continue;
    out.byName.set(input.name, input);
    const list = src.kind === 'execution' ? out.executions : out.traces;
    if (!list.includes(src.index)) list.push(src.index);
  }
  return out;
}

/**
 * Which frames of a stack to mark, from the server's per-frame `kind` ("framework" | "model" |
 * "user", docs/http_api.md): `source`, the innermost frame of model or user code (the line that
 * made the op, which the Source pane opens), and `user`, the innermost frame of the user's own
 * files. `known` (the summary's first bad tensor: `{source, user_source}`, frames as
 * `{file, line}`) names them instead where this stack holds those frames. Stacks arrive outermost
 * first (traceback order) unless the last frame is the `<module>` one.
 * @returns {{source: number, user: number, open: number}} indices, -1 for none; `open` is the
 *   frame to open first: `source`, else the innermost frame (-1 for no frames).
 */
export function frameMarks(frames, known = null) {
  if (!frames.length) return {source: -1, user: -1, open: -1};
  const innermostFirst = frames.length > 1 && frames[frames.length - 1].func === '<module>' &&
    frames[0].func !== '<module>';
  const order = frames.map((_, i) => i);
  if (!innermostFirst) order.reverse();
  const first = (test) => {
    const i = order.find((k) => test(frames[k]));
    return i === undefined ? -1 : i;
  };
  const at = (frame) => frame ? first((f) => f.file_path === frame.file && f.lineno === frame.line) : -1;
  let source = at(known && known.source);
  if (source < 0) source = first((f) => f.kind === 'model' || f.kind === 'user');
  let user = at(known && known.user_source);
  if (user < 0) user = first((f) => f.kind === 'user');
  return {source, user, open: source >= 0 ? source : order[0]};
}

/**
 * Whether a focus (`{host, kind, index}`) is the summary's first bad tensor.
 * @param {object|null} firstBad the summary's `first_bad_tensor`.
 */
export function isFirstBad(firstBad, focus) {
  return Boolean(firstBad && focus && firstBad.host === focus.host && firstBad.kind === focus.kind &&
    firstBad.index === focus.index);
}

/**
 * Where a focus sits on the first bad tensor's propagation path (`first_bad_tensor.path`, root
 * first), so the path strip can show and mark it.
 * @returns {number} the hop's position, -1 when the focus is not on the path.
 */
export function hopOf(firstBad, focus) {
  if (!firstBad || !focus || firstBad.host !== focus.host) return -1;
  return (firstBad.path || []).findIndex((h) => h.kind === focus.kind && h.index === focus.index);
}

/**
 * The hops a path strip shows: all of them up to `max`, else the first and last `keep` with the
 * number left out between them.
 * @returns {{head: number[], hidden: number, tail: number[]}} hop positions.
 */
export function pathWindow(n, {max = 8, keep = 3, expanded = false} = {}) {
  const all = Array.from({length: n}, (_, i) => i);
  if (expanded || n <= max) return {head: all, hidden: 0, tail: []};
  return {head: all.slice(0, keep), hidden: n - 2 * keep, tail: all.slice(n - keep)};
}

/**
 * The host a run opens on: the one asked for, else the host of the summary's first bad tensor
 * (a multi-host run opens where its NaN/∞ started), else the run's first host.
 * @param {string[]} hosts the run's hosts.
 * @param {object|null} summary the run's summary, or null when it failed.
 * @param {string|null} asked a host the user chose.
 * @returns {string|null} null when the run has no host.
 */
export function openingHost(hosts, summary, asked = null) {
  if (asked) return asked;
  const fb = summary ? summary.first_bad_tensor : null;
  if (fb && hosts.includes(fb.host)) return fb.host;
  return hosts.length ? hosts[0] : null;
}
