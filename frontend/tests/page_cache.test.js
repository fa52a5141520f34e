import {test} from 'node:test';
import assert from 'node:assert/strict';
import {PageCache, pagesFor} from '../page_cache.js';

function fakeServer(total, cap = 1000) {
  const calls = [];
  const fetchPage = async (begin, end) => {
    calls.push([begin, end]);
    const e = Math.min(end, total, begin + cap);
    const items = [];
    for (let i = begin; i < e; i++) items.push({index: i});
    return {begin, end: e, total, items};
  };
  return {calls, fetchPage};
}

test('pagesFor covers a range with aligned pages', () => {
  assert.deepEqual(pagesFor(0, 10, 10), [0]);
  assert.deepEqual(pagesFor(5, 25, 10), [0, 1, 2]);
  assert.deepEqual(pagesFor(10, 10, 10), []);
});

test('get reads loaded rows and never fetches', async () => {
  const s = fakeServer(2500);
  const c = new PageCache({fetchPage: s.fetchPage, pageSize: 100});
  assert.equal(c.get(5), undefined);
  assert.equal(s.calls.length, 0);
  await c.ensure(150, 260);
  assert.deepEqual(s.calls, [[100, 200], [200, 300]]);
  assert.equal(c.get(150).index, 150);
  assert.equal(c.get(299).index, 299);
  assert.equal(c.total, 2500);
  assert.equal(c.has(100, 300), true);
  assert.equal(c.has(0, 300), false);
});

test('concurrent ensures share one request per page', async () => {
  const s = fakeServer(1000);
  const c = new PageCache({fetchPage: s.fetchPage, pageSize: 100});
  await Promise.all([c.ensure(0, 50), c.ensure(10, 90), c.ensure(0, 100)]);
  assert.equal(s.calls.length, 1);
});

test('ranges past the known total fetch nothing more', async () => {
  const s = fakeServer(120);
  const c = new PageCache({fetchPage: s.fetchPage, pageSize: 100});
  assert.equal(await c.ensureTotal(), 120);
  await c.ensure(0, 10000);
  assert.deepEqual(s.calls, [[0, 100], [100, 200]]);
  assert.equal(c.get(119).index, 119);
});

test('least recently used pages are evicted', async () => {
  const s = fakeServer(1000000);
  const c = new PageCache({fetchPage: s.fetchPage, pageSize: 100, maxPages: 3});
  await c.ensure(0, 100);
  await c.ensure(100, 200);
  c.get(5); // page 0 becomes most recent
  await c.ensure(200, 300);
  await c.ensure(300, 400);
  assert.equal(c.size, 3);
  assert.notEqual(c.get(5), undefined);
  assert.equal(c.get(150), undefined);
});

test('a failed fetch rejects, is remembered, and can be retried', async () => {
  let fail = true;
  const c = new PageCache({pageSize: 10, fetchPage: async (b, e) => {
    if (fail) throw new Error('boom');
    return {begin: b, end: e, total: 20, items: Array.from({length: e - b}, (_, i) => b + i)};
  }});
  await assert.rejects(c.ensure(0, 5), /boom/);
  assert.equal(c.lastError.message, 'boom');
  fail = false;
  await c.ensure(0, 5);
  assert.equal(c.get(3), 3);
  assert.equal(c.lastError, null);
});
