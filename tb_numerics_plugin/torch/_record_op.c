/* The records of a claimed op: its Segment.ops (or Segment.eager) item, its
 * outputs' tags and traces (part of _record.c's extension). */
#include "_record.h"

/* Item `index` of Session.device(device), (device name, DebuggedDevice id):
 * the device's record is written once. */
static PyObject* device_item(PyObject* session, PyObject* device, Py_ssize_t index) {
  PyObject* devices = bound_attr(session, B_DEVICES);
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

/* t.device and its device name in the session, as new references; 0, or -1 on
 * error. Through the native hook, the last device seen is remembered with its
 * name: no torch.device made and looked up per op. */
static int device_and_name(PyObject* session, PyObject* t, PyObject** device, PyObject** name) {
  TbnMeta meta;
  int known = read_meta(t, &meta);
  if (known && remembered_device(session, &meta, device, name)) return 0;
  if ((*device = PyObject_GetAttr(t, s_device)) == NULL) return -1;
  if ((*name = device_name(session, *device)) == NULL) return -1;
  if (known) remember_device(session, &meta, *device, *name);
  return 0;
}

/* The last tensor object mark() tagged (compared by identity only) and its tag:
 * native_entry hands the tag back to the native hook for its op's output. */
PyObject *marked_object, *marked_tag;

/* Tags `out` (and the base it was written through) as output `slot` of op_name;
 * `first`: the op's "name:0", or NULL. */
static int mark(PyObject* out, PyObject* serial, PyObject* name, Py_ssize_t slot,
                PyObject* slot_number, PyObject* tensor_id, PyObject* first) {
  PyObject* version = tensor_version(out);
  PyObject* input_name = version == NULL ? NULL
                         : slot == 0 && first != NULL ? Py_NewRef(first) : slot_name(name, slot);
  /* the serial and version come from Python objects; the rest was made here */
  PyObject* tag = input_name ? untracked_but(PyTuple_Pack(6, serial, name, slot_number, version,
                                                          tensor_id, input_name),
                                             1u << T_SERIAL | 1u << T_VERSION) : NULL;
  Py_XDECREF(version);
  Py_XDECREF(input_name);
  if (tag == NULL || tag_write(out, tag) < 0) goto fail;
  marked_object = out;
  Py_XSETREF(marked_tag, Py_NewRef(tag));
  int view = is_view(out);
  if (view < 0) goto fail;
  if (view) {
    PyObject* base = PyObject_GetAttr(out, s_base);
    int failed = base == NULL || tag_write(base, tag) < 0;
    Py_XDECREF(base);
    if (failed) goto fail;
  }
  Py_DECREF(tag);
  return 0;
fail:
  Py_XDECREF(tag);
  return -1;
}

/* The session's encoder (an EncoderState), or NULL with an error: a new reference. */
static EncoderState* encoder_of(PyObject* session) {
  return (EncoderState*)bound_of_type(session, B_ENCODER, &EncoderStateType);
}

/* Encoder.dtype_traced(dtype), answered from its cache (Encoder.dtype_ok) when
 * there: 1, 0, or -1 on error. */
static int dtype_is_traced(EncoderState* encoder, PyObject* dtype) {
  /* the answers the cache gave, by dtype: it only grows, and each enable has a new one */
  enum { MEMO_SIZE = 8 };
  static struct {
    PyObject *cache, *dtype;
    int traced;
  } memo[MEMO_SIZE];
  PyObject* dtype_ok = encoder->dtype_ok;  /* (borrowed: the encoder holds it) */
  size_t slot = ((uintptr_t)dtype >> 4) % MEMO_SIZE;
  if (dtype_ok != NULL && memo[slot].cache == dtype_ok && memo[slot].dtype == dtype)
    return memo[slot].traced;
  PyObject* ok = dtype_ok ? lookup(dtype_ok, dtype) : NULL;
  int cached = ok != NULL;
  if (ok == NULL && !PyErr_Occurred())
    ok = PyObject_CallMethodOneArg((PyObject*)encoder, s_dtype_traced, dtype);
  int traced = ok ? PyObject_IsTrue(ok) : -1;
  Py_XDECREF(ok);
  if (cached && traced >= 0) {
    Py_XSETREF(memo[slot].cache, Py_NewRef(dtype_ok));
    Py_XSETREF(memo[slot].dtype, Py_NewRef(dtype));
    memo[slot].traced = traced;
  }
  return traced;
}

/* A trace's items that may come from Python: its payload, meta and device name. */
#define TRACE_FROM_PYTHON (1u << 3 | 1u << 4 | 1u << 5)

/* The trace item of the op's output, or NULL without an error when the op or
 * the output's dtype is not traced. */
static PyObject* trace_of(PyObject* session, PyObject* facts, PyObject* out, PyObject* device,
                          PyObject* name, PyObject* slot, PyObject* tensor_id,
                          PyObject* device_name, PyObject* wall) {
  EncoderState* encoder = NULL;
  PyObject *dtype = NULL, *payload = NULL, *meta = NULL;
  PyObject* trace = NULL;
  int traced = PyObject_IsTrue(PyTuple_GET_ITEM(facts, cfg.f_traced));
  if (traced <= 0) return NULL;
  if ((encoder = encoder_of(session)) == NULL) goto done;
  if ((dtype = tensor_dtype(out)) == NULL) goto done;
  if (dtype_is_traced(encoder, dtype) <= 0) goto done;
  if (encoder->graph_values) {
    if (payload_parts((PyObject*)encoder, out, device, dtype, &payload, &meta) < 0) goto done;
    trace = untracked_but(PyTuple_Pack(7, name, slot, tensor_id, payload, meta, device_name, wall),
                          TRACE_FROM_PYTHON);
  } else {
    trace = untracked_but(PyTuple_Pack(7, name, slot, tensor_id, Py_None, Py_None, device_name,
                                       wall), TRACE_FROM_PYTHON);
  }
done:
  Py_XDECREF(encoder);
  Py_XDECREF(dtype);
  Py_XDECREF(payload);
  Py_XDECREF(meta);
  return trace;
}

/* (number,), one object per small DataType number: most ops have one output, and
 * the registry compares an execution's dtype tuples with the last one's. */
PyObject* dtype_tuple(PyObject* number) {
  static PyObject* kept[DTYPES_KEPT];
  long v = PyLong_Check(number) ? PyLong_AsLong(number) : -1;
  if (v < 0 || v >= DTYPES_KEPT) {
    PyErr_Clear();  /* (a number past a long: not kept) */
    return untracked(PyTuple_Pack(1, number));
  }
  if (kept[v] == NULL && (kept[v] = untracked(PyTuple_Pack(1, number))) == NULL) return NULL;
  return Py_NewRef(kept[v]);
}

/* The DataType number of output `i`'s dtype: a new reference, or NULL with an error. */
static PyObject* output_dtype_number(const Claim* c, Py_ssize_t i) {
  PyObject* dtype = tensor_dtype(claim_output(c, i));
  PyObject* number = dtype ? dtype_number(dtype) : NULL;
  Py_XDECREF(dtype);
  return number;
}

/* The DataType numbers of the outputs' dtypes (0 for a dtype TensorFlow lacks). */
static PyObject* output_dtypes(const Claim* c) {
  Py_ssize_t n = claim_outputs_size(c);
  if (n == 1) {
    PyObject* number = output_dtype_number(c, 0);
    PyObject* dtypes = number ? dtype_tuple(number) : NULL;
    Py_XDECREF(number);
    return dtypes;
  }
  PyObject* dtypes = PyTuple_New(n);
  for (Py_ssize_t i = 0; dtypes != NULL && i < n; i++) {
    PyObject* number = output_dtype_number(c, i);
    if (number == NULL) Py_CLEAR(dtypes);
    else PyTuple_SET_ITEM(dtypes, i, number);
  }
  return untracked(dtypes);
}

/* Gives output `slot` the session's next tensor id and tags it; sets new
 * references to that id and to the slot number. */
static int tag_output(PyObject* session, Claim* c, PyObject* t, Py_ssize_t slot, PyObject* name,
                      PyObject** tensor_id, PyObject** slot_number) {
  PyObject* ids = bound_attr(session, B_IDS);
  int status = -1;
  if (ids == NULL || (*tensor_id = take_id(ids)) == NULL) goto done;
  if ((*slot_number = PyLong_FromSsize_t(slot)) == NULL) goto done;
  status = mark(t, c->serial, name, slot, *slot_number, *tensor_id, c->first_slot);
done:
  Py_XDECREF(ids);
  return status;
}

/* Tags and traces output `slot` (the slot loop of recorder.record_graph_op).
 * `device` and `dev_name` are the first output's, replaced by this one's for
 * a later slot (ops like to/copy may write across devices). */
static int record_output(PyObject* session, Claim* c, PyObject* t, Py_ssize_t slot,
                         PyObject* name, PyObject* device, PyObject* dev_name, PyObject* wall) {
  PyObject *tensor_id = NULL, *slot_number = NULL, *trace = NULL;
  PyObject *own_device = NULL, *own_name = NULL;
  int status = -1;
  if (tag_output(session, c, t, slot, name, &tensor_id, &slot_number) < 0) goto done;
  if (slot > 0) {
    if (device_and_name(session, t, &own_device, &own_name) < 0) goto done;
    device = own_device;
    dev_name = own_name;
  }
  trace = trace_of(session, c->facts, t, device, name, slot_number, tensor_id, dev_name, wall);
  if (trace == NULL ? PyErr_Occurred() != NULL : append_segment(c->segment, S_TRACES, trace) < 0)
    goto done;
  status = 0;
done:
  Py_XDECREF(tensor_id); Py_XDECREF(slot_number); Py_XDECREF(trace);
  Py_XDECREF(own_device); Py_XDECREF(own_name);
  return status;
}

/* Tags output `slot` of an eager op; appends its tensor id and dtype number,
 * and, when traced, (payload, meta, device id, tensor id) to `outs`. */
static int eager_output(PyObject* session, Claim* c, PyObject* t, Py_ssize_t slot,
                        PyObject* name, int traced, PyObject* lists[3]) {
  PyObject *tensor_id = NULL, *slot_number = NULL, *dtype = NULL;
  PyObject *number = NULL, *encoder = NULL, *device = NULL, *dev_name = NULL;
  PyObject *payload = NULL, *meta = NULL, *device_id = NULL, *out = NULL;
  int status = -1;
  if (tag_output(session, c, t, slot, name, &tensor_id, &slot_number) < 0) goto done;
  if ((dtype = tensor_dtype(t)) == NULL) goto done;
  if ((number = dtype_number(dtype)) == NULL) goto done;
  if (PyList_Append(lists[0], tensor_id) < 0 || PyList_Append(lists[1], number) < 0) goto done;
  if (traced) {
    if ((encoder = (PyObject*)encoder_of(session)) == NULL) goto done;
    int traced_dtype = dtype_is_traced((EncoderState*)encoder, dtype);
    if (traced_dtype < 0) goto done;
    if (traced_dtype) {
      if (device_and_name(session, t, &device, &dev_name) < 0) goto done;
      if (!((EncoderState*)encoder)->graph_values) {  /* NO_TENSOR: nothing reads them */
        payload = Py_NewRef(Py_None);
        meta = Py_NewRef(Py_None);
      } else if (payload_parts(encoder, t, device, dtype, &payload, &meta) < 0) {
        goto done;
      }
      if ((device_id = device_item(session, device, 1)) == NULL) goto done;
      out = untracked(PyTuple_Pack(4, payload, meta, device_id, tensor_id));
      if (out == NULL || PyList_Append(lists[2], out) < 0) goto done;
    }
  }
  status = 0;
done:
  Py_XDECREF(tensor_id); Py_XDECREF(slot_number); Py_XDECREF(dtype);
  Py_XDECREF(number); Py_XDECREF(encoder); Py_XDECREF(device); Py_XDECREF(dev_name);
  Py_XDECREF(payload); Py_XDECREF(meta); Py_XDECREF(device_id); Py_XDECREF(out);
  return status;
}

/* recorder.record_eager_op: the op joins the open run of eager ops as
 * (op_type, input ids, output ids, outs, stack ids, wall time, output dtypes). */
static int record_eager(PyObject* session, Claim* c, PyObject* args, PyObject* kwargs,
                        PyObject* name, PyObject* stack_ids) {
  PyObject *in_ids = NULL, *wall = NULL, *item = NULL;
  PyObject* lists[3] = {PyList_New(0), PyList_New(0), PyList_New(0)};  /* ids, dtypes, outs */
  int status = -1;
  int traced = PyObject_IsTrue(PyTuple_GET_ITEM(c->facts, cfg.f_traced));
  if (traced < 0 || !lists[0] || !lists[1] || !lists[2]) goto done;
  if (traced && (in_ids = input_ids(args, kwargs)) == NULL) goto done;
  for (Py_ssize_t slot = 0; slot < claim_outputs_size(c); slot++)
    if (eager_output(session, c, claim_output(c, slot), slot, name, traced,
                     lists) < 0)
      goto done;
  if (traced) {
    if ((wall = wall_time()) == NULL) goto done;
    item = PyTuple_Pack(7, PyTuple_GET_ITEM(c->facts, cfg.f_op_type), in_ids, lists[0],
                        lists[2], stack_ids, wall, lists[1]);
    if (item == NULL || append_segment(c->segment, S_EAGER, item) < 0) goto done;
  }
  status = 0;
done:
  Py_XDECREF(in_ids); Py_XDECREF(wall); Py_XDECREF(item);
  for (int i = 0; i < 3; i++) Py_XDECREF(lists[i]);
  return status;
}

/* Whether `a` and `b` are the same object, or tuples of the same objects. */
static int same_objects(PyObject* a, PyObject* b) {
  if (a == b) return 1;
  if (!PyTuple_CheckExact(a) || !PyTuple_CheckExact(b) || Py_SIZE(a) != Py_SIZE(b)) return 0;
  for (Py_ssize_t i = 0; i < Py_SIZE(a); i++)
    if (PyTuple_GET_ITEM(a, i) != PyTuple_GET_ITEM(b, i)) return 0;
  return 1;
}

/* The previous execution's item at the next op's place (borrowed: the segment's
 * prior_ops hold it), or NULL: none, or an error (*failed set). */
static PyObject* prior_item(PyObject* segment, int* failed) {
  PyObject* ops = segment_attr(segment, S_OPS);
  PyObject* prior = ops ? segment_attr(segment, S_PRIOR) : NULL;
  PyObject* old = NULL;
  *failed = prior == NULL;
  if (prior != NULL && PyTuple_CheckExact(prior) && PyList_CheckExact(ops) &&
      PyList_GET_SIZE(ops) < PyTuple_GET_SIZE(prior)) {
    old = PyTuple_GET_ITEM(prior, PyList_GET_SIZE(ops));
    if (!PyTuple_CheckExact(old) || PyTuple_GET_SIZE(old) != OP_ITEM_SIZE) old = NULL;
  }
  Py_XDECREF(ops);
  Py_XDECREF(prior);
  return old;
}

PyObject* prior_part(PyObject* segment, int part) {
  int failed;
  PyObject* old = prior_item(segment, &failed);
  return old != NULL ? PyTuple_GET_ITEM(old, part) : NULL;
}

/* The op's Segment.ops item: the previous execution's item at its place
 * (Segment.prior_ops) when that holds the same objects, else a new one. The
 * names, call sites, device names and dtype tuples a model's ops get are kept
 * objects (_record_names.c, the call-site memo, dtype_tuple), so step after step
 * an op's item is its last step's: no tuple made and freed per op, and
 * GraphRegistry.graph_id finds the execution's op sequence unchanged by comparing
 * addresses. A new reference, NULL with an error. */
PyObject* op_item(PyObject* segment, PyObject* const parts[OP_ITEM_SIZE]) {
  int failed;
  PyObject* old = prior_item(segment, &failed);
  if (failed) return NULL;
  int same = old != NULL;
  for (int i = 0; same && i < OP_ITEM_SIZE; i++)
    same = same_objects(PyTuple_GET_ITEM(old, i), parts[i]);
  if (same) return Py_NewRef(old);
  PyObject* item = PyTuple_New(OP_ITEM_SIZE);
  for (int i = 0; item != NULL && i < OP_ITEM_SIZE; i++)
    PyTuple_SET_ITEM(item, i, Py_NewRef(parts[i]));
  return untracked(item);
}

/* Records the op once claimed (Session.on_op, then recorder.record_graph_op or
 * record_eager_op). */
int record(PyObject* session, Claim* c, PyObject* args, PyObject* kwargs) {
  PyObject *stack_ids = NULL, *name = NULL, *names = NULL;
  PyObject *device = NULL, *dev_name = NULL, *item = NULL, *count = NULL, *dtypes = NULL;
  PyObject* wall = NULL;
  int status = -1;
  if (c->stack_ids != NULL) {  /* backward: the forward op's call site */
    stack_ids = Py_NewRef(c->stack_ids);
  } else {
    if ((stack_ids = call_site(session)) == NULL) goto done;
  }
  Py_CLEAR(c->first_slot);
  if ((name = op_name(c->segment, c->scope, c->short_name, &c->first_slot)) == NULL) goto done;
  if (c->stack_ids == NULL) {  /* forward: remembered for its backward ops */
    int grad_enabled;
    if (native_api != NULL) {
      grad_enabled = native_api->grad_enabled();
    } else {
      PyObject* grad = PyObject_CallNoArgs(cfg.is_grad_enabled);
      grad_enabled = grad ? PyObject_IsTrue(grad) : -1;
      Py_XDECREF(grad);
    }
    if (grad_enabled < 0) goto done;
    if (grad_enabled) {
      PyObject* ids = bound_attr(session, B_IDS);
      long long first_id = ids ? next_id(ids) : -1;
      Py_XDECREF(ids);
      if ((first_id == -1 && PyErr_Occurred()) ||
          remember_forward(session, name, stack_ids, first_id) < 0)
        goto done;
    }
  }
  if (c->eager) {
    status = record_eager(session, c, args, kwargs, name, stack_ids);
    goto done;
  }
  if ((names = input_names(session, c->segment, c->serial, args, kwargs)) == NULL)
    goto done;
  PyObject* first = claim_output(c, 0);
  if (device_and_name(session, first, &device, &dev_name) < 0) goto done;
  if ((dtypes = output_dtypes(c)) == NULL) goto done;
  if ((count = PyLong_FromSsize_t(claim_outputs_size(c))) == NULL) goto done;
  PyObject* parts[OP_ITEM_SIZE] = {PyTuple_GET_ITEM(c->facts, cfg.f_op_type), name, names,
                                   count, stack_ids, dev_name, dtypes};
  item = op_item(c->segment, parts);
  if (item == NULL || append_segment(c->segment, S_OPS, item) < 0) goto done;
  if ((wall = wall_time()) == NULL) goto done;
  for (Py_ssize_t slot = 0; slot < claim_outputs_size(c); slot++)
    if (record_output(session, c, claim_output(c, slot), slot, name, device,
                      dev_name, wall) < 0)
      goto done;
  status = 0;
done:
  Py_XDECREF(stack_ids); Py_XDECREF(name);
  Py_XDECREF(names); Py_XDECREF(device); Py_XDECREF(dev_name); Py_XDECREF(item);
  Py_XDECREF(count); Py_XDECREF(dtypes); Py_XDECREF(wall);
  return status;
}
