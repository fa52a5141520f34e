/* Numeric health of a contiguous float buffer in one pass (two for std).
 *
 * Plain CPython C API, no torch headers: the caller passes the address of the
 * tensor's data (tensor.data_ptr()), an element count, a dtype code, the
 * address of a float64 output row and a level. The caller guarantees both
 * buffers are contiguous, on the host and alive for the call.
 *
 * Never build this with -ffast-math: it lets the compiler assume there is no
 * NaN or Inf, which is exactly what this code counts. The main loops use GCC
 * vector extensions (whole 32-byte vectors, selects written as bit masks), so
 * the compiler needs no licence to reorder float reductions; target_clones
 * picks AVX-512, AVX2 or the baseline at load time on x86-64. Vectors are no
 * wider than AVX2's: gcc 12 lowers compares of wider generic vectors to scalar
 * code on an AVX2 machine (64-byte vectors counted 13x slower there).
 *
 * Output row (RAW_WIDTH doubles):
 *   0 n_neg_inf, 1 n_pos_inf, 2 n_nan, 3 n_neg, 4 n_zero, 5 n_pos
 *   (neg/zero/pos count finite elements only),
 *   6 min, 7 max (finite elements; +inf/-inf when there is none),
 *   8 abs_min_nonzero (+inf when no finite nonzero element),
 *   9 abs_max (finite elements; -1 when there is none),
 *   10 sum of finite elements, 11 sum of squared deviations from their mean.
 * `level` 0 computes the counts only (slots 6..11 keep the "no element"
 * values +inf, -inf, +inf, -1, 0, 0), 1 adds 6..10, 2 adds 11.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_health.h"

/* Elements per block: lane counters are 32-bit and are folded into 64-bit
 * totals after each block, so they never overflow. */
#define BLOCK (1 << 20)

enum { DT_F32 = 0, DT_F64 = 1, DT_F16 = 2, DT_BF16 = 3 };

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

/* 8 floats (or 4 doubles) per vector; int vectors of the same width hold
 * comparison masks (-1 true, 0 false). */
typedef float vf __attribute__((vector_size(32)));
typedef int32_t vi __attribute__((vector_size(32)));
typedef uint32_t vu __attribute__((vector_size(32)));
typedef uint16_t vh __attribute__((vector_size(16)));
typedef double vd __attribute__((vector_size(32)));
typedef int64_t vl __attribute__((vector_size(32)));

typedef struct {
    int64_t ni, pi, nan, neg, zero, pos;
    double mn, mx, amn, amx, sum;
} totals_t;

/* ---- loads: a vector of 8 floats (or 4 doubles) from element k --------- */
static inline vf load_f32(const void *p, Py_ssize_t k) {
    vf v;
    memcpy(&v, (const float *)p + k, sizeof v);
    return v;
}

static inline vd load_f64(const void *p, Py_ssize_t k) {
    vd v;
    memcpy(&v, (const double *)p + k, sizeof v);
    return v;
}

static inline vf load_bf16(const void *p, Py_ssize_t k) {
    vh h;
    memcpy(&h, (const uint16_t *)p + k, sizeof h);
    vu bits = __builtin_convertvector(h, vu) << 16;
    return (vf)bits;
}

/* IEEE half -> float without a table: shifting exponent and mantissa into
 * place and scaling by 2^112 is exact for normals and subnormals; Inf/NaN
 * (exponent 31) get the float's all-ones exponent OR-ed in. */
static inline vf load_f16(const void *p, Py_ssize_t k) {
    vh h;
    memcpy(&h, (const uint16_t *)p + k, sizeof h);
    vu w = __builtin_convertvector(h, vu);
    vu em = w & 0x7fff;
    vf mag = (vf)(em << 13) * 0x1p112f;
    vu special = (vu)(em >= 0x7c00) & 0x7f800000u;
    return (vf)((vu)mag | special | ((w & 0x8000) << 16));
}

/* Scalar loads for the tail (fewer elements than one vector). */
static inline double scalar_f32(const void *p, Py_ssize_t k) { return ((const float *)p)[k]; }
static inline double scalar_f64(const void *p, Py_ssize_t k) { return ((const double *)p)[k]; }
static inline double scalar_bf16(const void *p, Py_ssize_t k) {
    uint32_t bits = (uint32_t)((const uint16_t *)p)[k] << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static inline double scalar_f16(const void *p, Py_ssize_t k) {
    uint16_t h = ((const uint16_t *)p)[k];
    uint32_t em = h & 0x7fff;
    int sign = h & 0x8000;
    double v = em >= 0x7c00 ? ((em & 0x3ff) ? NAN : INFINITY)
                            : ldexp((double)((em & 0x3ff) | (em >= 0x400 ? 0x400 : 0)),
                                    (int)(em >> 10) - (em >= 0x400 ? 25 : 24));
    return sign ? -v : v;
}

static void tail(double x, int level, totals_t *t) {
    int fin = isfinite(x);
    double a = fabs(x);
    t->ni += x == -INFINITY; t->pi += x == INFINITY; t->nan += isnan(x);
    t->neg += fin && x < 0; t->zero += x == 0; t->pos += fin && x > 0;
    if (level >= LEVEL_EXTREMA && fin) {
        t->mn = x < t->mn ? x : t->mn;
        t->mx = x > t->mx ? x : t->mx;
        t->amn = (a > 0 && a < t->amn) ? a : t->amn;
        t->amx = a > t->amx ? a : t->amx;
        t->sum += x;
    }
}

/* Level 0, counts only, with whole vectors. The common case is all finite:
 * a lane's sum of its elements is finite when they all are (one that overflows
 * only sends the block to the recount), so one add and two compares settle a
 * vector, four vectors a round on independent sums (an add's latency, not the
 * adds, bounded one sum: 9 elements per ns against 20 for torch's sum); a dirty
 * block is recounted with six compares. Mask lanes are -1 for true, so counters
 * are subtracted at the end. */
#define COUNTS_BODY(VF, VI, W, LOAD, SCALAR)                                       \
    VI cni = {0}, cpi = {0}, cnan = {0}, cneg = {0}, czero = {0}, cpos = {0};      \
    VF zero_v = {0}, inf_v = zero_v + INFINITY, ninf_v = zero_v - INFINITY;        \
    VF d0 = zero_v, d1 = zero_v, d2 = zero_v, d3 = zero_v;                         \
    VI cneg1 = cneg, czero1 = czero;                                               \
    Py_ssize_t i = begin;                                                          \
    for (; i + 4 * W <= end; i += 4 * W) {                                         \
        VF x0 = LOAD(p, i), x1 = LOAD(p, i + W);                                   \
        VF x2 = LOAD(p, i + 2 * W), x3 = LOAD(p, i + 3 * W);                       \
        d0 += x0; d1 += x1; d2 += x2; d3 += x3;                                    \
        cneg += (VI)(x0 < 0); cneg1 += (VI)(x1 < 0);                               \
        cneg += (VI)(x2 < 0); cneg1 += (VI)(x3 < 0);                               \
        czero += (VI)(x0 == 0); czero1 += (VI)(x1 == 0);                           \
        czero += (VI)(x2 == 0); czero1 += (VI)(x3 == 0);                           \
    }                                                                              \
    for (; i + W <= end; i += W) {                                                 \
        VF x = LOAD(p, i);                                                         \
        d0 += x;                                                                   \
        cneg += (VI)(x < 0);                                                       \
        czero += (VI)(x == 0);                                                     \
    }                                                                              \
    cneg += cneg1;                                                                 \
    czero += czero1;                                                               \
    VF dirty = (d0 + d1) + (d2 + d3);                                              \
    int clean = 1;                                                                 \
    for (int j = 0; j < W; j++)                                                    \
        clean &= (dirty[j] - dirty[j]) == 0;                                       \
    if (clean) {                                                                   \
        t->pos += i - begin;                                                       \
        for (int j = 0; j < W; j++) {                                              \
            t->neg -= cneg[j];                                                     \
            t->zero -= czero[j];                                                   \
            t->pos += cneg[j] + czero[j];                                          \
        }                                                                          \
    } else {                                                                       \
        cneg = cneg - cneg;                                                        \
        czero = czero - czero;                                                     \
        for (i = begin; i + W <= end; i += W) {                                    \
            VF x = LOAD(p, i);                                                     \
            VI fin = (VI)((x - x) == 0);                                           \
            cni += (VI)(x == ninf_v); cpi += (VI)(x == inf_v);                     \
            cnan += (VI)(x != x);                                                  \
            cneg += fin & (VI)(x < 0); czero += (VI)(x == 0);                      \
            cpos += fin & (VI)(x > 0);                                             \
        }                                                                          \
        for (int j = 0; j < W; j++) {                                              \
            t->ni -= cni[j]; t->pi -= cpi[j]; t->nan -= cnan[j];                   \
            t->neg -= cneg[j]; t->zero -= czero[j]; t->pos -= cpos[j];             \
        }                                                                          \
    }                                                                              \
    for (; i < end; i++)                                                           \
        tail(SCALAR(p, i), LEVEL_COUNTS, t);

/* Levels 1 and 2 keep LANES independent scalar accumulators so gcc can
 * vectorize the inner lane loop with plain ternaries (a single running min
 * over the buffer is a float reduction gcc will not reorder without
 * -ffast-math; -fno-trapping-math lets it if-convert the compares). */
#define LANES 16
#define EXTREMA_BODY(T, ELEM)                                                      \
    int32_t cni[LANES] = {0}, cpi[LANES] = {0}, cnan[LANES] = {0};                 \
    int32_t cneg[LANES] = {0}, czero[LANES] = {0}, cpos[LANES] = {0};              \
    T mn[LANES], mx[LANES], amn[LANES], amx[LANES];                                \
    double sm[LANES];                                                              \
    for (int j = 0; j < LANES; j++) {                                              \
        mn[j] = (T)INFINITY; mx[j] = (T)-INFINITY;                                 \
        amn[j] = (T)INFINITY; amx[j] = (T)-1; sm[j] = 0.0;                         \
    }                                                                              \
    Py_ssize_t i = begin;                                                          \
    for (; i + LANES <= end; i += LANES) {                                         \
        for (int j = 0; j < LANES; j++) {                                          \
            T x = ELEM(p, i + j);                                                  \
            int fin = (x - x) == 0;                                                \
            T a = x < 0 ? -x : x;                                                  \
            cni[j] += x == (T)-INFINITY;                                           \
            cpi[j] += x == (T)INFINITY;                                            \
            cnan[j] += x != x;                                                     \
            cneg[j] += fin & (x < 0);                                              \
            czero[j] += x == 0;                                                    \
            cpos[j] += fin & (x > 0);                                              \
            mn[j] = (fin & (x < mn[j])) ? x : mn[j];                               \
            mx[j] = (fin & (x > mx[j])) ? x : mx[j];                               \
            amn[j] = (fin & (a > 0) & (a < amn[j])) ? a : amn[j];                  \
            amx[j] = (fin & (a > amx[j])) ? a : amx[j];                            \
            sm[j] += fin ? (double)x : 0.0;                                        \
        }                                                                          \
    }                                                                              \
    for (int j = 0; j < LANES; j++) {                                              \
        t->ni += cni[j]; t->pi += cpi[j]; t->nan += cnan[j];                       \
        t->neg += cneg[j]; t->zero += czero[j]; t->pos += cpos[j];                 \
        t->mn = mn[j] < t->mn ? mn[j] : t->mn;                                     \
        t->mx = mx[j] > t->mx ? mx[j] : t->mx;                                     \
        t->amn = amn[j] < t->amn ? amn[j] : t->amn;                                \
        t->amx = amx[j] > t->amx ? amx[j] : t->amx;                                \
        t->sum += sm[j];                                                           \
    }                                                                              \
    for (; i < end; i++)                                                           \
        tail((double)ELEM(p, i), LEVEL_EXTREMA, t);

#define SQ_DEV_BODY(T, ELEM)                                                       \
    double acc[LANES] = {0};                                                       \
    Py_ssize_t i = begin;                                                          \
    for (; i + LANES <= end; i += LANES) {                                         \
        for (int j = 0; j < LANES; j++) {                                          \
            T x = ELEM(p, i + j);                                                  \
            double d = ((x - x) == 0) ? (double)x - mean : 0.0;                    \
            acc[j] += d * d;                                                       \
        }                                                                          \
    }                                                                              \
    double s = 0.0;                                                                \
    for (int j = 0; j < LANES; j++)                                                \
        s += acc[j];                                                               \
    for (; i < end; i++) {                                                         \
        double x = (double)ELEM(p, i);                                             \
        double d = isfinite(x) ? x - mean : 0.0;                                   \
        s += d * d;                                                                \
    }                                                                              \
    *ssd += s;

/* Scalar element loads the lane loops vectorize (bit casts via memcpy). */
static inline float elem_f32(const void *p, Py_ssize_t k) { return ((const float *)p)[k]; }
static inline double elem_f64(const void *p, Py_ssize_t k) { return ((const double *)p)[k]; }
static inline float elem_bf16(const void *p, Py_ssize_t k) {
    uint32_t bits = (uint32_t)((const uint16_t *)p)[k] << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static inline float elem_f16(const void *p, Py_ssize_t k) {
    uint32_t w = ((const uint16_t *)p)[k], em = w & 0x7fff, bits;
    float mag;
    bits = em << 13;
    memcpy(&mag, &bits, sizeof mag);
    mag *= 0x1p112f;
    memcpy(&bits, &mag, sizeof bits);
    bits |= (em >= 0x7c00 ? 0x7f800000u : 0u) | ((w & 0x8000) << 16);
    memcpy(&mag, &bits, sizeof mag);
    return mag;
}

#define DEFINE_KERNELS(NAME, VF, VI, W, T)                                         \
    CLONES static void counts_##NAME(const void *p, Py_ssize_t begin,              \
                                     Py_ssize_t end, totals_t *t) {                \
        COUNTS_BODY(VF, VI, W, load_##NAME, scalar_##NAME)                         \
    }                                                                              \
    CLONES static void extrema_##NAME(const void *p, Py_ssize_t begin,             \
                                      Py_ssize_t end, totals_t *t) {               \
        EXTREMA_BODY(T, elem_##NAME)                                               \
    }                                                                              \
    CLONES static void sq_dev_##NAME(const void *p, Py_ssize_t begin,              \
                                     Py_ssize_t end, double mean, double *ssd) {   \
        SQ_DEV_BODY(T, elem_##NAME)                                                \
    }                                                                              \
    static void block_##NAME(const void *p, Py_ssize_t begin, Py_ssize_t end,      \
                             int level, totals_t *t) {                             \
        if (level >= LEVEL_EXTREMA)                                                \
            extrema_##NAME(p, begin, end, t);                                      \
        else                                                                       \
            counts_##NAME(p, begin, end, t);                                       \
    }

DEFINE_KERNELS(f32, vf, vi, 8, float)
DEFINE_KERNELS(f16, vf, vi, 8, float)
DEFINE_KERNELS(bf16, vf, vi, 8, float)
DEFINE_KERNELS(f64, vd, vl, 4, double)

typedef void (*block_fn)(const void *, Py_ssize_t, Py_ssize_t, int, totals_t *);
typedef void (*sq_dev_fn)(const void *, Py_ssize_t, Py_ssize_t, double, double *);

static void health(const void *p, Py_ssize_t n, int level, block_fn block, sq_dev_fn sq_dev,
                   double *out) {
    totals_t t = {0, 0, 0, 0, 0, 0, INFINITY, -INFINITY, INFINITY, -1.0, 0.0};
    for (Py_ssize_t b = 0; b < n; b += BLOCK)
        block(p, b, b + BLOCK < n ? b + BLOCK : n, level, &t);
    double ssd = 0.0;
    int64_t nfin = t.neg + t.zero + t.pos;
    if (level >= LEVEL_MOMENTS && nfin > 0) {
        double mean = t.sum / (double)nfin;
        for (Py_ssize_t b = 0; b < n; b += BLOCK)
            sq_dev(p, b, b + BLOCK < n ? b + BLOCK : n, mean, &ssd);
    }
    out[0] = (double)t.ni; out[1] = (double)t.pi; out[2] = (double)t.nan;
    out[3] = (double)t.neg; out[4] = (double)t.zero; out[5] = (double)t.pos;
    out[6] = t.mn; out[7] = t.mx; out[8] = t.amn; out[9] = t.amx;
    out[10] = t.sum; out[11] = ssd;
}

/* The kernels of a dtype code; 0 when the code is unknown. */
static int kernels_of(long code, block_fn *block, sq_dev_fn *sq_dev) {
    switch (code) {
    case DT_F32: *block = block_f32; *sq_dev = sq_dev_f32; return 1;
    case DT_F64: *block = block_f64; *sq_dev = sq_dev_f64; return 1;
    case DT_F16: *block = block_f16; *sq_dev = sq_dev_f16; return 1;
    case DT_BF16: *block = block_bf16; *sq_dev = sq_dev_bf16; return 1;
    default: return 0;
    }
}

/* health() of a buffer whose level was checked (_health.h); releases the GIL
 * only for large buffers (releasing it costs more than a small tensor's loop). */
int tbn_health_of(const void *data, Py_ssize_t n, long code, int level, double *out) {
    block_fn block;
    sq_dev_fn sq_dev;
    if (!kernels_of(code, &block, &sq_dev)) {
        PyErr_SetString(PyExc_ValueError, "unknown dtype code");
        return -1;
    }
    PyThreadState *ts = n > (1 << 16) ? PyEval_SaveThread() : NULL;
    health(data, n, level, block, sq_dev, out);
    if (ts != NULL)
        PyEval_RestoreThread(ts);
    return 0;
}
