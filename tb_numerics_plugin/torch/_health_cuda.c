/* Launches the CUDA health kernels (_health_cuda.cu, shipped as PTX) through
 * the CUDA driver API, found at run time with dlopen: no CUDA headers or
 * libraries at build time, no nvcc or Triton at run time.
 *
 * _health.CudaKernels(ptx) opens libcuda.so.1 and keeps, per device ordinal,
 * the device's primary context (the one torch's runtime API uses) and the
 * module the driver compiled from the PTX for it. launch() queues one row:
 * tbn_rows_<dtype> (plus tbn_sqdev_<dtype> at level 2) on the caller's stream,
 * in the tensor's device's context (pushed for the call when another one is
 * current). Nothing waits for the GPU. Driver errors raise RuntimeError with
 * the driver's name for the error.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>

#include "_health.h"

/* The driver API's types and entry points used here (cuda.h). */
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;

typedef struct {
  CUresult (*init)(unsigned int);
  CUresult (*device_get)(CUdevice*, int);
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice);
  CUresult (*ctx_get_current)(CUcontext*);
  CUresult (*ctx_push)(CUcontext);
  CUresult (*ctx_pop)(CUcontext*);
  CUresult (*module_load_data)(CUmodule*, const void*);
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*);
  CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                     unsigned, CUstream, void**, void**);
  CUresult (*error_string)(CUresult, const char**);
} Driver;

#define MAX_DEVICES 64
#define THREADS 256
#define MAX_BLOCKS 1024
#define ITEMS_PER_THREAD 8
#define N_DTYPES 4

static const char* const kRows[N_DTYPES] = {"tbn_rows_f32", "tbn_rows_f64", "tbn_rows_f16",
                                            "tbn_rows_bf16"};
static const char* const kSqdev[N_DTYPES] = {"tbn_sqdev_f32", "tbn_sqdev_f64", "tbn_sqdev_f16",
                                             "tbn_sqdev_bf16"};

typedef struct {
  CUcontext ctx;  /* NULL until the device's first launch */
  CUfunction rows[N_DTYPES], sqdev[N_DTYPES];
} Device;

typedef struct {
  PyObject_HEAD
  Driver cu;
  PyObject* ptx;  /* bytes, NUL-terminated by CPython */
  Device devices[MAX_DEVICES];
} CudaKernels;

/* Raises RuntimeError naming the driver call and its error; returns -1. */
static int fail(CudaKernels* k, const char* what, CUresult rc) {
  const char* name = NULL;
  if (k->cu.error_string == NULL || k->cu.error_string(rc, &name) != 0 || name == NULL) {
    name = "unknown error";
  }
  PyErr_Format(PyExc_RuntimeError, "CUDA driver: %s failed: %s (%d)", what, name, rc);
  return -1;
}

static int load_driver(Driver* cu) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    PyErr_Format(PyExc_RuntimeError, "CUDA driver not found: %s", dlerror());
    return -1;
  }
  struct {
    void** slot;
    const char* name;
  } syms[] = {
      {(void**)&cu->init, "cuInit"},
      {(void**)&cu->device_get, "cuDeviceGet"},
      {(void**)&cu->primary_ctx_retain, "cuDevicePrimaryCtxRetain"},
      {(void**)&cu->ctx_get_current, "cuCtxGetCurrent"},
      {(void**)&cu->ctx_push, "cuCtxPushCurrent_v2"},
      {(void**)&cu->ctx_pop, "cuCtxPopCurrent_v2"},
      {(void**)&cu->module_load_data, "cuModuleLoadData"},
      {(void**)&cu->module_get_function, "cuModuleGetFunction"},
      {(void**)&cu->launch, "cuLaunchKernel"},
      {(void**)&cu->error_string, "cuGetErrorString"},
  };
  for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); ++i) {
    *syms[i].slot = dlsym(lib, syms[i].name);
    if (*syms[i].slot == NULL) {
      PyErr_Format(PyExc_RuntimeError, "CUDA driver: libcuda.so.1 has no %s", syms[i].name);
      return -1;
    }
  }
  return 0;  /* the library stays open for the life of the process */
}

static PyObject* kernels_new(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  PyObject* ptx;
  if (!PyArg_ParseTuple(args, "S:CudaKernels", &ptx)) return NULL;
  CudaKernels* k = (CudaKernels*)type->tp_alloc(type, 0);  /* zeroed */
  if (k == NULL) return NULL;
  Py_INCREF(ptx);
  k->ptx = ptx;
  CUresult rc;
  if (load_driver(&k->cu) < 0 || ((rc = k->cu.init(0)) != 0 && fail(k, "cuInit", rc) < 0)) {
    Py_DECREF(k);
    return NULL;
  }
  return (PyObject*)k;
}

static void kernels_dealloc(CudaKernels* k) {
  Py_XDECREF(k->ptx);  /* modules and retained contexts live as long as the process */
  Py_TYPE(k)->tp_free((PyObject*)k);
}

/* Loads the module into `ctx` (current) and finds its kernels. */
static int load_module(CudaKernels* k, Device* d) {
  CUmodule module;
  CUresult rc = k->cu.module_load_data(&module, PyBytes_AS_STRING(k->ptx));
  if (rc != 0) return fail(k, "cuModuleLoadData (the health kernels' PTX)", rc);
  for (int i = 0; i < N_DTYPES; ++i) {
    if ((rc = k->cu.module_get_function(&d->rows[i], module, kRows[i])) != 0) {
      return fail(k, kRows[i], rc);
    }
    if ((rc = k->cu.module_get_function(&d->sqdev[i], module, kSqdev[i])) != 0) {
      return fail(k, kSqdev[i], rc);
    }
  }
  return 0;
}

/* Makes device `ordinal`'s primary context current; *pushed says whether it
 * was pushed (and must be popped). Loads the kernels on first use. */
static Device* enter(CudaKernels* k, int ordinal, int* pushed) {
  Device* d = &k->devices[ordinal];
  CUresult rc;
  *pushed = 0;
  if (d->ctx == NULL) {
    CUdevice dev;
    CUcontext ctx;
    if ((rc = k->cu.device_get(&dev, ordinal)) != 0 ||
        (rc = k->cu.primary_ctx_retain(&ctx, dev)) != 0) {
      fail(k, "getting the device's primary context", rc);
      return NULL;
    }
    if ((rc = k->cu.ctx_push(ctx)) != 0) {
      fail(k, "cuCtxPushCurrent", rc);
      return NULL;
    }
    int loaded = load_module(k, d);
    CUcontext popped;
    k->cu.ctx_pop(&popped);
    if (loaded < 0) return NULL;
    d->ctx = ctx;
  }
  CUcontext current = NULL;
  k->cu.ctx_get_current(&current);
  if (current != d->ctx) {
    if ((rc = k->cu.ctx_push(d->ctx)) != 0) {
      fail(k, "cuCtxPushCurrent", rc);
      return NULL;
    }
    *pushed = 1;
  }
  return d;
}

/* Undoes enter()'s push, if it pushed. */
static void leave(CudaKernels* k, int pushed) {
  CUcontext popped;
  if (pushed) k->cu.ctx_pop(&popped);
}

static int launch_one(CudaKernels* k, CUfunction f, unsigned blocks, CUstream stream,
                      void** params, const char* what) {
  CUresult rc = k->cu.launch(f, blocks, 1, 1, THREADS, 1, 1, 0, stream, params, NULL);
  return rc != 0 ? fail(k, what, rc) : 0;
}

static unsigned grid_for(Py_ssize_t n) {
  Py_ssize_t blocks = (n + THREADS * ITEMS_PER_THREAD - 1) / (THREADS * ITEMS_PER_THREAD);
  return blocks < 1 ? 1u : (blocks > MAX_BLOCKS ? MAX_BLOCKS : (unsigned)blocks);
}

PyDoc_STRVAR(launch_doc,
"launch(data_ptr, count, dtype_code, level, row_ptr, stream, device)\n--\n\n"
"Queues the raw health row of `count` elements of dtype_code (as stats()) at\n"
"device address `data_ptr` into the 12 float64 at `row_ptr`, which must hold\n"
"the empty row's values, on CUDA stream `stream` (a raw handle, 0 the default\n"
"stream) of device ordinal `device`. Returns at once; the row is ready when\n"
"the stream gets there. Raises ValueError for bad arguments, RuntimeError for\n"
"a driver error.");

int tbn_cuda_launch(PyObject* obj, const void* data, Py_ssize_t n, long code, int level,
                    unsigned long long row, void* stream, long ordinal) {
  CudaKernels* k = (CudaKernels*)obj;
  if (code < 0 || code >= N_DTYPES || ordinal < 0 || ordinal >= MAX_DEVICES || n < 0 ||
      level < LEVEL_COUNTS || level > LEVEL_MOMENTS) {
    PyErr_Format(PyExc_ValueError, "launch(): unknown dtype code %ld, device %ld or level %d, "
                 "or negative count", code, ordinal, level);
    return -1;
  }
  int pushed;
  Device* d = enter(k, (int)ordinal, &pushed);
  if (d == NULL) return -1;
  unsigned long long x = (unsigned long long)(uintptr_t)data;
  long long count = (long long)n;
  void* rows_params[] = {&x, &count, &level, &row};
  void* sqdev_params[] = {&x, &count, &row};
  unsigned blocks = grid_for(n);
  int rc = launch_one(k, d->rows[code], blocks, (CUstream)stream, rows_params, kRows[code]);
  if (rc == 0 && level >= LEVEL_MOMENTS && n > 0) {
    rc = launch_one(k, d->sqdev[code], blocks, (CUstream)stream, sqdev_params, kSqdev[code]);
  }
  leave(k, pushed);
  return rc;
}

static PyObject* kernels_launch(PyObject* k, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "launch() takes exactly 7 arguments");
    return NULL;
  }
  const void* data;
  Py_ssize_t n;
  long code, level;
  if (tbn_health_args(args, 3, &data, &n, &code, &level) < 0) return NULL;
  unsigned long long row = PyLong_AsUnsignedLongLong(args[4]);
  void* stream = (void*)(uintptr_t)PyLong_AsUnsignedLongLong(args[5]);
  long ordinal = PyLong_AsLong(args[6]);
  if (PyErr_Occurred()) return NULL;
  if (tbn_cuda_launch(k, data, n, code, (int)level, row, stream, ordinal) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject* kernels_prepare(PyObject* obj, PyObject* arg) {
  long ordinal = PyLong_AsLong(arg);
  if (ordinal == -1 && PyErr_Occurred()) return NULL;
  if (ordinal < 0 || ordinal >= MAX_DEVICES) {
    PyErr_Format(PyExc_ValueError, "prepare(): unknown device %ld", ordinal);
    return NULL;
  }
  int pushed;
  if (enter((CudaKernels*)obj, (int)ordinal, &pushed) == NULL) return NULL;
  leave((CudaKernels*)obj, pushed);
  Py_RETURN_NONE;
}

static PyMethodDef kernels_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))kernels_launch, METH_FASTCALL, launch_doc},
    {"prepare", (PyCFunction)kernels_prepare, METH_O,
     "prepare(device): has the driver compile the kernels for CUDA device ordinal `device`\n"
     "(done by the first launch otherwise). Raises RuntimeError where it cannot (a driver\n"
     "older than the PTX, say)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject CudaKernelsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tb_numerics_plugin.torch._health.CudaKernels",
    .tp_basicsize = sizeof(CudaKernels),
    .tp_dealloc = (destructor)kernels_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "CudaKernels(ptx): the CUDA health kernels, launched through the driver "
              "(see _health_cuda.c). Raises RuntimeError without a usable CUDA driver.",
    .tp_methods = kernels_methods,
    .tp_new = kernels_new,
};

int tbn_is_cuda_kernels(PyObject* obj) { return Py_IS_TYPE(obj, &CudaKernelsType); }

int tbn_add_cuda_type(PyObject* module) {
  return tbn_add_type(module, "CudaKernels", &CudaKernelsType);
}
