/* The capture's per-op hot path in C: an op run inside a module call, an
 * optimizer step or a backward pass, recorded into the open graph segment, or
 * an eager op into the open run of eager ops; and, when the segment finishes,
 * the encoding of its traces (encode_traces) and executions (encode_executions,
 * encode_graph_execution).
 *
 * Plain CPython C API, no torch headers. The recording (take_op) does what
 * capture.Session.on_op and recorder.record_graph_op do in Python for the
 * common case, on the same Python objects, so the records are the same
 * (tests/test_torch_record_c.py compares both paths' dumps). It passes over
 * ops the capture skips (views, metadata), tags the outputs of alias ops
 * (detach, _unsafe_view) as their inputs, and records an op when
 *
 *   - the op's facts are cached (Session._facts) and it is not skipped;
 *   - a module call or an optimizer step is in progress and its graph segment
 *     is open, or autograd is evaluating a node and the backward segment is
 *     open, or neither and a run of eager ops is open with room for the op
 *     (where none is, Session.open_for_op opens it in Python first);
 *   - the op returned a tensor, or a tuple or list holding tensors, or wrote
 *     tensors among its arguments (an in-place foreach op returns nothing).
 *
 * Anything else is left to Session.on_op in Python, before any state is touched
 * but the segment open_for_op may have opened (which on_op would open too).
 * The hooks' entries, `record` (the dispatch mode's) and
 * `native_entry` (the native hook's), are Session.record in C: under the
 * recording token they record the op in C or else call Session.on_op, and
 * count an error of either with Session.fail (the user's op has already run).
 *
 * Layouts shared with Python, fixed here:
 *   tag (tags.py):        (serial, op_name, slot, version, tensor_id, input_name)
 *   Segment.ops item:     (op_type, op_name, input_names, num_outputs, stack_ids,
 *                          device_name, output dtypes)
 *   Segment.traces item:  (op_name, slot, tensor_id, payload, meta, device_name, wall_time)
 *   Session._seq_ops:     a ForwardOps (_record_forward.c): forward node sequence nr
 *                         -> (op_name, stack_ids, first tensor id)
 * OpFacts fields are found by name once (configure).
 */
#include "_record.h"

/* What configure() hands over once: torch objects and the layout of OpFacts. */
Config cfg;

PyObject *zero, *one;  /* output slot 0; the one output */

/* Interned attribute names. */
PyObject *s_facts, *s_scopes, *s_segment, *s_stacks, *s_seq_ops,
    *s_encoder, *s_devices, *s_name, *s_is_graph,
    *s_serial, *s_counters, *s_ops, *s_traces, *s_tag, *s_is_view, *s_base,
    *s_version, *s_device, *s_dtype, *s_is_user, *s_user_code, *s_sites, *s_walk, *s_f_lasti,
    *s_dtype_traced, *s_payload, *s_sequence_nr,
    *s_eager, *s_stand_in_tag, *s_param_table, *s_placeholders, *s_placeholder_names,
    *s_input_ids, *s_gate, *s_take, *s_peek, *s_tensor_ids, *s_acquire, *s_on_op,
    *s_fail, *s_open_for_op, *s_values, *s_dataclass_fields, *s_prior;

static int intern_names(void) {
#define NAME(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1
  NAME(s_facts, "_facts"); NAME(s_scopes, "scopes"); NAME(s_segment, "_segment");
  NAME(s_stacks, "stacks"); NAME(s_seq_ops, "_seq_ops");
  NAME(s_encoder, "encoder"); NAME(s_devices, "_devices");
  NAME(s_name, "name");
  NAME(s_is_graph, "is_graph"); NAME(s_serial, "serial"); NAME(s_counters, "_counters");
  NAME(s_ops, "ops"); NAME(s_traces, "traces");
  NAME(s_tag, "_tbn_tag"); NAME(s_is_view, "_is_view"); NAME(s_base, "_base");
  NAME(s_version, "_version"); NAME(s_device, "device"); NAME(s_dtype, "dtype");
  NAME(s_is_user, "_is_user"); NAME(s_user_code, "_user_code"); NAME(s_sites, "_sites");
  NAME(s_walk, "_walk"); NAME(s_f_lasti, "f_lasti");
  NAME(s_dtype_traced, "dtype_traced");
  NAME(s_payload, "payload");
  NAME(s_sequence_nr, "_sequence_nr"); NAME(s_eager, "eager");
  NAME(s_stand_in_tag, "stand_in_tag"); NAME(s_param_table, "param_table");
  NAME(s_placeholders, "_placeholders"); NAME(s_placeholder_names, "_placeholder_names");
  NAME(s_input_ids, "input_ids"); NAME(s_gate, "gate");
  NAME(s_take, "take"); NAME(s_peek, "peek"); NAME(s_tensor_ids, "tensor_ids");
  NAME(s_acquire, "acquire");
  NAME(s_on_op, "on_op"); NAME(s_fail, "fail");
  NAME(s_open_for_op, "open_for_op"); NAME(s_prior, "prior_ops");
  NAME(s_values, "values"); NAME(s_dataclass_fields, "__dataclass_fields__");
  NAME(cfg.placeholder_type, "Placeholder"); NAME(cfg.untagged, "untagged");
  NAME(cfg.empty_str, ""); NAME(cfg.input_prefix, "input_");
  NAME(cfg.backward_slash, "backward/");
  if ((cfg.empty_tuple = PyTuple_New(0)) == NULL) return -1;
#undef NAME
  return 0;
}

const TbnNativeApi* native_api;
PyObject* native_stand_in;

/* The native meta of the last tensor read while take_op records an op: one op
 * reads its output's meta up to five times (its device, dtype, version, view
 * flag, and the dtype again for its trace), an input's twice. Kept only while
 * take_op runs (meta_hold .. meta_drop), when the op's arguments and outputs are
 * alive, so an address cannot stand for another tensor, and nothing the
 * recording runs writes a tensor (its version stays). Under the GIL. */
static struct {
  int held;
  PyObject* tensor;
  TbnMeta meta;
} last_meta;

void meta_hold(void) {
  last_meta.held = 1;
  last_meta.tensor = NULL;
}

void meta_drop(void) {
  last_meta.held = 0;
  last_meta.tensor = NULL;
}

/* native_api->meta(t, meta), answered from the last read when it was t's. */
int read_meta(PyObject* t, TbnMeta* meta) {
  if (native_api == NULL) return 0;
  if (last_meta.tensor == t && t != NULL) {
    *meta = last_meta.meta;
    return 1;
  }
  if (!native_api->meta(t, meta)) return 0;
  if (last_meta.held) {
    last_meta.tensor = t;
    last_meta.meta = *meta;
  }
  return 1;
}

/* t._is_view(): 1, 0, or -1 on error. */
int is_view(PyObject* t) {
  TbnMeta meta;
  if (read_meta(t, &meta)) return meta.view;
  PyObject* value = PyObject_CallMethodNoArgs(t, s_is_view);
  if (value == NULL) return -1;
  int truth = PyObject_IsTrue(value);
  Py_DECREF(value);
  return truth;
}

/* t.dtype: a new reference, NULL on error. */
PyObject* tensor_dtype(PyObject* t) {
  TbnMeta meta;
  if (read_meta(t, &meta) && meta.dtype != NULL) return Py_NewRef(meta.dtype);
  return PyObject_GetAttr(t, s_dtype);
}

/* t._version: a new reference, NULL on error. */
PyObject* tensor_version(PyObject* t) {
  TbnMeta meta;
  if (read_meta(t, &meta)) return PyLong_FromLongLong(meta.version);
  return PyObject_GetAttr(t, s_version);
}

/* The wall clock's time.time(): from clock_gettime, as time.time reads it, without
 * a Python call (about 200 instructions) when configure() was handed time.time or
 * was not called yet. */
PyObject* wall_time(void) {
  struct timespec now;
  if ((cfg.system_clock || cfg.wall_clock == NULL) && clock_gettime(CLOCK_REALTIME, &now) == 0)
    return PyFloat_FromDouble((double)now.tv_sec + (double)now.tv_nsec * 1e-9);
  return PyObject_CallNoArgs(cfg.wall_clock);
}

/* Untracks `tuple` from the cyclic collector when every item is atomic (None, a
 * bool, int, float or str, or a tuple already untracked): it cannot be part of a
 * cycle, which CPython's collector finds itself, but only at its next pass over
 * the tuple. The records are such tuples, kept until their segment finishes;
 * tracked, every collection of the youngest generation walked them, about 1.5k
 * instructions per recorded op. Returns `tuple` (NULL stays NULL). */
static inline int atomic(PyObject* x) {
  return x == Py_None || PyLong_Check(x) || PyFloat_CheckExact(x) || PyUnicode_CheckExact(x) ||
         (PyTuple_CheckExact(x) && !PyObject_GC_IsTracked(x));
}

PyObject* untracked(PyObject* tuple) {
  if (tuple == NULL || !PyTuple_CheckExact(tuple) || !PyObject_GC_IsTracked(tuple)) return tuple;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); i++)
    if (!atomic(PyTuple_GET_ITEM(tuple, i))) return tuple;
  PyObject_GC_UnTrack(tuple);
  return tuple;
}

/* untracked() for a record made of known parts, of fewer than 32 items: only those
 * whose bit is set in `checked` (item i: bit i) may be other than atomic. */
PyObject* untracked_but(PyObject* tuple, unsigned checked) {
  if (tuple == NULL || !PyTuple_CheckExact(tuple) || !PyObject_GC_IsTracked(tuple)) return tuple;
  Py_ssize_t n = PyTuple_GET_SIZE(tuple);
  if (n >= 32) return untracked(tuple);
  for (unsigned left = checked & ((1u << n) - 1); left != 0; left &= left - 1)
    if (!atomic(PyTuple_GET_ITEM(tuple, __builtin_ctz(left)))) return tuple;
  PyObject_GC_UnTrack(tuple);
  return tuple;
}

/* cfg.dtype_enum.get(dtype) as a new reference (NULL without an error when absent),
 * behind a memo by the dtype's address (torch's dtypes live as long as torch): a dict
 * lookup fewer per output. Emptied by configure. */
#define DTYPE_MEMO_SIZE 16
static MemoEntry dtype_memo[DTYPE_MEMO_SIZE];

PyObject* dtype_number(PyObject* dtype) {
  PyObject* number = memo_lookup(dtype_memo, DTYPE_MEMO_SIZE, cfg.dtype_enum, dtype);
  return number != NULL || PyErr_Occurred() ? number : Py_NewRef(zero);
}

PyObject* memo_lookup(MemoEntry* memo, size_t size, PyObject* mapping, PyObject* key) {
  MemoEntry* entry = memo_entry(memo, size, key);
  if (entry->key == key) return Py_NewRef(entry->value);
  PyObject* value = lookup(mapping, key);
  if (value != NULL) memo_keep(entry, key, value);
  return value;
}

void memo_forget(MemoEntry* memo, size_t size) {
  for (size_t i = 0; i < size; i++) {
    Py_CLEAR(memo[i].key);
    Py_CLEAR(memo[i].value);
  }
}

/* mapping.get(key) as a new reference; NULL without an error when absent. */
PyObject* lookup(PyObject* mapping, PyObject* key) {
  if (PyDict_CheckExact(mapping)) {
    PyObject* value = PyDict_GetItemWithError(mapping, key);
    Py_XINCREF(value);
    return value;
  }
  PyObject* value = PyObject_GetItem(mapping, key);
  if (value == NULL && PyErr_ExceptionMatches(PyExc_KeyError)) PyErr_Clear();
  return value;
}

/* ops.tensors_in: the tensors among args and kwargs values, and in lists or
 * tuples of them, in order. Appends to `found`; -1 on error. */
int collect_tensors(PyObject* items, PyObject* found) {
  PyObject* seq = PySequence_Fast(items, "arguments must be iterable");
  if (seq == NULL) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** item = PySequence_Fast_ITEMS(seq);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* a = item[i];
    if (is_tensor(a)) {
      if (PyList_Append(found, a) < 0) goto fail;
    } else if (PyList_CheckExact(a) || PyTuple_CheckExact(a)) {
      Py_ssize_t m = PySequence_Fast_GET_SIZE(a);
      for (Py_ssize_t j = 0; j < m; j++) {
        PyObject* x = PySequence_Fast_GET_ITEM(a, j);
        if (is_tensor(x) && PyList_Append(found, x) < 0) goto fail;
      }
    }
  }
  Py_DECREF(seq);
  return 0;
fail:
  Py_DECREF(seq);
  return -1;
}

/* ops.tensors_in: a new list of the tensors among args and kwargs values. */
PyObject* tensors_in(PyObject* args, PyObject* kwargs) {
  PyObject* found = PyList_New(0);
  if (found == NULL || collect_tensors(args, found) < 0) goto fail;
  if (kwargs != Py_None && PyDict_Check(kwargs) && PyDict_GET_SIZE(kwargs) > 0) {
    PyObject* values = PyDict_Values(kwargs);
    int failed = values == NULL || collect_tensors(values, found) < 0;
    Py_XDECREF(values);
    if (failed) goto fail;
  }
  return found;
fail:
  Py_XDECREF(found);
  return NULL;
}

/* ---- module ------------------------------------------------------------------------ */

static Py_ssize_t field_index(PyObject* fields, const char* name) {
  PyObject* key = PyUnicode_FromString(name);
  if (key == NULL) return -1;
  Py_ssize_t index = PySequence_Index(fields, key);
  Py_DECREF(key);
  return index;
}

static PyObject* configure(PyObject* self, PyObject* args) {
  PyObject *tensor_type, *is_grad_enabled, *sequence_nr, *autograd_node, *wall_clock,
      *dtype_enum, *backward_name, *fields, *tags_globals, *set_eval_frame;
  Py_ssize_t eager_batch;
  if (!PyArg_ParseTuple(args, "OOOOOO!UnOO!O:configure", &tensor_type, &is_grad_enabled,
                        &sequence_nr, &autograd_node, &wall_clock, &PyDict_Type,
                        &dtype_enum, &backward_name, &eager_batch, &fields,
                        &PyDict_Type, &tags_globals, &set_eval_frame))
    return NULL;
  if (!PyType_Check(tensor_type)) {
    PyErr_SetString(PyExc_TypeError, "configure: tensor_type must be a type (torch.Tensor)");
    return NULL;
  }
  Py_ssize_t f_op_type = field_index(fields, "op_type"), f_short = field_index(fields, "short"),
             f_skip = field_index(fields, "skip"), f_alias = field_index(fields, "alias"),
             f_traced = field_index(fields, "traced"), f_writes = field_index(fields, "writes");
  if (f_op_type < 0 || f_short < 0 || f_skip < 0 || f_alias < 0 || f_traced < 0 || f_writes < 0)
    return NULL;
  cfg.ready = 0;
  Py_XSETREF(cfg.tensor_type, Py_NewRef(tensor_type));
  PyObject* on_type;
  int defined = optional_attr(tensor_type, s_tag, &on_type);
  if (defined < 0) return NULL;
  Py_XDECREF(on_type);
  PyTypeObject* tensor = (PyTypeObject*)tensor_type;
  cfg.tag_in_dict = !defined && tensor->tp_getattro == PyObject_GenericGetAttr &&
                    tensor->tp_setattro == PyObject_GenericSetAttr &&
                    tensor->tp_dictoffset != 0;
  Py_XSETREF(cfg.is_grad_enabled, Py_NewRef(is_grad_enabled));
  Py_XSETREF(cfg.sequence_nr, Py_NewRef(sequence_nr));
  Py_XSETREF(cfg.wall_clock, Py_NewRef(wall_clock));
  PyObject* time_module = PyImport_ImportModule("time");
  PyObject* time_time = time_module ? PyObject_GetAttrString(time_module, "time") : NULL;
  Py_XDECREF(time_module);
  if (time_time == NULL) return NULL;
  cfg.system_clock = wall_clock == time_time;  /* read in C: wall_time() */
  Py_DECREF(time_time);
  Py_XSETREF(cfg.dtype_enum, Py_NewRef(dtype_enum));
  memo_forget(dtype_memo, DTYPE_MEMO_SIZE);
  Py_XSETREF(cfg.backward_name, Py_NewRef(backward_name));
  Py_XSETREF(cfg.autograd_node, Py_NewRef(autograd_node));
  Py_XSETREF(cfg.tags_globals, Py_NewRef(tags_globals));
  Py_XSETREF(cfg.set_eval_frame, Py_NewRef(set_eval_frame));
  if (cfg.backward_prefix == NULL &&
      (cfg.backward_prefix = PyUnicode_InternFromString("backward")) == NULL)
    return NULL;
  cfg.eager_batch = eager_batch;
  if (cfg.eager_name == NULL && (cfg.eager_name = PyUnicode_InternFromString("eager")) == NULL)
    return NULL;
  cfg.f_op_type = f_op_type;
  cfg.f_short = f_short;
  cfg.f_skip = f_skip;
  cfg.f_alias = f_alias;
  cfg.f_traced = f_traced;
  cfg.f_writes = f_writes;
  cfg.f_max = f_op_type;
  if (f_short > cfg.f_max) cfg.f_max = f_short;
  if (f_skip > cfg.f_max) cfg.f_max = f_skip;
  if (f_alias > cfg.f_max) cfg.f_max = f_alias;
  if (f_traced > cfg.f_max) cfg.f_max = f_traced;
  if (f_writes > cfg.f_max) cfg.f_max = f_writes;
  cfg.ready = 1;
  Py_RETURN_NONE;
}

/* call_site(session) -> frame ids: StackTracker.call_site through the memo the
 * recording's call sites use (_record_scope.c), for the module and optimizer hooks. */
static PyObject* call_site_of(PyObject* self, PyObject* session) {
  return call_site(session);
}

static PyMethodDef methods[] = {
    {"record", (PyCFunction)(void (*)(void))record_entry, METH_FASTCALL,
     "record(session, func, args, kwargs, out)\n\n"
     "Session.record in C: under the recording token, the op recorded in C or else by\n"
     "session.on_op, an Exception counted by session.fail."},
    {"native_entry", (PyCFunction)(void (*)(void))native_entry, METH_FASTCALL,
     "native_entry(session, func, args, out)\n\n"
     "Session.record as the native hook's entry: under the recording token, an\n"
     "Exception counted by session.fail, Dynamo's frame callback off meanwhile."},
    {"payload", (PyCFunction)(void (*)(void))payload_entry, METH_FASTCALL,
     "payload(encoder, tensor, device, dtype) -> (payload, meta)\n\n"
     "Encoder.payload, in C where it can be (_record_health.c): for the ops the\n"
     "recording leaves to Python (in-place foreach ops, say)."},
    {"call_site", call_site_of, METH_O,
     "call_site(session) -> tuple\n\n"
     "StackTracker.call_site from the calling frame outward, through the recording's memo."},
    {"producer_ids", producer_ids, METH_VARARGS,
     "producer_ids(value[, serial]) -> list\n\n"
     "segments.producer_ids in C: the tensor ids of the producers of the tensors in value."},
    {"encode_traces", encode_traces, METH_VARARGS,
     "encode_traces(traces, rows, graph_id, mode, step_bytes, trace_places, prefixes,\n"
     "              trace_prefix) -> list\n\n"
     "The serialized DebugEvents of a graph segment's traces (Segment.traces items), as\n"
     "Segment.finish encodes them in Python; `trace_places` is this encoding's table\n"
     "(graph id -> [(name, slot, device, prefix) per trace place]), `prefixes` the Encoder's\n"
     "cache of trace prefixes, `trace_prefix` makes a missing one. Not FULL_TENSOR."},
    {"encode_executions", encode_executions, METH_VARARGS,
     "encode_executions(eager, rows, mode, mode_enum, host_name, step) -> list\n\n"
     "The serialized DebugEvents of a run's eager ops (Segment.eager items), as\n"
     "Segment.finish builds them with protobuf. Not FULL_TENSOR."},
    {"encode_graph_execution", encode_graph_execution, METH_VARARGS,
     "encode_graph_execution(op_type, graph_id, input_ids, output_ids, mode_enum,\n"
     "                       host_name, stack_ids, wall_time, step) -> bytes\n\n"
     "The serialized DebugEvent of a graph segment's Execution, as\n"
     "Encoder.graph_execution_event builds it with protobuf."},
    {"configure_health", configure_health, METH_VARARGS,
     "configure_health(_health.C_API, torch.device('cpu'), {dtype: _health code}[,\n"
     "                 raw_stream])\n\n"
     "Health rows of dense CPU tensors computed in C, and of dense CUDA tensors queued\n"
     "from C when raw_stream (device index -> its current stream) is given\n"
     "(_record_health.c)."},
    {"configure_facts", configure_facts, METH_VARARGS,
     "configure_facts(native TENSOR_FACTS capsule[, its module's stand_in_tag])\n\n"
     "Tensor layouts read through the native hook (_record_health.c), and the tags\n"
     "untagged inputs stand for asked of it without a Python call."},
    {"unbind", unbind, METH_O,
     "unbind(session)\n\n"
     "Drops the session's attributes read once for its life (_record_bound.c), and\n"
     "the reference to it: Session.stop."},
    {"configure", configure, METH_VARARGS,
     "configure(Tensor, is_grad_enabled, get_sequence_nr, current_autograd_node,\n"
     "          time, dtype_enum, backward_name,\n"
     "          EAGER_BATCH, OpFacts._fields, vars(tags), set_eval_frame)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_record",
    "The capture's per-op hot path in C (see capture.Session.record).", -1, methods,
    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__record(void) {
  if (intern_names() < 0 || names_init() < 0) return NULL;
  if ((zero = PyLong_FromLong(0)) == NULL || (one = PyLong_FromLong(1)) == NULL) return NULL;
  PyObject* m = PyModule_Create(&module);
  if (m != NULL && state_types_ready(m) < 0) Py_CLEAR(m);
  return m;
}

