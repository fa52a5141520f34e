import {test} from 'node:test';
import assert from 'node:assert/strict';
import {clampIndex, contentHeight, scrollTopForRow, visibleRange, virtualTop} from '../virtual_list.js';

const base = {viewportHeight: 220, rowHeight: 22, overscan: 0};

test('small lists are laid out at full height', () => {
  assert.equal(contentHeight(100, 22), 2200);
  const r = visibleRange({...base, scrollTop: 44, total: 100});
  assert.deepEqual(r, {first: 2, end: 12, offset: 0});
});

test('a partly scrolled row gives a negative offset', () => {
  const r = visibleRange({...base, scrollTop: 50, total: 100});
  assert.equal(r.first, 2);
  assert.equal(r.offset, -6);
  assert.equal(r.end, 13);
});

test('overscan widens the window within bounds', () => {
  const r = visibleRange({...base, overscan: 3, scrollTop: 0, total: 100});
  assert.equal(r.first, 0);
  assert.equal(r.end, 13);
});

test('empty lists draw nothing', () => {
  assert.deepEqual(visibleRange({...base, scrollTop: 0, total: 0}), {first: 0, end: 0, offset: 0});
});

test('a million rows are compressed under the cap and the bottom reaches the last row', () => {
  const total = 1000000;
  const maxPx = 8000000;
  const h = contentHeight(total, 22, maxPx);
  assert.equal(h, maxPx);
  const bottom = h - base.viewportHeight;
  const r = visibleRange({...base, scrollTop: bottom, total, maxPx});
  assert.equal(r.end, total);
  assert.equal(r.first, total - 10);
  assert.equal(r.offset, 0);
  assert.equal(virtualTop(0, total, 22, 220, maxPx), 0);
});

test('centring a row puts it in the middle of the viewport, compressed or not', () => {
  for (const total of [1000, 1000000]) {
    const index = Math.floor(total * 0.7);
    const st = scrollTopForRow(index, {...base, total, align: 'center'});
    const r = visibleRange({...base, scrollTop: st, total});
    assert.ok(index >= r.first && index < r.end, `row ${index} visible for total ${total}`);
    const rowY = r.offset + (index - r.first) * 22;
    assert.ok(Math.abs(rowY - 99) < 1, `row centred (y=${rowY})`);
  }
});

test('nearest alignment moves only as far as needed', () => {
  const opts = {...base, total: 1000, align: 'nearest'};
  assert.equal(scrollTopForRow(3, {...opts, scrollTop: 0}), 0);
  assert.equal(scrollTopForRow(10, {...opts, scrollTop: 0}), 22);
  assert.equal(scrollTopForRow(2, {...opts, scrollTop: 220}), 44);
});

test('the cursor is clamped into the list', () => {
  assert.equal(clampIndex(-1, 10), 0);
  assert.equal(clampIndex(12, 10), 9);
  assert.equal(clampIndex(0, 0), -1);
});
