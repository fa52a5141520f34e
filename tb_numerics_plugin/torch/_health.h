/* Shared by the sources of tb_numerics_plugin.torch._health (_health.c: the
 * kernels; _health_module.c: stats(), argument checks, the module's init;
 * _health_rows.c: HostRows; _health_cuda.c: the CUDA kernels' launcher;
 * _health_device.c: DeviceRows) and by the extensions that use its C API,
 * the capsule `_health.C_API`: the recorder (_record) computes the health row of
 * a CPU tensor straight into the host rows of the capture's health batch, and
 * queues a CUDA tensor's into its device rows, without a Python call per tensor. */
#ifndef TBN_HEALTH_H
#define TBN_HEALTH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define RAW_WIDTH 12
#define LEVEL_COUNTS 0
#define LEVEL_EXTREMA 1
#define LEVEL_MOMENTS 2

#define TBN_HEALTH_CAPSULE "tb_numerics_plugin.torch._health.C_API"

typedef struct {
  /* Whether `obj` is a _health.HostRows. */
  int (*is_rows)(PyObject* obj);
  /* Computes the row of `count` elements of dtype `code` (0 float32, 1 float64,
   * 2 float16, 3 bfloat16) at `data` into the next free row of `rows`, at the
   * rows' own level. Returns 1 with the row's (block, row) token in *token (a new
   * reference), 0 when the rows take no row now (full, or in no batch: block < 0),
   * -1 with an exception set (an unknown dtype code). */
  int (*add)(PyObject* rows, const void* data, Py_ssize_t count, int code, PyObject** token);
  /* Whether `obj` is a _health.DeviceRows. */
  int (*is_device_rows)(PyObject* obj);
  /* Queues the row of `count` elements of dtype `code` at device address `data`
   * on CUDA device `device` into the next free row of `rows` (a DeviceRows), on
   * CUDA stream `stream`, at the rows' level. Returns as `add` does; 0 also when
   * the rows are on another device. */
  int (*device_add)(PyObject* rows, const void* data, Py_ssize_t count, int code, int device,
                    void* stream, PyObject** token);
} TbnHealthApi;

/* Inside _health only. */
int tbn_health_of(const void* data, Py_ssize_t n, long code, int level, double* out);
int tbn_health_args(PyObject* const* args, int level_at, const void** data, Py_ssize_t* n,
                    long* code, long* level);
/* Readies `type` and adds it to `module` as `name`; -1 with an exception set. */
int tbn_add_type(PyObject* module, const char* name, PyTypeObject* type);
/* A rows object's `level` setter: *level from `value`, or -1 with ValueError naming `what`. */
int tbn_set_level(PyObject* value, const char* what, int* level);
int tbn_add_rows_type(PyObject* module);
int tbn_add_cuda_type(PyObject* module);
int tbn_add_device_rows_type(PyObject* module);
/* The (block, row) tokens a block of rows handed out, kept for its next fills:
 * after each fetch the rows fill again from row 0, mostly as the same block, and
 * a token is a value (a tuple of two ints, out of the collector's sight). */
typedef struct {
  PyObject** kept;  /* `capacity` tokens of `block`, made as rows are filled; or NULL */
  Py_ssize_t capacity, block;
} TbnTokens;
void tbn_tokens_init(TbnTokens* tokens, Py_ssize_t capacity);
/* The token of `row` in `block` (a new reference), or NULL with an exception set. */
PyObject* tbn_token(TbnTokens* tokens, Py_ssize_t block, Py_ssize_t row);
void tbn_tokens_clear(TbnTokens* tokens);
int tbn_is_device_rows(PyObject* obj);
int tbn_device_rows_add(PyObject* rows, const void* data, Py_ssize_t count, int code, int device,
                        void* stream, PyObject** token);
/* Whether `obj` is a _health.CudaKernels. */
int tbn_is_cuda_kernels(PyObject* obj);
/* Queues one raw row on the GPU (_health_cuda.c's launch()); -1 with an exception set. */
int tbn_cuda_launch(PyObject* kernels, const void* data, Py_ssize_t count, long code, int level,
                    unsigned long long row, void* stream, long device);

#endif
