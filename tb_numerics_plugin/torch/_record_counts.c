/* _record.Counts: a segment's op-name counters (Segment._counters: name prefix ->
 * names handed out), counted in place (part of _record.c's extension).
 *
 * A dict of ints took a lookup, a new int and a store per recorded op (about 400
 * instructions a tight-loop op, callgrind); here the op's count is one probe of an
 * open-addressed table and an increment. Python's Segment.op_name (the Python
 * recorder's) reads and writes it as the dict it replaces: get(), [key], [key] =
 * count, len(), items(), and == compares it with a dict of the same items. */
#include "_record.h"

typedef struct {
  PyObject* key;  /* NULL: a free slot */
  Py_hash_t hash;
  Py_ssize_t count;
} CountSlot;

typedef struct {
  PyObject_HEAD
  CountSlot* slots;
  Py_ssize_t size, used;  /* size: 0 or a power of two, kept over twice `used` */
} Counts;

/* The slot of `key`, or the free slot where it would go; NULL with an exception set. */
static CountSlot* find(Counts* c, PyObject* key, Py_hash_t hash) {
  size_t mask = (size_t)c->size - 1;
  for (size_t i = (size_t)hash & mask;; i = (i + 1) & mask) {
    CountSlot* s = &c->slots[i];
    if (s->key == NULL || s->key == key) return s;
    if (s->hash != hash) continue;
    int same = PyObject_RichCompareBool(s->key, key, Py_EQ);
    if (same != 0) return same < 0 ? NULL : s;
  }
}

/* Doubles the table (from 8): -1 with an exception set. */
static int grow(Counts* c) {
  Py_ssize_t size = c->size ? c->size * 2 : 8;
  CountSlot* old = c->slots;
  Py_ssize_t old_size = c->size;
  if ((c->slots = PyMem_Calloc((size_t)size, sizeof(CountSlot))) == NULL) {
    c->slots = old;
    PyErr_NoMemory();
    return -1;
  }
  c->size = size;
  for (Py_ssize_t i = 0; i < old_size; i++) {
    if (old[i].key == NULL) continue;
    size_t j = (size_t)old[i].hash & (size_t)(size - 1);
    while (c->slots[j].key != NULL) j = (j + 1) & (size_t)(size - 1);
    c->slots[j] = old[i];
  }
  PyMem_Free(old);
  return 0;
}

/* The slot of `key`, made (count 0) when `make` and it has none; NULL when it has
 * none and `make` is 0, or with an exception set. Keys are exact strs: comparing
 * two runs no Python code, which could change the table while it is probed. */
static CountSlot* slot_of(Counts* c, PyObject* key, int make) {
  if (!PyUnicode_CheckExact(key)) {
    if (make) PyErr_Format(PyExc_TypeError, "Counts: a prefix is a str, not %.100s",
                           Py_TYPE(key)->tp_name);
    return NULL;
  }
  Py_hash_t hash = PyObject_Hash(key);
  if (hash == -1 || (c->size == 0 && (!make || grow(c) < 0))) return NULL;
  CountSlot* s = find(c, key, hash);
  if (s == NULL || s->key != NULL) return s;
  if (!make) return NULL;
  if (2 * (c->used + 1) > c->size && (grow(c) < 0 || (s = find(c, key, hash)) == NULL))
    return NULL;
  s->key = Py_NewRef(key);
  s->hash = hash;
  s->count = 0;
  c->used++;
  return s;
}

Py_ssize_t counts_next(PyObject* counts, PyObject* key) {
  CountSlot* s = slot_of((Counts*)counts, key, 1);
  return s == NULL ? -1 : s->count++;
}

PyObject* counts_new(void) { return PyType_GenericNew(&CountsType, NULL, NULL); }

static void counts_dealloc(PyObject* self) {
  Counts* c = (Counts*)self;
  for (Py_ssize_t i = 0; i < c->size; i++) Py_XDECREF(c->slots[i].key);
  PyMem_Free(c->slots);
  Py_TYPE(self)->tp_free(self);
}

/* ---- as Python sees it: the dict it replaces ----------------------------------------- */

static PyObject* counts_get(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  if (n < 1 || n > 2) {
    PyErr_SetString(PyExc_TypeError, "get(key, default=None) takes 1 or 2 arguments");
    return NULL;
  }
  CountSlot* s = slot_of((Counts*)self, args[0], 0);
  if (s != NULL) return PyLong_FromSsize_t(s->count);
  if (PyErr_Occurred()) return NULL;
  return Py_NewRef(n == 2 ? args[1] : Py_None);
}

static PyObject* counts_subscript(PyObject* self, PyObject* key) {
  CountSlot* s = slot_of((Counts*)self, key, 0);
  if (s != NULL) return PyLong_FromSsize_t(s->count);
  if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
  return NULL;
}

static int counts_assign(PyObject* self, PyObject* key, PyObject* value) {
  if (value == NULL) {
    PyErr_SetString(PyExc_TypeError, "Counts: a prefix's count cannot be deleted");
    return -1;
  }
  Py_ssize_t count = PyLong_AsSsize_t(value);
  if (count == -1 && PyErr_Occurred()) return -1;
  if (count < 0) {
    PyErr_Format(PyExc_ValueError, "Counts: a prefix's count must be 0 or more, not %zd", count);
    return -1;
  }
  CountSlot* s = slot_of((Counts*)self, key, 1);
  if (s == NULL) return -1;
  s->count = count;
  return 0;
}

static Py_ssize_t counts_length(PyObject* self) { return ((Counts*)self)->used; }

/* [(prefix, count), ...] */
static PyObject* counts_items(PyObject* self, PyObject* unused) {
  Counts* c = (Counts*)self;
  PyObject* items = PyList_New(0);
  for (Py_ssize_t i = 0; items != NULL && i < c->size; i++) {
    if (c->slots[i].key == NULL) continue;
    PyObject* item = Py_BuildValue("(On)", c->slots[i].key, c->slots[i].count);
    if (item == NULL || PyList_Append(items, item) < 0) Py_CLEAR(items);
    Py_XDECREF(item);
  }
  return items;
}

/* == and != against a Counts or a dict: the same items. */
static PyObject* counts_compare(PyObject* self, PyObject* other, int op) {
  if ((op != Py_EQ && op != Py_NE) || !(PyDict_Check(other) || Py_IS_TYPE(other, &CountsType)))
    Py_RETURN_NOTIMPLEMENTED;
  PyObject *mine = counts_items(self, NULL), *a = NULL, *b = NULL, *result = NULL;
  PyObject* theirs = PyDict_Check(other) ? Py_NewRef(other) : counts_items(other, NULL);
  if (mine != NULL && theirs != NULL && (a = PyDict_New()) != NULL &&
      PyDict_MergeFromSeq2(a, mine, 1) == 0) {
    b = PyDict_Check(theirs) ? Py_NewRef(theirs) : PyDict_New();
    if (b != NULL && (b == theirs || PyDict_MergeFromSeq2(b, theirs, 1) == 0))
      result = PyObject_RichCompare(a, b, op);
  }
  Py_XDECREF(mine); Py_XDECREF(theirs); Py_XDECREF(a); Py_XDECREF(b);
  return result;
}

static PyMappingMethods counts_mapping = {counts_length, counts_subscript, counts_assign};

static PyMethodDef counts_methods[] = {
    {"get", (PyCFunction)(void (*)(void))counts_get, METH_FASTCALL,
     "get(prefix, default=None) -> the names counted for it"},
    {"items", counts_items, METH_NOARGS, "items() -> [(prefix, count), ...]"},
    {NULL, NULL, 0, NULL}};

PyTypeObject CountsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tb_numerics_plugin.torch._record.Counts",
    .tp_basicsize = sizeof(Counts),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Counts(): a segment's op-name counters, prefix -> names counted (a dict's\n"
              "get, [key], [key] = count, len, items and ==).",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = counts_dealloc,
    .tp_as_mapping = &counts_mapping,
    .tp_methods = counts_methods,
    .tp_richcompare = counts_compare,
    .tp_hash = PyObject_HashNotImplemented,
};
