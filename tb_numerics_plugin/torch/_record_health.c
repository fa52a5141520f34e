/* What a traced tensor keeps until its segment finishes, its payload and meta
 * (Encoder.payload), computed in C for a dense CPU tensor in a health mode
 * (part of _record.c's extension).
 *
 * The health batch's CPU rows (kernels.HealthBatch, a _health.HostRows) are
 * the encoder's `cpu_rows`; the row is computed into them through _health's C
 * API (_health.h) and the payload is its (block, row) token, as
 * HealthBatch.add returns. Everything else goes to Encoder.payload: other
 * modes, other devices, non-contiguous tensors, rows that are full or not yet
 * registered in the batch (the Python call registers them or starts new rows).
 * configure_health() turns this on; recorder.py calls it when _health was built.
 * Once the native hook is loaded (configure_facts), a tensor's layout, address
 * and sizes come from its at::Tensor (_native_facts.h), without Python calls. */
#include "_record.h"
#include "_health.h"
#include "_native_facts.h"

static const TbnHealthApi* health_api;  /* NULL: every payload from Encoder.payload */
static PyObject* cpu_device;            /* torch.device("cpu") */
static PyObject* c_codes;               /* torch.dtype -> _health's dtype code */
static PyObject *s_cpu_rows, *s_shape, *s_is_contiguous, *s_data_ptr;
static PyObject* minus_one;             /* a host tensor's device id in its meta */
static TbnTensorFacts native_facts;     /* NULL until the native hook is loaded */

/* configure_health(_health.C_API, torch.device("cpu"), {dtype: code}) */
PyObject* configure_health(PyObject* self, PyObject* args) {
  PyObject *capsule, *device, *codes;
  if (!PyArg_ParseTuple(args, "OOO!:configure_health", &capsule, &device, &PyDict_Type,
                        &codes))
    return NULL;
  const TbnHealthApi* api = PyCapsule_GetPointer(capsule, TBN_HEALTH_CAPSULE);
  if (api == NULL) return NULL;
#define NAME(var, text) if (!var && !(var = PyUnicode_InternFromString(text))) return NULL
  NAME(s_cpu_rows, "cpu_rows"); NAME(s_shape, "shape");
  NAME(s_is_contiguous, "is_contiguous"); NAME(s_data_ptr, "data_ptr");
#undef NAME
  if (minus_one == NULL && (minus_one = PyLong_FromLong(-1)) == NULL) return NULL;
  Py_XSETREF(cpu_device, Py_NewRef(device));
  Py_XSETREF(c_codes, Py_NewRef(codes));
  health_api = api;
  Py_RETURN_NONE;
}

PyObject* configure_facts(PyObject* self, PyObject* capsule) {
  TbnTensorFacts facts = (TbnTensorFacts)PyCapsule_GetPointer(capsule, TBN_FACTS_CAPSULE);
  if (facts == NULL) return NULL;
  native_facts = facts;
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

/* Whether the C path takes `t`: 1 with its data address in *data, 0 when it does
 * not (Encoder.payload does), -1 on error. */
static int dense_cpu(PyObject* t, PyObject* device, void** data) {
  int cpu = device == cpu_device ? 1 : PyObject_RichCompareBool(device, cpu_device, Py_EQ);
  if (cpu <= 0) return cpu;
  PyObject* dense = PyObject_CallMethodNoArgs(t, s_is_contiguous);
  int is_dense = dense ? PyObject_IsTrue(dense) : -1;
  Py_XDECREF(dense);
  if (is_dense <= 0) return is_dense;
  PyObject* address = PyObject_CallMethodNoArgs(t, s_data_ptr);
  if (address == NULL) return -1;
  *data = PyLong_AsVoidPtr(address);
  Py_DECREF(address);
  return PyErr_Occurred() ? -1 : 1;
}

/* (token, meta) of `t` computed in C, or NULL: with an exception set on error,
 * without one when the C path does not take it. */
static PyObject* c_pair(PyObject* rows, PyObject* t, PyObject* device, PyObject* dtype) {
  PyObject *code = NULL, *shape = NULL, *number = NULL, *token = NULL, *meta = NULL;
  PyObject* pair = NULL;
  void* data = NULL;
  if ((code = lookup(c_codes, dtype)) == NULL) return NULL;
  long dtype_code = PyLong_AsLong(code);
  Py_DECREF(code);
  if (dtype_code == -1 && PyErr_Occurred()) return NULL;
  Py_ssize_t n;
  if (native_facts != NULL) {  /* shape: a tuple of the sizes, as a torch.Size holds */
    int dense = native_facts(t, (const void**)&data, &n, &shape);
    if (dense <= 0) return NULL;
  } else {
    if (dense_cpu(t, device, &data) <= 0) return NULL;
    if ((shape = PyObject_GetAttr(t, s_shape)) == NULL) return NULL;
    n = numel_of(shape);
  }
  if (n < 0 || health_api->add(rows, data, n, (int)dtype_code, &token) <= 0) goto done;
  number = lookup(cfg.dtype_enum, dtype);
  if (number == NULL && (PyErr_Occurred() || (number = Py_NewRef(zero)) == NULL)) goto done;
  if ((meta = PyTuple_Pack(3, number, shape, minus_one)) != NULL)
    pair = PyTuple_Pack(2, token, meta);
done:
  Py_XDECREF(shape); Py_XDECREF(number); Py_XDECREF(token); Py_XDECREF(meta);
  return pair;
}

/* Encoder.payload(t, device), as a (payload, meta) tuple: in C when it can be. */
PyObject* payload_pair(PyObject* encoder, PyObject* t, PyObject* device, PyObject* dtype) {
  if (health_api != NULL) {
    PyObject* rows = NULL;
    if (optional_attr(encoder, s_cpu_rows, &rows) < 0) return NULL;
    PyObject* pair = rows && health_api->is_rows(rows) ? c_pair(rows, t, device, dtype) : NULL;
    Py_XDECREF(rows);
    if (pair != NULL || PyErr_Occurred()) return pair;
  }
  PyObject* pair = PyObject_CallMethodObjArgs(encoder, s_payload, t, device, NULL);
  if (pair != NULL && (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2)) {
    PyErr_SetString(PyExc_TypeError, "Encoder.payload must return (payload, meta)");
    Py_CLEAR(pair);
  }
  return pair;
}
