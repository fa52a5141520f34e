// The native per-op hook of the torch capture: a dispatch key's boxed fallback
// in place of the Python TorchDispatchMode (tb_numerics_plugin/torch/native.py).
//
// While the hook is installed, the thread's dispatch keys include kHookKey, a
// mode key above every other: each op the dispatcher is asked to call reaches
// the hook first, composite ops and the ops they decompose into alike, and the
// nested calls a kernel makes. The hook keeps the ops a dispatch mode would
// see: the outermost op of a nest whose kernel is not a decomposition
// (CompositeImplicitAutograd), which runs with the key excluded, so that ops
// inside it run unseen. Only the op's own inputs are boxed, once; an earlier
// version hooked RecordFunction callbacks, which box every nested op's inputs
// and outputs and cost about six times as much per op (docs/benchmarks.md).
//
// Per operator a Python judge gives a verdict once (cached here):
//   TRANSPARENT  a decomposition (or not ours to see): its inner ops count;
//   SILENT       views and storage plumbing the capture skips: it claims its
//                nest and nothing crosses into Python;
//   RECORD       the op's inputs (copied before it runs) and outputs
//                go to the Python entry, under the GIL, after the op ran;
//   ALIAS        an output sharing its input's storage without being a view
//                (detach, _unsafe_view): given its input's tag here, so that
//                data flow reaches the producer (stand_in_tag) without a
//                Python object for the output. torch attaches subclass
//                objects to such outputs (Parameter's detach, as_subclass's
//                alias); one made here first would make that fail.
// The tags of tensors that carry none (alias outputs, memory written by
// recorded ops or returned by compiled calls) are kept in _native_tags.cpp.
//
// Ops under any TorchDispatchMode (fake tensors while torch.compile traces,
// a user's own mode), ops where torch excludes the Python dispatch key, and
// ops on tensor subclasses are transparent: the hook sees what a dispatch
// mode would see, and only plain tensors have values to check. While compiled
// regions keep compiled, the ops a compiled graph's generated code calls are
// not recorded: its record comes from custom_ops.emit, as under the mode. The hook
// never lets an exception of its own out: Python errors are cleared, C++ ones
// swallowed.

#include "_native.h"

#include <torch/csrc/autograd/python_variable.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using namespace tbn_native;

enum Verdict : int { TRANSPARENT = 0, SILENT = 1, RECORD = 2, ALIAS = 3 };

// The hook's dispatch key: a mode key above autograd that torch itself leaves
// unused outside its own tests (no kernels, no fallback). An op reaches it
// before any other key, as it reaches RecordFunction callbacks.
constexpr c10::DispatchKey kHookKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

struct Op {
  int verdict;
  PyObject* func;  // the OpOverload (a strong reference for the process's life)
  std::vector<std::string> returns;  // the schema's names of its outputs ("" unnamed)
  mutable SavedMemo saved;  // which outputs its autograd node saves (GIL held)
};

// One installed hook at a time; `generation` tells an op claimed before an
// uninstall() (on another thread, or by the recording) to record nothing.
std::atomic<uint64_t> generation{0};
PyObject* entry = nullptr;  // callable(func, args tuple, out)
PyObject* judge = nullptr;  // callable(qualified name, overload name) -> (verdict, func)
PyObject* carrier_of = nullptr;  // callable(exception) -> a class raising it again, argument-less
unsigned long main_thread = 0;  // its identity (threading.main_thread().ident)
// compiled.frames.called_from_compiled and custom_ops.instrumented, or null: the ops compiled code
// calls (extern kernels, health rows, emits) are the graph's, recorded by custom_ops.emit
PyObject* from_compiled = nullptr;  // callable(frame) -> bool
PyObject* instrumented = nullptr;  // dict: empty until a graph was instrumented
std::mutex ops_lock;
std::unordered_map<c10::OperatorName, Op> ops;  // by name and overload

// torch.compile's compilations in progress (its start and end callbacks, native.py):
// the ops a compiler runs on real tensors (inductor's lowerings, AOTAutograd's RNG
// state) are not the user's. Process-wide: a compile may end on another thread.
std::atomic<int> compiling{0};

bool on_python_key(c10::ArrayRef<const c10::IValue> values) {
  for (const auto& v : values) {
    if (v.isTensor()) {
      const auto& t = v.toTensor();
      if (t.defined() && t.key_set().has(c10::DispatchKey::Python)) return true;
    }
  }
  return false;
}

// Raises a pending exception (a strong reference) again, as a pending call of
// the main thread's interpreter, which takes it from here (runs with the GIL).
int raise_again(void* exception) {
  PyObject* value = static_cast<PyObject*>(exception);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(value)), value);
  Py_DECREF(value);
  return -1;
}

// Ends a failed Python call (GIL held): an Exception is the recording's own
// (counted by the entry) and dropped; a KeyboardInterrupt or SystemExit that a
// signal handler raised while Python ran here is the user's, raised again at
// the thread's next bytecode (the hook cannot raise into the op). If that
// bytecode is the recording of a later op, it comes back here and goes on
// again, until it lands in the user's code or a module hook.
// Signal handlers run in the main thread: there the exception itself goes back
// as a pending call. An asynchronous exception (other threads, or a full queue)
// takes a class, the carrier, which Python 3.11 leaves unnormalized where
// nothing catches it; a SystemExit there would exit with 0, not its code.
void settle_error() {
  if (!PyErr_Occurred()) return;
  if (PyErr_ExceptionMatches(PyExc_Exception) || carrier_of == nullptr) {
    PyErr_Clear();
    return;
  }
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (value != nullptr && traceback != nullptr) PyException_SetTraceback(value, traceback);
  if (value != nullptr && PyThread_get_thread_ident() == main_thread &&
      Py_AddPendingCall(raise_again, value) == 0) {
    value = nullptr;  // the pending call owns it now
  } else {
    PyObject* carrier = value != nullptr ? PyObject_CallOneArg(carrier_of, value) : nullptr;
    if (carrier != nullptr) {
      // set last, from C: raised at the next bytecode, which is no longer ours here
      PyThreadState_SetAsyncExc(PyThread_get_thread_ident(), carrier);
      Py_DECREF(carrier);
    } else {
      PyErr_Clear();
    }
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
}

// The GIL for a Python call of the hook, through CPython's own PyGILState calls:
// pybind11's gil_scoped_acquire, which interoperates with them, looks its thread
// state up in its own table first (about 150 instructions more per recorded op,
// callgrind, tight loop). Either makes a thread state for a thread without one.
class Gil {
 public:
  Gil() : state_(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(state_); }
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;

 private:
  PyGILState_STATE state_;
};

// The cached verdict of the op being called; asks the judge on first sight.
const Op* lookup(const c10::OperatorHandle& handle) {
  const c10::OperatorName& name = handle.operator_name();
  {
    std::lock_guard<std::mutex> guard(ops_lock);
    auto it = ops.find(name);
    if (it != ops.end()) return &it->second;
  }
  Gil gil;
  if (judge == nullptr) return nullptr;
  PyObject* got = PyObject_CallFunction(judge, "ss", name.name.c_str(),
                                        name.overload_name.c_str());
  int verdict = TRANSPARENT;
  PyObject* func = nullptr;
  if (got != nullptr && PyTuple_Check(got) && PyTuple_GET_SIZE(got) == 2) {
    verdict = static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(got, 0)));
    func = PyTuple_GET_ITEM(got, 1);
    Py_INCREF(func);
  }
  settle_error();
  Py_XDECREF(got);
  if (verdict != TRANSPARENT && (func == nullptr || func == Py_None)) verdict = TRANSPARENT;
  std::lock_guard<std::mutex> guard(ops_lock);
  std::vector<std::string> returns;
  for (const auto& r : handle.schema().returns()) returns.push_back(r.name());
  auto inserted = ops.emplace(name, Op{verdict, func, std::move(returns)});
  if (!inserted.second) Py_XDECREF(func);  // another thread judged it meanwhile
  return &inserted.first->second;
}

// Operators deregistered so far: a freed operator entry's address may come back
// as another operator's, so the threads' caches below start again after one.
std::atomic<uint64_t> deregistered{0};

struct Deregistrations final : c10::OpRegistrationListener {
  void onOperatorRegistered(const c10::OperatorHandle&) override {}
  void onOperatorDeregistered(const c10::OperatorHandle&) override {
    deregistered.fetch_add(1, std::memory_order_release);
  }
};

// The verdicts this thread has looked up, by the address of the operator's
// name in its dispatcher entry: no lock and no hashing of names per op.
struct SeenOps {
  uint64_t epoch = 0;
  std::unordered_map<const void*, const Op*> verdicts;
};
thread_local SeenOps seen;

const Op* cached_lookup(const c10::OperatorHandle& op) {
  SeenOps& mine = seen;
  const uint64_t now = deregistered.load(std::memory_order_acquire);
  if (mine.epoch != now) {
    mine.verdicts.clear();
    mine.epoch = now;
  }
  const c10::OperatorName& name = op.operator_name();
  auto it = mine.verdicts.find(&name);
  if (it != mine.verdicts.end()) return it->second;
  const Op* found = lookup(op);
  if (found != nullptr) mine.verdicts.emplace(&name, found);
  return found;
}

// The op's verdict where the hook looks at it now, else null (transparent): not
// while torch.compile compiles, under a TorchDispatchMode (fake tensors while
// torch.compile traces, a user's own mode), where torch keeps ops from every
// dispatch mode (the Python key excluded), or on tensor subclasses: what a
// mode cannot see, this hook does not record.
const Op* verdict_of(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> inputs) {
  if (entry == nullptr || compiling.load(std::memory_order_relaxed) > 0) return nullptr;
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) return nullptr;
  if (c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Python)) return nullptr;
  const Op* found = cached_lookup(op);
  if (found == nullptr || found->verdict == TRANSPARENT || on_python_key(inputs)) return nullptr;
  return found;
}

// Whether the op was called by a compiled graph's generated code (the dispatch
// mode's check, frames.called_from_compiled, from the op's calling frame).
bool called_from_compiled() {  // GIL held
  if (from_compiled == nullptr || PyDict_GET_SIZE(instrumented) == 0) return false;
  PyObject* frame = reinterpret_cast<PyObject*>(PyEval_GetFrame());
  PyObject* got = PyObject_CallOneArg(from_compiled, frame ? frame : Py_None);
  int yes = got != nullptr ? PyObject_IsTrue(got) : -1;
  Py_XDECREF(got);
  if (yes < 0) settle_error();
  return yes > 0;
}

void call_entry(const Op* op, c10::ArrayRef<c10::IValue> inputs,
                c10::ArrayRef<c10::IValue> outputs) {  // GIL held
  if (entry == nullptr || !Py_IsInitialized() || called_from_compiled()) return;
  PyObject* args = PyTuple_New(static_cast<Py_ssize_t>(inputs.size()));
  if (args == nullptr) {
    PyErr_Clear();
    return;
  }
  for (size_t i = 0; i < inputs.size(); ++i) PyTuple_SET_ITEM(args, i, to_python(inputs[i]));
  PyObject* out;
  if (outputs.empty()) {
    out = Py_None;
    Py_INCREF(out);
  } else if (outputs.size() == 1) {
    out = to_python(outputs[0]);
  } else {
    out = PyTuple_New(static_cast<Py_ssize_t>(outputs.size()));
    for (size_t i = 0; i < outputs.size(); ++i) PyTuple_SET_ITEM(out, i, to_python(outputs[i]));
  }
  PyObject* done = call_entry_fn(entry, op->func, args, out);
  if (done == nullptr) settle_error();  // never raise into the op
  const uint64_t saved = saved_by_node(op->returns, op->saved, outputs);
  if (saved != 0 && outputs.size() == 1 && outputs[0].isTensor()) {
    // the C entry answers the tag it gave the output (no attribute read for it)
    remember_output(outputs[0].toTensor(), out, saved, 0,
                    done != nullptr && PyTuple_Check(done) ? done : nullptr);
  } else if (saved != 0 && outputs.size() > 1) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].isTensor()) {
        remember_output(outputs[i].toTensor(), PyTuple_GET_ITEM(out, i), saved, i);
      }
    }
  }
  Py_XDECREF(done);
  Py_DECREF(args);
  Py_XDECREF(out);
}

// After a claimed op ran: RECORD hands its inputs and outputs to the entry, ALIAS
// gives its output the tag of the input it aliases. The hook's copies of the
// inputs (and the alias source) are let go before the GIL is: where one holds
// the last reference to a tensor besides its Python object, dropping it drops a
// reference to that object (torch's PyObject preservation, c10/util/intrusive_ptr.h),
// which takes the GIL, a second time per op were it released by then (about
// 1,100 instructions, a third of the empty hook's floor in the tight loop).
void settle(const Op* op, c10::SmallVectorImpl<c10::IValue>& inputs, at::Tensor& source,
            c10::ArrayRef<c10::IValue> outputs) {
  if (op->verdict == RECORD) {
    Gil gil;
    call_entry(op, inputs, outputs);
    inputs.clear();
  } else if (source.defined() && outputs.size() == 1 && outputs[0].isTensor() &&
             outputs[0].toTensor().defined()) {
    Gil gil;
    if (entry != nullptr) remember_alias(outputs[0].toTensor(), source);
    source.reset();
  }
}

// The hook: the boxed fallback of kHookKey, which the calling thread's dispatch
// keys include while the hook is installed (and the autograd threads it starts,
// through torch's thread-local state). An op it claims runs below the key with
// the key excluded: the ops its kernel calls, and those the recording runs, are
// not seen. Others run below the key as they are, their inner ops seen. The op's
// own errors reach its caller; the hook's never do.
void hook(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto below = keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kHookKey);
  const size_t num_args = op.schema().arguments().size();
  const Op* found = nullptr;
  try {
    found = verdict_of(op, torch::jit::last(*stack, num_args));
  } catch (...) {
  }
  if (found == nullptr) return op.redispatchBoxed(below, stack);
  c10::impl::ExcludeDispatchKeyGuard claimed(kHookKey);
  const uint64_t opened = generation.load(std::memory_order_relaxed);
  c10::SmallVector<c10::IValue, 8> inputs;  // RECORD only (inline: no allocation per op)
  at::Tensor source;  // ALIAS only: the input the output aliases
  try {
    auto args = torch::jit::last(*stack, num_args);
    if (found->verdict == RECORD) {
      inputs.assign(args.begin(), args.end());
    } else if (found->verdict == ALIAS && !args.empty() && args[0].isTensor()) {
      source = args[0].toTensor();
    }
  } catch (...) {
  }
  op.redispatchBoxed(below, stack);
  if (opened != generation.load(std::memory_order_relaxed)) return;  // uninstalled meanwhile
  try {
    settle(found, inputs, source, torch::jit::last(*stack, op.schema().returns().size()));
  } catch (...) {
  }
}

// The hook's fallback, registered once per process; an error when another
// library's fallback holds the key.
void register_hook() {
  static std::mutex lock;
  static torch::Library* library = nullptr;
  std::lock_guard<std::mutex> guard(lock);
  if (library != nullptr) return;
  if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(kHookKey)) {
    throw std::runtime_error(std::string("the dispatch key ") + c10::toString(kHookKey) +
                             " already has a fallback in this process");
  }
  // held for the process's life, as the fallback is
  new c10::RegistrationHandleRAII(c10::Dispatcher::singleton().addRegistrationListener(
      std::make_unique<Deregistrations>()));
  library = new torch::Library(torch::Library::IMPL, "_", kHookKey, __FILE__, __LINE__);
  library->fallback(torch::CppFunction::makeFromBoxedFunction<&hook>());
}

// Installs the hook on the calling thread. Returns whether the thread's dispatch
// keys included the hook's key before, for uninstall.
// `from_compiled_fn` and `instrumented_map`: None, or frames.called_from_compiled
// and custom_ops.instrumented while compiled regions keep compiled.
bool install(pybind11::object entry_fn, pybind11::object judge_fn,
             pybind11::object carrier_of_fn, pybind11::object from_compiled_fn,
             pybind11::object instrumented_map) {
  register_hook();
  set_entry(nullptr);
  Py_XDECREF(entry);
  Py_XDECREF(judge);
  Py_XDECREF(carrier_of);
  Py_CLEAR(from_compiled);
  Py_CLEAR(instrumented);
  compiling.store(0);
  entry = entry_fn.inc_ref().ptr();
  set_entry(entry);
  judge = judge_fn.inc_ref().ptr();
  carrier_of = carrier_of_fn.inc_ref().ptr();
  main_thread = pybind11::module_::import("threading").attr("main_thread")().attr("ident")
                    .cast<unsigned long>();
  if (!from_compiled_fn.is_none() && PyDict_Check(instrumented_map.ptr())) {
    from_compiled = from_compiled_fn.inc_ref().ptr();
    instrumented = instrumented_map.inc_ref().ptr();
  }
  reset_tags();
  generation.fetch_add(1);
  const bool before = c10::impl::tls_is_dispatch_key_included(kHookKey);
  c10::impl::tls_set_dispatch_key_included(kHookKey, true);
  return before;
}

// Removes the hook from this thread (threads that still include its key pass
// their ops through: the entry is gone).
void uninstall(bool before) {
  generation.fetch_add(1);
  c10::impl::tls_set_dispatch_key_included(kHookKey, before);
  set_entry(nullptr);
  Py_XDECREF(entry);
  entry = nullptr;
  Py_CLEAR(from_compiled);
  Py_CLEAR(instrumented);
  reset_tags();
}

bool installed() { return entry != nullptr; }

void compile_started() { compiling.fetch_add(1); }

void compile_ended() {  // never below 0 (a compile that began before install)
  int n = compiling.load();
  while (n > 0 && !compiling.compare_exchange_weak(n, n - 1)) {
  }
}

// Notes the tag a compiled call's returned value carries for the memory it
// covers (compiled.record.CompiledCalls._mark_returned): the caller may get another tensor
// object over that memory, which stand_in_tag then finds.
void remember(pybind11::object value) {
  if (!THPVariable_Check(value.ptr())) return;
  remember_written(THPVariable_Unpack(value.ptr()), value.ptr());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "tb-numerics native per-op hook (a dispatch key's boxed fallback)";
  m.def("install", &install,
        "install(entry, judge, carrier_of, from_compiled, instrumented) -> handle");
  m.def("register_hook", &register_hook, "registers the hook's fallback (once per process)");
  m.def("compile_started", &compile_started, "a torch.compile compilation began");
  m.def("compile_ended", &compile_ended, "a torch.compile compilation ended");
  m.def("remember", &remember, "remember(tensor): its tag stands for its memory");
  m.def("uninstall", &uninstall, "uninstall(handle)");
  m.def("stand_in_tag", &stand_in_tag, "stand_in_tag(tensor): the tag it stands for, or None");
  m.def("installed", &installed, "installed(): whether a hook is installed");
  m.def("lingering", &lingering,
        "lingering(): entries still holding a dead tensor's StorageImpl or TensorImpl");
  m.attr("TENSOR_FACTS") = tbn_native::tensor_facts_capsule();
  m.attr("HOOK_KEY") = static_cast<int>(kHookKey);
}
