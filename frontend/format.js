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

function trim(x) {
  return (Math.abs(x) < 100 ? x.toFixed(1) : x.toFixed(0)).replace(/\.0$/, '');
}

/** 1 -> "1 trace", 1000000 -> "1,000,000 traces": pane status counts. */
export function countNoun(n, singular, plural = singular + 's') {
  return `${Number(n).toLocaleString('en-US')} ${n === 1 ? singular : plural}`;
}

/** True when a health object reports any -inf, +inf or NaN (the server's `any_inf_or_nan`). */
export function isBad(health) {
  return Boolean(health && health.any_inf_or_nan);
}

/**
 * Chips for one health object.
 * @returns {{key: string, label: string, text: string, title: string,
 *   tone: 'bad'|'warn'|'muted'|'plain'}[]} 'warn': the abs_max of a tensor the server flags with
 *   `overflow_limit` (an OverflowHeadroom alert: one doubling from overflow).
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
      if (key === 'abs_max' && 'overflow_limit' in health) tone = 'warn';
    } else text = formatCount(value);
    if (COUNT_KEYS.has(key) && value === 0) tone = 'muted';
    if (BAD_KEYS.has(key) && value > 0) tone = 'bad';
    const label = LABELS[key];
    const near = tone === 'warn' ? ` (within 2x of the ${health.dtype} limit ${health.overflow_limit})` : '';
    const shown = STAT_KEYS.has(key) && text === '–' ? 'none (no finite elements)' : value;
    chips.push({key, label, text, tone, title: `${label}: ${shown}${near}`});
  }
  return chips;
}

/**
 * The non-finite counts of a health object: "106 -inf, 107 +inf", "24 NaN"; "inf or NaN" when
 * the mode records only a flag (CURT_HEALTH); "" for a finite tensor.
 */
export function badCounts(health) {
  if (!isBad(health)) return '';
  if (!('nan' in health)) return 'inf or NaN';
  return [['neg_inf', '-inf'], ['pos_inf', '+inf'], ['nan', 'NaN']]
    .filter(([k]) => health[k] > 0).map(([k, label]) => `${formatCount(health[k])} ${label}`).join(', ');
}

/**
 * One phrase for a health object: "finite, 823 zeros of 1000", "823 -inf, 2 NaN of 1000",
 * "holds inf or NaN" (CURT_HEALTH), "no health recorded" (null).
 */
export function healthSummary(health) {
  if (!health) return 'no health recorded';
  const of = typeof health.size === 'number' ? ` of ${health.size}` : '';
  if (!('nan' in health)) return isBad(health) ? 'holds inf or NaN' : 'finite';
  if (isBad(health)) return badCounts(health) + of;
  return typeof health.zero === 'number' ? `finite, ${health.zero} zeros${of}` : 'finite';
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

/**
 * An op name short enough for a chip: the innermost module (with its list index) and the op,
 * "encoder.block.1.layer.1.DenseReluDense.wo/mm_0" -> "wo/mm_0", "encoder.block.1/clamp_1" ->
 * "block.1/clamp_1"; TF names and function names as shortOpName leaves them.
 */
export function shortScopedName(name) {
  const parts = String(name || '').split('/');
  const op = shortOpName(parts.pop());
  const backward = parts[0] === 'backward' && parts.length > 1 ? '∇' : '';
  const segs = (parts.pop() || '').split('.');
  let tail = segs.pop();
  if (/^\d+$/.test(tail) && segs.length) tail = segs.pop() + '.' + tail;
  return backward + (tail ? `${tail}/${op}` : op);
}
