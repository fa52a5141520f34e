// The values of a recorded op as the dispatch mode sees them in Python (see
// _native.cpp): tensors as their Python objects, a Python scalar operand as the
// number, the common scalar kinds directly.

#include "_native.h"

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>

namespace tbn_native {
namespace {

// A Python scalar operand arrives as a wrapped-number tensor (0-dim, on the CPU),
// which the dispatch mode sees as the number: its value, or null for a complex one.
PyObject* wrapped_number(const at::Tensor& t) {
  if (!t.device().is_cpu() || t.numel() != 1) return nullptr;
  switch (t.scalar_type()) {
    case at::kDouble:
      return PyFloat_FromDouble(*t.const_data_ptr<double>());
    case at::kLong:
      return PyLong_FromLongLong(*t.const_data_ptr<int64_t>());
    case at::kBool:
      return PyBool_FromLong(*t.const_data_ptr<bool>());
    default:
      return nullptr;
  }
}

// The common kinds directly (toPyObject costs several times more for them); null
// for the others.
PyObject* to_python_directly(const c10::IValue& value) {
  if (value.isTensor()) {
    const auto& t = value.toTensor();
    if (!t.defined() || !t.unsafeGetTensorImpl()->is_wrapped_number()) return THPVariable_Wrap(t);
    return wrapped_number(t);
  } else if (value.isNone()) {
    Py_RETURN_NONE;
  } else if (value.isInt()) {
    return PyLong_FromLongLong(value.toInt());
  } else if (value.isDouble()) {
    return PyFloat_FromDouble(value.toDouble());
  } else if (value.isBool()) {
    return PyBool_FromLong(value.toBool());
  }
  return nullptr;
}

}  // namespace

PyObject* to_python(const c10::IValue& value) {
  PyObject* direct = to_python_directly(value);
  if (direct != nullptr) return direct;
  if (PyErr_Occurred()) {  // a failed wrap: the capture reads tensors only
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  try {
    return torch::jit::toPyObject(value).release().ptr();
  } catch (...) {  // a value Python has no type for: the capture reads tensors only
    if (PyErr_Occurred()) PyErr_Clear();
    Py_RETURN_NONE;
  }
}

}  // namespace tbn_native
