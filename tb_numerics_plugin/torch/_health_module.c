/* The _health module: its stats() entry, the argument and level checks its
 * types share (HostRows, CudaKernels, DeviceRows), and its init. The kernels
 * are _health.c's. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_health.h"

/* The (data_ptr, count, dtype_code) in args[0..2] and the level in
 * args[level_at] of stats() and HostRows.add(); -1 with an exception set. */
int tbn_health_args(PyObject *const *args, int level_at, const void **data, Py_ssize_t *n,
                    long *code, long *level) {
    *data = (const void *)(uintptr_t)PyLong_AsUnsignedLongLong(args[0]);
    *n = PyLong_AsSsize_t(args[1]);
    *code = PyLong_AsLong(args[2]);
    *level = PyLong_AsLong(args[level_at]);
    if (PyErr_Occurred())
        return -1;
    if (*n < 0 || *level < LEVEL_COUNTS || *level > LEVEL_MOMENTS) {
        PyErr_SetString(PyExc_ValueError, "negative count or unknown level");
        return -1;
    }
    return 0;
}

int tbn_add_type(PyObject *module, const char *name, PyTypeObject *type) {
    if (PyType_Ready(type) < 0)
        return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

int tbn_set_level(PyObject *value, const char *what, int *level) {
    long got = value ? PyLong_AsLong(value) : -1;
    if (got == -1 && PyErr_Occurred())
        return -1;
    if (got < LEVEL_COUNTS || got > LEVEL_MOMENTS) {
        PyErr_Format(PyExc_ValueError, "%s.level: unknown level", what);
        return -1;
    }
    *level = (int)got;
    return 0;
}

PyDoc_STRVAR(stats_doc,
"stats(data_ptr, count, dtype_code, out_ptr, level)\n--\n\n"
"Writes 12 float64 health values of `count` elements at `data_ptr` into\n"
"`out_ptr`. dtype_code: 0 float32, 1 float64, 2 float16, 3 bfloat16.\n"
"level: 0 counts only (slots 6-11 keep their empty values), 1 also\n"
"extrema and sum, 2 also squared deviations.\n"
"Raises ValueError for an unknown dtype code or level, or a negative count.");

static PyObject *stats(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "stats() takes exactly 5 arguments");
        return NULL;
    }
    const void *data;
    Py_ssize_t n;
    long code, level;
    uintptr_t outp = (uintptr_t)PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred() || tbn_health_args(args, 4, &data, &n, &code, &level) < 0)
        return NULL;
    if (tbn_health_of(data, n, code, (int)level, (double *)outp) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"stats", (PyCFunction)(void (*)(void))stats, METH_FASTCALL, stats_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_health",
    "Vectorized health statistics of raw float buffers (see _health.c).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__health(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "RAW_WIDTH", RAW_WIDTH) < 0 || tbn_add_rows_type(m) < 0 ||
        tbn_add_cuda_type(m) < 0 || tbn_add_device_rows_type(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
