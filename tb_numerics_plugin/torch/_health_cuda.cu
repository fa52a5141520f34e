/* Raw health rows of CUDA tensors: one launch per tensor, no host sync.
 *
 * Compiled ahead of time to PTX (`make ptx` -> _health_cuda.ptx, shipped in
 * the wheel) and loaded by the driver at run time through _health_cuda.c, so
 * a user needs neither nvcc nor Triton: the driver compiles the PTX for the
 * GPU it finds. Row layout and "no element" values as in _health.c.
 *
 * tbn_rows_<dtype>(x, n, level, row): every block folds its grid-stride share
 * of the n elements (6 counts; min, max, abs_min_nonzero, abs_max and sum at
 * level >= 1) and merges it into row[0..10] with atomics, so the row must hold
 * the "no element" values before the launch (the caller fills its rows buffer
 * with them once). Rows are the only state: kernels on any streams may run
 * at once, each on its own row.
 * tbn_sqdev_<dtype>(x, n, row) then adds the squared deviations of the finite
 * elements from their mean to row[11] (level 2 only).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define THREADS 256

struct Totals {
  double c[6];  /* -inf, +inf, nan, finite < 0, == 0, finite > 0 */
  double mn, mx, amn, amx, sum;
};

/* Elements are read in their own precision (float for the 16-bit types, whose
 * conversion to float is exact): the counts and extrema need no wider type, and
 * only the sum is kept in double. */
__device__ inline float load(const float* x, long long i) { return x[i]; }
__device__ inline double load(const double* x, long long i) { return x[i]; }
__device__ inline float load(const __half* x, long long i) { return __half2float(x[i]); }
__device__ inline float load(const __nv_bfloat16* x, long long i) {
  return __bfloat162float(x[i]);
}

/* One thread's share: counters, and extrema in the elements' precision F. */
template <typename F>
struct Lane {
  unsigned long long c[6];
  F mn, mx, amn, amx;
  double sum;

  __device__ Lane() : mn(INFINITY), mx(-INFINITY), amn(INFINITY), amx(-1), sum(0.0) {
    for (int k = 0; k < 6; ++k) c[k] = 0ull;
  }

  template <bool EXTREMA>
  __device__ inline void take(F v) {
    if (v - v == F(0)) {  /* finite */
      c[3] += v < F(0);
      c[4] += v == F(0);
      c[5] += v > F(0);
      if (EXTREMA) {
        F a = v < F(0) ? -v : v;
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
        if (a > F(0) && a < amn) amn = a;
        amx = a > amx ? a : amx;
        sum += (double)v;
      }
    } else {
      c[2] += v != v;
      c[1] += v > F(0);
      c[0] += v < F(0);
    }
  }

  __device__ Totals totals() const {
    Totals t;
    for (int k = 0; k < 6; ++k) t.c[k] = (double)c[k];
    t.mn = (double)mn;
    t.mx = (double)mx;
    t.amn = (double)amn;
    t.amx = (double)amx;
    t.sum = sum;
    return t;
  }
};

__device__ inline void merge(Totals* t, const Totals& o) {
  for (int k = 0; k < 6; ++k) t->c[k] += o.c[k];
  t->mn = fmin(t->mn, o.mn);
  t->mx = fmax(t->mx, o.mx);
  t->amn = fmin(t->amn, o.amn);
  t->amx = fmax(t->amx, o.amx);
  t->sum += o.sum;
}

__device__ inline double shuffle(double v, int offset) {
  return __shfl_down_sync(0xffffffffu, v, offset);
}

/* Folds the block's totals into thread 0's (every thread must call it). */
__device__ void block_fold(Totals* t) {
  __shared__ Totals warps[THREADS / 32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    Totals o;
    for (int k = 0; k < 6; ++k) o.c[k] = shuffle(t->c[k], offset);
    o.mn = shuffle(t->mn, offset);
    o.mx = shuffle(t->mx, offset);
    o.amn = shuffle(t->amn, offset);
    o.amx = shuffle(t->amx, offset);
    o.sum = shuffle(t->sum, offset);
    merge(t, o);
  }
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warps[warp] = *t;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < THREADS / 32; ++w) merge(t, warps[w]);
  }
  __syncthreads();
}

/* Min and max of doubles with integer atomics: for a non-negative double the
 * signed order of its bits is the value order, for a negative one the unsigned
 * order is the reverse. -0.0 is folded to +0.0 first (it would order below
 * every negative number). Never called with NaN. */
__device__ inline void atomic_min(double* at, double v) {
  v += 0.0;
  if (v >= 0.0) {
    atomicMin((long long*)at, __double_as_longlong(v));
  } else {
    atomicMax((unsigned long long*)at, (unsigned long long)__double_as_longlong(v));
  }
}

__device__ inline void atomic_max(double* at, double v) {
  v += 0.0;
  if (v >= 0.0) {
    atomicMax((long long*)at, __double_as_longlong(v));
  } else {
    atomicMin((unsigned long long*)at, (unsigned long long)__double_as_longlong(v));
  }
}

/* Merges a block's totals into its row (thread 0 only). */
__device__ void publish(const Totals& t, double* row, int extrema) {
  for (int k = 0; k < 6; ++k) {
    if (t.c[k] != 0.0) atomicAdd(row + k, t.c[k]);
  }
  if (!extrema || t.mx < t.mn) return;  /* no finite element in this block */
  atomic_min(row + 6, t.mn);
  atomic_max(row + 7, t.mx);
  if (t.amn < __longlong_as_double(0x7ff0000000000000LL)) atomic_min(row + 8, t.amn);
  atomic_max(row + 9, t.amx);
  if (t.sum != 0.0) atomicAdd(row + 10, t.sum);
}

/* The grid-stride share of this thread, four loads in flight per iteration. */
template <bool EXTREMA, typename T, typename F>
__device__ void scan(const T* x, long long n, Lane<F>* lane) {
  long long stride = (long long)gridDim.x * THREADS;
  long long i = (long long)blockIdx.x * THREADS + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    F v0 = load(x, i), v1 = load(x, i + stride), v2 = load(x, i + 2 * stride),
      v3 = load(x, i + 3 * stride);
    lane->template take<EXTREMA>(v0);
    lane->template take<EXTREMA>(v1);
    lane->template take<EXTREMA>(v2);
    lane->template take<EXTREMA>(v3);
  }
  for (; i < n; i += stride) lane->template take<EXTREMA>(load(x, i));
}

template <typename T>
__device__ void rows(const T* x, long long n, int level, double* row) {
  typedef decltype(load(x, 0)) F;
  Lane<F> lane;
  int extrema = level >= 1;
  if (extrema) {
    scan<true>(x, n, &lane);
  } else {
    scan<false>(x, n, &lane);
  }
  Totals t = lane.totals();
  block_fold(&t);
  if (threadIdx.x == 0) publish(t, row, extrema);
}

template <typename T>
__device__ void sqdev(const T* x, long long n, double* row) {
  __shared__ double warps[THREADS / 32];
  double finite = row[3] + row[4] + row[5];
  double mean = row[10] / fmax(finite, 1.0);
  double s = 0.0;
  long long stride = (long long)gridDim.x * THREADS;
  for (long long i = (long long)blockIdx.x * THREADS + threadIdx.x; i < n; i += stride) {
    double v = load(x, i);
    if (v - v == 0.0) s += (v - mean) * (v - mean);
  }
  for (int offset = 16; offset > 0; offset >>= 1) s += shuffle(s, offset);
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < THREADS / 32; ++w) s += warps[w];
    atomicAdd(row + 11, s);
  }
}

#define KERNELS(NAME, T)                                                                 \
  extern "C" __global__ void __launch_bounds__(THREADS)                                  \
      tbn_rows_##NAME(const T* x, long long n, int level, double* row) {                 \
    rows<T>(x, n, level, row);                                                           \
  }                                                                                      \
  extern "C" __global__ void __launch_bounds__(THREADS)                                  \
      tbn_sqdev_##NAME(const T* x, long long n, double* row) {                           \
    sqdev<T>(x, n, row);                                                                 \
  }

KERNELS(f32, float)
KERNELS(f64, double)
KERNELS(f16, __half)
KERNELS(bf16, __nv_bfloat16)
