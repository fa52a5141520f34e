/* What a traced tensor keeps until its segment finishes, its payload and meta
 * (Encoder.payload), computed in C for a dense CPU or CUDA tensor in a health
 * mode (part of _record.c's extension).
 *
 * The health batch's CPU rows (kernels.HealthBatch, a _health.HostRows) are
 * the encoder's `cpu_rows`, its rows on its first CUDA device (a
 * _health.DeviceRows) its `cuda_rows`; the row is computed into the first, or
 * queued on the device's current stream into the second, through _health's C
 * API (_health.h), and the payload is its (block, row) token, as
 * HealthBatch.add returns. Everything else goes to Encoder.payload: other
 * modes, other devices, non-contiguous tensors, rows that are full or not yet
 * registered in the batch (the Python call registers them or starts new rows).
 * configure_health() turns this on; recorder.py calls it when _health was built.
 * Once the native hook is loaded (configure_facts), a tensor's layout, address,
 * sizes and device come from its at::Tensor (_native_facts.h), without Python
 * calls. */
#include "_record.h"
#include "_health.h"

static const TbnHealthApi* health_api;  /* NULL: every payload from Encoder.payload */
static PyObject* cpu_device;            /* torch.device("cpu") */
static PyObject* c_codes;               /* torch.dtype -> _health's dtype code */
static PyObject* raw_stream;            /* device index -> its current CUDA stream; or NULL */
static PyObject *s_cpu_rows, *s_cuda_rows, *s_shape, *s_is_contiguous, *s_data_ptr, *s_type,
    *s_index, *s_cuda;
static PyObject* minus_one;             /* a host tensor's device id in its meta */

/* c_codes.get(dtype), memoized as dtype_number is (emptied by configure_health). */
#define CODE_MEMO_SIZE 8
static MemoEntry code_memo[CODE_MEMO_SIZE];

/* configure_health(_health.C_API, torch.device("cpu"), {dtype: code}, raw_stream or None) */
PyObject* configure_health(PyObject* self, PyObject* args) {
  PyObject *capsule, *device, *codes, *stream_of = Py_None;
  if (!PyArg_ParseTuple(args, "OOO!|O:configure_health", &capsule, &device, &PyDict_Type,
                        &codes, &stream_of))
    return NULL;
  const TbnHealthApi* api = PyCapsule_GetPointer(capsule, TBN_HEALTH_CAPSULE);
  if (api == NULL) return NULL;
#define NAME(var, text) if (!var && !(var = PyUnicode_InternFromString(text))) return NULL
  NAME(s_cpu_rows, "cpu_rows"); NAME(s_cuda_rows, "cuda_rows"); NAME(s_shape, "shape");
  NAME(s_is_contiguous, "is_contiguous"); NAME(s_data_ptr, "data_ptr");
  NAME(s_type, "type"); NAME(s_index, "index"); NAME(s_cuda, "cuda");
#undef NAME
  if (minus_one == NULL && (minus_one = PyLong_FromLong(-1)) == NULL) return NULL;
  Py_XSETREF(cpu_device, Py_NewRef(device));
  Py_XSETREF(c_codes, Py_NewRef(codes));
  memo_forget(code_memo, CODE_MEMO_SIZE);
  Py_XSETREF(raw_stream, stream_of == Py_None ? NULL : Py_NewRef(stream_of));
  health_api = api;
  Py_RETURN_NONE;
}

PyObject* configure_facts(PyObject* self, PyObject* args) {
  PyObject *capsule, *stand_in = Py_None;
  if (!PyArg_ParseTuple(args, "O|O", &capsule, &stand_in)) return NULL;
  const TbnNativeApi* api = PyCapsule_GetPointer(capsule, TBN_FACTS_CAPSULE);
  if (api == NULL) return NULL;
  native_api = api;
  Py_XSETREF(native_stand_in, stand_in == Py_None ? NULL : Py_NewRef(stand_in));
  Py_RETURN_NONE;
}

/* The number of elements of a torch.Size; -1 with an exception set. */
static Py_ssize_t numel_of(PyObject* shape) {
  if (!PyTuple_Check(shape)) {
    PyErr_SetString(PyExc_TypeError, "a tensor's shape is not a tuple");
    return -1;
  }
  Py_ssize_t n = 1;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); i++) {
    Py_ssize_t d = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
    if (d < 0) return PyErr_Occurred() ? -1 : 0;
    n *= d;
  }
  return n;
}

/* Where `device` is: 0 the CPU, 1 a CUDA device (its ordinal in *index), 2 elsewhere
 * (or CUDA without a stream source), -1 on error. */
static int device_kind(PyObject* device, int* index) {
  int cpu = device == cpu_device ? 1 : PyObject_RichCompareBool(device, cpu_device, Py_EQ);
  if (cpu != 0) return cpu < 0 ? -1 : 0;
  if (raw_stream == NULL) return 2;
  PyObject* type = PyObject_GetAttr(device, s_type);
  int cuda = type ? PyObject_RichCompareBool(type, s_cuda, Py_EQ) : -1;
  Py_XDECREF(type);
  if (cuda <= 0) return cuda < 0 ? -1 : 2;
  PyObject* ordinal = PyObject_GetAttr(device, s_index);
  long value = ordinal && ordinal != Py_None ? PyLong_AsLong(ordinal) : -1;
  Py_XDECREF(ordinal);
  if (value == -1 && PyErr_Occurred()) return -1;
  *index = (int)value;
  return value < 0 ? 2 : 1;
}

/* The facts of `t` through Python calls (without the native hook): 1 when the C
 * path takes it, 0 when it does not, -1 on error. */
static int python_facts(PyObject* t, PyObject* device, TbnFacts* f) {
  int index = -1, kind = device_kind(device, &index);
  if (kind != 0 && kind != 1) return kind == 2 ? 0 : -1;
  PyObject* dense = PyObject_CallMethodNoArgs(t, s_is_contiguous);
  int is_dense = dense ? PyObject_IsTrue(dense) : -1;
  Py_XDECREF(dense);
  if (is_dense <= 0) return is_dense;
  PyObject* address = PyObject_CallMethodNoArgs(t, s_data_ptr);
  if (address == NULL) return -1;
  f->data = PyLong_AsVoidPtr(address);
  Py_DECREF(address);
  if (PyErr_Occurred() || (f->shape = PyObject_GetAttr(t, s_shape)) == NULL) return -1;
  /* a plain tuple, not a torch.Size: the record holding it can leave the collector */
  Py_SETREF(f->shape, PySequence_Tuple(f->shape));
  if (f->shape == NULL) return -1;
  if ((f->numel = numel_of(f->shape)) < 0) {
    Py_CLEAR(f->shape);
    return -1;
  }
  f->cuda = kind;
  f->device = index;
  return 1;
}

/* Queues the row of the tensor of `f` into `rows`: 1 with its token, 0 when the
 * rows take no row, -1 on error. */
static int add_row(PyObject* rows, const TbnFacts* f, int code, PyObject** token) {
  if (!f->cuda) return health_api->add(rows, f->data, f->numel, code, token);
  PyObject* ordinal = PyLong_FromLong(f->device);
  PyObject* handle = ordinal ? PyObject_CallOneArg(raw_stream, ordinal) : NULL;
  Py_XDECREF(ordinal);
  void* stream = handle ? PyLong_AsVoidPtr(handle) : NULL;
  Py_XDECREF(handle);
  if (PyErr_Occurred()) return -1;
  return health_api->device_add(rows, f->data, f->numel, code, f->device, stream, token);
}

/* The encoder's rows the C API takes, in *cpu and *cuda (new references, or NULL
 * where there are none); -1 on error. */
static int usable_rows(PyObject* encoder, PyObject** cpu, PyObject** cuda) {
  *cpu = *cuda = NULL;
  if (encoder_state(encoder)) {  /* fields: no attribute lookup */
    EncoderState* state = (EncoderState*)encoder;
    *cpu = state->cpu_rows;
    *cuda = raw_stream != NULL ? state->cuda_rows : NULL;
    Py_XINCREF(*cpu);
    Py_XINCREF(*cuda);
  } else if (optional_attr(encoder, s_cpu_rows, cpu) < 0 ||
             (raw_stream != NULL && optional_attr(encoder, s_cuda_rows, cuda) < 0)) {
    Py_CLEAR(*cpu);
    return -1;
  }
  if (*cpu != NULL && !health_api->is_rows(*cpu)) Py_CLEAR(*cpu);
  if (*cuda != NULL && !health_api->is_device_rows(*cuda)) Py_CLEAR(*cuda);
  return 0;
}

/* The meta tuples made so far, by dtype number, device and sizes: a model's
 * outputs come in few shapes, and an output of a kept shape gets the kept tuple
 * (no shape tuple, sizes and meta made and freed per traced op). Direct-mapped;
 * tuples are values, so a kept one serves any later session. */
enum { META_MEMO_SIZE = 64, META_MEMO_DIMS = 6 };
typedef struct {
  PyObject* meta;    /* (number, shape, where), or NULL */
  PyObject* number;  /* the dtype number, compared by address (dtype_number keeps them) */
  int where;
  Py_ssize_t ndim;
  int64_t sizes[META_MEMO_DIMS];
} MetaMemo;
static MetaMemo meta_memo[META_MEMO_SIZE];

static MetaMemo* meta_slot(PyObject* number, int where, const TbnFacts* f) {
  uint64_t h = (uint64_t)(uintptr_t)number * 0x9E3779B97F4A7C15ull ^ (uint64_t)(where + 1);
  for (Py_ssize_t i = 0; i < f->ndim; i++) h = (h ^ (uint64_t)f->sizes[i]) * 0x100000001B3ull;
  return &meta_memo[(h >> 32) % META_MEMO_SIZE];
}

static int meta_matches(const MetaMemo* m, PyObject* number, int where, const TbnFacts* f) {
  if (m->meta == NULL || m->number != number || m->where != where || m->ndim != f->ndim)
    return 0;
  for (Py_ssize_t i = 0; i < f->ndim; i++)
    if (m->sizes[i] != f->sizes[i]) return 0;
  return 1;
}

/* A plain tuple of the sizes in `f` (not a torch.Size: the record holding it
 * can leave the collector). */
static PyObject* shape_tuple(const TbnFacts* f) {
  if (f->shape != NULL) return untracked(Py_NewRef(f->shape));
  PyObject* shape = PyTuple_New(f->ndim);
  for (Py_ssize_t i = 0; shape != NULL && i < f->ndim; i++) {
    PyObject* size = PyLong_FromLongLong(f->sizes[i]);
    if (size == NULL) Py_CLEAR(shape);
    else PyTuple_SET_ITEM(shape, i, size);
  }
  return untracked(shape);
}

/* The meta of a traced tensor, (DataType number, shape, device id or -1): a new
 * reference, kept in the memo when its sizes came from the native facts. */
static PyObject* meta_of(PyObject* number, const TbnFacts* f) {
  int where = f->cuda ? f->device : -1;
  int kept = f->shape == NULL && f->ndim <= META_MEMO_DIMS;
  MetaMemo* m = kept ? meta_slot(number, where, f) : NULL;
  if (m != NULL && meta_matches(m, number, where, f)) return Py_NewRef(m->meta);
  PyObject* shape = shape_tuple(f);
  PyObject* device = shape == NULL ? NULL
                     : f->cuda ? PyLong_FromLong(f->device) : Py_NewRef(minus_one);
  PyObject* meta = device ? untracked(PyTuple_Pack(3, number, shape, device)) : NULL;
  Py_XDECREF(shape);
  Py_XDECREF(device);
  if (m != NULL && meta != NULL) {
    Py_XSETREF(m->meta, Py_NewRef(meta));
    m->number = number;  /* held by the meta */
    m->where = where;
    m->ndim = f->ndim;
    memcpy(m->sizes, f->sizes, (size_t)f->ndim * sizeof(int64_t));
  }
  return meta;
}

/* The token and meta of `t` computed in C, into *payload and *meta (new
 * references): 1; 0 when the C path does not take it; -1 on error. */
static int c_parts(PyObject* encoder, PyObject* t, PyObject* device, PyObject* dtype,
                   PyObject** payload, PyObject** meta) {
  PyObject *code = NULL, *cpu = NULL, *cuda = NULL, *number = NULL, *token = NULL;
  TbnFacts f = {NULL, 0, NULL, 0, -1, NULL, 0};
  int status = -1;
  if (usable_rows(encoder, &cpu, &cuda) < 0) return -1;
  if (cpu == NULL && cuda == NULL) return 0;
  if ((code = memo_lookup(code_memo, CODE_MEMO_SIZE, c_codes, dtype)) == NULL) {
    status = PyErr_Occurred() ? -1 : 0;
    goto done;
  }
  long dtype_code = PyLong_AsLong(code);
  if (dtype_code == -1 && PyErr_Occurred()) goto done;
  int taken = native_api != NULL ? native_api->facts(t, &f) : python_facts(t, device, &f);
  PyObject* rows = f.cuda ? cuda : cpu;
  if (taken <= 0 || rows == NULL) {
    status = taken < 0 ? -1 : 0;
    goto done;
  }
  if ((status = add_row(rows, &f, (int)dtype_code, &token)) <= 0) goto done;
  status = -1;
  if ((number = dtype_number(dtype)) == NULL) goto done;
  if ((*meta = meta_of(number, &f)) == NULL) goto done;
  *payload = token;  /* made out of the collector's sight (_health.h, TbnTokens) */
  token = NULL;
  status = 1;
done:
  Py_XDECREF(code); Py_XDECREF(cpu); Py_XDECREF(cuda); Py_XDECREF(f.shape);
  Py_XDECREF(number); Py_XDECREF(token);
  return status;
}

/* Encoder.payload(t, device) into *payload and *meta (new references), in C
 * when it can be: 0, or -1 on error. */
int payload_parts(PyObject* encoder, PyObject* t, PyObject* device, PyObject* dtype,
                  PyObject** payload, PyObject** meta) {
  if (health_api != NULL) {
    int taken = c_parts(encoder, t, device, dtype, payload, meta);
    if (taken != 0) return taken < 0 ? -1 : 0;
  }
  PyObject* pair = PyObject_CallMethodObjArgs(encoder, s_payload, t, device, NULL);
  if (pair != NULL && (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2)) {
    PyErr_SetString(PyExc_TypeError, "Encoder.payload must return (payload, meta)");
    Py_CLEAR(pair);
  }
  if (pair == NULL) return -1;
  *payload = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
  *meta = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
  Py_DECREF(pair);
  return 0;
}

/* payload(encoder, tensor, device, dtype) -> (payload, meta): _record.payload */
PyObject* payload_entry(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "payload() takes exactly 4 arguments");
    return NULL;
  }
  PyObject *payload, *meta;
  if (payload_parts(args[0], args[1], args[2], args[3], &payload, &meta) < 0) return NULL;
  PyObject* pair = PyTuple_Pack(2, payload, meta);
  Py_DECREF(payload);
  Py_DECREF(meta);
  return pair;
}
