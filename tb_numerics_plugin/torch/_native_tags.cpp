// The native hook's tags for tensors that carry none (see _native.cpp and
// _native.h): alias outputs, and memory written by recorded ops or returned
// by compiled calls.

#include "_native.h"

#include <c10/util/SmallVector.h>

#include <unordered_map>

namespace tbn_native {
namespace {

PyObject* tag_attr = nullptr;  // "_tbn_tag", interned

// Tags for tensors that carry none, kept under the GIL (tags are Python
// tuples, held strongly; the tensors weakly, entries of dead ones swept once
// kSweepEvery entries were added since the last sweep):
//  - alias outputs (detach, _unsafe_view): the tag of the input they alias,
//    taken when the alias op ran (the input is often a temporary);
//  - by storage, the tag of the latest recorded output written there:
//    autograd saves an op's output for backward as a new tensor over the
//    same storage (no op runs, no hook sees it), and may free the output
//    itself before the backward op reads that copy.
struct Aliased {
  c10::weak_intrusive_ptr<c10::TensorImpl> output;
  PyObject* tag;
};
struct Written {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  c10::SmallVector<int64_t, 5> sizes;  // inline up to 5 dimensions: no allocation per op
  c10::SmallVector<int64_t, 5> strides;
  int64_t offset;
  PyObject* tag;
};
std::unordered_map<const c10::TensorImpl*, Aliased> aliased;
std::unordered_map<const c10::StorageImpl*, Written> written;
// Sweeping often matters. While a weak reference holds a dead StorageImpl,
// the host allocator was seen not to reuse its memory (a loop making 100
// tensors of 1.5 MB, each leaving a weak reference, grew by 147 MB; without
// them by 9): with sweeps every 4096 entries, the demo MLP's weight gradient
// was allocated anew each step (1.5 MB of page faults per step) and a tiny
// GPT-2 grew to 2.1 GB in 70 training steps (0.5 GB on the dispatch mode).
// A sweep walks the live entries: it costs live / kSweepEvery per added entry.
constexpr size_t kSweepEvery = 16;
size_t aliased_sweep_at = kSweepEvery;
size_t written_sweep_at = kSweepEvery;

template <typename Map, typename Dead>
void sweep(Map& map, size_t& sweep_at, Dead dead) {  // GIL held
  if (map.size() < sweep_at) return;
  for (auto it = map.begin(); it != map.end();) {
    if (dead(it->second)) {
      Py_DECREF(it->second.tag);
      it = map.erase(it);
    } else {
      ++it;
    }
  }
  sweep_at = map.size() + kSweepEvery;
}

template <typename Map>
void forget(Map& map) {  // GIL held
  for (auto& item : map) Py_DECREF(item.second.tag);
  map.clear();
}

// A new reference to the tag of a tensor object, or null (no exception): no
// AttributeError is raised and cleared for an untagged one (about 3,500
// instructions), a parameter say, or the output of an op whose recording failed.
PyObject* optional_tag(PyObject* object) {
  PyObject* tag = nullptr;
#if PY_VERSION_HEX >= 0x030D0000
  int found = PyObject_GetOptionalAttr(object, tag_attr, &tag);
#else
  int found = _PyObject_LookupAttr(object, tag_attr, &tag);
#endif
  if (found < 0) PyErr_Clear();
  return found > 0 ? tag : nullptr;
}

}  // namespace

// A new reference to the tag `t` carries or stands for, or null. GIL held.
PyObject* tag_of(const at::Tensor& t) {
  if (!t.defined() || tag_attr == nullptr) return nullptr;
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  PyObject* object = impl->pyobj_slot()->load_pyobj();
  if (object != nullptr) {
    PyObject* tag = optional_tag(object);
    if (tag != nullptr) return tag;
  }
  auto a = aliased.find(impl);
  if (a != aliased.end() && a->second.output.lock().get() == impl) {
    Py_INCREF(a->second.tag);
    return a->second.tag;
  }
  if (!t.has_storage()) return nullptr;
  auto w = written.find(t.storage().unsafeGetStorageImpl());
  if (w == written.end() || w->second.storage.expired()) return nullptr;
  if (t.sizes() != c10::IntArrayRef(w->second.sizes) ||
      t.strides() != c10::IntArrayRef(w->second.strides) ||
      t.storage_offset() != w->second.offset) {
    return nullptr;
  }
  Py_INCREF(w->second.tag);
  return w->second.tag;
}

void remember_alias(const at::Tensor& output, const at::Tensor& source) {  // GIL held
  PyObject* tag = tag_of(source);
  if (tag == nullptr) return;
  sweep(aliased, aliased_sweep_at, [](const Aliased& e) { return e.output.expired(); });
  const c10::TensorImpl* impl = output.unsafeGetTensorImpl();
  auto it = aliased.find(impl);
  if (it != aliased.end()) {
    Py_DECREF(it->second.tag);
    aliased.erase(it);
  }
  aliased.emplace(impl, Aliased{c10::weak_intrusive_ptr<c10::TensorImpl>(
                                    output.getIntrusivePtr()), tag});
}

void remember_written(const at::Tensor& t, PyObject* object) {  // GIL held
  if (!t.defined() || !t.has_storage() || tag_attr == nullptr) return;
  PyObject* tag = optional_tag(object);
  if (tag == nullptr) return;
  sweep(written, written_sweep_at, [](const Written& e) { return e.storage.expired(); });
  const c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
  auto it = written.find(key);
  if (it == written.end()) {
    it = written.emplace(key, Written{t.storage().getWeakStorageImpl(), {}, {}, 0, nullptr})
             .first;
  } else {  // the storage's latest write replaces its last
    Py_DECREF(it->second.tag);
    it->second.storage = t.storage().getWeakStorageImpl();
  }
  Written& entry = it->second;
  entry.sizes.assign(t.sizes().begin(), t.sizes().end());
  entry.strides.assign(t.strides().begin(), t.strides().end());
  entry.offset = t.storage_offset();
  entry.tag = tag;
}

// What an untagged tensor stands for: the tag of the input of the alias op
// that made it, else of the recorded output it copies; None when neither.
pybind11::object stand_in_tag(const at::Tensor& t) {
  PyObject* tag = tag_of(t);
  if (tag == nullptr) return pybind11::none();
  return pybind11::reinterpret_steal<pybind11::object>(tag);
}

void reset_tags() {
  if (tag_attr == nullptr) tag_attr = PyUnicode_InternFromString("_tbn_tag");
  forget(aliased);
  forget(written);
  aliased_sweep_at = written_sweep_at = kSweepEvery;
}

}  // namespace tbn_native
