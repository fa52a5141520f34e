/* What the native hook (_native_facts.cpp, which links torch) tells the C
 * recorder (_record_health.c, plain C API) about a tensor object, through the
 * capsule `TENSOR_FACTS` of the hook's module: the health payload of a dense
 * CPU tensor without Python calls for its layout, address and shape. */
#ifndef TBN_NATIVE_FACTS_H
#define TBN_NATIVE_FACTS_H

#include <Python.h>

#define TBN_FACTS_CAPSULE "tb_numerics_plugin.torch.native.TENSOR_FACTS"

/* 1 when `obj` is a torch.Tensor (or Parameter, not another subclass) on the CPU,
 * strided and contiguous: its data address in *data, its element count in
 * *numel and a new tuple of its sizes in *shape. 0 when it is not (nothing set,
 * no exception), -1 with an exception set. The caller holds the GIL. */
typedef int (*TbnTensorFacts)(PyObject* obj, const void** data, Py_ssize_t* numel,
                              PyObject** shape);

#endif
