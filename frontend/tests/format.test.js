import {test} from 'node:test';
import assert from 'node:assert/strict';
import {badCounts, countNoun, formatCount, formatStat, healthChips, healthSummary, isBad, opInitial,
  shortDtype, shortScopedName} from '../format.js';

// Health objects as the server decodes them (docs/internals.md): `any_inf_or_nan` is always there.
const LOG_HEALTH = {mode: 'FULL_HEALTH', size: 1000, neg_inf: 271, pos_inf: 0, nan: 0, neg: 729,
  zero: 0, pos: 0, dtype: 'float32', rank: 2, device_id: -1, any_inf_or_nan: true};

test('full health gives the nine chips in order', () => {
  const chips = healthChips(LOG_HEALTH);
  assert.deepEqual(chips.map((c) => c.label), ['dtype', 'rank', 'size', '-∞', '+∞', 'NaN', '−', '0', '+']);
  assert.equal(chips[0].text, 'f32');
});

test('non-zero inf and nan counts are bad, zero counts muted', () => {
  const tone = Object.fromEntries(healthChips(LOG_HEALTH).map((c) => [c.key, c.tone]));
  assert.equal(tone.neg_inf, 'bad');
  assert.equal(tone.pos_inf, 'muted');
  assert.equal(tone.nan, 'muted');
  assert.equal(tone.neg, 'plain');
  assert.equal(tone.zero, 'muted');
  assert.equal(tone.size, 'plain');
});

test('chips follow the mode: concise, curt and shape', () => {
  assert.deepEqual(healthChips({mode: 'CONCISE_HEALTH', size: 4, neg_inf: 0, pos_inf: 0, nan: 2, any_inf_or_nan: true})
    .map((c) => c.key), ['size', 'neg_inf', 'pos_inf', 'nan']);
  const curt = healthChips({mode: 'CURT_HEALTH', any_inf_or_nan: true});
  assert.equal(curt.length, 1);
  assert.equal(curt[0].tone, 'bad');
  const shape = healthChips({mode: 'SHAPE', dtype: 'float16', rank: 2, size: 6, shape: [2, 3]});
  assert.deepEqual(shape.map((c) => c.text), ['f16', '2', '6', '[2,3]']);
});

test('no health gives no chips', () => {
  assert.deepEqual(healthChips(null), []);
});

test('isBad is the server\'s any_inf_or_nan flag', () => {
  assert.equal(isBad(LOG_HEALTH), true);
  assert.equal(isBad({...LOG_HEALTH, neg_inf: 0, any_inf_or_nan: false}), false);
  assert.equal(isBad({mode: 'SHAPE', dtype: 'float32', rank: 1, size: 4, shape: [4]}), false);
  assert.equal(isBad({mode: 'CURT_HEALTH', any_inf_or_nan: true}), true);
  assert.equal(isBad(null), false);
});

test('counts are compacted past four digits', () => {
  assert.equal(formatCount(9999), '9999');
  assert.equal(formatCount(12345), '12.3k');
  assert.equal(formatCount(2500000), '2.5M');
  assert.equal(formatCount(1000000), '1M');
});

test('dtype names shorten', () => {
  assert.equal(shortDtype('bfloat16'), 'bf16');
  assert.equal(shortDtype('float64'), 'f64');
  assert.equal(shortDtype('bool'), 'bool');
});

test('timeline initials skip TF and torch prefixes', () => {
  assert.equal(opInitial('__inference_loss_316'), 'L');
  assert.equal(opInitial('__inference___backward_loss_259_317'), 'L');
  assert.equal(opInitial('aten.log.default'), 'L');
  assert.equal(opInitial('MatMul'), 'M');
  assert.equal(opInitial(''), '?');
});

test('a health summary says finite with its zeros, or the bad counts', () => {
  const probs = {mode: 'FULL_HEALTH', size: 1000, neg_inf: 0, pos_inf: 0, nan: 0, neg: 0, zero: 823,
    pos: 177, any_inf_or_nan: false};
  assert.equal(healthSummary(probs), 'finite, 823 zeros of 1000');
  assert.equal(healthSummary(LOG_HEALTH), '271 -inf of 1000');
  assert.equal(healthSummary({mode: 'CONCISE_HEALTH', size: 10, neg_inf: 0, pos_inf: 2, nan: 3, any_inf_or_nan: true}),
    '2 +inf, 3 NaN of 10');
  assert.equal(healthSummary({mode: 'CURT_HEALTH', any_inf_or_nan: true}), 'holds inf or NaN');
  assert.equal(healthSummary({mode: 'CURT_HEALTH', any_inf_or_nan: false}), 'finite');
  assert.equal(healthSummary(null), 'no health recorded');
});

// A float16 activation of the fp16 test program: 40000 everywhere, one doubling from 65504.
const FP16_NUMERICS = {mode: 'FULL_NUMERICS', dtype: 'float16', rank: 2, size: 32, neg_inf: 0, pos_inf: 0,
  nan: 0, neg: 0, zero: 0, pos: 32, min: -3.5, max: 40000, abs_min_nonzero: 3.5, abs_max: 40000,
  mean: 39000, std: 12.5, device_id: -1, any_inf_or_nan: false};

test('full numerics adds min, max and abs-max chips after the counts', () => {
  const chips = healthChips(FP16_NUMERICS);
  assert.deepEqual(chips.slice(-3).map((c) => [c.key, c.label, c.text]),
    [['min', 'min', '-3.5'], ['max', 'max', '4e4'], ['abs_max', '|max|', '4e4']]);
  assert.equal(chips.length, 12);
});

test('an abs-max is a warning chip where the server flags an overflow limit, and only there', () => {
  const absMax = (h) => healthChips(h).find((c) => c.key === 'abs_max');
  const flagged = {...FP16_NUMERICS, overflow_limit: 65504};
  assert.equal(absMax(flagged).tone, 'warn');
  assert.match(absMax(flagged).title, /within 2x of the float16 limit 65504/);
  // No rule of its own: the same numbers without the server's flag are plain.
  assert.equal(absMax(FP16_NUMERICS).tone, 'plain');
  assert.equal(absMax({...FP16_NUMERICS, abs_max: 32752}).tone, 'plain');
});

test('statistics are short, non-finite ones are symbols', () => {
  assert.deepEqual([40000, 65504, 1.5, 123.456, 0, -0.000123, 0.5].map(formatStat),
    ['4e4', '6.55e4', '1.5', '123', '0', '-1.23e-4', '0.5']);
  assert.deepEqual(['NaN', 'Infinity', '-Infinity'].map(formatStat), ['NaN', '∞', '-∞']);
});

test('a statistic over no finite elements is a muted dash', () => {
  const inf = {...FP16_NUMERICS, pos: 0, pos_inf: 32, min: 'NaN', max: 'NaN', abs_max: 'NaN', any_inf_or_nan: true};
  const min = healthChips(inf).find((c) => c.key === 'min');
  assert.deepEqual([min.text, min.tone, min.title], ['–', 'muted', 'min: none (no finite elements)']);
});

test('bad counts name only the non-finite kinds present', () => {
  assert.equal(badCounts({mode: 'FULL_HEALTH', size: 512, neg_inf: 106, pos_inf: 107, nan: 0, any_inf_or_nan: true}),
    '106 -inf, 107 +inf');
  assert.equal(badCounts({mode: 'FULL_HEALTH', size: 5e5, neg_inf: 0, pos_inf: 0, nan: 416000, any_inf_or_nan: true}),
    '416k NaN');
  assert.equal(badCounts({mode: 'CURT_HEALTH', any_inf_or_nan: true}), 'inf or NaN');
  assert.equal(badCounts(LOG_HEALTH), '271 -inf');
  assert.equal(badCounts({...LOG_HEALTH, neg_inf: 0, any_inf_or_nan: false}), '');
});

test('short scoped names keep the innermost module and the op', () => {
  assert.equal(shortScopedName('encoder.block.1.layer.1.DenseReluDense.wo/mm_0'), 'wo/mm_0');
  assert.equal(shortScopedName('encoder.block.1/clamp_1'), 'block.1/clamp_1');
  assert.equal(shortScopedName('encoder.block.1.layer.1/add_0'), 'layer.1/add_0');
  assert.equal(shortScopedName('backward/encoder.final_layer_norm/MulBackward0'), '∇final_layer_norm/MulBackward0');
  assert.equal(shortScopedName('Log'), 'Log');
  assert.equal(shortScopedName('__inference_loss_12'), 'loss_12');
  assert.equal(shortScopedName('aten.log.default'), 'log.default');
});

test('pane counts are grouped and singular for one', () => {
  assert.equal(countNoun(1000000, 'trace'), '1,000,000 traces');
  assert.equal(countNoun(1, 'execution'), '1 execution');
  assert.equal(countNoun(0, 'frame'), '0 frames');
  assert.equal(countNoun(3, 'match', 'matches'), '3 matches');
});
