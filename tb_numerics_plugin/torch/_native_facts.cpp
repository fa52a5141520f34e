// The tensor facts the C recorder reads (_native_facts.h), from the at::Tensor
// behind a Python tensor: for a health payload (CPU or CUDA), where
// _record_health.c would call is_contiguous(), data_ptr() and read .shape and
// .device through Python; for a tag, where _record_op.c and _record_input.c
// would call _is_view() and read _version; and the tag an untagged input
// stands for, where _record_input.c would call the module's stand_in_tag.
#include "_native.h"

#include <ATen/SequenceNumber.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/python_variable.h>

extern "C" {
#include "_native_facts.h"
}

namespace {

int tensor_facts(PyObject* obj, TbnFacts* facts) {
  // Subclasses may define their own layout or shape: Encoder.payload reads them.
  if (!THPVariable_CheckExact(obj)) return 0;
  try {
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (!t.defined()) return 0;
    c10::Device device = t.device();
    if (!(device.is_cpu() || device.is_cuda()) || t.layout() != c10::kStrided ||
        t.unsafeGetTensorImpl()->is_python_dispatch() || !t.is_contiguous())
      return 0;
    c10::IntArrayRef sizes = t.sizes();
    facts->data = t.const_data_ptr();
    facts->numel = static_cast<Py_ssize_t>(t.numel());
    facts->shape = nullptr;  // the recorder makes (or keeps) the tuple
    facts->sizes = sizes.data();
    facts->ndim = static_cast<Py_ssize_t>(sizes.size());
    facts->cuda = device.is_cuda() ? 1 : 0;
    facts->device = device.is_cuda() ? device.index() : -1;
    return 1;
  } catch (const std::exception&) {  // e.g. a tensor without storage: Python decides
    return 0;
  }
}

int tensor_meta(PyObject* obj, TbnMeta* meta) {
  if (!THPVariable_CheckExact(obj)) return 0;
  try {
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (!t.defined()) return 0;
    int view = t.is_view() ? 1 : 0;
    meta->version = static_cast<long long>(t._version());  // throws for inference tensors
    meta->view = view;
    c10::Device device = t.device();
    meta->device_type = static_cast<int>(device.type());
    meta->device_index = device.has_index() ? device.index() : -1;
    meta->dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
    return 1;
  } catch (const std::exception&) {  // Python raises its own error for it
    return 0;
  }
}

int grad_enabled() { return c10::GradMode::is_enabled() ? 1 : 0; }

long long sequence_nr() { return static_cast<long long>(at::sequence_number::peek()); }

int current_node(long long* nr) {
  const c10::intrusive_ptr<torch::autograd::Node> node = torch::autograd::get_current_node();
  if (!node) return 0;
  *nr = static_cast<long long>(node->sequence_nr());
  return 1;
}

PyObject* stand_in(PyObject* obj) {
  if (!THPVariable_Check(obj)) {
    PyErr_SetString(PyExc_TypeError, "stand_in_tag takes a tensor");
    return nullptr;
  }
  try {
    PyObject* tag = tbn_native::kept_tag(THPVariable_Unpack(obj));
    return tag != nullptr ? tag : Py_NewRef(Py_None);
  } catch (const std::exception& exc) {  // as pybind11 would translate it
    PyErr_SetString(PyExc_RuntimeError, exc.what());
    return nullptr;
  }
}

const TbnNativeApi api = {&tensor_facts, &tensor_meta, &grad_enabled, &sequence_nr,
                          &current_node, &stand_in};

}  // namespace

namespace tbn_native {

namespace {
// The entry as the C function it is, where it is one: the C recorder's native_entry
// (METH_FASTCALL) bound to its session as a method. Held by the entry's references.
using FastCall = PyObject* (*)(PyObject*, PyObject* const*, Py_ssize_t);
FastCall direct_fn = nullptr;
PyObject* direct_module = nullptr;
PyObject* direct_self = nullptr;
}  // namespace

void set_entry(PyObject* entry) {  // GIL held
  direct_fn = nullptr;
  direct_module = direct_self = nullptr;
  if (entry == nullptr || !PyMethod_Check(entry)) return;
  PyObject* f = PyMethod_GET_FUNCTION(entry);
  const int kinds = METH_VARARGS | METH_FASTCALL | METH_KEYWORDS | METH_NOARGS | METH_O |
                    METH_METHOD;
  if (!PyCFunction_Check(f) || (PyCFunction_GET_FLAGS(f) & kinds) != METH_FASTCALL) return;
  PyCFunction fn = PyCFunction_GET_FUNCTION(f);
  direct_fn = reinterpret_cast<FastCall>(reinterpret_cast<void (*)()>(fn));
  direct_module = PyCFunction_GET_SELF(f);
  direct_self = PyMethod_GET_SELF(entry);
}

PyObject* call_entry_fn(PyObject* entry, PyObject* func, PyObject* args, PyObject* out) {
  if (direct_fn == nullptr) return PyObject_CallFunctionObjArgs(entry, func, args, out, nullptr);
  PyObject* argv[4] = {direct_self, func, args, out};
  return direct_fn(direct_module, argv, 4);
}

pybind11::capsule tensor_facts_capsule() {
  return pybind11::capsule(const_cast<void*>(static_cast<const void*>(&api)),
                           TBN_FACTS_CAPSULE);
}

}  // namespace tbn_native
