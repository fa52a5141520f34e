/* Where an op belongs: its call site, its forward node remembered for backward,
 * and the claim take_op makes before it records anything (part of _record.c's
 * extension; its name is _record_names.c's). */
#include "_record.h"

/* ---- call sites (stacks.StackTracker.call_site) --------------------------------- */

/* A memo in front of the bound session's StackTracker._is_user (code object ->
 * user code) and _sites ((id(code), f_lasti) -> frame ids), whose lookups make
 * an int and a tuple key and hash them, about 1,200 instructions per op. Direct
 * mapped by address. The tracker keeps every code object _user_code saw alive
 * (_codes), and the memo learns only of those, so an address cannot stand for
 * another code object while the session is bound; the memo is forgotten with
 * the binding (forget_call_sites: another session, or unbind at stop, before
 * a later enable configures the tracker again). It holds what the tracker's
 * dicts hold, which keep it. */
#define MEMO_SIZE 256
static struct {
  const void* code;
  int user;
} user_memo[MEMO_SIZE];
static struct {
  const void* code;
  long lasti;
  PyObject* ids;
} site_memo[MEMO_SIZE];

void forget_call_sites(void) {
  for (int i = 0; i < MEMO_SIZE; i++) {
    user_memo[i].code = NULL;
    site_memo[i].code = NULL;
    Py_CLEAR(site_memo[i].ids);
  }
}

static size_t memo_slot(const void* code, long lasti) {
  uintptr_t h = ((uintptr_t)code >> 4) ^ ((uintptr_t)lasti * 0x9E3779B1u);
  return (size_t)(h ^ (h >> 8)) & (MEMO_SIZE - 1);
}

/* StackTracker._user_code(code) through the memo: 1, 0, or -1 on error. */
static int user_code(PyObject* session, PyObject* stacks, PyCodeObject* code) {
  size_t slot = memo_slot(code, 0);
  if (user_memo[slot].code == code) return user_memo[slot].user;
  PyObject* is_user = bound_attr(session, B_IS_USER);
  PyObject* code_id = is_user ? PyLong_FromVoidPtr(code) : NULL;
  PyObject* user = code_id ? lookup(is_user, code_id) : NULL;
  if (user == NULL && !PyErr_Occurred() && code_id != NULL)
    user = PyObject_CallMethodOneArg(stacks, s_user_code, (PyObject*)code);
  int truth = user ? PyObject_IsTrue(user) : -1;
  Py_XDECREF(is_user);
  Py_XDECREF(code_id);
  Py_XDECREF(user);
  if (truth >= 0) {
    user_memo[slot].code = code;
    user_memo[slot].user = truth;
  }
  return truth;
}

/* frame.f_lasti, or -1 with an error. */
static long frame_lasti(PyFrameObject* f) {
#if PY_VERSION_HEX >= 0x030B0000
  return (long)PyFrame_GetLasti(f);
#else
  PyObject* value = PyObject_GetAttr((PyObject*)f, s_f_lasti);
  long lasti = value ? PyLong_AsLong(value) : -1;
  Py_XDECREF(value);
  return lasti;
#endif
}

/* StackTracker._sites[(id(code), f_lasti)] of user frame `f`, walked and kept
 * there on a miss; through the memo. A new reference, NULL on error. */
static PyObject* site_of(PyObject* session, PyObject* stacks, PyFrameObject* f) {
  PyCodeObject* code = PyFrame_GetCode(f);
  long lasti = frame_lasti(f);
  PyObject *sites = NULL, *code_id = NULL, *lasti_value = NULL, *key = NULL, *ids = NULL;
  size_t slot = memo_slot(code, lasti);
  if (lasti == -1 && PyErr_Occurred()) goto done;
  if (site_memo[slot].code == code && site_memo[slot].lasti == lasti) {
    ids = Py_NewRef(site_memo[slot].ids);
    goto done;
  }
  if ((sites = bound_attr(session, B_SITES)) == NULL) goto done;
  if ((code_id = PyLong_FromVoidPtr(code)) == NULL) goto done;
  if ((lasti_value = PyLong_FromLong(lasti)) == NULL) goto done;
  if ((key = PyTuple_Pack(2, code_id, lasti_value)) == NULL) goto done;
  ids = lookup(sites, key);
  if (ids == NULL && !PyErr_Occurred()) {
    ids = PyObject_CallMethodOneArg(stacks, s_walk, (PyObject*)f);
    if (ids != NULL && PyObject_SetItem(sites, key, ids) < 0) Py_CLEAR(ids);
  }
  if (ids != NULL) {
    site_memo[slot].code = code;
    site_memo[slot].lasti = lasti;
    Py_XSETREF(site_memo[slot].ids, Py_NewRef(ids));
  }
done:
  Py_DECREF(code);
  Py_XDECREF(sites);
  Py_XDECREF(code_id);
  Py_XDECREF(lasti_value);
  Py_XDECREF(key);
  return ids;
}

/* The frame ids of the innermost user frame at or above the current Python frame
 * (the hooks' entries are C: no frame of the capture is above the op's caller);
 * () when there is none. New reference, NULL on error. */
PyObject* call_site(PyObject* session) {
  PyObject* result = NULL;
  PyFrameObject* f = PyEval_GetFrame();
  Py_XINCREF(f);
  PyObject* stacks = bound_attr(session, B_STACKS);  /* binds the session first */
  if (stacks == NULL) goto done;
  while (f != NULL) {
    PyCodeObject* code = PyFrame_GetCode(f);
    int user = user_code(session, stacks, code);
    Py_DECREF(code);
    if (user < 0) goto done;
    if (user) break;
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  result = f == NULL ? PyTuple_New(0) : site_of(session, stacks, f);
done:
  Py_XDECREF(f);
  Py_XDECREF(stacks);
  return result;
}

/* The session's ForwardOps (a new reference), or NULL with an error. */
static ForwardOps* forward_ops(PyObject* session) {
  return (ForwardOps*)bound_of_type(session, B_SEQ_OPS, &ForwardOpsType);
}

/* Session._remember_forward: the op's autograd node (the thread's sequence
 * counter has moved one past it) -> (op_name, stack_ids, first tensor id). */
int remember_forward(PyObject* session, PyObject* name, PyObject* stack_ids,
                     long long first_id) {
  long long nr;
  if (native_api != NULL) {
    nr = native_api->sequence_nr();
  } else {
    PyObject* counter = PyObject_CallNoArgs(cfg.sequence_nr);
    nr = counter ? PyLong_AsLongLong(counter) : -1;
    Py_XDECREF(counter);
    if (nr == -1 && PyErr_Occurred()) return -1;
  }
  ForwardOps* ops = forward_ops(session);
  int status = ops ? forward_remember(ops, nr - 1, name, stack_ids, first_id) : -1;
  Py_XDECREF(ops);
  return status;
}

/* ---- the op ------------------------------------------------------------------------ */


void release(Claim* c) {
  Py_CLEAR(c->facts);
  Py_CLEAR(c->segment);
  Py_CLEAR(c->scope);
  Py_CLEAR(c->serial);
  Py_CLEAR(c->stack_ids);
  Py_CLEAR(c->outputs);
  Py_CLEAR(c->single);
  Py_CLEAR(c->first_slot);
}

/* 1 while autograd evaluates a node on this thread, with its sequence number in
 * `nr`; 0 outside backward, -1 on error: from the native hook without a Python
 * object for the node, else through Python. */
static int evaluated_node(long long* nr) {
  if (native_api != NULL) return native_api->current_node(nr);
  PyObject* node = PyObject_CallNoArgs(cfg.autograd_node);
  if (node == NULL) return -1;
  if (node == Py_None) {
    Py_DECREF(node);
    return 0;
  }
  PyObject* seq = PyObject_CallMethodNoArgs(node, s_sequence_nr);
  Py_DECREF(node);
  int overflow = 0;  /* AccumulateGrad's nodes carry UINT64_MAX: -1, no forward op */
  *nr = seq ? PyLong_AsLongLongAndOverflow(seq, &overflow) : -1;
  Py_XDECREF(seq);
  if (overflow) *nr = -1;
  return *nr == -1 && PyErr_Occurred() ? -1 : 1;
}

/* "backward/" + `name`, behind a memo by the name's address. Op names are kept across
 * executions (_record_names.c), so a step's backward ops find their scopes here: no
 * new string, whose hash the scope's dict lookups would compute again, per op. */
#define BACKWARD_MEMO_SIZE 256
static MemoEntry backward_memo[BACKWARD_MEMO_SIZE];

static PyObject* backward_name(PyObject* name) {
  MemoEntry* entry = memo_entry(backward_memo, BACKWARD_MEMO_SIZE, name);
  if (entry->key == name) return Py_NewRef(entry->value);
  PyObject* scope = PyUnicode_Concat(cfg.backward_slash, name);
  if (scope != NULL) memo_keep(entry, name, scope);
  return scope;
}

/* The scope of a backward op (Session.on_op): "backward/" + the forward op that
 * made its autograd node, with that op's stack ids; "backward" and () when the
 * node was not seen forward. */
static int backward_scope(PyObject* session, long long seq, Claim* c) {
  ForwardOps* ops = forward_ops(session);
  if (ops == NULL) return -1;
  const Forward* fwd = forward_op(ops, seq);
  if (fwd != NULL) {
    c->scope = backward_name(fwd->name);
    c->stack_ids = Py_NewRef(fwd->stack_ids);
  } else {
    c->scope = Py_NewRef(cfg.backward_prefix);
    c->stack_ids = PyTuple_New(0);
  }
  Py_DECREF(ops);
  return c->scope && c->stack_ids ? 0 : -1;
}

/* claim_scope's answer when no open segment takes the op: Python opens it first. */
enum { NO_SEGMENT = 2 };

/* 1 when the eager run `seg` has room for another op (recorder.EAGER_BATCH),
 * NO_SEGMENT when the next run must start, -1 on error. */
static int eager_room(PyObject* seg) {
  PyObject* eager = segment_attr(seg, S_EAGER);
  Py_ssize_t size = eager ? PyObject_Length(eager) : -1;
  Py_XDECREF(eager);
  return size < 0 ? -1 : size < cfg.eager_batch ? 1 : NO_SEGMENT;
}

/* The session's Scopes (hooks.Scopes, a _record.ScopeState): a new reference, or
 * NULL with an error. */
static ScopeState* scope_state(PyObject* session) {
  return (ScopeState*)bound_of_type(session, B_SCOPES, &ScopeStateType);
}

/* Where the op belongs, as Session.on_op decides it: 1 for a module call's or an
 * optimizer step's open graph segment; outside both, for the open backward
 * segment while autograd evaluates a node, else for the open run of eager ops
 * (c->eager); NO_SEGMENT when Python must open the op's segment first
 * (Session.open_for_op), 0 when Python records the op (a module called during
 * backward, say). Fills segment, scope and, backward, stack_ids. */
static int claim_scope(PyObject* session, Claim* c) {
  int result = -1;
  ScopeState* scopes = scope_state(session);
  if (scopes == NULL) return -1;
  Py_ssize_t depth = scopes->depth;
  int in_optimizer = depth <= 0 && scopes->in_optimizer;
  if (!session_state(session)) {
    PyErr_SetString(PyExc_TypeError, "the session is not a _record.SessionState");
    goto done;
  }
  c->segment = Py_NewRef(((SessionState*)session)->segment ? ((SessionState*)session)->segment
                                                           : Py_None);
  result = NO_SEGMENT;
  if (c->segment == Py_None) goto done;
  int kind = segment_kind(c->segment);
  result = kind < 0 ? -1 : 0;
  if (kind < 0) goto done;
  int is_graph = kind & SEG_GRAPH, backward = kind & SEG_BACKWARD;
  if (depth > 0 || in_optimizer) {
    if (!is_graph || backward) goto done;  /* e.g. a module called during backward */
    if (depth > 0) {  /* the innermost module's path */
      PyObject* stack = scopes->stack;  /* (borrowed: the scopes hold it) */
      if (stack == NULL || !PyList_CheckExact(stack) || PyList_GET_SIZE(stack) == 0) goto done;
      c->scope = Py_NewRef(PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1));
    } else if ((c->scope = segment_attr(c->segment, S_NAME)) == NULL) {
      result = -1;  /* an optimizer step's scope: its execution's name */
      goto done;
    }
    result = PyUnicode_Check(c->scope) ? 1 : 0;
    goto done;
  }
  long long seq;
  int evaluating = evaluated_node(&seq);
  if (evaluating < 0) { result = -1; goto done; }
  if (evaluating) {  /* backward: into the open backward segment */
    result = !backward ? NO_SEGMENT : backward_scope(session, seq, c) < 0 ? -1 : 1;
    goto done;
  }
  /* an eager op: into the open run of eager ops */
  result = is_graph ? NO_SEGMENT : eager_room(c->segment);
  if (result == 1) {
    c->scope = Py_NewRef(cfg.eager_name);
    c->eager = 1;
  }
done:
  Py_DECREF(scopes);
  return result;
}

/* The tensors among the positional arguments an op wrote (its facts' `writes`
 * indices), appended to `found`: what ops.outputs_of takes for an op that
 * returns nothing (in-place foreach ops). */
static int written_args(PyObject* args, PyObject* writes, PyObject* found) {
  if (!PyTuple_Check(writes) || !PyTuple_Check(args)) return 0;
  PyObject* items = PyList_New(0);
  if (items == NULL) return -1;
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(writes); k++) {
    Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(writes, k));
    if (i == -1 && PyErr_Occurred()) goto fail;
    if (i >= 0 && i < PyTuple_GET_SIZE(args) &&
        PyList_Append(items, PyTuple_GET_ITEM(args, i)) < 0)
      goto fail;
  }
  int status = collect_tensors(items, found);
  Py_DECREF(items);
  return status;
fail:
  Py_DECREF(items);
  return -1;
}

/* The op's output tensors into c->outputs (ops.outputs_of): the tensor it
 * returned, those of the tuple or list it returned, or else those it wrote
 * among its arguments; 1, 0 for none (Python's), -1 on error. */
static int claim_outputs(PyObject* args, PyObject* out, Claim* c) {
  if (is_tensor(out)) {  /* most ops */
    c->single = Py_NewRef(out);
    return 1;
  }
  if ((c->outputs = PyList_New(0)) == NULL) return -1;
  if ((PyTuple_CheckExact(out) || PyList_CheckExact(out)) && PySequence_Fast_GET_SIZE(out) > 0) {
    if (collect_tensors(out, c->outputs) < 0) return -1;
  } else if (written_args(args, PyTuple_GET_ITEM(c->facts, cfg.f_writes), c->outputs) < 0) {
    return -1;
  }
  return PyList_GET_SIZE(c->outputs) > 0;
}

/* claim_scope, after Python opened the op's segment when none was open for it
 * (Session.open_for_op: the first op of a backward pass or of a run of eager
 * ops finishes the execution before it): 1, 0 (Python's), -1 on error. */
static int claim_or_open_scope(PyObject* session, Claim* c) {
  int result = claim_scope(session, c);
  if (result != NO_SEGMENT) return result;
  Py_CLEAR(c->segment);
  PyObject* opened = PyObject_CallMethodNoArgs(session, s_open_for_op);
  result = opened == NULL ? -1 : claim_scope(session, c);
  Py_XDECREF(opened);
  return result == NO_SEGMENT ? 0 : result;
}

/* A memo in front of the bound session's _facts (id(func) -> OpFacts), whose
 * lookup made an int key per op (about 350 instructions). Direct mapped by address;
 * an OpFacts holds its func, so an address cannot stand for another op while the
 * session is bound, and the session never replaces an op's facts. Forgotten with
 * the binding (forget_facts). */
#define FACTS_MEMO_SIZE 64
static struct {
  const void* func;
  PyObject* facts;
} facts_memo[FACTS_MEMO_SIZE];

void forget_facts(void) {
  for (int i = 0; i < FACTS_MEMO_SIZE; i++) {
    facts_memo[i].func = NULL;
    Py_CLEAR(facts_memo[i].facts);
  }
}

/* The op's facts (a new reference), or NULL: with an error, or none yet. */
static PyObject* facts_of(PyObject* session, PyObject* func) {
  PyObject* facts_map = bound_attr(session, B_FACTS);  /* binds `session`: the memo is its */
  if (facts_map == NULL) return NULL;
  size_t slot = ((uintptr_t)func >> 4) % FACTS_MEMO_SIZE;
  PyObject* facts = NULL;
  if (facts_memo[slot].func == func) {
    facts = Py_NewRef(facts_memo[slot].facts);
  } else {
    PyObject* key = PyLong_FromVoidPtr(func);
    facts = key ? lookup(facts_map, key) : NULL;
    Py_XDECREF(key);
    if (facts != NULL) {
      facts_memo[slot].func = func;
      Py_XSETREF(facts_memo[slot].facts, Py_NewRef(facts));
    }
  }
  Py_DECREF(facts_map);
  return facts;
}

/* SKIPPED for an op the capture skips (a view, metadata: nothing to do),
 * ALIASED for an alias op (detach, _unsafe_view: its output takes its input's
 * tag, inherit_tag), CLAIMED when take_op records this op (and `c` is filled), 0
 * when Python records it, -1 on error. */
int claim(PyObject* session, PyObject* func, PyObject* args, PyObject* out, Claim* c) {
  int result = -1;
  memset(c, 0, sizeof(*c));
  c->facts = facts_of(session, func);
  result = 0;
  if (c->facts == NULL) { result = PyErr_Occurred() ? -1 : 0; goto done; }
  if (!PyTuple_Check(c->facts) || PyTuple_GET_SIZE(c->facts) <= cfg.f_max) goto done;
  int skip = PyObject_IsTrue(PyTuple_GET_ITEM(c->facts, cfg.f_skip));
  int alias = skip > 0 ? PyObject_IsTrue(PyTuple_GET_ITEM(c->facts, cfg.f_alias)) : 0;
  if (skip < 0 || alias < 0) { result = -1; goto done; }
  if (skip) { result = alias ? ALIASED : SKIPPED; goto done; }
  if ((result = claim_outputs(args, out, c)) <= 0) goto done;
  c->short_name = PyTuple_GET_ITEM(c->facts, cfg.f_short);  /* borrowed from facts */
  if (!PyUnicode_Check(c->short_name)) goto done;
  if ((result = claim_or_open_scope(session, c)) <= 0) goto done;
  if ((c->serial = segment_attr(c->segment, S_SERIAL)) == NULL) result = -1;
done:
  if (result != CLAIMED) release(c);
  return result;
}
