/* _health.DeviceRows: the bookkeeping of a block of float64 health rows in CUDA
 * memory, each queued by one launch of the CUDA kernels (part of the _health
 * extension; the memory itself is a torch tensor that kernels.py owns).
 *
 * The twin of HostRows for CUDA tensors: kernels.HealthBatch keeps one for its
 * first CUDA device, add() queues the next row from Python, and the recorder
 * (_record) queues rows through the C API of _health.h while the batch has
 * registered them (`block` >= 0) at `address` (rows that hold the empty row's
 * values: the kernels merge into them) on device ordinal `device`. */
#include "_health.h"

#include <structmember.h>

typedef struct {
  PyObject_HEAD
  PyObject* kernels;  /* a _health.CudaKernels */
  unsigned long long address;
  Py_ssize_t capacity, used, block;
  int level, device;
  TbnTokens tokens;
} DeviceRows;

static PyTypeObject DeviceRowsType;

int tbn_is_device_rows(PyObject* obj) { return Py_IS_TYPE(obj, &DeviceRowsType); }

/* Reserves the next row and queues it; the row's index, or -1 with an exception set. */
static Py_ssize_t queue(DeviceRows* r, const void* data, Py_ssize_t n, int code, int level,
                        void* stream) {
  Py_ssize_t row = r->used;
  unsigned long long at = r->address + (unsigned long long)row * RAW_WIDTH * sizeof(double);
  if (tbn_cuda_launch(r->kernels, data, n, code, level, at, stream, r->device) < 0) return -1;
  r->used = row + 1;
  return row;
}

int tbn_device_rows_add(PyObject* obj, const void* data, Py_ssize_t n, int code, int device,
                        void* stream, PyObject** token) {
  DeviceRows* r = (DeviceRows*)obj;
  if (r->block < 0 || r->used >= r->capacity || r->address == 0 || device != r->device)
    return 0;
  Py_ssize_t row = queue(r, data, n, code, r->level, stream);
  if (row < 0) return -1;
  *token = tbn_token(&r->tokens, r->block, row);
  return *token == NULL ? -1 : 1;
}

static PyObject* rows_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static char* names[] = {"kernels", "capacity", NULL};
  PyObject* kernels;
  Py_ssize_t capacity;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "On:DeviceRows", names, &kernels, &capacity))
    return NULL;
  if (!tbn_is_cuda_kernels(kernels)) {
    PyErr_SetString(PyExc_TypeError, "DeviceRows: kernels must be a _health.CudaKernels");
    return NULL;
  }
  if (capacity <= 0) {
    PyErr_Format(PyExc_ValueError, "DeviceRows: capacity must be positive, not %zd", capacity);
    return NULL;
  }
  DeviceRows* r = (DeviceRows*)type->tp_alloc(type, 0);
  if (r == NULL) return NULL;
  r->kernels = Py_NewRef(kernels);
  r->capacity = capacity;
  r->block = -1;
  r->level = LEVEL_MOMENTS;
  tbn_tokens_init(&r->tokens, capacity);
  return (PyObject*)r;
}

static void rows_dealloc(DeviceRows* r) {
  tbn_tokens_clear(&r->tokens);
  PyMem_Free(r->tokens.kept);
  Py_XDECREF(r->kernels);
  Py_TYPE(r)->tp_free((PyObject*)r);
}

static PyObject* rows_add_py(DeviceRows* r, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "DeviceRows.add() takes exactly 5 arguments");
    return NULL;
  }
  const void* data;
  Py_ssize_t n;
  long code, level;
  if (tbn_health_args(args, 3, &data, &n, &code, &level) < 0) return NULL;
  void* stream = PyLong_AsVoidPtr(args[4]);
  if (PyErr_Occurred()) return NULL;
  if (r->address == 0 || r->used >= r->capacity) {
    PyErr_Format(PyExc_IndexError, "DeviceRows: %s", r->address == 0 ? "no memory given yet"
                 : "all rows are used");
    return NULL;
  }
  Py_ssize_t row = queue(r, data, n, (int)code, (int)level, stream);
  return row < 0 ? NULL : PyLong_FromSsize_t(row);
}

static PyObject* rows_restart(DeviceRows* r, PyObject* args) {
  Py_ssize_t block;
  unsigned long long address;
  int device;
  if (!PyArg_ParseTuple(args, "nKi:restart", &block, &address, &device)) return NULL;
  if (device < 0 || (block >= 0 && address == 0)) {
    PyErr_SetString(PyExc_ValueError, "DeviceRows.restart: a negative device, or no memory");
    return NULL;
  }
  r->used = 0;
  r->block = block;
  r->address = address;
  r->device = device;
  Py_RETURN_NONE;
}

static PyObject* get_used(DeviceRows* r, void* closure) { return PyLong_FromSsize_t(r->used); }

static int set_level(DeviceRows* r, PyObject* value, void* closure) {
  return tbn_set_level(value, "DeviceRows", &r->level);
}

static PyObject* get_level(DeviceRows* r, void* closure) { return PyLong_FromLong(r->level); }

static PyGetSetDef rows_getset[] = {
    {"used", (getter)get_used, NULL, "rows queued", NULL},
    {"level", (getter)get_level, (setter)set_level, "level of the rows the C API queues", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMemberDef rows_members[] = {
    {"capacity", T_PYSSIZET, offsetof(DeviceRows, capacity), READONLY, "rows in all"},
    {"block", T_PYSSIZET, offsetof(DeviceRows, block), READONLY,
     "index of the rows among their batch's blocks; -1: the C API queues none"},
    {"device", T_INT, offsetof(DeviceRows, device), READONLY, "CUDA device ordinal"},
    {NULL, 0, 0, 0, NULL}};

static PyMethodDef rows_methods[] = {
    {"add", (PyCFunction)(void (*)(void))rows_add_py, METH_FASTCALL,
     "add(data_ptr, count, dtype_code, level, stream) -> row: queues the next row."},
    {"restart", (PyCFunction)rows_restart, METH_VARARGS,
     "restart(block, address, device): no row used; registered as `block` (-1: none) with "
     "rows at device address `address` (holding empty rows) on CUDA device `device`."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject DeviceRowsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tb_numerics_plugin.torch._health.DeviceRows",
    .tp_basicsize = sizeof(DeviceRows),
    .tp_dealloc = (destructor)rows_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "DeviceRows(kernels, capacity): health rows queued on a CUDA device "
              "(see _health_device.c).",
    .tp_methods = rows_methods,
    .tp_members = rows_members,
    .tp_getset = rows_getset,
    .tp_new = rows_new,
};

int tbn_add_device_rows_type(PyObject* module) {
  return tbn_add_type(module, "DeviceRows", &DeviceRowsType);
}
