/* The health rows a finished segment's encoding reads (part of _record.c's
 * extension): Encoder.fetch_rows' blocks, float64 arrays of RAW_WIDTH columns,
 * read in place through the buffer protocol, and a payload's (block, row)
 * token turned into the address of its row. */
#include "_record.h"
#include "_health.h"

void rows_release(Rows* rows) {
  for (Py_ssize_t i = 0; i < rows->count; i++) PyBuffer_Release(&rows->views[i]);
  PyMem_Free(rows->views);
  rows->views = NULL;
  rows->count = 0;
}

/* Holds a view of each block of `blocks` (a list; None: no blocks) until
 * rows_release, which the caller calls whatever this returns; -1 on error. */
int rows_acquire(PyObject* blocks, Rows* rows) {
  rows->views = NULL;
  rows->count = 0;
  if (blocks == Py_None) return 0;
  if (!PyList_Check(blocks)) {
    PyErr_SetString(PyExc_TypeError, "health rows must be a list of arrays");
    return -1;
  }
  Py_ssize_t n = PyList_GET_SIZE(blocks);
  if (n == 0) return 0;
  if ((rows->views = PyMem_Calloc((size_t)n, sizeof(Py_buffer))) == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    Py_buffer* view = &rows->views[i];
    if (PyObject_GetBuffer(PyList_GET_ITEM(blocks, i), view,
                           PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
      return -1;
    rows->count = i + 1;
    const char* format = view->format ? view->format : "B";
    if (format[0] == '<' || format[0] == '=' || format[0] == '@') format++;
    if (view->ndim != 2 || view->shape[1] != RAW_WIDTH || strcmp(format, "d") != 0) {
      PyErr_Format(PyExc_TypeError, "health rows block %zd is not float64 [n, %d]", i,
                   RAW_WIDTH);
      return -1;
    }
  }
  return 0;
}

/* The row of a health payload, a (block, row) token; NULL with an exception set
 * when the token is not one or points past the rows. */
const double* row_at(const Rows* rows, PyObject* payload) {
  if (!PyTuple_Check(payload) || PyTuple_GET_SIZE(payload) < 2) {
    PyErr_SetString(PyExc_TypeError, "a health payload is (block, row)");
    return NULL;
  }
  Py_ssize_t block = PyLong_AsSsize_t(PyTuple_GET_ITEM(payload, 0));
  Py_ssize_t row = PyLong_AsSsize_t(PyTuple_GET_ITEM(payload, 1));
  if ((block == -1 || row == -1) && PyErr_Occurred()) return NULL;
  if (block < 0 || block >= rows->count || row < 0 || row >= rows->views[block].shape[0]) {
    PyErr_Format(PyExc_IndexError, "health payload (%zd, %zd) is past the fetched rows",
                 block, row);
    return NULL;
  }
  return (const double*)rows->views[block].buf + row * RAW_WIDTH;
}
