/* The encoding of executions as protobuf writes them (part of _record.c's
 * extension): the Execution events of a run's eager ops, and the one Execution
 * event of a finished graph segment.
 *
 * A DebugEvent (wall_time 1, execution 9) holding an Execution: op_type 1,
 * num_outputs 2, graph_id 3, input_tensor_ids 4 and output_tensor_ids 5 (packed
 * int64), tensor_debug_mode 6, tensor_protos 7, code_location 8 (host_name 1,
 * stack_frame_ids 2), output_tensor_device_ids 9 (packed int32), output_dtypes
 * 100 (packed), step 101; fields in number order, zero scalars, empty strings and
 * empty lists left out, as protobuf writes them. Negative ids are 10-byte varints
 * (two's complement). */
#include "_record.h"
#include "_record_wire.h"

/* A packed repeated integer field from a sequence of ints (left out when empty). */
static int put_packed(Buffer* b, uint64_t tag, PyObject* numbers) {
  STACK_BUFFER(packed, 256);
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
  buffer_free(&packed);
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
    STACK_BUFFER(proto, 256);
    int count = debug_values(mode, minus_one, row, PyTuple_GET_ITEM(out, 1), v);
    int failed = count < 0 || put_values_proto(&proto, v, count) < 0 ||
                 put_field(protos, 0x3a, proto.data, proto.size) < 0;
    buffer_free(&proto);
    if (failed) return -1;
  }
  return 0;
}

/* Field 8, the code location: the host name and the stack frame ids. */
static int put_location(Buffer* ex, PyObject* host, PyObject* stack_ids) {
  STACK_BUFFER(location, 512);
  PyObject* seq = PySequence_Fast(stack_ids, "stack ids must be a sequence");
  int failed = seq == NULL || put_str_field(&location, 0x0a, host, 1) < 0;
  for (Py_ssize_t i = 0; !failed && i < PySequence_Fast_GET_SIZE(seq); i++)
    failed = put_str_field(&location, 0x12, PySequence_Fast_GET_ITEM(seq, i), 0) < 0;
  failed = failed || put_field(ex, 0x42, location.data, location.size) < 0;
  Py_XDECREF(seq);
  buffer_free(&location);
  return failed ? -1 : 0;
}

/* What one Execution holds; `graph_id` is NULL for an eager op, `outs` and `dtypes`
 * are NULL for a graph's (it records neither its outputs' values nor their dtypes). */
typedef struct {
  PyObject *op_type, *graph_id, *in_ids, *out_ids, *outs, *stack_ids, *dtypes;
} Fields;

/* The Execution message of `f`. */
static int put_execution(Buffer* ex, const Fields* f, const Rows* rows, int mode,
                         long mode_enum, PyObject* host, PyObject* step,
                         PyObject* minus_one) {
  STACK_BUFFER(protos, 256);
  STACK_BUFFER(devices, 64);
  int status = -1;
  Py_ssize_t num_outputs = PyObject_Length(f->out_ids);
  if (num_outputs < 0) goto done;
  if (f->outs != NULL && !PyList_Check(f->outs)) {
    PyErr_SetString(PyExc_TypeError, "an eager item's outputs must be a list");
    goto done;
  }
  if (put_str_field(ex, 0x0a, f->op_type, 1) < 0) goto done;
  if (num_outputs && (put_varint(ex, 0x10) < 0 || put_varint(ex, num_outputs) < 0)) goto done;
  if (f->graph_id != NULL && put_str_field(ex, 0x1a, f->graph_id, 1) < 0) goto done;
  if (put_packed(ex, 0x22, f->in_ids) < 0 || put_packed(ex, 0x2a, f->out_ids) < 0) goto done;
  if (mode_enum && (put_varint(ex, 0x30) < 0 || put_varint(ex, mode_enum) < 0)) goto done;
  if (f->outs != NULL && put_outputs(&protos, &devices, f->outs, rows, mode, minus_one) < 0)
    goto done;
  if (put(ex, protos.data, protos.size) < 0) goto done;  /* field 7 */
  if (put_location(ex, host, f->stack_ids) < 0) goto done;  /* field 8: always set */
  if (devices.size && put_field(ex, 0x4a, devices.data, devices.size) < 0) goto done;
  if (f->dtypes != NULL && put_packed(ex, 0x322, f->dtypes) < 0) goto done;  /* field 100 */
  if (step != Py_None) {  /* field 101 */
    long long value = PyLong_AsLongLong(step);
    if ((value == -1 && PyErr_Occurred()) || put_varint(ex, 0x328) < 0 ||
        put_varint(ex, (uint64_t)value) < 0)
      goto done;
  }
  status = 0;
done:
  buffer_free(&protos);
  buffer_free(&devices);
  return status;
}

/* The serialized DebugEvent (wall_time 1, left out when 0; execution 9) of `f`. */
static PyObject* execution_event(double wall, const Fields* f, const Rows* rows, int mode,
                                 long mode_enum, PyObject* host, PyObject* step,
                                 PyObject* minus_one) {
  STACK_BUFFER(ex, 1024);
  STACK_BUFFER(event, 1024);
  unsigned char wall_bytes[9] = {0x09};  /* wall_time, a double */
  PyObject* bytes = NULL;
  write_double(wall_bytes + 1, wall);
  if (put_execution(&ex, f, rows, mode, mode_enum, host, step, minus_one) == 0 &&
      (wall == 0.0 || put(&event, wall_bytes, 9) == 0) &&
      put_field(&event, 0x4a, ex.data, ex.size) == 0)
    bytes = PyBytes_FromStringAndSize((const char*)event.data, event.size);
  buffer_free(&ex);
  buffer_free(&event);
  return bytes;
}

/* The event of one eager item (see Segment.eager). */
static PyObject* eager_event(PyObject* item, const Rows* rows, int mode, long mode_enum,
                             PyObject* host, PyObject* step, PyObject* minus_one) {
  if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 7) {
    PyErr_SetString(PyExc_TypeError, "an eager item is a 7-tuple");
    return NULL;
  }
  double wall = PyFloat_AsDouble(PyTuple_GET_ITEM(item, 5));
  if (wall == -1.0 && PyErr_Occurred()) return NULL;
  Fields f = {PyTuple_GET_ITEM(item, 0), NULL, PyTuple_GET_ITEM(item, 1),
              PyTuple_GET_ITEM(item, 2), PyTuple_GET_ITEM(item, 3),
              PyTuple_GET_ITEM(item, 4), PyTuple_GET_ITEM(item, 6)};
  return execution_event(wall, &f, rows, mode, mode_enum, host, step, minus_one);
}

PyObject* executions_encoded(PyObject* items, PyObject* rows, PyObject* mode_name,
                             long mode_enum, PyObject* host, PyObject* step) {
  if (!PyList_Check(items) || !PyUnicode_Check(mode_name) || !PyUnicode_Check(host)) {
    PyErr_SetString(PyExc_TypeError, "encode_executions takes (list, rows, str, int, str, step)");
    return NULL;
  }
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
    PyObject* bytes = eager_event(PyList_GET_ITEM(items, i), &blocks, mode, mode_enum, host,
                                  step, minus_one);
    if (bytes == NULL) Py_CLEAR(events);
    else PyList_SET_ITEM(events, i, bytes);
  }
  Py_XDECREF(minus_one);
  rows_release(&blocks);  /* whatever rows_acquire returned */
  return events;
}

PyObject* encode_executions(PyObject* self, PyObject* args) {
  PyObject *items, *rows, *mode_name, *host, *step;
  long mode_enum;
  if (!PyArg_ParseTuple(args, "O!OUlUO:encode_executions", &PyList_Type, &items, &rows,
                        &mode_name, &mode_enum, &host, &step))
    return NULL;
  return executions_encoded(items, rows, mode_name, mode_enum, host, step);
}

PyObject* graph_execution_encoded(PyObject* op_type, PyObject* graph_id, PyObject* in_ids,
                                  PyObject* out_ids, long mode_enum, PyObject* host,
                                  PyObject* stack_ids, double wall, PyObject* step) {
  if (!PyUnicode_Check(op_type) || !PyUnicode_Check(graph_id) || !PyUnicode_Check(host)) {
    PyErr_SetString(PyExc_TypeError, "encode_graph_execution: op_type, graph_id and host "
                                     "must be str");
    return NULL;
  }
  Fields f = {.op_type = op_type, .graph_id = graph_id, .in_ids = in_ids, .out_ids = out_ids,
              .stack_ids = stack_ids};
  return execution_event(wall, &f, NULL, M_NO_TENSOR, mode_enum, host, step, NULL);
}

PyObject* encode_graph_execution(PyObject* self, PyObject* args) {
  PyObject *op_type, *graph_id, *in_ids, *out_ids, *host, *stack_ids, *step;
  long mode_enum;
  double wall;
  if (!PyArg_ParseTuple(args, "UUOOlUOdO:encode_graph_execution", &op_type, &graph_id,
                        &in_ids, &out_ids, &mode_enum, &host, &stack_ids, &wall, &step))
    return NULL;
  return graph_execution_encoded(op_type, graph_id, in_ids, out_ids, mode_enum, host,
                                 stack_ids, wall, step);
}
