import {test} from 'node:test';
import assert from 'node:assert/strict';
import {countNoun, decodeHealth, formatCount, formatStat, healthChips, healthSummary, isBad, nearOverflow, isFrameworkFrame, opInitial, shortDtype,
  userFrameIndex} from '../format.js';

const LOG_HEALTH = {mode: 'FULL_HEALTH', size: 1000, neg_inf: 271, pos_inf: 0, nan: 0, neg: 729,
  zero: 0, pos: 0, dtype: 'float32', rank: 2, device_id: -1};

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
  assert.deepEqual(healthChips({mode: 'CONCISE_HEALTH', size: 4, neg_inf: 0, pos_inf: 0, nan: 2})
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

test('isBad reads counts and the curt flag', () => {
  assert.equal(isBad(LOG_HEALTH), true);
  assert.equal(isBad({...LOG_HEALTH, neg_inf: 0}), false);
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

test('raw FULL_HEALTH values decode like the backend', () => {
  const h = decodeHealth('FULL_HEALTH', [46, -1, 1, 2, 1000, 823, 0, 0, 90, 87, 0]);
  assert.equal(h.dtype, 'float32');
  assert.equal(h.neg_inf, 823);
  assert.equal(h.zero, 87);
  assert.equal('tensor_id' in h, false);
  assert.equal(isBad(h), true);
  assert.deepEqual(decodeHealth('SHAPE', [1, 1, 2, 6, 2, 3, 0, 0, 0, 0]).shape, [2, 3]);
  assert.equal(decodeHealth('NO_TENSOR', []), null);
  assert.equal(decodeHealth('FULL_HEALTH', null), null);
});

test('timeline initials skip TF and torch prefixes', () => {
  assert.equal(opInitial('__inference_loss_316'), 'L');
  assert.equal(opInitial('__inference___backward_loss_259_317'), 'L');
  assert.equal(opInitial('aten.log.default'), 'L');
  assert.equal(opInitial('MatMul'), 'M');
  assert.equal(opInitial(''), '?');
});

test('framework frames: packages, frameworks and the standard library', () => {
  assert.equal(isFrameworkFrame('/x/.venv/lib/python3.11/site-packages/tensorflow/ops.py'), true);
  assert.equal(isFrameworkFrame('/usr/lib/python3/dist-packages/numpy/core.py'), true);
  assert.equal(isFrameworkFrame('/usr/lib/python3.11/runpy.py'), true);
  assert.equal(isFrameworkFrame('/work/main/<frozen runpy>'), true);
  assert.equal(isFrameworkFrame('/src/pytorch/torch/nn/functional.py'), true);
  assert.equal(isFrameworkFrame('/work/main/tb_numerics_plugin/demo/tf_mnist.py'), false);
  assert.equal(isFrameworkFrame('/home/me/train.py'), false);
});

test('the user frame is the innermost one the user wrote', () => {
  const f = (file_path, func) => ({file_path, func});
  const outerFirst = [f('/a/<frozen runpy>', '_run_code'), f('/me/demo.py', '<module>'),
    f('/me/demo.py', 'loss'), f('/v/site-packages/tensorflow/x.py', 'log')];
  assert.equal(userFrameIndex(outerFirst), 2);
  const innerFirst = [f('/v/site-packages/torch/x.py', 'log'), f('/me/demo.py', 'loss'),
    f('/me/demo.py', '<module>')];
  assert.equal(userFrameIndex(innerFirst), 1);
  assert.equal(userFrameIndex([]), -1);
  assert.equal(userFrameIndex([f('/v/site-packages/t.py', 'x')]), 0);
});

test('a health summary says finite with its zeros, or the bad counts', () => {
  const probs = {mode: 'FULL_HEALTH', size: 1000, neg_inf: 0, pos_inf: 0, nan: 0, neg: 0, zero: 823,
    pos: 177, any_inf_or_nan: false};
  assert.equal(healthSummary(probs), 'finite, 823 zeros of 1000');
  assert.equal(healthSummary(LOG_HEALTH), '271 -inf of 1000');
  assert.equal(healthSummary({mode: 'CONCISE_HEALTH', size: 10, neg_inf: 0, pos_inf: 2, nan: 3}),
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

test('an abs-max within 2x of the dtype limit is a warning chip', () => {
  const absMax = (h) => healthChips(h).find((c) => c.key === 'abs_max');
  assert.equal(absMax(FP16_NUMERICS).tone, 'warn');
  assert.match(absMax(FP16_NUMERICS).title, /within 2x of the float16 limit 65504/);
  assert.equal(absMax({...FP16_NUMERICS, abs_max: 30000}).tone, 'plain');
  assert.equal(absMax({...FP16_NUMERICS, dtype: 'float32'}).tone, 'plain');
  assert.equal(nearOverflow({...FP16_NUMERICS, abs_max: 'NaN'}), false);
  assert.equal(nearOverflow(null), false);
});

test('statistics are short, non-finite ones are symbols', () => {
  assert.deepEqual([40000, 65504, 1.5, 123.456, 0, -0.000123, 0.5].map(formatStat),
    ['4e4', '6.55e4', '1.5', '123', '0', '-1.23e-4', '0.5']);
  assert.deepEqual(['NaN', 'Infinity', '-Infinity'].map(formatStat), ['NaN', '∞', '-∞']);
});

test('full numerics raw values decode with their statistics', () => {
  const values = [-1, -1, 19, 2, 32, 0, 0, 0, 0, 0, 32, 40000, 40000, 40000, 40000, 40000, 0];
  const h = decodeHealth('FULL_NUMERICS', values);
  assert.equal(h.dtype, 'float16');
  assert.deepEqual([h.pos, h.min, h.max, h.abs_min_nonzero, h.abs_max, h.mean, h.std],
    [32, 40000, 40000, 40000, 40000, 40000, 0]);
  const inf = decodeHealth('FULL_NUMERICS', [-1, -1, 19, 2, 32, 0, 32, 0, 0, 0, 0, 'NaN']);
  assert.ok(Number.isNaN(inf.min));
  const min = healthChips(inf).find((c) => c.key === 'min');
  assert.deepEqual([min.text, min.tone, min.title], ['–', 'muted', 'min: none (no finite elements)']);
});

test('pane counts are grouped and singular for one', () => {
  assert.equal(countNoun(1000000, 'trace'), '1,000,000 traces');
  assert.equal(countNoun(1, 'execution'), '1 execution');
  assert.equal(countNoun(0, 'frame'), '0 frames');
  assert.equal(countNoun(3, 'match', 'matches'), '3 matches');
});
