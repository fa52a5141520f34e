// Shared by the native hook's sources (_native.cpp, _native_tags.cpp, _native_facts.cpp,
// _native_values.cpp).
#pragma once

// Not <torch/extension.h>, which brings the whole C++ frontend: a first enable
// waits for this build, which took 2m53s with it on a 2-core host and 1m11s
// with the headers below (docs/benchmarks.md, "The native hook as the default path").
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <typeinfo>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace tbn_native {

// Tags for tensors that carry none (_native_tags.cpp). Every call holds the GIL.
// A new reference to the tag `t` carries or stands for, or null.
PyObject* tag_of(const at::Tensor& t);
// A new reference to the tag the tables keep for `t` (its own not read), or null.
PyObject* kept_tag(const at::Tensor& t);
// An alias op's output (detach, _unsafe_view) stands for its input's tag.
void remember_alias(const at::Tensor& output, const at::Tensor& source);
// The memory of `t` stands for the tag its Python object `object` carries
// (`tag` when given: the tag the recording gave it, not read again).
void remember_written(const at::Tensor& t, PyObject* object, PyObject* tag = nullptr);
// What an untagged tensor stands for (tags.stand_in_tag), or None.
pybind11::object stand_in_tag(const at::Tensor& t);
// Interns the tag attribute's name (once) and forgets every entry.
void reset_tags();
// Entries that still hold a dead tensor's StorageImpl or TensorImpl (weakly),
// which the allocator cannot have back until the entry lets go. GIL held.
size_t lingering();

// Which outputs of an op (bit i: output i, of `returns`, the schema's names) its
// autograd node `node` saves for backward, as its Python type names them
// (_native_saved.cpp); kSavedUnknown for a node that is not one of torch's generated
// ones. GIL held.
constexpr uint64_t kSavedUnknown = ~uint64_t{0};
uint64_t saved_outputs(const std::vector<std::string>& returns,
                       const c10::intrusive_ptr<torch::autograd::Node>& node);
// saved_outputs for the type of the autograd node an op's outputs had last.
struct SavedMemo {
  const std::type_info* node_type = nullptr;
  uint64_t saved = 0;
};
// Which outputs of a recorded op (its schema's output names `returns`) to remember by
// their memory, as saved_outputs tells for their autograd node (memo'd per op).
uint64_t saved_by_node(const std::vector<std::string>& returns, SavedMemo& memo,
                       c10::ArrayRef<c10::IValue> outputs);
// remember_written for output `i` (Python object `object`) where `saved` keeps it.
void remember_output(const at::Tensor& t, PyObject* object, uint64_t saved, size_t i,
                     PyObject* tag = nullptr);

// A new reference to `value` as Python sees it (_native_values.cpp): None for
// what the capture does not read (GIL held).
PyObject* to_python(const c10::IValue& value);

// The capsule of the tensor facts the C recorder reads (_native_facts.cpp).
pybind11::capsule tensor_facts_capsule();

// The hook's entry, entry(func, args, out), for call_entry_fn (GIL held; null: none).
// The C recorder's native_entry bound to its session is called as the C function it
// is, without CPython's call machinery (about 280 instructions per recorded op).
void set_entry(PyObject* entry);
PyObject* call_entry_fn(PyObject* entry, PyObject* func, PyObject* args, PyObject* out);

}  // namespace tbn_native
