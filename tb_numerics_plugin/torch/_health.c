/* Single-pass numeric health of a contiguous float buffer.
 *
 * Plain CPython C API, no torch headers: the caller passes the address of the
 * tensor's data (tensor.data_ptr()), an element count, a dtype code and the
 * address of a float64 output row. The caller guarantees both buffers are
 * contiguous, on the host and alive for the call.
 *
 * Never build this with -ffast-math: it lets the compiler assume there is no
 * NaN or Inf, which is exactly what this code counts. The loops use explicit
 * ternaries instead of branches so gcc can if-convert and vectorize them.
 *
 * Output row (RAW_WIDTH doubles):
 *   0 n_neg_inf, 1 n_pos_inf, 2 n_nan, 3 n_neg, 4 n_zero, 5 n_pos
 *   (neg/zero/pos count finite elements only),
 *   6 min, 7 max (finite elements; +inf/-inf when there is none),
 *   8 abs_min_nonzero (+inf when no finite nonzero element),
 *   9 abs_max (finite elements; -1 when there is none),
 *   10 sum of finite elements, 11 sum of squared deviations from their mean
 *   (only computed when want_moments is true, else 0).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define RAW_WIDTH 12

enum { DT_F32 = 0, DT_F64 = 1, DT_F16 = 2, DT_BF16 = 3 };

static float half_table[65536];

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    float f;
    if (exp == 0) {
        /* zero or subnormal: value = man * 2^-24, exact in float */
        f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    if (exp == 31)
        bits = sign | 0x7f800000u | (man << 13);
    else
        bits = sign | ((exp + 112) << 23) | (man << 13);
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float bf16_load(const uint16_t *p, Py_ssize_t i) {
    uint32_t bits = (uint32_t)p[i] << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* One pass over counts, extrema and the sum; a second pass (optional) for the
 * squared deviations, which is more accurate than summing squares. */
#define HEALTH_LOOPS(T, LOAD)                                                   \
    do {                                                                        \
        int64_t nni = 0, npi = 0, nnan = 0, nneg = 0, nzero = 0, npos = 0;      \
        T mn = (T)INFINITY, mx = (T)-INFINITY, amn = (T)INFINITY, amx = (T)-1;  \
        double sum = 0.0;                                                       \
        for (Py_ssize_t i = 0; i < n; i++) {                                    \
            T x = LOAD;                                                         \
            int fin = (x - x) == 0;                                             \
            T a = x < 0 ? -x : x;                                               \
            nni += (x == (T)-INFINITY) ? 1 : 0;                                 \
            npi += (x == (T)INFINITY) ? 1 : 0;                                  \
            nnan += (x != x) ? 1 : 0;                                           \
            nneg += (fin && x < 0) ? 1 : 0;                                     \
            nzero += (x == 0) ? 1 : 0;                                          \
            npos += (fin && x > 0) ? 1 : 0;                                     \
            mn = (fin && x < mn) ? x : mn;                                      \
            mx = (fin && x > mx) ? x : mx;                                      \
            amn = (fin && a > 0 && a < amn) ? a : amn;                          \
            amx = (fin && a > amx) ? a : amx;                                   \
            sum += fin ? (double)x : 0.0;                                       \
        }                                                                       \
        double ssd = 0.0;                                                       \
        int64_t nfin = nneg + nzero + npos;                                     \
        if (want_moments && nfin > 0) {                                         \
            double mean = sum / (double)nfin;                                   \
            for (Py_ssize_t i = 0; i < n; i++) {                                \
                T x = LOAD;                                                     \
                int fin = (x - x) == 0;                                         \
                double d = fin ? (double)x - mean : 0.0;                        \
                ssd += d * d;                                                   \
            }                                                                   \
        }                                                                       \
        out[0] = (double)nni; out[1] = (double)npi; out[2] = (double)nnan;      \
        out[3] = (double)nneg; out[4] = (double)nzero; out[5] = (double)npos;   \
        out[6] = (double)mn; out[7] = (double)mx; out[8] = (double)amn;         \
        out[9] = (double)amx; out[10] = sum; out[11] = ssd;                     \
    } while (0)

static void health_f32(const float *p, Py_ssize_t n, int want_moments, double *out) {
    HEALTH_LOOPS(float, p[i]);
}

static void health_f64(const double *p, Py_ssize_t n, int want_moments, double *out) {
    HEALTH_LOOPS(double, p[i]);
}

static void health_f16(const uint16_t *p, Py_ssize_t n, int want_moments, double *out) {
    HEALTH_LOOPS(float, half_table[p[i]]);
}

static void health_bf16(const uint16_t *p, Py_ssize_t n, int want_moments, double *out) {
    HEALTH_LOOPS(float, bf16_load(p, i));
}

PyDoc_STRVAR(stats_doc,
"stats(data_ptr, count, dtype_code, out_ptr, want_moments)\n--\n\n"
"Writes 12 float64 health values of `count` elements at `data_ptr` into\n"
"`out_ptr`. dtype_code: 0 float32, 1 float64, 2 float16, 3 bfloat16.\n"
"Raises ValueError for an unknown dtype code or a negative count.");

static PyObject *stats(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "stats() takes exactly 5 arguments");
        return NULL;
    }
    uintptr_t data = (uintptr_t)PyLong_AsUnsignedLongLong(args[0]);
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    long code = PyLong_AsLong(args[2]);
    uintptr_t outp = (uintptr_t)PyLong_AsUnsignedLongLong(args[3]);
    int want = PyObject_IsTrue(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "negative count");
        return NULL;
    }
    double *out = (double *)outp;
    /* Releasing the GIL costs more than a small tensor's loop. */
    PyThreadState *ts = n > (1 << 16) ? PyEval_SaveThread() : NULL;
    switch (code) {
    case DT_F32: health_f32((const float *)data, n, want, out); break;
    case DT_F64: health_f64((const double *)data, n, want, out); break;
    case DT_F16: health_f16((const uint16_t *)data, n, want, out); break;
    case DT_BF16: health_bf16((const uint16_t *)data, n, want, out); break;
    default: code = -1; break;
    }
    if (ts != NULL)
        PyEval_RestoreThread(ts);
    if (code == -1) {
        PyErr_SetString(PyExc_ValueError, "unknown dtype code");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"stats", (PyCFunction)(void (*)(void))stats, METH_FASTCALL, stats_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_health",
    "Single-pass health statistics of raw float buffers (see _health.c).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__health(void) {
    for (uint32_t h = 0; h < 65536; h++)
        half_table[h] = half_to_float((uint16_t)h);
    PyObject *m = PyModule_Create(&module);
    if (m != NULL)
        PyModule_AddIntConstant(m, "RAW_WIDTH", RAW_WIDTH);
    return m;
}
