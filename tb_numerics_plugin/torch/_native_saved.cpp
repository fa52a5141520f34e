// Which outputs of a recorded op its autograd node saves for backward, and so which the
// hook remembers by their memory (see _native.h).
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

// The memory of a recorded output stands for its tag where another tensor may come
// over it without an op the hook sees: the copy autograd saves of an output its node
// reads in backward (saved_outputs: relu's, softmax's; not add's or mm's). Backward's
// outputs reach .grad through the `detach` of AccumulateGrad, an alias op
// (remember_alias). Other outputs are not kept: each entry holds its
// StorageImpl weakly, so the StorageImpl of a dead output stays allocated until the
// entry is swept, a small block among the tensors' own memory that split glibc's free
// blocks: a chain of ops on 4 MB tensors under no_grad wrote its outputs to fresh
// memory, and the demo MLP's gradients each step, with page faults (docs/benchmarks.md,
// "Page faults from the hook's table"); and an entry costs about 750 instructions.
// Where the node is not one of torch's generated ones (CopySlices after an in-place
// op on a view, a C++ extension's Function) or the output is a leaf written in place
// (a parameter's update), each output that requires grad is kept.
uint64_t saved_by_node(const std::vector<std::string>& returns, SavedMemo& memo,
                       c10::ArrayRef<c10::IValue> outputs) {  // GIL held
  bool requires_grad = false;
  for (const auto& v : outputs) {
    if (!v.isTensor() || !v.toTensor().defined() || !v.toTensor().requires_grad()) continue;
    const at::Tensor& t = v.toTensor();
    requires_grad = true;
    if (t.is_view()) return kSavedUnknown;  // (its grad_fn may be made anew when read)
    const c10::intrusive_ptr<torch::autograd::Node>& node = t.grad_fn();
    if (!node) continue;
    const std::type_info* type = &typeid(*node);
    if (type != memo.node_type) {
      memo.saved = saved_outputs(returns, node);
      memo.node_type = type;
    }
    return memo.saved;
  }
  return requires_grad ? kSavedUnknown : 0;
}

void remember_output(const at::Tensor& t, PyObject* object, uint64_t saved, size_t i,
                     PyObject* tag) {
  // (a saved output that does not require grad is kept as itself: a leaf)
  if (!t.defined() || !t.requires_grad()) return;
  if (saved == kSavedUnknown || (i < 64 && (saved >> i & 1))) remember_written(t, object, tag);
}

}  // namespace tbn_native
