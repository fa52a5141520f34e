/* The capture's per-op hot path in C: an op run inside a module call, an
 * optimizer step or a backward pass, recorded into the open graph segment, or
 * an eager op into the open run of eager ops; and, when the segment finishes,
 * the encoding of its traces (encode_traces).
 *
 * Plain CPython C API, no torch headers. `graph_op` does what
 * capture.Session.on_op and Session._record_graph_op do in Python for the
 * common case, on the same Python objects, so the records are the same
 * (tests/test_torch_record_c.py compares both paths' dumps). It passes over
 * ops the capture skips (views, metadata), tags the outputs of alias ops
 * (detach, _unsafe_view) as their inputs, and records an op when
 *
 *   - the op's facts are cached (Session._facts) and it is not skipped;
 *   - a module call or an optimizer step is in progress and its graph segment
 *     is open, or autograd is evaluating a node and the backward segment is
 *     open, or neither and a run of eager ops is open with room for the op;
 *   - the op returned a tensor, or a tuple or list holding tensors.
 *
 * Anything else returns False before touching any state, and the caller
 * records the op in Python. Errors propagate to the caller (Session.record
 * counts them; the user's op has already run).
 *
 * Layouts shared with Python, fixed here:
 *   tag (tags.py):        (serial, op_name, slot, version, tensor_id, input_name)
 *   Segment.ops item:     (op_type, op_name, input_names, num_outputs, stack_ids,
 *                          device_name, output dtypes)
 *   Segment.traces item:  (op_name, slot, tensor_id, payload, meta, device_name, wall_time)
 *   Session._seq_ops:     forward node sequence nr -> (op_name, stack_ids, first tensor id)
 * OpFacts fields are found by name once (configure).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject* Py_NewRef(PyObject* o) {
  Py_INCREF(o);
  return o;
}
#endif

/* What configure() hands over once: torch objects and the layout of OpFacts. */
static struct {
  PyObject* tensor_type;     /* torch.Tensor */
  PyObject* is_grad_enabled; /* torch.is_grad_enabled */
  PyObject* sequence_nr;     /* torch._C._autograd._get_sequence_nr */
  PyObject* wall_clock;      /* time.time */
  PyObject* dtype_enum;      /* torch.dtype -> DataType number (health.DTYPE_ENUM) */
  PyObject* backward_name;   /* capture.BACKWARD */
  PyObject* backward_prefix; /* "backward": the scope of backward ops */
  PyObject* autograd_node;   /* torch._C._current_autograd_node */
  PyObject* producer_tag;    /* tags.producer_tag */
  PyObject* eager_name;      /* "eager": the scope of eager ops */
  Py_ssize_t eager_batch;    /* capture.EAGER_BATCH */
  Py_ssize_t seq_map_max;    /* capture._SEQ_MAP_MAX */
  Py_ssize_t f_op_type, f_short, f_skip, f_alias, f_traced, f_max;  /* indices into an OpFacts */
  int ready;
} cfg;

static PyObject *zero, *one;  /* output slot 0; the one output; the tensor id step */

/* Interned attribute names. */
static PyObject *s_facts, *s_scopes, *s_segment, *s_stacks, *s_seq_ops, *s_next_id,
    *s_encoder, *s_devices, *s_depth, *s_in_optimizer, *s_stack, *s_name, *s_is_graph,
    *s_serial, *s_counters, *s_ops, *s_traces, *s_input_name, *s_tag, *s_is_view, *s_base,
    *s_version, *s_device, *s_dtype, *s_is_user, *s_user_code, *s_sites, *s_walk, *s_f_lasti,
    *s_dtype_ok, *s_dtype_traced, *s_graph_values, *s_payload, *s_popitem, *s_sequence_nr,
    *s_eager;

static int intern_names(void) {
#define NAME(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1
  NAME(s_facts, "_facts"); NAME(s_scopes, "scopes"); NAME(s_segment, "_segment");
  NAME(s_stacks, "stacks"); NAME(s_seq_ops, "_seq_ops"); NAME(s_next_id, "_next_tensor_id");
  NAME(s_encoder, "encoder"); NAME(s_devices, "_devices"); NAME(s_depth, "depth");
  NAME(s_in_optimizer, "in_optimizer"); NAME(s_stack, "stack"); NAME(s_name, "name");
  NAME(s_is_graph, "is_graph"); NAME(s_serial, "serial"); NAME(s_counters, "_counters");
  NAME(s_ops, "ops"); NAME(s_traces, "traces"); NAME(s_input_name, "input_name");
  NAME(s_tag, "_tbn_tag"); NAME(s_is_view, "_is_view"); NAME(s_base, "_base");
  NAME(s_version, "_version"); NAME(s_device, "device"); NAME(s_dtype, "dtype");
  NAME(s_is_user, "_is_user"); NAME(s_user_code, "_user_code"); NAME(s_sites, "_sites");
  NAME(s_walk, "_walk"); NAME(s_f_lasti, "f_lasti"); NAME(s_dtype_ok, "dtype_ok");
  NAME(s_dtype_traced, "dtype_traced"); NAME(s_graph_values, "graph_values");
  NAME(s_payload, "payload"); NAME(s_popitem, "popitem");
  NAME(s_sequence_nr, "_sequence_nr"); NAME(s_eager, "eager");
#undef NAME
  return 0;
}

/* obj.name as a truth value: 1, 0, or -1 on error. */
static int attr_true(PyObject* obj, PyObject* name) {
  PyObject* value = PyObject_GetAttr(obj, name);
  if (value == NULL) return -1;
  int truth = PyObject_IsTrue(value);
  Py_DECREF(value);
  return truth;
}

/* t._is_view(): 1, 0, or -1 on error. */
static int is_view(PyObject* t) {
  PyObject* value = PyObject_CallMethodNoArgs(t, s_is_view);
  if (value == NULL) return -1;
  int truth = PyObject_IsTrue(value);
  Py_DECREF(value);
  return truth;
}

/* mapping.get(key) as a new reference; NULL without an error when absent. */
static PyObject* lookup(PyObject* mapping, PyObject* key) {
  if (PyDict_CheckExact(mapping)) {
    PyObject* value = PyDict_GetItemWithError(mapping, key);
    Py_XINCREF(value);
    return value;
  }
  PyObject* value = PyObject_GetItem(mapping, key);
  if (value == NULL && PyErr_ExceptionMatches(PyExc_KeyError)) PyErr_Clear();
  return value;
}

/* ---- call sites (stacks.StackTracker.call_site) --------------------------------- */

/* The frame ids of the innermost user frame at or above `skip` frames out of the
 * current Python frame; () when there is none. New reference, NULL on error. */
static PyObject* call_site(PyObject* stacks, int skip) {
  PyObject *is_user = NULL, *key = NULL, *sites = NULL, *result = NULL;
  PyFrameObject* f = PyEval_GetFrame();
  Py_XINCREF(f);
  for (; skip > 0 && f != NULL; skip--) {
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  if ((is_user = PyObject_GetAttr(stacks, s_is_user)) == NULL) goto done;
  while (f != NULL) {
    PyCodeObject* code = PyFrame_GetCode(f);
    PyObject* code_id = PyLong_FromVoidPtr(code);
    PyObject* user = code_id ? lookup(is_user, code_id) : NULL;
    if (user == NULL && !PyErr_Occurred())
      user = PyObject_CallMethodOneArg(stacks, s_user_code, (PyObject*)code);
    Py_DECREF(code);
    int truth = user ? PyObject_IsTrue(user) : -1;
    Py_XDECREF(user);
    if (truth < 0) { Py_XDECREF(code_id); goto done; }
    if (truth) {
      PyObject* lasti = PyObject_GetAttr((PyObject*)f, s_f_lasti);
      key = lasti ? PyTuple_Pack(2, code_id, lasti) : NULL;
      Py_XDECREF(lasti);
      Py_DECREF(code_id);
      if (key == NULL) goto done;
      break;
    }
    Py_DECREF(code_id);
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  if (f == NULL) { result = PyTuple_New(0); goto done; }
  if ((sites = PyObject_GetAttr(stacks, s_sites)) == NULL) goto done;
  result = lookup(sites, key);
  if (result == NULL && !PyErr_Occurred()) {
    result = PyObject_CallMethodOneArg(stacks, s_walk, (PyObject*)f);
    if (result != NULL && PyObject_SetItem(sites, key, result) < 0) Py_CLEAR(result);
  }
done:
  Py_XDECREF(f);
  Py_XDECREF(is_user);
  Py_XDECREF(key);
  Py_XDECREF(sites);
  return result;
}

/* ---- names ----------------------------------------------------------------------- */

/* Segment.op_name: "scope/short_k", k counting (scope, short) in the segment. */
static PyObject* op_name(PyObject* seg, PyObject* scope, PyObject* short_name) {
  PyObject *counters = NULL, *key = NULL, *count = NULL, *next = NULL, *name = NULL;
  if ((counters = PyObject_GetAttr(seg, s_counters)) == NULL) goto done;
  if ((key = PyTuple_Pack(2, scope, short_name)) == NULL) goto done;
  count = lookup(counters, key);
  if (count == NULL && PyErr_Occurred()) goto done;
  Py_ssize_t k = count ? PyLong_AsSsize_t(count) : 0;
  if (k == -1 && PyErr_Occurred()) goto done;
  if ((next = PyLong_FromSsize_t(k + 1)) == NULL) goto done;
  if (PyObject_SetItem(counters, key, next) < 0) goto done;
  name = PyUnicode_FromFormat("%U/%U_%zd", scope, short_name, k);
done:
  Py_XDECREF(counters);
  Py_XDECREF(key);
  Py_XDECREF(count);
  Py_XDECREF(next);
  return name;
}

/* Session._remember_forward: the op's autograd node (the thread's sequence
 * counter has moved one past it) -> (op_name, stack_ids, first tensor id). */
static int remember_forward(PyObject* session, PyObject* name, PyObject* stack_ids,
                            PyObject* first_id) {
  PyObject *counter = NULL, *seq = NULL, *seq_ops = NULL, *entry = NULL, *popped = NULL;
  int status = -1;
  if ((counter = PyObject_CallNoArgs(cfg.sequence_nr)) == NULL) goto done;
  long long nr = PyLong_AsLongLong(counter);
  if (nr == -1 && PyErr_Occurred()) goto done;
  if ((seq = PyLong_FromLongLong(nr - 1)) == NULL) goto done;
  if ((seq_ops = PyObject_GetAttr(session, s_seq_ops)) == NULL) goto done;
  int known = PySequence_Contains(seq_ops, seq);
  if (known < 0) goto done;
  if (!known) {
    if ((entry = PyTuple_Pack(3, name, stack_ids, first_id)) == NULL) goto done;
    if (PyObject_SetItem(seq_ops, seq, entry) < 0) goto done;  /* OrderedDict: keeps order */
    Py_ssize_t size = PyObject_Length(seq_ops);
    if (size < 0) goto done;
    if (size > cfg.seq_map_max &&
        (popped = PyObject_CallMethodOneArg(seq_ops, s_popitem, Py_False)) == NULL)
      goto done;
  }
  status = 0;
done:
  Py_XDECREF(counter);
  Py_XDECREF(seq);
  Py_XDECREF(seq_ops);
  Py_XDECREF(entry);
  Py_XDECREF(popped);
  return status;
}

/* ops.tensors_in: the tensors among args and kwargs values, and in lists or
 * tuples of them, in order. Appends to `found`; -1 on error. */
static int collect_tensors(PyObject* items, PyObject* found) {
  PyObject* seq = PySequence_Fast(items, "arguments must be iterable");
  if (seq == NULL) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** item = PySequence_Fast_ITEMS(seq);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* a = item[i];
    int is_tensor = PyObject_IsInstance(a, cfg.tensor_type);
    if (is_tensor < 0) goto fail;
    if (is_tensor) {
      if (PyList_Append(found, a) < 0) goto fail;
    } else if (PyList_CheckExact(a) || PyTuple_CheckExact(a)) {
      Py_ssize_t m = PySequence_Fast_GET_SIZE(a);
      for (Py_ssize_t j = 0; j < m; j++) {
        PyObject* x = PySequence_Fast_GET_ITEM(a, j);
        int inner = PyObject_IsInstance(x, cfg.tensor_type);
        if (inner < 0 || (inner && PyList_Append(found, x) < 0)) goto fail;
      }
    }
  }
  Py_DECREF(seq);
  return 0;
fail:
  Py_DECREF(seq);
  return -1;
}

/* The input names of the op (Session._record_graph_op): "producer:slot" read
 * off a tag made in this segment, else Segment.input_name (a Placeholder). */
static PyObject* input_names(PyObject* seg, PyObject* serial, PyObject* args, PyObject* kwargs) {
  PyObject* found = PyList_New(0);
  PyObject* names = NULL;
  if (found == NULL || collect_tensors(args, found) < 0) goto done;
  if (kwargs != Py_None && PyDict_Check(kwargs) && PyDict_GET_SIZE(kwargs) > 0) {
    PyObject* values = PyDict_Values(kwargs);
    int failed = values == NULL || collect_tensors(values, found) < 0;
    Py_XDECREF(values);
    if (failed) goto done;
  }
  Py_ssize_t n = PyList_GET_SIZE(found);
  if ((names = PyTuple_New(n)) == NULL) goto done;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* t = PyList_GET_ITEM(found, i);
    PyObject* name = NULL;
    PyObject* tag = PyObject_GetAttr(t, s_tag);
    if (tag == NULL) {
      if (!PyErr_ExceptionMatches(PyExc_AttributeError)) goto fail;
      PyErr_Clear();
    } else if (PyTuple_Check(tag) && PyTuple_GET_SIZE(tag) == 6) {
      int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(tag, 0), serial, Py_EQ);
      int view = same > 0 ? is_view(t) : 0;
      if (same < 0 || view < 0) { Py_DECREF(tag); goto fail; }
      if (same && !view) {  /* made earlier in this segment, read directly */
        name = PyTuple_GET_ITEM(tag, 5);
        Py_INCREF(name);
      }
    }
    Py_XDECREF(tag);
    if (name == NULL && (name = PyObject_CallMethodOneArg(seg, s_input_name, t)) == NULL)
      goto fail;
    PyTuple_SET_ITEM(names, i, name);
  }
  goto done;
fail:
  Py_CLEAR(names);
done:
  Py_XDECREF(found);
  return names;
}

/* ---- the op ------------------------------------------------------------------------ */

/* What graph_op reads before it changes anything: new references, cleared by
 * release(). For a backward op, also its scope's stack_ids. */
typedef struct {
  PyObject *facts, *segment, *scope, *short_name, *serial, *stack_ids;
  PyObject* outputs;  /* list: the op's output tensors (ops.outputs_of) */
  int eager;          /* an eager op (Session._record_eager_op) */
} Claim;

static void release(Claim* c) {
  Py_CLEAR(c->facts);
  Py_CLEAR(c->segment);
  Py_CLEAR(c->scope);
  Py_CLEAR(c->serial);
  Py_CLEAR(c->stack_ids);
  Py_CLEAR(c->outputs);
}

/* The scope of a backward op (Session.on_op): "backward/" + the forward op that
 * made its autograd node, with that op's stack ids; "backward" and () when the
 * node was not seen forward. */
static int backward_scope(PyObject* session, PyObject* node, Claim* c) {
  PyObject* seq_ops = PyObject_GetAttr(session, s_seq_ops);
  PyObject* seq = seq_ops ? PyObject_CallMethodNoArgs(node, s_sequence_nr) : NULL;
  PyObject* fwd = seq ? lookup(seq_ops, seq) : NULL;
  Py_XDECREF(seq_ops);
  Py_XDECREF(seq);
  if (fwd == NULL && PyErr_Occurred()) return -1;
  int known = fwd != NULL && PyTuple_Check(fwd) && PyTuple_GET_SIZE(fwd) >= 2;
  if (known) {
    c->scope = PyUnicode_FromFormat("%U/%U", cfg.backward_prefix, PyTuple_GET_ITEM(fwd, 0));
    c->stack_ids = Py_NewRef(PyTuple_GET_ITEM(fwd, 1));
  } else {
    c->scope = Py_NewRef(cfg.backward_prefix);
    c->stack_ids = PyTuple_New(0);
  }
  Py_XDECREF(fwd);
  return c->scope && c->stack_ids ? 0 : -1;
}

/* 1 when the eager run `seg` has room for another op (capture.EAGER_BATCH),
 * 0 when Python must start the next run, -1 on error. */
static int eager_room(PyObject* seg) {
  PyObject* eager = PyObject_GetAttr(seg, s_eager);
  Py_ssize_t size = eager ? PyObject_Length(eager) : -1;
  Py_XDECREF(eager);
  return size < 0 ? -1 : size < cfg.eager_batch;
}

/* Where the op belongs, as Session.on_op decides it: 1 for a module call's or an
 * optimizer step's open graph segment; outside both, for the open backward
 * segment while autograd evaluates a node, else for the open run of eager ops
 * (c->eager); 0 when Python must open a segment first. Fills segment, scope
 * and, backward, stack_ids. */
static int claim_scope(PyObject* session, Claim* c) {
  PyObject *scopes = NULL, *name = NULL, *node = NULL, *stack = NULL;
  int result = -1;
  if ((scopes = PyObject_GetAttr(session, s_scopes)) == NULL) goto done;
  PyObject* depth_value = PyObject_GetAttr(scopes, s_depth);
  long depth = depth_value ? PyLong_AsLong(depth_value) : -1;
  Py_XDECREF(depth_value);
  if (depth == -1 && PyErr_Occurred()) goto done;
  int in_optimizer = depth > 0 ? 0 : attr_true(scopes, s_in_optimizer);
  if (in_optimizer < 0 || (c->segment = PyObject_GetAttr(session, s_segment)) == NULL) goto done;
  result = 0;
  if (c->segment == Py_None) goto done;  /* Python opens one */
  int is_graph = attr_true(c->segment, s_is_graph);
  if (is_graph < 0 || (is_graph && (name = PyObject_GetAttr(c->segment, s_name)) == NULL)) {
    result = -1;
    goto done;
  }
  int backward = is_graph ? PyObject_RichCompareBool(name, cfg.backward_name, Py_EQ) : 0;
  if (backward < 0) { result = -1; goto done; }
  if (depth > 0 || in_optimizer) {
    if (!is_graph || backward) goto done;  /* e.g. a module called during backward */
    if (depth > 0) {  /* the innermost module's path */
      if ((stack = PyObject_GetAttr(scopes, s_stack)) == NULL) { result = -1; goto done; }
      if (!PyList_CheckExact(stack) || PyList_GET_SIZE(stack) == 0) goto done;
      c->scope = Py_NewRef(PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1));
    } else {  /* an optimizer step: its execution's name */
      c->scope = Py_NewRef(name);
    }
    result = PyUnicode_Check(c->scope) ? 1 : 0;
    goto done;
  }
  if ((node = PyObject_CallNoArgs(cfg.autograd_node)) == NULL) { result = -1; goto done; }
  if (node != Py_None) {  /* backward: into the open backward segment */
    if (backward) result = backward_scope(session, node, c) < 0 ? -1 : 1;
    goto done;
  }
  if (is_graph) goto done;  /* an eager op: Python opens the eager run */
  result = eager_room(c->segment);
  if (result == 1) {
    c->scope = Py_NewRef(cfg.eager_name);
    c->eager = 1;
  }
done:
  Py_XDECREF(scopes);
  Py_XDECREF(name);
  Py_XDECREF(node);
  Py_XDECREF(stack);
  return result;
}

/* The op's output tensors into c->outputs (ops.outputs_of): the tensor it
 * returned, or those of the tuple or list it returned; 1, 0 for none (an op
 * that returns what it wrote, or nothing: Python's), -1 on error. */
static int claim_outputs(PyObject* out, Claim* c) {
  int is_tensor = PyObject_IsInstance(out, cfg.tensor_type);
  if (is_tensor < 0 || (c->outputs = PyList_New(0)) == NULL) return -1;
  if (is_tensor) return PyList_Append(c->outputs, out) < 0 ? -1 : 1;
  if ((!PyTuple_CheckExact(out) && !PyList_CheckExact(out)) || PySequence_Fast_GET_SIZE(out) == 0)
    return 0;
  if (collect_tensors(out, c->outputs) < 0) return -1;
  return PyList_GET_SIZE(c->outputs) > 0;
}

/* SKIPPED for an op the capture skips (a view, metadata: nothing to do),
 * ALIASED for an alias op (detach, _unsafe_view: its output takes its input's
 * tag, inherit_tag), CLAIMED when graph_op records this op (and `c` is filled), 0 when Python
 * records it, -1 on error. */
enum { CLAIMED = 1, SKIPPED = 2, ALIASED = 3 };
static int claim(PyObject* session, PyObject* func, PyObject* out, Claim* c) {
  PyObject *facts_map = NULL, *key = NULL;
  int result = -1;
  memset(c, 0, sizeof(*c));
  if ((facts_map = PyObject_GetAttr(session, s_facts)) == NULL) goto done;
  if ((key = PyLong_FromVoidPtr(func)) == NULL) goto done;
  c->facts = lookup(facts_map, key);
  result = 0;
  if (c->facts == NULL) { result = PyErr_Occurred() ? -1 : 0; goto done; }
  if (!PyTuple_Check(c->facts) || PyTuple_GET_SIZE(c->facts) <= cfg.f_max) goto done;
  int skip = PyObject_IsTrue(PyTuple_GET_ITEM(c->facts, cfg.f_skip));
  int alias = skip > 0 ? PyObject_IsTrue(PyTuple_GET_ITEM(c->facts, cfg.f_alias)) : 0;
  if (skip < 0 || alias < 0) { result = -1; goto done; }
  if (skip) { result = alias ? ALIASED : SKIPPED; goto done; }
  if ((result = claim_outputs(out, c)) <= 0) goto done;
  c->short_name = PyTuple_GET_ITEM(c->facts, cfg.f_short);  /* borrowed from facts */
  if (!PyUnicode_Check(c->short_name)) goto done;
  if ((result = claim_scope(session, c)) <= 0) goto done;
  if ((c->serial = PyObject_GetAttr(c->segment, s_serial)) == NULL) result = -1;
done:
  if (result != CLAIMED) release(c);
  Py_XDECREF(facts_map);
  Py_XDECREF(key);
  return result;
}

/* Item `index` of Session.device(device), (device name, DebuggedDevice id):
 * the device's record is written once. */
static PyObject* device_item(PyObject* session, PyObject* device, Py_ssize_t index) {
  PyObject* devices = PyObject_GetAttr(session, s_devices);
  if (devices == NULL) return NULL;
  PyObject* known = lookup(devices, device);
  Py_DECREF(devices);
  if (known == NULL) {
    if (PyErr_Occurred()) return NULL;
    if ((known = PyObject_CallMethodOneArg(session, s_device, device)) == NULL) return NULL;
  }
  PyObject* item = PySequence_GetItem(known, index);
  Py_DECREF(known);
  return item;
}

static PyObject* device_name(PyObject* session, PyObject* device) {
  return device_item(session, device, 0);
}

/* Tags `out` (and the base it was written through) as output `slot` of op_name. */
static int mark(PyObject* out, PyObject* serial, PyObject* name, Py_ssize_t slot,
                PyObject* slot_number, PyObject* tensor_id) {
  PyObject* version = PyObject_GetAttr(out, s_version);
  PyObject* input_name = version ? PyUnicode_FromFormat("%U:%zd", name, slot) : NULL;
  PyObject* tag = input_name ? PyTuple_Pack(6, serial, name, slot_number, version,
                                            tensor_id, input_name) : NULL;
  Py_XDECREF(version);
  Py_XDECREF(input_name);
  if (tag == NULL || PyObject_SetAttr(out, s_tag, tag) < 0) goto fail;
  int view = is_view(out);
  if (view < 0) goto fail;
  if (view) {
    PyObject* base = PyObject_GetAttr(out, s_base);
    int failed = base == NULL || PyObject_SetAttr(base, s_tag, tag) < 0;
    Py_XDECREF(base);
    if (failed) goto fail;
  }
  Py_DECREF(tag);
  return 0;
fail:
  Py_XDECREF(tag);
  return -1;
}

/* The trace item of the op's output, or NULL without an error when the op or
 * the output's dtype is not traced. */
static PyObject* trace_of(PyObject* session, PyObject* facts, PyObject* out, PyObject* device,
                          PyObject* name, PyObject* slot, PyObject* tensor_id,
                          PyObject* device_name, PyObject* wall) {
  PyObject *encoder = NULL, *dtype = NULL, *dtype_ok = NULL, *ok = NULL, *pair = NULL;
  PyObject* trace = NULL;
  int traced = PyObject_IsTrue(PyTuple_GET_ITEM(facts, cfg.f_traced));
  if (traced <= 0) return NULL;
  if ((encoder = PyObject_GetAttr(session, s_encoder)) == NULL) goto done;
  if ((dtype = PyObject_GetAttr(out, s_dtype)) == NULL) goto done;
  if ((dtype_ok = PyObject_GetAttr(encoder, s_dtype_ok)) == NULL) goto done;
  ok = lookup(dtype_ok, dtype);
  if (ok == NULL && !PyErr_Occurred())
    ok = PyObject_CallMethodOneArg(encoder, s_dtype_traced, dtype);
  int traced_dtype = ok ? PyObject_IsTrue(ok) : -1;
  if (traced_dtype <= 0) goto done;
  int values = attr_true(encoder, s_graph_values);
  if (values < 0) goto done;
  if (values) {
    pair = PyObject_CallMethodObjArgs(encoder, s_payload, out, device, NULL);
    if (pair == NULL) goto done;
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
      PyErr_SetString(PyExc_TypeError, "Encoder.payload must return (payload, meta)");
      goto done;
    }
    trace = PyTuple_Pack(7, name, slot, tensor_id, PyTuple_GET_ITEM(pair, 0),
                         PyTuple_GET_ITEM(pair, 1), device_name, wall);
  } else {
    trace = PyTuple_Pack(7, name, slot, tensor_id, Py_None, Py_None, device_name, wall);
  }
done:
  Py_XDECREF(encoder);
  Py_XDECREF(dtype);
  Py_XDECREF(dtype_ok);
  Py_XDECREF(ok);
  Py_XDECREF(pair);
  return trace;
}

/* Appends `item` to the list attribute `list_name` of `owner`. */
static int append_to(PyObject* owner, PyObject* list_name, PyObject* item) {
  PyObject* list = PyObject_GetAttr(owner, list_name);
  if (list == NULL) return -1;
  int status = PyList_Check(list) ? PyList_Append(list, item) : -1;
  if (status < 0 && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "not a list");
  Py_DECREF(list);
  return status;
}

/* The DataType numbers of the outputs' dtypes (0 for a dtype TensorFlow lacks). */
static PyObject* output_dtypes(PyObject* outputs) {
  Py_ssize_t n = PyList_GET_SIZE(outputs);
  PyObject* dtypes = PyTuple_New(n);
  for (Py_ssize_t i = 0; dtypes != NULL && i < n; i++) {
    PyObject* dtype = PyObject_GetAttr(PyList_GET_ITEM(outputs, i), s_dtype);
    PyObject* number = dtype ? lookup(cfg.dtype_enum, dtype) : NULL;
    Py_XDECREF(dtype);
    if (number == NULL && !PyErr_Occurred()) number = Py_NewRef(zero);
    if (number == NULL) Py_CLEAR(dtypes);
    else PyTuple_SET_ITEM(dtypes, i, number);
  }
  return dtypes;
}

/* Tags and traces output `slot` (the slot loop of Session._record_graph_op).
 * `device` and `dev_name` are the first output's, replaced by this one's for
 * a later slot (ops like to/copy may write across devices). */
static int record_output(PyObject* session, Claim* c, PyObject* t, Py_ssize_t slot,
                         PyObject* name, PyObject* device, PyObject* dev_name, PyObject* wall) {
  PyObject *tensor_id = NULL, *next_id = NULL, *slot_number = NULL, *trace = NULL;
  PyObject *own_device = NULL, *own_name = NULL;
  int status = -1;
  if ((tensor_id = PyObject_GetAttr(session, s_next_id)) == NULL) goto done;
  if ((next_id = PyNumber_Add(tensor_id, one)) == NULL) goto done;
  if (PyObject_SetAttr(session, s_next_id, next_id) < 0) goto done;
  if ((slot_number = PyLong_FromSsize_t(slot)) == NULL) goto done;
  if (mark(t, c->serial, name, slot, slot_number, tensor_id) < 0) goto done;
  if (slot > 0) {
    if ((own_device = PyObject_GetAttr(t, s_device)) == NULL) goto done;
    if ((own_name = device_name(session, own_device)) == NULL) goto done;
    device = own_device;
    dev_name = own_name;
  }
  trace = trace_of(session, c->facts, t, device, name, slot_number, tensor_id, dev_name, wall);
  if (trace == NULL ? PyErr_Occurred() != NULL : append_to(c->segment, s_traces, trace) < 0)
    goto done;
  status = 0;
done:
  Py_XDECREF(tensor_id); Py_XDECREF(next_id); Py_XDECREF(slot_number); Py_XDECREF(trace);
  Py_XDECREF(own_device); Py_XDECREF(own_name);
  return status;
}

/* The producers' tensor ids of the op's tensor inputs, -1 for an outside value
 * (Session._record_eager_op). */
static PyObject* input_ids(PyObject* args, PyObject* kwargs) {
  PyObject* found = PyList_New(0);
  PyObject* ids = NULL;
  if (found == NULL || collect_tensors(args, found) < 0) goto done;
  if (kwargs != Py_None && PyDict_Check(kwargs) && PyDict_GET_SIZE(kwargs) > 0) {
    PyObject* values = PyDict_Values(kwargs);
    int failed = values == NULL || collect_tensors(values, found) < 0;
    Py_XDECREF(values);
    if (failed) goto done;
  }
  Py_ssize_t n = PyList_GET_SIZE(found);
  if ((ids = PyList_New(n)) == NULL) goto done;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* tag = PyObject_CallOneArg(cfg.producer_tag, PyList_GET_ITEM(found, i));
    PyObject* id = NULL;
    if (tag == Py_None) id = PyLong_FromLong(-1);
    else if (tag != NULL) id = PySequence_GetItem(tag, 4);  /* TENSOR_ID */
    Py_XDECREF(tag);
    if (id == NULL) { Py_CLEAR(ids); goto done; }
    PyList_SET_ITEM(ids, i, id);
  }
done:
  Py_XDECREF(found);
  return ids;
}

/* Tags output `slot` of an eager op; appends its tensor id and dtype number,
 * and, when traced, (payload, meta, device id, tensor id) to `outs`. */
static int eager_output(PyObject* session, Claim* c, PyObject* t, Py_ssize_t slot,
                        PyObject* name, int traced, PyObject* lists[3]) {
  PyObject *tensor_id = NULL, *next_id = NULL, *slot_number = NULL, *dtype = NULL;
  PyObject *number = NULL, *encoder = NULL, *ok = NULL, *device = NULL, *pair = NULL;
  PyObject *device_id = NULL, *out = NULL;
  int status = -1;
  if ((tensor_id = PyObject_GetAttr(session, s_next_id)) == NULL) goto done;
  if ((next_id = PyNumber_Add(tensor_id, one)) == NULL) goto done;
  if (PyObject_SetAttr(session, s_next_id, next_id) < 0) goto done;
  if ((slot_number = PyLong_FromSsize_t(slot)) == NULL) goto done;
  if (mark(t, c->serial, name, slot, slot_number, tensor_id) < 0) goto done;
  if ((dtype = PyObject_GetAttr(t, s_dtype)) == NULL) goto done;
  number = lookup(cfg.dtype_enum, dtype);
  if (number == NULL && (PyErr_Occurred() || (number = Py_NewRef(zero)) == NULL)) goto done;
  if (PyList_Append(lists[0], tensor_id) < 0 || PyList_Append(lists[1], number) < 0) goto done;
  if (traced) {
    if ((encoder = PyObject_GetAttr(session, s_encoder)) == NULL) goto done;
    if ((ok = PyObject_CallMethodOneArg(encoder, s_dtype_traced, dtype)) == NULL) goto done;
    int traced_dtype = PyObject_IsTrue(ok);
    if (traced_dtype < 0) goto done;
    if (traced_dtype) {
      if ((device = PyObject_GetAttr(t, s_device)) == NULL) goto done;
      pair = PyObject_CallMethodObjArgs(encoder, s_payload, t, device, NULL);
      if (pair == NULL || (device_id = device_item(session, device, 1)) == NULL) goto done;
      if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        PyErr_SetString(PyExc_TypeError, "Encoder.payload must return (payload, meta)");
        goto done;
      }
      out = PyTuple_Pack(4, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1), device_id,
                         tensor_id);
      if (out == NULL || PyList_Append(lists[2], out) < 0) goto done;
    }
  }
  status = 0;
done:
  Py_XDECREF(tensor_id); Py_XDECREF(next_id); Py_XDECREF(slot_number); Py_XDECREF(dtype);
  Py_XDECREF(number); Py_XDECREF(encoder); Py_XDECREF(ok); Py_XDECREF(device);
  Py_XDECREF(pair); Py_XDECREF(device_id); Py_XDECREF(out);
  return status;
}

/* Session._record_eager_op: the op joins the open run of eager ops as
 * (op_type, input ids, output ids, outs, stack ids, wall time, output dtypes). */
static int record_eager(PyObject* session, Claim* c, PyObject* args, PyObject* kwargs,
                        PyObject* name, PyObject* stack_ids) {
  PyObject *in_ids = NULL, *wall = NULL, *item = NULL;
  PyObject* lists[3] = {PyList_New(0), PyList_New(0), PyList_New(0)};  /* ids, dtypes, outs */
  int status = -1;
  int traced = PyObject_IsTrue(PyTuple_GET_ITEM(c->facts, cfg.f_traced));
  if (traced < 0 || !lists[0] || !lists[1] || !lists[2]) goto done;
  if ((in_ids = input_ids(args, kwargs)) == NULL) goto done;
  for (Py_ssize_t slot = 0; slot < PyList_GET_SIZE(c->outputs); slot++)
    if (eager_output(session, c, PyList_GET_ITEM(c->outputs, slot), slot, name, traced,
                     lists) < 0)
      goto done;
  if (traced) {
    if ((wall = PyObject_CallNoArgs(cfg.wall_clock)) == NULL) goto done;
    item = PyTuple_Pack(7, PyTuple_GET_ITEM(c->facts, cfg.f_op_type), in_ids, lists[0],
                        lists[2], stack_ids, wall, lists[1]);
    if (item == NULL || append_to(c->segment, s_eager, item) < 0) goto done;
  }
  status = 0;
done:
  Py_XDECREF(in_ids); Py_XDECREF(wall); Py_XDECREF(item);
  for (int i = 0; i < 3; i++) Py_XDECREF(lists[i]);
  return status;
}

/* Records the op once claimed (Session.on_op, then _record_graph_op or
 * _record_eager_op). */
static int record(PyObject* session, Claim* c, PyObject* args, PyObject* kwargs, int skip) {
  PyObject *stacks = NULL, *stack_ids = NULL, *name = NULL, *first_id = NULL, *names = NULL;
  PyObject *device = NULL, *dev_name = NULL, *item = NULL, *count = NULL, *dtypes = NULL;
  PyObject* wall = NULL;
  int status = -1;
  if (c->stack_ids != NULL) {  /* backward: the forward op's call site */
    stack_ids = Py_NewRef(c->stack_ids);
  } else {
    if ((stacks = PyObject_GetAttr(session, s_stacks)) == NULL) goto done;
    if ((stack_ids = call_site(stacks, skip)) == NULL) goto done;
  }
  if ((name = op_name(c->segment, c->scope, c->short_name)) == NULL) goto done;
  if (c->stack_ids == NULL) {  /* forward: remembered for its backward ops */
    PyObject* grad = PyObject_CallNoArgs(cfg.is_grad_enabled);
    int grad_enabled = grad ? PyObject_IsTrue(grad) : -1;
    Py_XDECREF(grad);
    if (grad_enabled < 0) goto done;
    if ((first_id = PyObject_GetAttr(session, s_next_id)) == NULL) goto done;
    if (grad_enabled && remember_forward(session, name, stack_ids, first_id) < 0) goto done;
  }
  if (c->eager) {
    status = record_eager(session, c, args, kwargs, name, stack_ids);
    goto done;
  }
  if ((names = input_names(c->segment, c->serial, args, kwargs)) == NULL) goto done;
  PyObject* first = PyList_GET_ITEM(c->outputs, 0);
  if ((device = PyObject_GetAttr(first, s_device)) == NULL) goto done;
  if ((dev_name = device_name(session, device)) == NULL) goto done;
  if ((dtypes = output_dtypes(c->outputs)) == NULL) goto done;
  if ((count = PyLong_FromSsize_t(PyList_GET_SIZE(c->outputs))) == NULL) goto done;
  item = PyTuple_Pack(7, PyTuple_GET_ITEM(c->facts, cfg.f_op_type), name, names, count,
                      stack_ids, dev_name, dtypes);
  if (item == NULL || append_to(c->segment, s_ops, item) < 0) goto done;
  if ((wall = PyObject_CallNoArgs(cfg.wall_clock)) == NULL) goto done;
  for (Py_ssize_t slot = 0; slot < PyList_GET_SIZE(c->outputs); slot++)
    if (record_output(session, c, PyList_GET_ITEM(c->outputs, slot), slot, name, device,
                      dev_name, wall) < 0)
      goto done;
  status = 0;
done:
  Py_XDECREF(stacks); Py_XDECREF(stack_ids); Py_XDECREF(name); Py_XDECREF(first_id);
  Py_XDECREF(names); Py_XDECREF(device); Py_XDECREF(dev_name); Py_XDECREF(item);
  Py_XDECREF(count); Py_XDECREF(dtypes); Py_XDECREF(wall);
  return status;
}

/* ---- graph execution traces, encoded when their segment finishes -------------------
 *
 * What Segment.finish, Encoder.value_bytes and wire.trace_event make in Python
 * for each trace of a graph segment: a serialized DebugEvent holding one
 * GraphExecutionTrace. Field numbers: debug_event.proto (DebugEvent.wall_time 1,
 * graph_execution_trace 10; GraphExecutionTrace.tensor_proto 5) and
 * tensor.proto (dtype 1, tensor_shape 2, tensor_content 4; TensorShapeProto.dim 2;
 * Dim.size 1). The debug values follow health.debug_values. */

enum { M_NO_TENSOR, M_CURT, M_CONCISE, M_FULL_HEALTH, M_SHAPE, M_FULL_NUMERICS };
#define SHAPE_MAX_RANK 6 /* health.SHAPE_MAX_RANK */
#define MAX_VALUES 17

typedef struct {
  unsigned char* data;
  size_t size, capacity;
} Buffer;

static int put(Buffer* b, const void* bytes, size_t n) {
  if (b->size + n > b->capacity) {
    size_t capacity = b->capacity ? b->capacity * 2 : 256;
    while (capacity < b->size + n) capacity *= 2;
    unsigned char* data = PyMem_Realloc(b->data, capacity);
    if (data == NULL) {
      PyErr_NoMemory();
      return -1;
    }
    b->data = data;
    b->capacity = capacity;
  }
  memcpy(b->data + b->size, bytes, n);
  b->size += n;
  return 0;
}

static int put_varint(Buffer* b, uint64_t v) {
  unsigned char bytes[10];
  size_t n = 0;
  while (v > 0x7F) {
    bytes[n++] = (unsigned char)((v & 0x7F) | 0x80);
    v >>= 7;
  }
  bytes[n++] = (unsigned char)v;
  return put(b, bytes, n);
}

static size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v > 0x7F) {
    v >>= 7;
    n++;
  }
  return n;
}

/* float(seq[i]) */
static int item_double(PyObject* seq, Py_ssize_t i, double* out) {
  PyObject* item = PySequence_GetItem(seq, i);
  if (item == NULL) return -1;
  *out = PyFloat_AsDouble(item);
  Py_DECREF(item);
  return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* health.debug_values into `v`; returns the count, -1 on error. */
static int debug_values(int mode, PyObject* tensor_id, PyObject* raw, PyObject* meta,
                        double* v) {
  PyObject* shape = NULL;
  double dtype_enum, device_id, tid = PyFloat_AsDouble(tensor_id);
  int n = -1;
  if (tid == -1.0 && PyErr_Occurred()) return -1;
  if (!PyTuple_Check(meta) || PyTuple_GET_SIZE(meta) != 3) {
    PyErr_SetString(PyExc_TypeError, "a trace's meta must be (dtype_enum, shape, device_id)");
    return -1;
  }
  if (item_double(meta, 0, &dtype_enum) < 0 || item_double(meta, 2, &device_id) < 0) return -1;
  shape = PySequence_Tuple(PyTuple_GET_ITEM(meta, 1));
  if (shape == NULL) return -1;
  Py_ssize_t rank = PyTuple_GET_SIZE(shape);
  double dims[SHAPE_MAX_RANK] = {0};
  double size = 1;
  long long numel = 1;
  for (Py_ssize_t i = 0; i < rank; i++) {
    long long d = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    if (d == -1 && PyErr_Occurred()) goto done;
    numel *= d;
    if (i >= rank - SHAPE_MAX_RANK) dims[i - (rank > SHAPE_MAX_RANK ? rank - SHAPE_MAX_RANK : 0)] = (double)d;
  }
  size = (double)numel;
  if (mode == M_SHAPE) {
    v[0] = tid, v[1] = dtype_enum, v[2] = (double)rank, v[3] = size;
    for (int i = 0; i < SHAPE_MAX_RANK; i++) v[4 + i] = dims[i];
    n = 4 + SHAPE_MAX_RANK;
    goto done;
  }
  double r[12];
  int width = mode == M_FULL_NUMERICS ? 12 : mode == M_FULL_HEALTH ? 6 : 3;
  for (int i = 0; i < width; i++)
    if (item_double(raw, i, &r[i]) < 0) goto done;
  if (mode == M_CURT) {
    v[0] = tid, v[1] = r[0] + r[1] + r[2] > 0 ? 1.0 : 0.0;
    n = 2;
  } else if (mode == M_CONCISE) {
    v[0] = tid, v[1] = size, v[2] = r[0], v[3] = r[1], v[4] = r[2];
    n = 5;
  } else {
    double head[11] = {tid, device_id, dtype_enum, (double)rank, size, r[0], r[1], r[2],
                       r[3], r[4], r[5]};
    memcpy(v, head, sizeof(head));
    n = 11;
    if (mode == M_FULL_NUMERICS) {  /* health.numerics_tail */
      double n_fin = r[3] + r[4] + r[5];
      if (n_fin == 0) {
        double tail[6] = {Py_NAN, Py_NAN, 0.0, Py_NAN, Py_NAN, Py_NAN};
        memcpy(v + 11, tail, sizeof(tail));
      } else {
        double tail[6] = {r[6], r[7], isinf(r[8]) ? 0.0 : r[8], r[9], r[10] / n_fin,
                          sqrt(r[11] / n_fin)};
        memcpy(v + 11, tail, sizeof(tail));
      }
      n = 17;
    }
  }
done:
  Py_XDECREF(shape);
  return n;
}

/* wire.values_tensor_proto: a 1-D float64 TensorProto of `n` values. */
static int put_values_proto(Buffer* b, const double* v, int n) {
  unsigned char dim[12], shape[16];
  size_t dim_size = 0, shape_size = 0;
  if (n) {  /* Dim {size: n} */
    dim[dim_size++] = 0x08;
    for (uint64_t x = (uint64_t)n; ; x >>= 7) {
      dim[dim_size++] = (unsigned char)(x > 0x7F ? (x & 0x7F) | 0x80 : x);
      if (x <= 0x7F) break;
    }
  }
  shape[shape_size++] = 0x12;  /* TensorShapeProto.dim */
  shape[shape_size++] = (unsigned char)dim_size;
  memcpy(shape + shape_size, dim, dim_size);
  shape_size += dim_size;
  static const unsigned char dtype[] = {0x08, 0x02};  /* dtype: DT_DOUBLE */
  if (put(b, dtype, 2) < 0 || put_varint(b, 0x12) < 0 || put_varint(b, shape_size) < 0 ||
      put(b, shape, shape_size) < 0 || put_varint(b, 0x22) < 0 ||
      put_varint(b, 8 * (uint64_t)n) < 0)
    return -1;
  for (int i = 0; i < n; i++) {  /* little-endian doubles */
    unsigned char bytes[8];
    uint64_t bits;
    memcpy(&bits, &v[i], 8);
    for (int k = 0; k < 8; k++) bytes[k] = (unsigned char)(bits >> (8 * k));
    if (put(b, bytes, 8) < 0) return -1;
  }
  return 0;
}

/* One trace event; `prefix` is Encoder.trace_prefix's (head, tail). */
static PyObject* trace_event(double wall, PyObject* prefix, const Buffer* values,
                             int has_values, PyObject* step) {
  char *head, *tail, *step_bytes;
  Py_ssize_t head_size, tail_size, step_size;
  if (!PyTuple_Check(prefix) || PyTuple_GET_SIZE(prefix) != 2 ||
      PyBytes_AsStringAndSize(PyTuple_GET_ITEM(prefix, 0), &head, &head_size) < 0 ||
      PyBytes_AsStringAndSize(PyTuple_GET_ITEM(prefix, 1), &tail, &tail_size) < 0 ||
      PyBytes_AsStringAndSize(step, &step_bytes, &step_size) < 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a trace prefix is (head, tail)");
    return NULL;
  }
  size_t body = head_size + tail_size + step_size;
  if (has_values) body += 1 + varint_size(values->size) + values->size;
  Buffer b = {NULL, 0, 0};
  unsigned char wall_bytes[9] = {0x09};
  uint64_t bits;
  memcpy(&bits, &wall, 8);
  for (int k = 0; k < 8; k++) wall_bytes[1 + k] = (unsigned char)(bits >> (8 * k));
  PyObject* event = NULL;
  if (put(&b, wall_bytes, 9) < 0 || put_varint(&b, 0x52) < 0 || put_varint(&b, body) < 0 ||
      put(&b, head, head_size) < 0)
    goto done;
  if (has_values && (put_varint(&b, 0x2a) < 0 || put_varint(&b, values->size) < 0 ||
                     put(&b, values->data, values->size) < 0))
    goto done;
  if (put(&b, tail, tail_size) < 0 || put(&b, step_bytes, step_size) < 0) goto done;
  event = PyBytes_FromStringAndSize((const char*)b.data, b.size);
done:
  PyMem_Free(b.data);
  return event;
}

/* The health row of a payload: rows[payload[0]][payload[1]] (borrowed from rows). */
static PyObject* row_of(PyObject* rows, PyObject* payload) {
  PyObject* block = NULL;
  PyObject* row = NULL;
  if (PyTuple_Check(payload) && PyTuple_GET_SIZE(payload) >= 2 &&
      (block = PyObject_GetItem(rows, PyTuple_GET_ITEM(payload, 0))) != NULL)
    row = PyObject_GetItem(block, PyTuple_GET_ITEM(payload, 1));
  else if (!PyErr_Occurred())
    PyErr_SetString(PyExc_TypeError, "a health payload is (block, row)");
  Py_XDECREF(block);
  return row;
}

/* The encoded event of one trace item (see Segment.traces). */
static PyObject* encode_trace(PyObject* item, PyObject* rows, PyObject* graph_id, int mode,
                              PyObject* step, PyObject* prefixes, PyObject* make_prefix) {
  PyObject *key = NULL, *prefix = NULL, *row = NULL, *event = NULL;
  Buffer values = {NULL, 0, 0};
  if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 7) {
    PyErr_SetString(PyExc_TypeError, "a trace is a 7-tuple");
    return NULL;
  }
  PyObject *name = PyTuple_GET_ITEM(item, 0), *slot = PyTuple_GET_ITEM(item, 1),
           *tensor_id = PyTuple_GET_ITEM(item, 2), *payload = PyTuple_GET_ITEM(item, 3),
           *meta = PyTuple_GET_ITEM(item, 4), *device = PyTuple_GET_ITEM(item, 5);
  double wall = PyFloat_AsDouble(PyTuple_GET_ITEM(item, 6));
  if (wall == -1.0 && PyErr_Occurred()) return NULL;
  if ((key = PyTuple_Pack(4, graph_id, name, slot, device)) == NULL) goto done;
  prefix = lookup(prefixes, key);
  if (prefix == NULL && !PyErr_Occurred())
    prefix = PyObject_CallFunctionObjArgs(make_prefix, graph_id, name, slot, device, NULL);
  if (prefix == NULL) goto done;
  if (mode != M_NO_TENSOR) {
    double v[MAX_VALUES];
    if (mode != M_SHAPE && (row = row_of(rows, payload)) == NULL) goto done;
    int n = debug_values(mode, tensor_id, row, meta, v);
    if (n < 0 || put_values_proto(&values, v, n) < 0) goto done;
  }
  event = trace_event(wall, prefix, &values, mode != M_NO_TENSOR, step);
done:
  PyMem_Free(values.data);
  Py_XDECREF(key);
  Py_XDECREF(prefix);
  Py_XDECREF(row);
  return event;
}

static int mode_code(PyObject* name);

/* ---- eager executions, encoded when their run finishes ----------------------------
 *
 * What Segment.finish builds with protobuf for each eager op: a DebugEvent
 * (wall_time 1, execution 9) holding an Execution: op_type 1, num_outputs 2,
 * input_tensor_ids 4 and output_tensor_ids 5 (packed int64), tensor_debug_mode
 * 6, tensor_protos 7, code_location 8 (host_name 1, stack_frame_ids 2),
 * output_tensor_device_ids 9 (packed int32), output_dtypes 100 (packed),
 * step 101; fields in number order, zero scalars and empty lists left out, as
 * protobuf writes them. Negative ids are 10-byte varints (two's complement). */

static int put_field(Buffer* b, uint64_t tag, const void* bytes, size_t n) {
  return put_varint(b, tag) < 0 || put_varint(b, n) < 0 || put(b, bytes, n) < 0 ? -1 : 0;
}

static int put_str_field(Buffer* b, uint64_t tag, PyObject* text, int skip_empty) {
  Py_ssize_t n;
  const char* utf8 = PyUnicode_AsUTF8AndSize(text, &n);
  if (utf8 == NULL) return -1;
  return skip_empty && n == 0 ? 0 : put_field(b, tag, utf8, (size_t)n);
}

/* A packed repeated integer field from a sequence of ints (left out when empty). */
static int put_packed(Buffer* b, uint64_t tag, PyObject* numbers) {
  Buffer packed = {NULL, 0, 0};
  PyObject* seq = PySequence_Fast(numbers, "ids must be a sequence");
  int status = -1;
  if (seq == NULL) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  for (Py_ssize_t i = 0; i < n; i++) {
    long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if ((v == -1 && PyErr_Occurred()) || put_varint(&packed, (uint64_t)v) < 0) goto done;
  }
  status = n ? put_field(b, tag, packed.data, packed.size) : 0;
done:
  Py_DECREF(seq);
  PyMem_Free(packed.data);
  return status;
}

/* Of one eager op's outputs: field 7 items (their value protos) into `protos`,
 * and their device ids, packed, into `devices` (the payload of field 9). */
static int put_outputs(Buffer* protos, Buffer* devices, PyObject* outs, PyObject* rows,
                       int mode, PyObject* minus_one) {
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(outs); i++) {
    PyObject* out = PyList_GET_ITEM(outs, i);  /* (payload, meta, device id, tensor id) */
    if (!PyTuple_Check(out) || PyTuple_GET_SIZE(out) != 4) {
      PyErr_SetString(PyExc_TypeError, "an eager output is (payload, meta, device, id)");
      return -1;
    }
    long long device = PyLong_AsLongLong(PyTuple_GET_ITEM(out, 2));
    if ((device == -1 && PyErr_Occurred()) || put_varint(devices, (uint64_t)device) < 0)
      return -1;
    if (mode == M_NO_TENSOR) continue;
    PyObject* row = NULL;
    if (mode != M_SHAPE && (row = row_of(rows, PyTuple_GET_ITEM(out, 0))) == NULL) return -1;
    double v[MAX_VALUES];
    Buffer proto = {NULL, 0, 0};
    int count = debug_values(mode, minus_one, row, PyTuple_GET_ITEM(out, 1), v);
    Py_XDECREF(row);
    int failed = count < 0 || put_values_proto(&proto, v, count) < 0 ||
                 put_field(protos, 0x3a, proto.data, proto.size) < 0;
    PyMem_Free(proto.data);
    if (failed) return -1;
  }
  return 0;
}

/* Field 8, the code location: the host name and the stack frame ids. */
static int put_location(Buffer* ex, PyObject* host, PyObject* stack_ids) {
  Buffer location = {NULL, 0, 0};
  PyObject* seq = PySequence_Fast(stack_ids, "stack ids must be a sequence");
  int failed = seq == NULL || put_str_field(&location, 0x0a, host, 1) < 0;
  for (Py_ssize_t i = 0; !failed && i < PySequence_Fast_GET_SIZE(seq); i++)
    failed = put_str_field(&location, 0x12, PySequence_Fast_GET_ITEM(seq, i), 0) < 0;
  failed = failed || put_field(ex, 0x42, location.data, location.size) < 0;
  Py_XDECREF(seq);
  PyMem_Free(location.data);
  return failed ? -1 : 0;
}

/* The Execution message of one eager item (see Segment.eager). */
static int put_execution(Buffer* ex, PyObject* item, PyObject* rows, int mode,
                         long mode_enum, PyObject* host, PyObject* step,
                         PyObject* minus_one) {
  PyObject *op_type = PyTuple_GET_ITEM(item, 0), *in_ids = PyTuple_GET_ITEM(item, 1),
           *out_ids = PyTuple_GET_ITEM(item, 2), *outs = PyTuple_GET_ITEM(item, 3),
           *stack_ids = PyTuple_GET_ITEM(item, 4), *dtypes = PyTuple_GET_ITEM(item, 6);
  Buffer protos = {NULL, 0, 0}, devices = {NULL, 0, 0};
  int status = -1;
  Py_ssize_t num_outputs = PyObject_Length(out_ids);
  if (num_outputs < 0) goto done;
  if (!PyList_Check(outs)) {
    PyErr_SetString(PyExc_TypeError, "an eager item's outputs must be a list");
    goto done;
  }
  if (put_str_field(ex, 0x0a, op_type, 1) < 0) goto done;
  if (num_outputs && (put_varint(ex, 0x10) < 0 || put_varint(ex, num_outputs) < 0)) goto done;
  if (put_packed(ex, 0x22, in_ids) < 0 || put_packed(ex, 0x2a, out_ids) < 0) goto done;
  if (mode_enum && (put_varint(ex, 0x30) < 0 || put_varint(ex, mode_enum) < 0)) goto done;
  if (put_outputs(&protos, &devices, outs, rows, mode, minus_one) < 0) goto done;
  if (put(ex, protos.data, protos.size) < 0) goto done;  /* field 7 */
  if (put_location(ex, host, stack_ids) < 0) goto done;  /* field 8: always set */
  if (devices.size && put_field(ex, 0x4a, devices.data, devices.size) < 0) goto done;
  if (put_packed(ex, 0x322, dtypes) < 0) goto done;  /* field 100 */
  if (step != Py_None) {  /* field 101 */
    long long value = PyLong_AsLongLong(step);
    if ((value == -1 && PyErr_Occurred()) || put_varint(ex, 0x328) < 0 ||
        put_varint(ex, (uint64_t)value) < 0)
      goto done;
  }
  status = 0;
done:
  PyMem_Free(protos.data);
  PyMem_Free(devices.data);
  return status;
}

static PyObject* encode_executions(PyObject* self, PyObject* args) {
  PyObject *items, *rows, *mode_name, *host, *step;
  long mode_enum;
  if (!PyArg_ParseTuple(args, "O!OUlUO:encode_executions", &PyList_Type, &items, &rows,
                        &mode_name, &mode_enum, &host, &step))
    return NULL;
  int mode = mode_code(mode_name);
  if (mode < 0) {
    PyErr_Format(PyExc_ValueError, "encode_executions: no encoding in C for mode %R", mode_name);
    return NULL;
  }
  PyObject* minus_one = PyLong_FromLong(-1);
  Py_ssize_t n = PyList_GET_SIZE(items);
  PyObject* events = minus_one ? PyList_New(n) : NULL;
  for (Py_ssize_t i = 0; events != NULL && i < n; i++) {
    PyObject* item = PyList_GET_ITEM(items, i);
    Buffer ex = {NULL, 0, 0}, event = {NULL, 0, 0};
    PyObject* bytes = NULL;
    double wall = -1.0;
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 7)
      PyErr_SetString(PyExc_TypeError, "an eager item is a 7-tuple");
    else
      wall = PyFloat_AsDouble(PyTuple_GET_ITEM(item, 5));
    if (!PyErr_Occurred() &&
        put_execution(&ex, item, rows, mode, mode_enum, host, step, minus_one) == 0) {
      unsigned char wall_bytes[9] = {0x09};
      uint64_t bits;
      memcpy(&bits, &wall, 8);
      for (int k = 0; k < 8; k++) wall_bytes[1 + k] = (unsigned char)(bits >> (8 * k));
      if ((wall == 0.0 || put(&event, wall_bytes, 9) == 0) &&
          put_field(&event, 0x4a, ex.data, ex.size) == 0)
        bytes = PyBytes_FromStringAndSize((const char*)event.data, event.size);
    }
    PyMem_Free(ex.data);
    PyMem_Free(event.data);
    if (bytes == NULL) Py_CLEAR(events);
    else PyList_SET_ITEM(events, i, bytes);
  }
  Py_XDECREF(minus_one);
  return events;
}

static int mode_code(PyObject* name) {
  static const char* names[] = {"NO_TENSOR", "CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH",
                                "SHAPE", "FULL_NUMERICS"};
  for (int i = 0; i < 6; i++)
    if (PyUnicode_CompareWithASCIIString(name, names[i]) == 0) return i;
  return -1;
}

static PyObject* encode_traces(PyObject* self, PyObject* args) {
  PyObject *traces, *rows, *graph_id, *mode_name, *step, *prefixes, *make_prefix;
  if (!PyArg_ParseTuple(args, "O!OUUSOO:encode_traces", &PyList_Type, &traces, &rows,
                        &graph_id, &mode_name, &step, &prefixes, &make_prefix))
    return NULL;
  int mode = mode_code(mode_name);
  if (mode < 0) {
    PyErr_Format(PyExc_ValueError, "encode_traces: no encoding in C for mode %R", mode_name);
    return NULL;
  }
  Py_ssize_t n = PyList_GET_SIZE(traces);
  PyObject* events = PyList_New(n);
  if (events == NULL) return NULL;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* event = encode_trace(PyList_GET_ITEM(traces, i), rows, graph_id, mode, step,
                                   prefixes, make_prefix);
    if (event == NULL) {
      Py_DECREF(events);
      return NULL;
    }
    PyList_SET_ITEM(events, i, event);
  }
  return events;
}

/* ---- module ------------------------------------------------------------------------ */

/* tags.inherit_tag: an alias op's output gets the tag of the input it aliases. */
static int inherit_tag(PyObject* args, PyObject* out) {
  if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) == 0) return 0;
  PyObject* source = PyTuple_GET_ITEM(args, 0);
  int tensors = PyObject_IsInstance(out, cfg.tensor_type);
  if (tensors > 0) tensors = PyObject_IsInstance(source, cfg.tensor_type);
  if (tensors <= 0) return tensors;
  PyObject* tag = PyObject_CallOneArg(cfg.producer_tag, source);
  if (tag == NULL) return -1;
  int status = tag == Py_None ? 0 : PyObject_SetAttr(out, s_tag, tag);
  Py_DECREF(tag);
  return status;
}

static PyObject* graph_op(PyObject* self, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 6) {
    PyErr_SetString(PyExc_TypeError,
                    "graph_op(session, func, args, kwargs, out, skip) takes 6 arguments");
    return NULL;
  }
  if (!cfg.ready) {
    PyErr_SetString(PyExc_RuntimeError, "_record.configure() was not called");
    return NULL;
  }
  int skip = PyLong_AsLong(argv[5]);
  if (skip == -1 && PyErr_Occurred()) return NULL;
  Claim c;
  int claimed = claim(argv[0], argv[1], argv[4], &c);
  if (claimed == ALIASED && inherit_tag(argv[2], argv[4]) < 0) return NULL;
  if (claimed != CLAIMED) {
    if (claimed < 0) return NULL;
    return Py_NewRef(claimed == 0 ? Py_False : Py_True);
  }
  int status = record(argv[0], &c, argv[2], argv[3], skip);
  release(&c);
  return status < 0 ? NULL : Py_NewRef(Py_True);
}

static Py_ssize_t field_index(PyObject* fields, const char* name) {
  PyObject* key = PyUnicode_FromString(name);
  if (key == NULL) return -1;
  Py_ssize_t index = PySequence_Index(fields, key);
  Py_DECREF(key);
  return index;
}

static PyObject* configure(PyObject* self, PyObject* args) {
  PyObject *tensor_type, *is_grad_enabled, *sequence_nr, *autograd_node, *producer_tag,
      *wall_clock, *dtype_enum, *backward_name, *fields;
  Py_ssize_t seq_map_max, eager_batch;
  if (!PyArg_ParseTuple(args, "OOOOOOO!UnnO:configure", &tensor_type, &is_grad_enabled,
                        &sequence_nr, &autograd_node, &producer_tag, &wall_clock, &PyDict_Type,
                        &dtype_enum, &backward_name, &seq_map_max, &eager_batch, &fields))
    return NULL;
  Py_ssize_t f_op_type = field_index(fields, "op_type"), f_short = field_index(fields, "short"),
             f_skip = field_index(fields, "skip"), f_alias = field_index(fields, "alias"),
             f_traced = field_index(fields, "traced");
  if (f_op_type < 0 || f_short < 0 || f_skip < 0 || f_alias < 0 || f_traced < 0) return NULL;
  cfg.ready = 0;
  Py_XSETREF(cfg.tensor_type, Py_NewRef(tensor_type));
  Py_XSETREF(cfg.is_grad_enabled, Py_NewRef(is_grad_enabled));
  Py_XSETREF(cfg.sequence_nr, Py_NewRef(sequence_nr));
  Py_XSETREF(cfg.wall_clock, Py_NewRef(wall_clock));
  Py_XSETREF(cfg.dtype_enum, Py_NewRef(dtype_enum));
  Py_XSETREF(cfg.backward_name, Py_NewRef(backward_name));
  Py_XSETREF(cfg.autograd_node, Py_NewRef(autograd_node));
  Py_XSETREF(cfg.producer_tag, Py_NewRef(producer_tag));
  if (cfg.backward_prefix == NULL &&
      (cfg.backward_prefix = PyUnicode_InternFromString("backward")) == NULL)
    return NULL;
  cfg.seq_map_max = seq_map_max;
  cfg.eager_batch = eager_batch;
  if (cfg.eager_name == NULL && (cfg.eager_name = PyUnicode_InternFromString("eager")) == NULL)
    return NULL;
  cfg.f_op_type = f_op_type;
  cfg.f_short = f_short;
  cfg.f_skip = f_skip;
  cfg.f_alias = f_alias;
  cfg.f_traced = f_traced;
  cfg.f_max = f_op_type;
  if (f_short > cfg.f_max) cfg.f_max = f_short;
  if (f_skip > cfg.f_max) cfg.f_max = f_skip;
  if (f_alias > cfg.f_max) cfg.f_max = f_alias;
  if (f_traced > cfg.f_max) cfg.f_max = f_traced;
  cfg.ready = 1;
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"graph_op", (PyCFunction)(void (*)(void))graph_op, METH_FASTCALL,
     "graph_op(session, func, args, kwargs, out, skip) -> bool\n\n"
     "Records an op run inside a module call or an optimizer step into the open graph\n"
     "segment, as Session.on_op would, or passes over an op the capture skips; False\n"
     "(nothing done) for an op it leaves to Python. `skip`: Python frames between the\n"
     "caller and the op's call site."},
    {"encode_traces", encode_traces, METH_VARARGS,
     "encode_traces(traces, rows, graph_id, mode, step_bytes, prefixes, trace_prefix) -> list\n\n"
     "The serialized DebugEvents of a graph segment's traces (Segment.traces items), as\n"
     "Segment.finish encodes them in Python; `prefixes` is the Encoder's cache of\n"
     "trace prefixes, `trace_prefix` makes a missing one. Not FULL_TENSOR."},
    {"encode_executions", encode_executions, METH_VARARGS,
     "encode_executions(eager, rows, mode, mode_enum, host_name, step) -> list\n\n"
     "The serialized DebugEvents of a run's eager ops (Segment.eager items), as\n"
     "Segment.finish builds them with protobuf. Not FULL_TENSOR."},
    {"configure", configure, METH_VARARGS,
     "configure(Tensor, is_grad_enabled, get_sequence_nr, current_autograd_node,\n"
     "          tags.producer_tag, time, dtype_enum, backward_name, seq_map_max,\n"
     "          EAGER_BATCH, OpFacts._fields)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_record",
    "The capture's per-op hot path in C (see capture.Session.record).", -1, methods,
    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__record(void) {
  if (intern_names() < 0) return NULL;
  if ((zero = PyLong_FromLong(0)) == NULL || (one = PyLong_FromLong(1)) == NULL) return NULL;
  return PyModule_Create(&module);
}
