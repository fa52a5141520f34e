// Which outputs of a recorded op its autograd node saves for backward (see _native.h).
// Autograd keeps a saved output as another tensor over the output's memory, made by
// no op the hook sees, which backward reads: only such outputs need the table of
// written storages (_native_tags.cpp). Most do not (add, mm, addmm: their nodes save
// inputs, which backward reads as the same tensors), and an entry per output cost about
// 750 instructions per recorded op, and kept StorageImpls of dead outputs.

#include "_native.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/python_cpp_function.h>

#include <string>
#include <typeinfo>

namespace tbn_native {
namespace {

// The names a node's Python type gives the saved output `i` of `returns` outputs
// (torch's generated nodes: `_saved_result` for an op's only output, `_saved_result<i>`
// for unnamed outputs, `_saved_<name>` for named ones: `_saved_indices` of max.dim).
bool names_saved(PyObject* type, const std::string& name, size_t i, size_t returns) {
  if (!name.empty() && PyObject_HasAttrString(type, ("_saved_" + name).c_str())) return true;
  if (PyObject_HasAttrString(type, ("_saved_result" + std::to_string(i)).c_str())) return true;
  return returns == 1 && PyObject_HasAttrString(type, "_saved_result");
}

}  // namespace

uint64_t saved_outputs(const std::vector<std::string>& returns,
                       const c10::intrusive_ptr<torch::autograd::Node>& node) {  // GIL held
  if (returns.size() > 63) return kSavedUnknown;
  PyObject* object = torch::autograd::functionToPyObject(node);
  if (object == nullptr) {
    PyErr_Clear();
    return kSavedUnknown;
  }
  // torch's generated nodes have Python types of their own name; others (CopySlices,
  // "torch::autograd::CopySlices", an extension's Function) may save what they like
  uint64_t saved = kSavedUnknown;
  if (node->name() == Py_TYPE(object)->tp_name) {
    PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(object));
    saved = 0;
    for (size_t i = 0; i < returns.size(); ++i) {
      if (names_saved(type, returns[i], i, returns.size())) saved |= uint64_t{1} << i;
    }
  }
  Py_DECREF(object);
  return saved;
}

}  // namespace tbn_native
