import {test} from 'node:test';
import assert from 'node:assert/strict';
import {BANDS, cellTitle, cellWidth, columnOf, columnsFor, headroomBand, spanLabel, tickEvery} from '../views/trends.js';

test('headroom bands: red at or below 1 bit, orange 4, yellow 8, green above', () => {
  assert.equal(headroomBand(65504, 0, 0), 'red');
  assert.equal(headroomBand(32752, 1, 0), 'red');
  assert.equal(headroomBand(30000, 1.1, 0), 'orange');
  assert.equal(headroomBand(4094, 4, 0), 'orange');
  assert.equal(headroomBand(4000, 4.03, 0), 'yellow');
  assert.equal(headroomBand(255.9, 8, 0), 'yellow');
  assert.equal(headroomBand(2, 15, 0), 'green');
  assert.deepEqual(BANDS.map((b) => b.band), ['red', 'orange', 'yellow', 'green']);
});

test('a non-finite count wins over any headroom, even with no finite element', () => {
  assert.equal(headroomBand(2, 15, 3), 'nonfinite');
  assert.equal(headroomBand(null, null, 16), 'nonfinite');
});

test('no summary is absent; a summary without a limit (or abs_max 0) has no band', () => {
  assert.equal(headroomBand(null, null, null), 'absent');
  assert.equal(headroomBand(undefined, undefined, 0), 'absent');
  assert.equal(headroomBand(0, null, 0), 'nolimit');
  assert.equal(headroomBand(12, null, 0), 'nolimit');
});

test('span labels name one step or a range', () => {
  assert.equal(spanLabel([7, 7]), 'step 7');
  assert.equal(spanLabel([10, 19]), 'steps 10–19');
});

test('columnOf finds the bucket holding a step', () => {
  const spans = [[0, 4], [5, 9], [10, 14], [20, 24]];
  assert.equal(columnOf(spans, 0), 0);
  assert.equal(columnOf(spans, 7), 1);
  assert.equal(columnOf(spans, 10), 2);
  assert.equal(columnOf(spans, 17), 2);  // between buckets: the earlier one
  assert.equal(columnOf(spans, 99), 3);
  assert.equal(columnOf(spans, -3), 0);
  assert.equal(columnOf([], 3), -1);
});

test('axis labels fall every 1, 2, 5, 10... columns, never closer than a label', () => {
  assert.equal(tickEvery(10, 8), 1);
  assert.equal(tickEvery(10, 15), 2);
  assert.equal(tickEvery(10, 48), 5);
  assert.equal(tickEvery(10, 51), 10);
  assert.equal(tickEvery(2, 48), 50);
});

test('columns asked for fit the width beside the labels, within 20 and 400', () => {
  assert.equal(columnsFor(1280), 98);
  assert.equal(columnsFor(0), 20);
  assert.equal(columnsFor(100000), 400);
});

test('a cell title names module, steps, abs_max, dtype with its limit, headroom and non-finite', () => {
  const m = {module: 'encoder.block.0.layer.1.DenseReluDense.wo', dtype: 'float16', limit: 65504};
  const title = cellTitle(m, [12, 15], 40000, 0.71, 0);
  assert.deepEqual(title.split('\n'), ['encoder.block.0.layer.1.DenseReluDense.wo', 'steps 12–15',
    'abs_max 4e4', 'dtype float16 (limit 6.55e4)', 'headroom 0.7 bits']);
  const bad = cellTitle(m, [16, 16], null, null, 8).split('\n');
  assert.equal(bad[2], 'no finite element');
  assert.equal(bad.at(-1), '8 non-finite (-inf, +inf or NaN)');
  assert.equal(cellTitle({module: 'Net', dtype: 'float32', limit: null}, [1, 1], null, null, 0).split('\n')[2],
    'no summary');
});

test('a few columns widen to fill the width, many keep the narrowest', () => {
  assert.equal(cellWidth(1280, 6), 32);
  assert.equal(cellWidth(1280, 40), 24);
  assert.equal(cellWidth(1280, 98), 10);
  assert.equal(cellWidth(1280, 400), 10);
});
