// The only module that knows the plugin's routes (docs/http_api.md). Relative URLs resolve
// against the entry page's <base href="plugin/numerics/">, so they reach our routes.

/** An answer in the plugin's one error shape, or a network failure (code 0). */
export class ApiError extends Error {
  constructor(code, message, parameter = null, route = '') {
    super(message);
    this.name = 'ApiError';
    this.code = code;
    this.parameter = parameter;
    this.route = route;
  }

  /** One line for the UI: what failed and which parameter the server blamed. */
  describe() {
    const where = this.parameter ? ` (parameter "${this.parameter}")` : '';
    const code = this.code ? `HTTP ${this.code}` : 'network error';
    return `${this.route}: ${this.message}${where} [${code}]`;
  }
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
  }
  const s = q.toString();
  return s ? '?' + s : '';
}

async function getJson(route, params = {}) {
  let response;
  try {
    response = await fetch('./' + route + query(params), {headers: {Accept: 'application/json'}});
  } catch (err) {
    throw new ApiError(0, `cannot reach TensorBoard (${err.message})`, null, route);
  }
  let body = null;
  try {
    body = await response.json();
  } catch (err) {
    body = null;
  }
  if (!response.ok) {
    const e = body && body.error;
    if (e) throw new ApiError(e.code || response.status, e.message, e.parameter, route);
    throw new ApiError(response.status, response.statusText || 'request failed', null, route);
  }
  if (body === null) throw new ApiError(response.status, 'answer is not JSON', null, route);
  return body;
}

/** Binds run and host once, so views ask for data without knowing the routing. */
export function client(run, host) {
  const base = {run, host};
  const paged = (route) => (begin, end, extra = {}) =>
    getJson(route, {...base, ...extra, begin, end});
  return {
    run,
    host,
    summary: () => getJson('summary', {run}),
    alerts: (begin, end, alertType) => getJson('alerts', {...base, begin, end, alert_type: alertType}),
    nextAlert: (index, direction, kind, alertType) => getJson('alerts/next',
      {...base, index, direction, kind, alert_type: alertType}),
    executionDigests: paged('execution/digests'),
    executionData: paged('execution/data'),
    traceDigests: paged('graph_execution/digests'),
    traceData: paged('graph_execution/data'),
    search: (begin, end, {opType, name, badOnly, step}) => getJson('graph_execution/search',
      {...base, begin, end, op_type: opType, name, bad_only: badOnly ? 'true' : 'false', step}),
    steps: (begin, end) => getJson('steps', {...base, begin, end}),
    findStep: (step) => getJson('steps/find', {...base, step}),
    trends: ({kind, stat, maxSteps}) => getJson('trends', {...base, kind, stat, max_steps: maxSteps}),
    graphInfo: (graphId) => getJson('graphs/graph_info', {...base, graph_id: graphId}),
    opInfo: (graphId, opName) => getJson('graphs/op_info', {...base, graph_id: graphId, op_name: opName}),
    sourceFiles: () => getJson('source_files/list', base),
    sourceFile: (index) => getJson('source_files/file', {...base, index}),
    stackFrames: (ids) => getJson('stack_frames/stack_frames', {...base, stack_frame_ids: ids.join(',')}),
  };
}

/** The run list; not bound to a run. */
export function fetchRuns() {
  return getJson('runs');
}

/** A run's summary (run-level: it names the host of the first bad tensor). */
export function fetchSummary(run) {
  return getJson('summary', {run});
}
