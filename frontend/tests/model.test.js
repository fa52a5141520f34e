import {test} from 'node:test';
import assert from 'node:assert/strict';
import {PageCache} from '../page_cache.js';
import {executionAtTime, executionOfTrace, findInputRows, findNearestTrace, flatConsumers, frameMarks, hopOf,
  inputSources, isFirstBad, lowerBound, openingHost, pathWindow, sourceIndexOf} from '../model.js';

function cacheOf(rows, pageSize = 4) {
  const calls = [];
  const cache = new PageCache({pageSize, fetchPage: async (begin, end) => {
    calls.push(begin);
    return {begin, end: Math.min(end, rows.length), total: rows.length, items: rows.slice(begin, end)};
  }});
  return {cache, calls};
}

// Two steps of a graph "g": x -> softmax -> log, and a different graph "h" in between.
const TRACES = [
  {op_name: 'x', output_slot: 0, graph_id: 'g'},
  {op_name: 'softmax', output_slot: 0, graph_id: 'g'},
  {op_name: 'log', output_slot: 0, graph_id: 'g'},
  {op_name: 'softmax', output_slot: 0, graph_id: 'h'},
  {op_name: 'x', output_slot: 0, graph_id: 'g'},
  {op_name: 'softmax', output_slot: 0, graph_id: 'g'},
  {op_name: 'other', output_slot: 0, graph_id: 'h'},
  {op_name: 'log', output_slot: 0, graph_id: 'g'},
  {op_name: 'mul', output_slot: 0, graph_id: 'g'},
];

test('the input row is the nearest earlier trace of the producer in the same graph', async () => {
  const {cache} = cacheOf(TRACES);
  assert.deepEqual(await findInputRows(cache, 7, 'g', [{op_name: 'softmax', output_slot: 0}]), [5]);
  assert.deepEqual(await findInputRows(cache, 2, 'g', [{op_name: 'softmax', output_slot: 0}]), [1]);
});

test('inputs never traced give no row', async () => {
  const {cache} = cacheOf(TRACES);
  assert.deepEqual(await findInputRows(cache, 7, 'g', [{op_name: 'probs', output_slot: 0}]), []);
});

test('consumers are found forwards, and the scan stops at its limit', async () => {
  const {cache} = cacheOf(TRACES);
  assert.equal(await findNearestTrace(cache, 2, {graphId: 'g', opName: 'log'}, +1), 7);
  assert.equal(await findNearestTrace(cache, 2, {graphId: 'g', opName: 'log'}, +1, 3), -1);
  assert.equal(await findNearestTrace(cache, 7, {graphId: 'g', opName: 'mul'}, +1), 8);
  assert.equal(await findNearestTrace(cache, 8, {graphId: 'g', opName: 'mul'}, +1), -1);
});

test('binary search loads few pages of a long list', async () => {
  const rows = Array.from({length: 100000}, (_, i) => ({wall_time: i * 0.5}));
  const {cache, calls} = cacheOf(rows, 1000);
  assert.equal(await lowerBound(cache, (d) => d.wall_time >= 30000), 60000);
  assert.ok(calls.length <= 18, `${calls.length} page loads`);
});

test('a trace belongs to the first execution recorded at or after it', async () => {
  const execs = [{wall_time: 1}, {wall_time: 2}, {wall_time: 5}];
  const {cache} = cacheOf(execs);
  assert.equal(await executionAtTime(cache, 3), 2);
  assert.equal(await executionAtTime(cache, 2), 1);
  assert.equal(await executionAtTime(cache, 9), 2);
  assert.equal(await executionAtTime(cacheOf([]).cache, 1), -1);
});

test('frames map to source files by host and path', () => {
  const files = [{index: 0, host_name: 'a', file_path: '/x.py'}, {index: 1, host_name: 'b', file_path: '/x.py'}];
  assert.equal(sourceIndexOf(files, {host_name: 'b', file_path: '/x.py', file_index: 0}), 1);
  assert.equal(sourceIndexOf(files, {host_name: 'c', file_path: '/x.py', file_index: 0}), 0);
  assert.equal(sourceIndexOf(files, {host_name: 'a', file_path: '/y.py', file_index: 0}), -1);
});

test('consumers of every slot are listed once', () => {
  const info = {consumers: [[{op_name: 'a'}, {op_name: 'b'}], [{op_name: 'a'}, {op_name: 'c'}]]};
  assert.deepEqual(flatConsumers(info).map((c) => c.op_name), ['a', 'b', 'c']);
});

// The TF demo's first bad tensor: Log fed by the `probs` argument, made by execution #18.
const FIRST_BAD = {kind: 'graph_execution_trace', index: 10, host: 'vm', inputs: [
  {name: 'probs:0', op_type: 'Placeholder', health: null,
    source: {kind: 'execution', index: 18, output_slot: 0, op_type: '__forward_model_219'}},
  {name: 'w:0', op_type: 'ReadVariableOp', health: null, source: {kind: 'graph_execution_trace', index: 7}},
  {name: 'b:0', op_type: 'Placeholder', health: null, source: null},
]};

test('input sources of the first bad tensor name executions and traces', () => {
  const s = inputSources(FIRST_BAD, {host: 'vm', kind: 'graph_execution_trace', index: 10});
  assert.deepEqual(s.executions, [18]);
  assert.deepEqual(s.traces, [7]);
  assert.deepEqual([...s.byName.keys()], ['probs:0', 'w:0']);
  assert.equal(s.byName.get('probs:0').source.op_type, '__forward_model_219');
});

test('another focus, host or kind has no input sources', () => {
  for (const focus of [{host: 'vm', kind: 'graph_execution_trace', index: 11},
    {host: 'vm.rank1', kind: 'graph_execution_trace', index: 10},
    {host: 'vm', kind: 'execution', index: 10}]) {
    const s = inputSources(FIRST_BAD, focus);
    assert.deepEqual([s.executions, s.traces, s.byName.size], [[], [], 0]);
  }
  assert.equal(inputSources(null, {host: 'vm', kind: 'execution', index: 0}).byName.size, 0);
});

// torch writes a graph call when it starts (before its traces), TF when it ends, graph_id-less.
const EXECUTIONS = [
  {op_type: 'aten.randn', graph_id: null, wall_time: 1},
  {op_type: 'Classifier.forward', graph_id: 'g0', wall_time: 2},
  {op_type: 'aten.ones_like', graph_id: null, wall_time: 5},
  {op_type: 'autograd.backward', graph_id: 'g1', wall_time: 6},
];

test('a trace belongs to the nearest call of its graph, not the next execution in time', async () => {
  const {cache} = cacheOf(EXECUTIONS, 2);
  assert.equal(await executionOfTrace(cache, {wall_time: 3, graph_ids: ['g0']}), 1);
  assert.equal(await executionOfTrace(cache, {wall_time: 3, graph_ids: ['outer', 'g1']}), 3);
});

test('without a call of its graph nearby, the first execution at or after the trace', async () => {
  const {cache} = cacheOf(EXECUTIONS, 2);
  assert.equal(await executionOfTrace(cache, {wall_time: 3, graph_ids: ['tf-graph']}), 2);
  assert.equal(await executionOfTrace(cache, {wall_time: 3}), 2);
  assert.equal(await executionOfTrace(cache, {wall_time: 3, graph_ids: ['g1']}, 0), 2);
});

// A T5 stack as the server sends it (outermost first, each frame with its `kind`).
const frame = (file_path, lineno, func, kind) => ({file_path, lineno, func, kind});
const T5_STACK = [
  frame('/w/tests/models.py', 112, 't5_fp16_overflow', 'user'),
  frame('/w/tests/models.py', 71, '_hf_train', 'user'),
  frame('/v/site-packages/transformers/models/t5/modeling_t5.py', 1014, 'forward', 'model'),
  frame('/v/site-packages/torch/nn/modules/module.py', 1775, '_call_impl', 'framework'),
  frame('/v/site-packages/transformers/models/t5/modeling_t5.py', 94, 'forward', 'model'),
  frame('/v/site-packages/torch/nn/modules/linear.py', 125, 'forward', 'framework'),
];

test('frame marks: the innermost model-or-user frame is the source, the innermost user frame is yours', () => {
  assert.deepEqual(frameMarks(T5_STACK), {source: 4, user: 1, open: 4});
  // Traceback order with the <module> frame last: the first frames are the innermost.
  const innerFirst = [frame('/v/site-packages/torch/x.py', 1, 'log', 'framework'),
    frame('/me/demo.py', 9, 'loss', 'user'), frame('/me/demo.py', 20, '<module>', 'user')];
  assert.deepEqual(frameMarks(innerFirst), {source: 1, user: 1, open: 1});
  // Only framework frames: nothing marked, the innermost one opens.
  assert.deepEqual(frameMarks([frame('/v/torch/a.py', 1, 'f', 'framework'), frame('/v/torch/b.py', 2, 'g', 'framework')]),
    {source: -1, user: -1, open: 1});
  assert.deepEqual(frameMarks([]), {source: -1, user: -1, open: -1});
});

test('frame marks follow the summary where it names frames of the stack', () => {
  const known = {source: {file: T5_STACK[2].file_path, line: 1014}, user_source: {file: '/w/tests/models.py', line: 112}};
  assert.deepEqual(frameMarks(T5_STACK, known), {source: 2, user: 0, open: 2});
  // Frames the stack does not hold fall back to the kinds.
  assert.deepEqual(frameMarks(T5_STACK, {source: {file: '/elsewhere.py', line: 1}, user_source: null}),
    {source: 4, user: 1, open: 4});
});

// The summary's first bad tensor of the T5 float16 run, shortened to what the strip needs.
const T5_FIRST_BAD = {host: 'vm', kind: 'graph_execution_trace', index: 112, sink: 'model output',
  path: [112, 115, 116, 121].map((index) => ({kind: 'graph_execution_trace', index, host: 'vm'}))
    .concat([{kind: 'execution', index: 3, host: 'vm'}])};

test('the first bad tensor and the hops of its path are found by host, kind and index', () => {
  const at = (kind, index, host = 'vm') => ({host, kind, index});
  assert.equal(isFirstBad(T5_FIRST_BAD, at('graph_execution_trace', 112)), true);
  assert.equal(isFirstBad(T5_FIRST_BAD, at('graph_execution_trace', 112, 'other')), false);
  assert.equal(isFirstBad(T5_FIRST_BAD, at('execution', 112)), false);
  assert.equal(isFirstBad(null, at('graph_execution_trace', 112)), false);
  assert.equal(hopOf(T5_FIRST_BAD, at('graph_execution_trace', 116)), 2);
  assert.equal(hopOf(T5_FIRST_BAD, at('execution', 3)), 4);
  assert.equal(hopOf(T5_FIRST_BAD, at('graph_execution_trace', 3)), -1);
  assert.equal(hopOf(T5_FIRST_BAD, at('graph_execution_trace', 116, 'other')), -1);
  assert.equal(hopOf({...T5_FIRST_BAD, path: undefined}, at('graph_execution_trace', 112)), -1);
});

test('a long path shows its first and last hops and counts the rest', () => {
  assert.deepEqual(pathWindow(13), {head: [0, 1, 2], hidden: 7, tail: [10, 11, 12]});
  assert.deepEqual(pathWindow(8), {head: [0, 1, 2, 3, 4, 5, 6, 7], hidden: 0, tail: []});
  assert.deepEqual(pathWindow(13, {expanded: true}).head.length, 13);
  assert.deepEqual(pathWindow(1), {head: [0], hidden: 0, tail: []});
});

test('a run opens on the host of its first bad tensor, else on its first host', () => {
  const hosts = ['node.rank0', 'node.rank1'];
  const bad = {first_bad_tensor: {host: 'node.rank1', kind: 'graph_execution_trace', index: 7}};
  assert.equal(openingHost(hosts, bad), 'node.rank1');
  assert.equal(openingHost(hosts, {first_bad_tensor: null}), 'node.rank0');
  assert.equal(openingHost(hosts, null), 'node.rank0');
  // A host the user picked wins; a first bad tensor on a host not listed (yet) is not opened.
  assert.equal(openingHost(hosts, bad, 'node.rank0'), 'node.rank0');
  assert.equal(openingHost(['a'], bad), 'a');
  assert.equal(openingHost([], null), null);
});
