/* The encoding of a finished segment's records: graph execution traces and
 * eager executions, as protobuf writes them (part of _record.c's extension). */
#include "_record.h"

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

/* health.debug_values into `v` (`raw`: the row, NULL for SHAPE); returns the count,
 * -1 on error. */
static int debug_values(int mode, PyObject* tensor_id, const double* raw, PyObject* meta,
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
  shape = PyTuple_GET_ITEM(meta, 1);  /* a torch.Size is a tuple: no copy */
  shape = PyTuple_Check(shape) ? Py_NewRef(shape) : PySequence_Tuple(shape);
  if (shape == NULL) return -1;
  Py_ssize_t rank = PyTuple_GET_SIZE(shape);
  double dims[SHAPE_MAX_RANK] = {0};
  double size = 1;
  long long numel = 1;
  for (Py_ssize_t i = 0; i < rank; i++) {
    long long d = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    if (d == -1 && PyErr_Occurred()) goto done;
    numel *= d;
    if (i >= rank - SHAPE_MAX_RANK)
      dims[i - (rank > SHAPE_MAX_RANK ? rank - SHAPE_MAX_RANK : 0)] = (double)d;
  }
  size = (double)numel;
  if (mode == M_SHAPE) {
    v[0] = tid, v[1] = dtype_enum, v[2] = (double)rank, v[3] = size;
    for (int i = 0; i < SHAPE_MAX_RANK; i++) v[4 + i] = dims[i];
    n = 4 + SHAPE_MAX_RANK;
    goto done;
  }
  const double* r = raw;
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

/* The encoded event of one trace item (see Segment.traces). */
static PyObject* encode_trace(PyObject* item, const Rows* rows, PyObject* graph_id, int mode,
                              PyObject* step, PyObject* prefixes, PyObject* make_prefix) {
  PyObject *key = NULL, *prefix = NULL, *event = NULL;
  const double* row = NULL;
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
    if (mode != M_SHAPE && (row = row_at(rows, payload)) == NULL) goto done;
    int n = debug_values(mode, tensor_id, row, meta, v);
    if (n < 0 || put_values_proto(&values, v, n) < 0) goto done;
  }
  event = trace_event(wall, prefix, &values, mode != M_NO_TENSOR, step);
done:
  PyMem_Free(values.data);
  Py_XDECREF(key);
  Py_XDECREF(prefix);
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
static int put_outputs(Buffer* protos, Buffer* devices, PyObject* outs, const Rows* rows,
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
    const double* row = NULL;
    if (mode != M_SHAPE && (row = row_at(rows, PyTuple_GET_ITEM(out, 0))) == NULL) return -1;
    double v[MAX_VALUES];
    Buffer proto = {NULL, 0, 0};
    int count = debug_values(mode, minus_one, row, PyTuple_GET_ITEM(out, 1), v);
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
static int put_execution(Buffer* ex, PyObject* item, const Rows* rows, int mode,
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

PyObject* encode_executions(PyObject* self, PyObject* args) {
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
  Rows blocks;
  int have_rows = rows_acquire(rows, &blocks) == 0;
  PyObject* minus_one = have_rows ? PyLong_FromLong(-1) : NULL;
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
        put_execution(&ex, item, &blocks, mode, mode_enum, host, step, minus_one) == 0) {
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
  rows_release(&blocks);
  return events;
}

static int mode_code(PyObject* name) {
  static const char* names[] = {"NO_TENSOR", "CURT_HEALTH", "CONCISE_HEALTH", "FULL_HEALTH",
                                "SHAPE", "FULL_NUMERICS"};
  for (int i = 0; i < 6; i++)
    if (PyUnicode_CompareWithASCIIString(name, names[i]) == 0) return i;
  return -1;
}

PyObject* encode_traces(PyObject* self, PyObject* args) {
  PyObject *traces, *rows, *graph_id, *mode_name, *step, *prefixes, *make_prefix;
  if (!PyArg_ParseTuple(args, "O!OUUSOO:encode_traces", &PyList_Type, &traces, &rows,
                        &graph_id, &mode_name, &step, &prefixes, &make_prefix))
    return NULL;
  int mode = mode_code(mode_name);
  if (mode < 0) {
    PyErr_Format(PyExc_ValueError, "encode_traces: no encoding in C for mode %R", mode_name);
    return NULL;
  }
  Rows blocks;
  Py_ssize_t n = PyList_GET_SIZE(traces);
  PyObject* events = rows_acquire(rows, &blocks) == 0 ? PyList_New(n) : NULL;
  for (Py_ssize_t i = 0; events != NULL && i < n; i++) {
    PyObject* event = encode_trace(PyList_GET_ITEM(traces, i), &blocks, graph_id, mode, step,
                                   prefixes, make_prefix);
    if (event == NULL) Py_CLEAR(events);
    else PyList_SET_ITEM(events, i, event);
  }
  rows_release(&blocks);
  return events;
}
