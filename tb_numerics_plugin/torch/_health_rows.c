/* _health.HostRows: a preallocated block of float64 health rows on the host,
 * filled in place one tensor at a time (part of the _health extension).
 *
 * kernels.HealthBatch keeps one for CPU tensors. From Python, add() fills the
 * next row; the rows are read as a buffer (numpy.frombuffer: capacity *
 * RAW_WIDTH doubles). The recorder (_record) fills rows through the C API of
 * _health.h instead, at the rows' `level`, when the batch has registered them
 * (`block` >= 0, the index of the rows among the batch's blocks): one C call
 * per traced tensor where Python's Encoder.payload made five. */
#include "_health.h"

#include <structmember.h>

typedef struct {
  PyObject_HEAD
  double* data;
  Py_ssize_t capacity, used, block;
  int level;
  TbnTokens tokens;
} HostRows;

static PyTypeObject HostRowsType;

/* Reserves the next row (before the kernel runs, which may release the GIL) and
 * computes it; -1 with an exception set on a bad dtype code. */
static Py_ssize_t fill(HostRows* r, const void* data, Py_ssize_t n, long code, int level) {
  Py_ssize_t row = r->used++;
  if (tbn_health_of(data, n, code, level, r->data + row * RAW_WIDTH) < 0) {
    r->used = row;
    return -1;
  }
  return row;
}

static int rows_check(PyObject* obj) { return Py_IS_TYPE(obj, &HostRowsType); }

static int rows_add(PyObject* obj, const void* data, Py_ssize_t n, int code, PyObject** token) {
  HostRows* r = (HostRows*)obj;
  if (r->block < 0 || r->used >= r->capacity) return 0;
  Py_ssize_t row = fill(r, data, n, code, r->level);
  if (row < 0) return -1;
  *token = tbn_token(&r->tokens, r->block, row);
  return *token == NULL ? -1 : 1;
}

/* The (block, row) tuple of a filled row, as HealthBatch.add returns it. */
static PyObject* row_token(Py_ssize_t block, Py_ssize_t row) {
  PyObject* b = PyLong_FromSsize_t(block);
  PyObject* index = b ? PyLong_FromSsize_t(row) : NULL;
  PyObject* token = index ? PyTuple_Pack(2, b, index) : NULL;  /* Py_BuildValue parses */
  Py_XDECREF(b);
  Py_XDECREF(index);
  if (token != NULL) PyObject_GC_UnTrack(token);  /* ints only: no cycle through it */
  return token;
}

void tbn_tokens_init(TbnTokens* tokens, Py_ssize_t capacity) {
  tokens->kept = NULL;
  tokens->capacity = capacity;
  tokens->block = -1;
}

void tbn_tokens_clear(TbnTokens* tokens) {
  for (Py_ssize_t i = 0; tokens->kept != NULL && i < tokens->capacity; i++)
    Py_CLEAR(tokens->kept[i]);
}

PyObject* tbn_token(TbnTokens* tokens, Py_ssize_t block, Py_ssize_t row) {
  if (row < 0 || row >= tokens->capacity) return row_token(block, row);
  if (tokens->kept == NULL) {
    tokens->kept = PyMem_Calloc((size_t)tokens->capacity, sizeof(PyObject*));
    if (tokens->kept == NULL) return PyErr_NoMemory();
  }
  if (block != tokens->block) {
    tbn_tokens_clear(tokens);
    tokens->block = block;
  }
  PyObject** slot = &tokens->kept[row];
  if (*slot == NULL) *slot = row_token(block, row);
  return *slot == NULL ? NULL : Py_NewRef(*slot);
}

static const TbnHealthApi api = {rows_check, rows_add, tbn_is_device_rows, tbn_device_rows_add};

static PyObject* rows_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static char* names[] = {"capacity", NULL};
  Py_ssize_t capacity;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n:HostRows", names, &capacity)) return NULL;
  if (capacity <= 0 || capacity > PY_SSIZE_T_MAX / (RAW_WIDTH * (Py_ssize_t)sizeof(double))) {
    PyErr_Format(PyExc_ValueError, "HostRows: capacity must be positive, not %zd", capacity);
    return NULL;
  }
  HostRows* r = (HostRows*)type->tp_alloc(type, 0);
  if (r == NULL) return NULL;
  r->data = PyMem_Calloc((size_t)capacity * RAW_WIDTH, sizeof(double));
  if (r->data == NULL) {
    Py_DECREF(r);
    return PyErr_NoMemory();
  }
  r->capacity = capacity;
  r->block = -1;
  r->level = LEVEL_MOMENTS;
  tbn_tokens_init(&r->tokens, capacity);
  return (PyObject*)r;
}

static void rows_dealloc(HostRows* r) {
  tbn_tokens_clear(&r->tokens);
  PyMem_Free(r->tokens.kept);
  PyMem_Free(r->data);
  Py_TYPE(r)->tp_free((PyObject*)r);
}

static PyObject* rows_add_py(HostRows* r, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "HostRows.add() takes exactly 4 arguments");
    return NULL;
  }
  const void* data;
  Py_ssize_t n;
  long code, level;
  if (tbn_health_args(args, 3, &data, &n, &code, &level) < 0) return NULL;
  if (r->used >= r->capacity) {
    PyErr_Format(PyExc_IndexError, "HostRows: all %zd rows are used", r->capacity);
    return NULL;
  }
  Py_ssize_t row = fill(r, data, n, code, (int)level);
  return row < 0 ? NULL : PyLong_FromSsize_t(row);
}

static int rows_getbuffer(HostRows* r, Py_buffer* view, int flags) {
  return PyBuffer_FillInfo(view, (PyObject*)r, r->data,
                           r->capacity * RAW_WIDTH * (Py_ssize_t)sizeof(double), 0, flags);
}

static int set_used(HostRows* r, PyObject* value, void* closure) {
  Py_ssize_t used = value ? PyLong_AsSsize_t(value) : -1;
  if (used == -1 && PyErr_Occurred()) return -1;
  if (used < 0 || used > r->capacity) {
    PyErr_Format(PyExc_ValueError, "HostRows.used must be in 0..%zd", r->capacity);
    return -1;
  }
  r->used = used;
  return 0;
}

static PyObject* get_used(HostRows* r, void* closure) { return PyLong_FromSsize_t(r->used); }

static int set_level(HostRows* r, PyObject* value, void* closure) {
  return tbn_set_level(value, "HostRows", &r->level);
}

static PyObject* get_level(HostRows* r, void* closure) { return PyLong_FromLong(r->level); }

static PyGetSetDef rows_getset[] = {
    {"used", (getter)get_used, (setter)set_used, "rows filled", NULL},
    {"level", (getter)get_level, (setter)set_level, "level of the rows the C API fills", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMemberDef rows_members[] = {
    {"capacity", T_PYSSIZET, offsetof(HostRows, capacity), READONLY, "rows in all"},
    {"block", T_PYSSIZET, offsetof(HostRows, block), 0,
     "index of the rows among their batch's blocks; -1: the C API fills none"},
    {NULL, 0, 0, 0, NULL}};

static PyMethodDef rows_methods[] = {
    {"add", (PyCFunction)(void (*)(void))rows_add_py, METH_FASTCALL,
     "add(data_ptr, count, dtype_code, level) -> row: computes the next row (see stats)."},
    {NULL, NULL, 0, NULL}};

static PyBufferProcs rows_buffer = {(getbufferproc)rows_getbuffer, NULL};

static PyTypeObject HostRowsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tb_numerics_plugin.torch._health.HostRows",
    .tp_basicsize = sizeof(HostRows),
    .tp_dealloc = (destructor)rows_dealloc,
    .tp_as_buffer = &rows_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "HostRows(capacity): float64 health rows filled in place (see _health_rows.c).",
    .tp_methods = rows_methods,
    .tp_members = rows_members,
    .tp_getset = rows_getset,
    .tp_new = rows_new,
};

int tbn_add_rows_type(PyObject* module) {
  if (tbn_add_type(module, "HostRows", &HostRowsType) < 0) return -1;
  PyObject* capsule = PyCapsule_New((void*)&api, TBN_HEALTH_CAPSULE, NULL);
  if (capsule == NULL || PyModule_AddObject(module, "C_API", capsule) < 0) {
    Py_XDECREF(capsule);
    return -1;
  }
  return 0;
}
