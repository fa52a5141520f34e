// Health formatting and small naming helpers. Pure: no DOM, so `node --test` can import it.

// Chips shown for each tensor debug mode, in the order TF's debugger shows them.
const CHIP_KEYS = {
  FULL_HEALTH: ['dtype', 'rank', 'size', 'neg_inf', 'pos_inf', 'nan', 'neg', 'zero', 'pos'],
  FULL_NUMERICS: ['dtype', 'rank', 'size', 'neg_inf', 'pos_inf', 'nan', 'neg', 'zero', 'pos', 'min',
    'max', 'abs_max'],
  CONCISE_HEALTH: ['size', 'neg_inf', 'pos_inf', 'nan'],
  CURT_HEALTH: ['any_inf_or_nan'],
  SHAPE: ['dtype', 'rank', 'size', 'shape'],
  REDUCE_INF_NAN_THREE_SLOTS: ['neg_inf', 'pos_inf', 'nan'],
};
const LABELS = {
  dtype: 'dtype', rank: 'rank', size: 'size', neg_inf: '-∞', pos_inf: '+∞', nan: 'NaN',
  neg: '−', zero: '0', pos: '+', any_inf_or_nan: '∞/NaN', shape: 'shape', min: 'min', max: 'max',
  abs_max: '|max|',
};
// FULL_NUMERICS statistics (floats over the finite elements; non-finite ones arrive as strings).
const STAT_KEYS = new Set(['min', 'max', 'abs_max']);
// Largest finite value per dtype: an abs_max within a factor 2 of it is one doubling from
// overflow (the OverflowHeadroom alert's rule, docs/report.md).
const DTYPE_MAX = {float16: 65504, bfloat16: 3.3895e38, float32: 3.4028e38, float64: 1.798e308};
const BAD_KEYS = new Set(['neg_inf', 'pos_inf', 'nan']);
// Counts whose zero value carries no information and is drawn muted.
const COUNT_KEYS = new Set(['neg_inf', 'pos_inf', 'nan', 'neg', 'zero', 'pos']);

/** Short dtype names keep nine chips inside a 1280px-wide layout. */
export function shortDtype(dtype) {
  if (typeof dtype !== 'string') return String(dtype);
  const m = /^(float|bfloat|int|uint|complex)(\d+)$/.exec(dtype);
  if (!m) return dtype;
  const prefix = {float: 'f', bfloat: 'bf', int: 'i', uint: 'u', complex: 'c'}[m[1]];
  return prefix + m[2];
}

/** 1234 -> "1234", 12345 -> "12.3k", 2500000 -> "2.5M": keeps chips narrow. */
export function formatCount(n) {
  if (typeof n !== 'number' || !Number.isFinite(n)) return String(n);
  const abs = Math.abs(n);
  if (abs < 10000) return String(n);
  if (abs < 1e6) return trim(n / 1e3) + 'k';
  if (abs < 1e9) return trim(n / 1e6) + 'M';
  return trim(n / 1e9) + 'G';
}

/**
 * A statistic in at most ~6 characters: 40000 -> "4e4", 65504 -> "6.55e4", 1.5 -> "1.5",
 * 0.000123 -> "1.23e-4"; "NaN" / "Infinity" strings (and numbers) -> "NaN", "∞", "-∞".
 */
export function formatStat(v) {
  const x = Number(v);
  if (Number.isNaN(x)) return 'NaN';
  if (!Number.isFinite(x)) return x > 0 ? '∞' : '-∞';
  const abs = Math.abs(x);
  if (abs !== 0 && (abs >= 1e4 || abs < 1e-2)) {
    const [m, e] = x.toExponential(2).split('e');
    return `${Number(m)}e${Number(e)}`;
  }
  return String(Number(x.toPrecision(3)));
}

/** True when a finite abs_max is within a factor 2 of its dtype's largest finite value. */
export function nearOverflow(health) {
  const limit = health && DTYPE_MAX[health.dtype];
  const x = health ? Number(health.abs_max) : NaN;
  return Boolean(limit) && Number.isFinite(x) && x * 2 > limit;
}

function trim(x) {
  return (Math.abs(x) < 100 ? x.toFixed(1) : x.toFixed(0)).replace(/\.0$/, '');
}

/** 1 -> "1 trace", 1000000 -> "1,000,000 traces": pane status counts. */
export function countNoun(n, singular, plural = singular + 's') {
  return `${Number(n).toLocaleString('en-US')} ${n === 1 ? singular : plural}`;
}

/** True when a health object reports any -inf, +inf or NaN. */
export function isBad(health) {
  if (!health) return false;
  if (health.any_inf_or_nan === true) return true;
  return (health.neg_inf || 0) + (health.pos_inf || 0) + (health.nan || 0) > 0;
}

/**
 * Chips for one health object.
 * @returns {{key: string, label: string, text: string, title: string,
 *   tone: 'bad'|'warn'|'muted'|'plain'}[]} 'warn': an abs_max one doubling from overflow.
 *   one per field the mode knows; [] for no health (NO_TENSOR, FULL_TENSOR).
 */
export function healthChips(health) {
  if (!health) return [];
  const keys = CHIP_KEYS[health.mode] || CHIP_KEYS.FULL_HEALTH;
  const chips = [];
  for (const key of keys) {
    if (!(key in health)) continue;
    const value = health[key];
    let text;
    let tone = 'plain';
    if (key === 'dtype') text = shortDtype(value);
    else if (key === 'shape') text = '[' + value.join(',') + ']';
    else if (key === 'any_inf_or_nan') {
      text = value ? 'yes' : 'no';
      tone = value ? 'bad' : 'muted';
    } else if (STAT_KEYS.has(key)) {
      // Statistics cover finite elements only: NaN says there were none.
      const none = Number.isNaN(Number(value));
      text = none ? '–' : formatStat(value);
      if (none) tone = 'muted';
      if (key === 'abs_max' && nearOverflow(health)) tone = 'warn';
    } else text = formatCount(value);
    if (COUNT_KEYS.has(key) && value === 0) tone = 'muted';
    if (BAD_KEYS.has(key) && value > 0) tone = 'bad';
    const label = LABELS[key];
    const near = tone === 'warn' ? ` (within 2x of the ${health.dtype} limit ${DTYPE_MAX[health.dtype]})` : '';
    const shown = STAT_KEYS.has(key) && text === '–' ? 'none (no finite elements)' : value;
    chips.push({key, label, text, tone, title: `${label}: ${shown}${near}`});
  }
  return chips;
}

/**
 * One phrase for a health object: "finite, 823 zeros of 1000", "823 -inf, 2 NaN of 1000",
 * "holds inf or NaN" (CURT_HEALTH), "no health recorded" (null).
 */
export function healthSummary(health) {
  if (!health) return 'no health recorded';
  const of = typeof health.size === 'number' ? ` of ${health.size}` : '';
  if (!('nan' in health)) return isBad(health) ? 'holds inf or NaN' : 'finite';
  if (isBad(health)) {
    const parts = [['neg_inf', '-inf'], ['pos_inf', '+inf'], ['nan', 'NaN']]
      .filter(([k]) => health[k] > 0).map(([k, label]) => `${health[k]} ${label}`);
    return parts.join(', ') + of;
  }
  return typeof health.zero === 'number' ? `finite, ${health.zero} zeros${of}` : 'finite';
}

// Layouts of the raw debug values, index by index, as TF's kernel writes them (DESIGN §2).
const LAYOUTS = {
  CURT_HEALTH: ['tensor_id', 'any_inf_or_nan'],
  CONCISE_HEALTH: ['tensor_id', 'size', 'neg_inf', 'pos_inf', 'nan'],
  FULL_HEALTH: ['tensor_id', 'device_id', 'dtype_enum', 'rank', 'size', 'neg_inf', 'pos_inf',
    'nan', 'neg', 'zero', 'pos'],
  SHAPE: ['tensor_id', 'dtype_enum', 'rank', 'size'],
};
LAYOUTS.FULL_NUMERICS = LAYOUTS.FULL_HEALTH.concat(['min', 'max', 'abs_min_nonzero', 'abs_max',
  'mean', 'std']);
const DTYPES = {1: 'float32', 2: 'float64', 3: 'int32', 4: 'uint8', 5: 'int16', 6: 'int8',
  9: 'int64', 10: 'bool', 14: 'bfloat16', 19: 'float16'};

/**
 * Decodes one output's raw debug values (an execution's `debug_tensor_values[i]`) into the
 * Health shape of docs/internals.md, so per-output health uses the same chips as the list.
 * @returns {object|null} null when the mode carries no health or values are missing.
 */
export function decodeHealth(mode, values) {
  const layout = LAYOUTS[mode];
  if (!layout || !Array.isArray(values)) return null;
  const h = {mode};
  layout.forEach((key, i) => {
    if (i >= values.length || key === 'tensor_id') return;
    const v = Number(values[i]);
    if (key === 'dtype_enum') h.dtype = DTYPES[v] || `dtype#${v}`;
    else if (key === 'any_inf_or_nan') h.any_inf_or_nan = v !== 0;
    else h[key] = v;
  });
  if (mode === 'SHAPE') h.shape = values.slice(4, 4 + Math.min(h.rank || 0, 6)).map(Number);
  return h;
}

/**
 * One letter standing for an execution in the timeline: the op or graph function's name with
 * TF's and torch's mechanical prefixes removed ("__inference_loss_12" -> "L", "aten.log" -> "L").
 */
export function opInitial(name) {
  const core = shortOpName(name);
  const m = /[A-Za-z0-9]/.exec(core);
  return m ? m[0].toUpperCase() : '?';
}

/** Drops the prefixes that make every TF function and torch op look alike. */
export function shortOpName(name) {
  return String(name || '')
    .replace(/^(__inference_+|__forward_+|__backward_+)+/, '')
    .replace(/^(__backward_+|backward_+)/, '')
    .replace(/^aten\./, '');
}

// Paths of code the user did not write: installed packages, the frameworks, Python itself.
const FRAMEWORK_PATTERNS = [
  /[\\/](site|dist)-packages[\\/]/,
  /[\\/](torch|tensorflow|keras)[\\/]/,
  /^<frozen /, /[\\/]<frozen /,
  /[\\/]lib[\\/]python\d+(\.\d+)?[\\/](?!.*(site|dist)-packages)/,
  /[\\/]Python\d*[\\/]Lib[\\/]/i,
];

/** True for frames of installed packages, torch/TF/keras and the Python standard library. */
export function isFrameworkFrame(filePath) {
  const p = String(filePath || '');
  return FRAMEWORK_PATTERNS.some((re) => re.test(p));
}

/**
 * Index of the frame to open first: the innermost frame the user wrote. Stacks arrive outermost
 * first (traceback order, as TF writes them) unless the last frame is the `<module>` one.
 * @returns {number} -1 when there are no frames.
 */
export function userFrameIndex(frames) {
  if (!frames.length) return -1;
  const innermostFirst = frames.length > 1 && frames[frames.length - 1].func === '<module>' &&
    frames[0].func !== '<module>';
  const order = frames.map((_, i) => i);
  if (!innermostFirst) order.reverse();
  const user = order.find((i) => !isFrameworkFrame(frames[i].file_path));
  return user === undefined ? order[0] : user;
}
