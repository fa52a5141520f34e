// The native hook's tags for tensors that carry none (see _native.cpp and
// _native.h): alias outputs, and memory written by recorded ops or returned
// by compiled calls.

#include "_native.h"

#include <c10/util/SmallVector.h>

#include <array>
#include <iterator>
#include <unordered_map>
#include <vector>

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
  bool dead() const { return output.expired(); }
  bool held() const { return output._unsafe_get_target() != nullptr; }
  void drop() { output.reset(); }  // the dead TensorImpl's memory goes now
};
struct Written {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  c10::SmallVector<int64_t, 5> sizes;  // inline up to 5 dimensions: no allocation per op
  c10::SmallVector<int64_t, 5> strides;
  int64_t offset;
  PyObject* tag;
  bool dead() const { return storage.expired(); }
  bool held() const { return storage._unsafe_get_target() != nullptr; }
  void drop() { storage.reset(); }
};

// Sweeping often matters. While a weak reference holds a dead StorageImpl,
// the host allocator was seen not to reuse its memory (a loop making 100
// tensors of 1.5 MB, each leaving a weak reference, grew by 147 MB; without
// them by 9): with sweeps every 4096 entries, the demo MLP's weight gradient
// was allocated anew each step (1.5 MB of page faults per step) and a tiny
// GPT-2 grew to 2.1 GB in 70 training steps (0.5 GB on the dispatch mode).
// A sweep walks the live entries: it costs live / kSweepEvery per added entry.
constexpr size_t kSweepEvery = 16;

// One table of entries by address. The map nodes of swept entries are kept
// and reused, not freed: a node allocated with malloc per recorded op, among
// the tensors' own allocations, was carved by glibc out of freed tensor
// memory, so that the next tensor of that size found no free block and took
// fresh memory at the heap's top. A loop of `y = y + 1` on 4 MB tensors then
// wrote each output to a new address, walking through 40 MB or more, out of
// the caches: 250-280 µs per op against 115 without the table's allocations
// (docs/benchmarks.md, "Large tensors").
template <typename Key, typename Entry>
struct Table {
  using Map = std::unordered_map<Key, Entry>;
  Map map;
  std::vector<typename Map::node_type> spare;  // swept nodes, for the next entries
  size_t sweep_at = kSweepEvery;
  std::array<Entry*, 4> recent{};  // the entries made or renewed last (until a sweep)
  size_t next_recent = 0;

  // Lets go of the tensors among the latest entries that died since: most
  // are temporaries, dead by the next recorded op, and their StorageImpl (or
  // TensorImpl) goes back to the allocator now, not at the next sweep, up to
  // 16 ops later. Lingering among the tensors' data, those small blocks too
  // sent a loop of 4 MB tensors to fresh addresses (see above). The entry
  // stays, dead, until the sweep.
  void release_recent() {  // GIL held
    for (Entry* e : recent) {
      if (e != nullptr && e->dead()) e->drop();
    }
  }

  void note_recent(Entry* e) {
    recent[next_recent] = e;
    next_recent = (next_recent + 1) % recent.size();
  }

  void sweep() {  // GIL held
    if (map.size() < sweep_at) return;
    recent.fill(nullptr);  // swept entries' nodes are spare now
    for (auto it = map.begin(); it != map.end();) {
      auto next = std::next(it);
      if (it->second.dead()) {
        Py_DECREF(it->second.tag);
        auto node = map.extract(it);
        node.mapped().drop();
        spare.push_back(std::move(node));
      }
      it = next;
    }
    sweep_at = map.size() + kSweepEvery;
  }

  // The entry of `key`, made by `make()` where there is none (in a spare node
  // when one is left); `fresh` tells which.
  template <typename Make>
  Entry& at(Key key, bool* fresh, Make make) {
    auto it = map.find(key);
    *fresh = it == map.end();
    if (!*fresh) return it->second;
    if (spare.empty()) return map.emplace(key, make()).first->second;
    auto node = std::move(spare.back());
    spare.pop_back();
    node.key() = key;
    node.mapped() = make();
    return map.insert(std::move(node)).position->second;
  }

  size_t lingering() const {  // GIL held
    size_t n = 0;
    for (const auto& item : map) n += item.second.held() && item.second.dead();
    return n;
  }

  void forget() {  // GIL held
    for (auto& item : map) Py_DECREF(item.second.tag);
    map.clear();
    spare.clear();
    recent.fill(nullptr);
    sweep_at = kSweepEvery;
  }
};
Table<const c10::TensorImpl*, Aliased> aliased;
Table<const c10::StorageImpl*, Written> written;

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

// A new reference to the tag the tables keep for `t`, or null: that of the input
// of the alias op that made it, else of the recorded output whose memory it
// covers as that output did. GIL held.
PyObject* kept_tag(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  auto a = aliased.map.find(impl);
  if (a != aliased.map.end() && a->second.output.lock().get() == impl) {
    Py_INCREF(a->second.tag);
    return a->second.tag;
  }
  if (!t.has_storage()) return nullptr;
  auto w = written.map.find(t.storage().unsafeGetStorageImpl());
  if (w == written.map.end() || w->second.storage.expired()) return nullptr;
  if (t.sizes() != c10::IntArrayRef(w->second.sizes) ||
      t.strides() != c10::IntArrayRef(w->second.strides) ||
      t.storage_offset() != w->second.offset) {
    return nullptr;
  }
  Py_INCREF(w->second.tag);
  return w->second.tag;
}

// A new reference to the tag `t` carries or stands for, or null. GIL held.
PyObject* tag_of(const at::Tensor& t) {
  if (!t.defined() || tag_attr == nullptr) return nullptr;
  PyObject* object = t.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj();
  if (object != nullptr) {
    PyObject* tag = optional_tag(object);
    if (tag != nullptr) return tag;
  }
  return kept_tag(t);
}

// The tag of what an alias op's input holds: its own, else, for a view that carries
// none (view ops are not recorded), its base's, as tags.producer_tag reads it. Backward
// hands AccumulateGrad views of the memory an op wrote (a bias gradient's `view` of a
// `sum`, a weight gradient's `t` of an `mm`), whose `detach` becomes `.grad`. GIL held.
static PyObject* source_tag(const at::Tensor& source) {
  PyObject* tag = tag_of(source);
  if (tag != nullptr || !source.is_view()) return tag;
  const at::TensorBase& base = source._base();
  return base.defined() ? tag_of(at::Tensor(base)) : nullptr;
}

void remember_alias(const at::Tensor& output, const at::Tensor& source) {  // GIL held
  PyObject* tag = source_tag(source);
  if (tag == nullptr) return;
  aliased.release_recent();
  aliased.sweep();
  bool fresh;
  auto weak = [&] { return c10::weak_intrusive_ptr<c10::TensorImpl>(output.getIntrusivePtr()); };
  Aliased& entry = aliased.at(output.unsafeGetTensorImpl(), &fresh, [&] {
    return Aliased{weak(), nullptr};
  });
  if (!fresh) {  // the address's latest alias replaces its last
    Py_DECREF(entry.tag);
    entry.output = weak();
  }
  entry.tag = tag;
  aliased.note_recent(&entry);
}

void remember_written(const at::Tensor& t, PyObject* object, PyObject* tag) {  // GIL held
  if (!t.defined() || !t.has_storage() || tag_attr == nullptr) return;
  if (tag != nullptr) Py_INCREF(tag);
  else tag = optional_tag(object);
  if (tag == nullptr) return;
  written.release_recent();
  written.sweep();
  bool fresh;
  Written& entry = written.at(t.storage().unsafeGetStorageImpl(), &fresh, [&] {
    return Written{t.storage().getWeakStorageImpl(), {}, {}, 0, nullptr};
  });
  if (!fresh) {  // the storage's latest write replaces its last
    Py_DECREF(entry.tag);
    entry.storage = t.storage().getWeakStorageImpl();
  }
  entry.sizes.assign(t.sizes().begin(), t.sizes().end());
  entry.strides.assign(t.strides().begin(), t.strides().end());
  entry.offset = t.storage_offset();
  entry.tag = tag;
  written.note_recent(&entry);
}

// What an untagged tensor stands for (its callers read its own tag first): the
// tag of the input of the alias op that made it, else of the recorded output it
// copies; None when neither.
pybind11::object stand_in_tag(const at::Tensor& t) {
  PyObject* tag = kept_tag(t);
  if (tag == nullptr) return pybind11::none();
  return pybind11::reinterpret_steal<pybind11::object>(tag);
}

size_t lingering() { return aliased.lingering() + written.lingering(); }

void reset_tags() {
  if (tag_attr == nullptr) tag_attr = PyUnicode_InternFromString("_tbn_tag");
  aliased.forget();
  written.forget();
}

}  // namespace tbn_native
