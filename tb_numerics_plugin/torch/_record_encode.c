/* The encoding of a finished graph segment's traces as protobuf writes them, and
 * the debug values of each tensor debug mode (part of _record.c's extension;
 * executions: _record_exec.c). */
#include "_record.h"
#include "_record_wire.h"

/* ---- graph execution traces, encoded when their segment finishes -------------------
 *
 * What Segment.finish, Encoder.value_bytes and wire.trace_event make in Python
 * for each trace of a graph segment: a serialized DebugEvent holding one
 * GraphExecutionTrace. Field numbers: debug_event.proto (DebugEvent.wall_time 1,
 * graph_execution_trace 10; GraphExecutionTrace.tensor_proto 5) and
 * tensor.proto (dtype 1, tensor_shape 2, tensor_content 4; TensorShapeProto.dim 2;
 * Dim.size 1). The debug values follow health.debug_values. */

/* float(x): an int without the float object PyFloat_AsDouble makes of it (about 150
 * instructions per value; the same conversion, the same OverflowError). */
static double as_double(PyObject* x) {
  if (PyLong_CheckExact(x)) return PyLong_AsDouble(x);
  return PyFloat_AsDouble(x);
}

/* float(tuple[i]) */
static int item_double(PyObject* tuple, Py_ssize_t i, double* out) {
  *out = as_double(PyTuple_GET_ITEM(tuple, i));
  return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* What debug values read of a trace's meta (dtype_enum, shape, device_id). */
typedef struct {
  double dtype_enum, device_id, rank, size;
  double dims[SHAPE_MAX_RANK];  /* the last SHAPE_MAX_RANK sizes, 0 before them */
} MetaValues;

/* Reads `meta` into `m`: 0, or -1 with an exception set. The last meta read is kept
 * with its values: a model's traces share meta tuples (_record_health.c's memo). */
static int meta_values(PyObject* meta, MetaValues* m) {
  static PyObject* last;
  static MetaValues last_values;
  if (meta == last && last != NULL) {
    *m = last_values;
    return 0;
  }
  if (!PyTuple_Check(meta) || PyTuple_GET_SIZE(meta) != 3) {
    PyErr_SetString(PyExc_TypeError, "a trace's meta must be (dtype_enum, shape, device_id)");
    return -1;
  }
  if (item_double(meta, 0, &m->dtype_enum) < 0 || item_double(meta, 2, &m->device_id) < 0)
    return -1;
  PyObject* shape = PyTuple_GET_ITEM(meta, 1);  /* a torch.Size is a tuple: no copy */
  int kept = PyTuple_Check(shape);  /* values that cannot change */
  shape = kept ? Py_NewRef(shape) : PySequence_Tuple(shape);
  if (shape == NULL) return -1;
  Py_ssize_t rank = PyTuple_GET_SIZE(shape);
  Py_ssize_t skipped = rank > SHAPE_MAX_RANK ? rank - SHAPE_MAX_RANK : 0;
  long long numel = 1;
  memset(m->dims, 0, sizeof(m->dims));
  for (Py_ssize_t i = 0; i < rank; i++) {
    long long d = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    if (d == -1 && PyErr_Occurred()) {
      Py_DECREF(shape);
      return -1;
    }
    numel *= d;
    if (i >= skipped) m->dims[i - skipped] = (double)d;
  }
  Py_DECREF(shape);
  m->rank = (double)rank;
  m->size = (double)numel;
  if (kept) {
    Py_XSETREF(last, Py_NewRef(meta));
    last_values = *m;
  }
  return 0;
}

/* The values of the health modes past CONCISE_HEALTH (health.debug_values): n. */
static int full_values(int mode, double tid, const MetaValues* m, const double* r, double* v) {
  double head[11] = {tid, m->device_id, m->dtype_enum, m->rank, m->size, r[0], r[1], r[2],
                     r[3], r[4], r[5]};
  memcpy(v, head, sizeof(head));
  if (mode != M_FULL_NUMERICS) return 11;
  double n_fin = r[3] + r[4] + r[5];  /* health.numerics_tail */
  if (n_fin == 0) {
    double tail[6] = {Py_NAN, Py_NAN, 0.0, Py_NAN, Py_NAN, Py_NAN};
    memcpy(v + 11, tail, sizeof(tail));
  } else {
    double tail[6] = {r[6], r[7], isinf(r[8]) ? 0.0 : r[8], r[9], r[10] / n_fin,
                      sqrt(r[11] / n_fin)};
    memcpy(v + 11, tail, sizeof(tail));
  }
  return 17;
}

/* health.debug_values into `v` (`raw`: the row, NULL for SHAPE); returns the count,
 * -1 on error. */
int debug_values(int mode, PyObject* tensor_id, const double* raw, PyObject* meta,
                        double* v) {
  MetaValues m;
  double tid = as_double(tensor_id);
  if ((tid == -1.0 && PyErr_Occurred()) || meta_values(meta, &m) < 0) return -1;
  if (mode == M_SHAPE) {
    v[0] = tid, v[1] = m.dtype_enum, v[2] = m.rank, v[3] = m.size;
    for (int i = 0; i < SHAPE_MAX_RANK; i++) v[4 + i] = m.dims[i];
    return 4 + SHAPE_MAX_RANK;
  }
  const double* r = raw;
  if (mode == M_CURT) {
    v[0] = tid, v[1] = r[0] + r[1] + r[2] > 0 ? 1.0 : 0.0;
    return 2;
  }
  if (mode == M_CONCISE) {
    v[0] = tid, v[1] = m.size, v[2] = r[0], v[3] = r[1], v[4] = r[2];
    return 5;
  }
  return full_values(mode, tid, &m, r, v);
}

/* wire.values_tensor_proto: a 1-D float64 TensorProto of `n` values (at most
 * MAX_VALUES), made on the stack and put in one piece. */
int put_values_proto(Buffer* b, const double* v, int n) {
  unsigned char proto[32 + 8 * MAX_VALUES], dim[12];
  unsigned char* p = proto;
  size_t dim_size = 0;
  if (n < 0 || n > MAX_VALUES) {
    PyErr_Format(PyExc_ValueError, "%d debug values (at most %d)", n, MAX_VALUES);
    return -1;
  }
  if (n) {  /* Dim {size: n} */
    dim[dim_size++] = 0x08;
    dim_size = (size_t)(write_varint(dim + dim_size, (uint64_t)n) - dim);
  }
  *p++ = 0x08, *p++ = 0x02;  /* dtype: DT_DOUBLE */
  *p++ = 0x12;  /* tensor_shape: TensorShapeProto { dim } */
  p = write_varint(p, 2 + dim_size);
  *p++ = 0x12;  /* TensorShapeProto.dim */
  *p++ = (unsigned char)dim_size;
  memcpy(p, dim, dim_size);
  p += dim_size;
  *p++ = 0x22;  /* tensor_content: little-endian doubles */
  p = write_varint(p, 8 * (uint64_t)n);
  for (int i = 0; i < n; i++) p = write_double(p, v[i]);
  return put(b, proto, (size_t)(p - proto));
}

static unsigned char* write_bytes(unsigned char* p, const void* bytes, size_t n) {
  if (n) memcpy(p, bytes, n);  /* (memcpy's source may not be NULL, even for 0 bytes) */
  return p + n;
}

/* One trace event; `prefix` is Encoder.trace_prefix's (head, tail). Written in place
 * into the bytes object, its size counted first. */
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
  PyObject* event = PyBytes_FromStringAndSize(NULL, 9 + 1 + varint_size(body) + body);
  if (event == NULL) return NULL;
  unsigned char* p = (unsigned char*)PyBytes_AS_STRING(event);
  *p++ = 0x09;  /* wall_time, a double */
  p = write_double(p, wall);
  *p++ = 0x52;  /* graph_execution_trace */
  p = write_bytes(write_varint(p, body), head, head_size);
  if (has_values) {
    *p++ = 0x2a;  /* tensor_proto */
    p = write_bytes(write_varint(p, values->size), values->data, values->size);
  }
  write_bytes(write_bytes(p, tail, tail_size), step_bytes, step_size);
  return event;
}

/* Encoder.trace_prefix(graph, name, slot, device): looked up in its cache `prefixes`
 * ((graph, name, slot, device) -> prefix), `make_prefix` called on a miss. New
 * reference. */
static PyObject* prefix_of(PyObject* graph_id, PyObject* name, PyObject* slot, PyObject* device,
                           PyObject* prefixes, PyObject* make_prefix) {
  Py_ssize_t k = PyLong_AsSsize_t(slot);
  if (k < 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a trace's slot is negative");
    return NULL;
  }
  PyObject* key = PyTuple_Pack(4, graph_id, name, slot, device);
  if (key == NULL) return NULL;
  PyObject* prefix = lookup(prefixes, key);
  Py_DECREF(key);
  if (prefix == NULL && !PyErr_Occurred())
    prefix = PyObject_CallFunctionObjArgs(make_prefix, graph_id, name, slot, device, NULL);
  return prefix;
}

/* What a graph's traces were encoded with, by their place in the execution: the
 * encoder's table `by_graph` maps the graph id to a list of (name, slot, device,
 * prefix). A model's traces come in the same order step after step, with the same
 * name, slot and device objects (kept names, small ints, remembered devices), so the
 * trace at a place takes the prefix found there last: no key tuple made, hashed and
 * looked up per trace. A borrowed reference; NULL with an error. */
static PyObject* places_of(PyObject* by_graph, PyObject* graph_id) {
  PyObject* places = PyDict_GetItemWithError(by_graph, graph_id);
  if (places != NULL || PyErr_Occurred()) return places;
  if ((places = PyList_New(0)) == NULL) return NULL;
  int stored = PyDict_SetItem(by_graph, graph_id, places);
  Py_DECREF(places);  /* by_graph holds it */
  return stored < 0 ? NULL : places;
}

/* The prefix found at place `i` last time for the same objects, or NULL (no error). */
static PyObject* placed_prefix(PyObject* places, Py_ssize_t i, PyObject* name, PyObject* slot,
                               PyObject* device) {
  if (i >= PyList_GET_SIZE(places)) return NULL;
  PyObject* seen = PyList_GET_ITEM(places, i);
  if (seen == Py_None || PyTuple_GET_ITEM(seen, 0) != name ||
      PyTuple_GET_ITEM(seen, 1) != slot || PyTuple_GET_ITEM(seen, 2) != device)
    return NULL;
  return Py_NewRef(PyTuple_GET_ITEM(seen, 3));
}

/* Notes `prefix` (a pair of bytes) at place `i`. -1 on error. */
static int place_prefix(PyObject* places, Py_ssize_t i, PyObject* name, PyObject* slot,
                        PyObject* device, PyObject* prefix) {
  PyObject* seen = untracked(PyTuple_Pack(4, name, slot, device, prefix));
  if (seen == NULL) return -1;
  while (PyList_GET_SIZE(places) < i)
    if (PyList_Append(places, Py_None) < 0) goto fail;
  if (PyList_GET_SIZE(places) == i) {
    int status = PyList_Append(places, seen);
    Py_DECREF(seen);
    return status;
  }
  return PyList_SetItem(places, i, seen);  /* steals `seen`, drops the old entry */
fail:
  Py_DECREF(seen);
  return -1;
}

/* The encoded event of one trace item (see Segment.traces), the `i`-th of its graph. */
static PyObject* encode_trace(PyObject* item, Py_ssize_t i, const Rows* rows, PyObject* graph_id,
                              int mode, PyObject* step, PyObject* places, PyObject* prefixes,
                              PyObject* make_prefix) {
  PyObject *prefix = NULL, *event = NULL;
  const double* row = NULL;
  STACK_BUFFER(values, 256);  /* a values proto: at most 17 doubles */
  if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 7) {
    PyErr_SetString(PyExc_TypeError, "a trace is a 7-tuple");
    return NULL;
  }
  PyObject *name = PyTuple_GET_ITEM(item, 0), *slot = PyTuple_GET_ITEM(item, 1),
           *tensor_id = PyTuple_GET_ITEM(item, 2), *payload = PyTuple_GET_ITEM(item, 3),
           *meta = PyTuple_GET_ITEM(item, 4), *device = PyTuple_GET_ITEM(item, 5);
  double wall = PyFloat_AsDouble(PyTuple_GET_ITEM(item, 6));
  if (wall == -1.0 && PyErr_Occurred()) return NULL;
  if ((prefix = placed_prefix(places, i, name, slot, device)) == NULL) {
    prefix = prefix_of(graph_id, name, slot, device, prefixes, make_prefix);
    if (prefix == NULL || place_prefix(places, i, name, slot, device, prefix) < 0) goto done;
  }
  if (mode != M_NO_TENSOR) {
    double v[MAX_VALUES];
    if (mode != M_SHAPE && (row = row_at(rows, payload)) == NULL) goto done;
    int n = debug_values(mode, tensor_id, row, meta, v);
    if (n < 0 || put_values_proto(&values, v, n) < 0) goto done;
  }
  event = trace_event(wall, prefix, &values, mode != M_NO_TENSOR, step);
done:
  buffer_free(&values);
  Py_XDECREF(prefix);
  return event;
}

int mode_code(PyObject* name) {
  static const char* names[] = {"NO_TENSOR", "CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH",
                                "SHAPE", "FULL_NUMERICS"};
  for (int i = 0; i < 6; i++)
    if (PyUnicode_CompareWithASCIIString(name, names[i]) == 0) return i;
  return -1;
}

PyObject* traces_encoded(PyObject* traces, PyObject* rows, PyObject* graph_id,
                         PyObject* mode_name, PyObject* step, PyObject* by_graph,
                         PyObject* prefixes, PyObject* make_prefix) {
  if (!PyList_Check(traces) || !PyUnicode_Check(graph_id) || !PyUnicode_Check(mode_name) ||
      !PyBytes_Check(step) || !PyDict_Check(by_graph)) {
    PyErr_SetString(PyExc_TypeError, "encode_traces takes (list, rows, str, str, bytes, dict, "
                                     "prefixes, make_prefix)");
    return NULL;
  }
  int mode = mode_code(mode_name);
  if (mode < 0) {
    PyErr_Format(PyExc_ValueError, "encode_traces: no encoding in C for mode %R", mode_name);
    return NULL;
  }
  PyObject* places = places_of(by_graph, graph_id);
  if (places == NULL) return NULL;
  Py_INCREF(places);
  Rows blocks;
  Py_ssize_t n = PyList_GET_SIZE(traces);
  PyObject* events = rows_acquire(rows, &blocks) == 0 ? PyList_New(n) : NULL;
  for (Py_ssize_t i = 0; events != NULL && i < n; i++) {
    PyObject* event = encode_trace(PyList_GET_ITEM(traces, i), i, &blocks, graph_id, mode, step,
                                   places, prefixes, make_prefix);
    if (event == NULL) Py_CLEAR(events);
    else PyList_SET_ITEM(events, i, event);
  }
  rows_release(&blocks);
  Py_DECREF(places);  /* (held: make_prefix runs Python code) */
  return events;
}

PyObject* encode_traces(PyObject* self, PyObject* args) {
  PyObject* a[8];
  if (!PyArg_UnpackTuple(args, "encode_traces", 8, 8, &a[0], &a[1], &a[2], &a[3], &a[4], &a[5],
                         &a[6], &a[7]))
    return NULL;
  return traces_encoded(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
}
