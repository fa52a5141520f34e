/* The forward ops the autograd nodes of a session came from (capture.Session's
 * ForwardOps, part of _record.c's extension): a node's sequence number -> the
 * op's name, its stack ids and its first output's tensor id, remembered by each
 * recorded forward op and read by the backward ops of its node (their scope
 * "backward/<forward op>", their call site) and by the loss check (stop.py).
 *
 * A table indexed by the sequence number's low bits (a thread's autograd
 * counter only grows), each slot checked against the number it holds: no
 * Python int, tuple or dict entry per forward op (a dict took about 700
 * instructions of a recorded forward op, callgrind, tight loop). It grows by
 * doubling from FIRST_SIZE (or less) while the entry a new one would replace is among
 * the newest `limit` numbers, up to `limit` rounded up to a power of two, and
 * then replaces it: the nodes of the newest `limit` sequence numbers are kept
 * (older ones as long as no newer one took their slot). recorder.PyForwardOps
 * is its twin where the extension is missing. */
#include "_record.h"

#define FIRST_SIZE 1024

static void drop(Forward* f) {
  Py_CLEAR(f->name);
  Py_CLEAR(f->stack_ids);
}

/* Doubles the table: an entry's slot is its old one or that plus the old size,
 * so no two meet. */
static int grow(ForwardOps* self) {
  Py_ssize_t size = self->size ? self->size * 2 : FIRST_SIZE < self->limit ? FIRST_SIZE
                                                                          : self->limit;
  Forward* slots = PyMem_Calloc((size_t)size, sizeof(Forward));
  if (slots == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < self->size; i++)
    if (self->slots[i].name != NULL) slots[self->slots[i].seq & (size - 1)] = self->slots[i];
  PyMem_Free(self->slots);
  self->slots = slots;
  self->size = size;
  return 0;
}

int forward_remember(ForwardOps* self, long long seq, PyObject* name, PyObject* stack_ids,
                     long long first_id) {
  if (seq < 0) return 0;
  for (;;) {
    if (self->size == 0 && grow(self) < 0) return -1;
    Forward* f = &self->slots[seq & (self->size - 1)];
    if (f->name != NULL && f->seq == seq) return 0;  /* the node's first op made it */
    if (f->name == NULL || self->size >= self->limit || seq < f->seq ||
        seq - f->seq >= self->limit) {
      drop(f);
      f->seq = seq;
      f->name = Py_NewRef(name);
      f->stack_ids = Py_NewRef(stack_ids);
      f->first_id = first_id;
      return 0;
    }
    if (grow(self) < 0) return -1;
  }
}

const Forward* forward_op(const ForwardOps* self, long long seq) {
  if (self->size == 0 || seq < 0) return NULL;
  const Forward* f = &self->slots[seq & (self->size - 1)];
  return f->name != NULL && f->seq == seq ? f : NULL;
}

static void forget_all(ForwardOps* self) {
  for (Py_ssize_t i = 0; i < self->size; i++) drop(&self->slots[i]);
  PyMem_Free(self->slots);
  self->slots = NULL;
  self->size = 0;
}

/* ---- as Python sees it --------------------------------------------------------------- */

/* A sequence number from Python, -1 for one past a long long (AccumulateGrad's
 * nodes carry UINT64_MAX, no forward op's); -2 with an error. */
static long long seq_of(PyObject* number) {
  int overflow;
  long long seq = PyLong_AsLongLongAndOverflow(number, &overflow);
  if (seq == -1 && PyErr_Occurred()) return -2;
  return overflow ? -1 : seq;
}

static PyObject* forward_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  Py_ssize_t limit;
  static char* keywords[] = {"limit", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n:ForwardOps", keywords, &limit)) return NULL;
  if (limit < 1) {
    PyErr_SetString(PyExc_ValueError, "ForwardOps: limit must be at least 1");
    return NULL;
  }
  ForwardOps* self = (ForwardOps*)type->tp_alloc(type, 0);
  if (self == NULL) return NULL;
  self->limit = 1;
  while (self->limit < limit) self->limit *= 2;
  return (PyObject*)self;
}

static void forward_dealloc(PyObject* self) {
  forget_all((ForwardOps*)self);
  Py_TYPE(self)->tp_free(self);
}

static PyObject* forward_py_remember(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  if (n != 4) {
    PyErr_SetString(PyExc_TypeError,
                    "remember(seq, op_name, stack_ids, first_tensor_id) takes 4 arguments");
    return NULL;
  }
  long long seq = seq_of(args[0]);
  if (seq == -2) return NULL;
  long long first_id = PyLong_AsLongLong(args[3]);
  if (first_id == -1 && PyErr_Occurred()) return NULL;
  if (forward_remember((ForwardOps*)self, seq, args[1], args[2], first_id) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject* forward_py_get(PyObject* self, PyObject* arg) {
  long long seq = seq_of(arg);
  if (seq == -2) return NULL;
  const Forward* f = forward_op((ForwardOps*)self, seq);
  if (f == NULL) Py_RETURN_NONE;
  return Py_BuildValue("(OOL)", f->name, f->stack_ids, f->first_id);
}

static PyObject* forward_py_clear(PyObject* self, PyObject* unused) {
  forget_all((ForwardOps*)self);
  Py_RETURN_NONE;
}

static PyMethodDef forward_methods[] = {
    {"remember", (PyCFunction)(void (*)(void))forward_py_remember, METH_FASTCALL,
     "remember(seq, op_name, stack_ids, first_tensor_id): the forward op of node `seq`,\n"
     "unless one is remembered for it"},
    {"get", forward_py_get, METH_O,
     "get(seq) -> (op_name, stack_ids, first_tensor_id) of node `seq`, or None"},
    {"clear", forward_py_clear, METH_NOARGS, "clear(): forgets every node"},
    {NULL, NULL, 0, NULL}};

PyTypeObject ForwardOpsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tb_numerics_plugin.torch._record.ForwardOps",
    .tp_basicsize = sizeof(ForwardOps),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ForwardOps(limit): the forward ops of a session's autograd nodes, by sequence\n"
              "number (capture.Session._seq_ops); the newest `limit` numbers kept.",
    .tp_methods = forward_methods,
    .tp_new = forward_new,
    .tp_dealloc = forward_dealloc,
};
