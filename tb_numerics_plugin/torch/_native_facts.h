/* What the native hook (_native_facts.cpp, which links torch) tells the C
 * recorder (_record_health.c, plain C API) about a tensor object, through the
 * capsule `TENSOR_FACTS` of the hook's module (a TbnNativeApi): the health
 * payload of a dense CPU or CUDA tensor without Python calls for its layout,
 * address and shape, any tensor's view flag, version counter, device and
 * dtype without calling `_is_view()` or reading `_version`, `device` and
 * `dtype` through Python, the thread's grad mode, autograd sequence number
 * and the node autograd evaluates, and the tag an untagged tensor stands for. */
#ifndef TBN_NATIVE_FACTS_H
#define TBN_NATIVE_FACTS_H

#include <Python.h>
#include <stdint.h>

#define TBN_FACTS_CAPSULE "tb_numerics_plugin.torch.native.TENSOR_FACTS"

/* What the hook reads of a dense tensor. */
typedef struct {
  const void* data;  /* its data address */
  Py_ssize_t numel;  /* its element count */
  PyObject* shape;   /* a new tuple of its sizes, or NULL: they are in `sizes` */
  int cuda;          /* 0: on the CPU; 1: on CUDA device `device` */
  int device;
  const int64_t* sizes;  /* its `ndim` sizes (the tensor's own, valid while it lives) */
  Py_ssize_t ndim;
} TbnFacts;

/* 1 when `obj` is a torch.Tensor (or Parameter, not another subclass) on the CPU
 * or a CUDA device, strided and contiguous, with `facts` filled. 0 when it is not
 * (nothing set, no exception), -1 with an exception set. The caller holds the GIL. */
typedef int (*TbnTensorFacts)(PyObject* obj, TbnFacts* facts);

/* What the recorder reads of any tensor it tags. */
typedef struct {
  int view;           /* t._is_view() */
  long long version;  /* t._version */
  int device_type;    /* t.device: its c10::DeviceType */
  int device_index;   /* and index (-1 for none) */
  PyObject* dtype;    /* t.dtype, borrowed (torch keeps one object per dtype) */
} TbnMeta;

/* 1 when `obj` is a torch.Tensor (or Parameter, not another subclass) whose
 * `meta` could be read, 0 when not (nothing set, no exception: the caller asks
 * Python, which raises what it raises). The caller holds the GIL. */
typedef int (*TbnTensorMeta)(PyObject* obj, TbnMeta* meta);

typedef struct {
  TbnTensorFacts facts;
  TbnTensorMeta meta;
  int (*grad_enabled)(void);      /* torch.is_grad_enabled() on the calling thread */
  long long (*sequence_nr)(void); /* torch._C._autograd._get_sequence_nr() */
  /* 1 while autograd evaluates a node on the calling thread, with its sequence
   * number (torch._C._current_autograd_node()._sequence_nr()) in `nr`, else 0:
   * no Python object for the node. Added last: a recorder built before it
   * reads the fields above as they were. */
  int (*current_node)(long long* nr);
  /* The module's stand_in_tag(tensor) without a Python call: a new reference to
   * the tag the hook keeps for the untagged tensor `obj` (an alias output, a copy
   * autograd saved of a recorded output), or to None; NULL with an exception set
   * (`obj` not a tensor). The caller holds the GIL. Added last, as above. */
  PyObject* (*stand_in_tag)(PyObject* obj);
} TbnNativeApi;

#endif
