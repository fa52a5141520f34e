/* The capture's state that the C entries and Python share, as objects whose
 * fields the entries read and write without a Python call (part of _record.c's
 * extension): the recording token (gate.Token) and the session's tensor ids
 * (capture.Session.tensor_ids), both zeroed when made (the token free, the next id
 * 0), with gate.PyToken and tags.PyIds their Python twins where the extension is
 * missing; and the C bases of Scopes, Session, Segment and Encoder (the
 * methods of Session's and Segment's in _record_segment.c). ForwardOps
 * (_record_forward.c) is registered here too. */
#include "_record.h"

#include <stddef.h>
#include <string.h>
#include <structmember.h>

/* tp_new of both: no arguments, the object's fields zeroed (tp_alloc). */
static PyObject* zeroed_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  if (PyTuple_GET_SIZE(args) > 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0)) {
    PyErr_Format(PyExc_TypeError, "%s() takes no arguments", type->tp_name);
    return NULL;
  }
  return type->tp_alloc(type, 0);
}

/* ---- the recording token ----------------------------------------------------------- */

/* Free or not: take() answers whether it was and leaves it taken, give() frees
 * it, clear() takes it from whoever held it. Each is one step under the GIL. */
static PyObject* token_take(PyObject* self, PyObject* unused) {
  int was_free = !((Token*)self)->taken;
  ((Token*)self)->taken = 1;
  return PyBool_FromLong(was_free);
}

static PyObject* token_give(PyObject* self, PyObject* unused) {
  ((Token*)self)->taken = 0;
  Py_RETURN_NONE;
}

static PyObject* token_clear(PyObject* self, PyObject* unused) {
  ((Token*)self)->taken = 1;
  Py_RETURN_NONE;
}

static PyMethodDef token_methods[] = {
    {"take", token_take, METH_NOARGS, "take() -> whether the token was free; taken now"},
    {"give", token_give, METH_NOARGS, "give(): the token is free"},
    {"clear", token_clear, METH_NOARGS, "clear(): the token is taken, by no one"},
    {NULL, NULL, 0, NULL}};

PyTypeObject TokenType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tb_numerics_plugin.torch._record.Token",
    .tp_basicsize = sizeof(Token),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The recording token (gate.RecordingGate): free when made.",
    .tp_methods = token_methods,
    .tp_new = zeroed_new,
};

/* ---- tensor ids -------------------------------------------------------------------- */

/* The next id of `ids` (an Ids, or its Python twin), counted: a new reference. */
PyObject* take_id(PyObject* ids) {
  if (Py_IS_TYPE(ids, &IdsType)) return PyLong_FromLongLong(((Ids*)ids)->next++);
  return PyObject_CallMethodNoArgs(ids, s_take);
}

/* The next id of `ids`, not counted: a new reference. */
PyObject* peek_id(PyObject* ids) {
  if (Py_IS_TYPE(ids, &IdsType)) return PyLong_FromLongLong(((Ids*)ids)->next);
  return PyObject_CallMethodNoArgs(ids, s_peek);
}

/* The next id of `ids`, not counted, as a C integer: -1 with an error. */
long long next_id(PyObject* ids) {
  if (Py_IS_TYPE(ids, &IdsType)) return ((Ids*)ids)->next;
  PyObject* next = peek_id(ids);
  long long value = next ? PyLong_AsLongLong(next) : -1;
  Py_XDECREF(next);
  return value;
}

/* The next tensor id of a session: take() hands it out and counts one on,
 * peek() reads it. */
static PyObject* ids_take(PyObject* self, PyObject* unused) { return take_id(self); }

static PyObject* ids_peek(PyObject* self, PyObject* unused) { return peek_id(self); }

static PyMethodDef ids_methods[] = {
    {"take", ids_take, METH_NOARGS, "take() -> the next tensor id, counted"},
    {"peek", ids_peek, METH_NOARGS, "peek() -> the next tensor id"},
    {NULL, NULL, 0, NULL}};

PyTypeObject IdsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tb_numerics_plugin.torch._record.Ids",
    .tp_basicsize = sizeof(Ids),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A session's tensor ids (capture.Session.tensor_ids): 0 next when made.",
    .tp_methods = ids_methods,
    .tp_new = zeroed_new,
};

/* ---- the bases of Scopes, Session and Encoder ---------------------------------------- */

/* What the recording reads per op of hooks.Scopes, capture.Session and encoder.Encoder,
 * as fields of their C bases, not from the instances' __dict__ (a dict lookup of about
 * 110 instructions each). Their object fields are seen by the cyclic collector: the
 * open segment refers back to its session (Segment.session), a cycle only the
 * collector frees when a session is dropped with one open. */
static PyMemberDef scope_members[] = {
    {"depth", T_PYSSIZET, offsetof(ScopeState, depth), 0, "module calls in progress"},
    {"in_optimizer", T_BOOL, offsetof(ScopeState, in_optimizer), 0,
     "an optimizer step is running"},
    {"stack", T_OBJECT_EX, offsetof(ScopeState, stack), 0,
     "the scope names of the calls in progress"},
    {"thread", T_ULONG, offsetof(ScopeState, thread), 0, "the capturing thread's identity"},
    {"gate", T_OBJECT, offsetof(ScopeState, gate), 0, "the session's recording token"},
    {"paths", T_OBJECT, offsetof(ScopeState, paths), 0,
     "the module paths of the root call in progress (a WeakIdMap's table), or None"},
    {NULL, 0, 0, 0, NULL}};

/* Whether the module hooks' common case is ScopeState's to take: a submodule's
 * call (`depth` above `floor`) on the capturing thread, the recording token free. */
static int sub_call(ScopeState* self, Py_ssize_t floor) {
  return self->depth > floor && self->gate != NULL && Py_IS_TYPE(self->gate, &TokenType) &&
         !((Token*)self->gate)->taken && self->stack != NULL && PyList_CheckExact(self->stack) &&
         PyThread_get_thread_ident() == self->thread;
}

/* enter_sub(module): hooks.Scopes._module_pre's common case, a submodule's call
 * inside a root call on the capturing thread whose path the root's paths hold:
 * its path pushed, True. Else (or on an error, cleared) False, and the Python
 * hook does it all. Nothing here runs Python code or lets the GIL go: the token
 * needs no taking. */
static PyObject* scope_enter_sub(PyObject* self, PyObject* module) {
  ScopeState* scopes = (ScopeState*)self;
  if (!sub_call(scopes, 0) || scopes->paths == NULL || !PyDict_CheckExact(scopes->paths))
    Py_RETURN_FALSE;
  PyObject* path = weak_id_get(scopes->paths, module);
  int pushed = path != NULL && PyUnicode_CheckExact(path) &&
               PyList_Append(scopes->stack, path) == 0;
  Py_XDECREF(path);
  if (!pushed) {
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  scopes->depth++;
  Py_RETURN_TRUE;
}

/* leave_sub(): hooks.Scopes._module_post's common case, the end of a submodule's
 * call (not the root's): its path popped, True; else False, as enter_sub. */
static PyObject* scope_leave_sub(PyObject* self, PyObject* unused) {
  ScopeState* scopes = (ScopeState*)self;
  if (!sub_call(scopes, 1)) Py_RETURN_FALSE;
  Py_ssize_t n = PyList_GET_SIZE(scopes->stack);
  if (n > 0 && PyList_SetSlice(scopes->stack, n - 1, n, NULL) < 0) {
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  scopes->depth--;
  Py_RETURN_TRUE;
}

static PyMethodDef scope_methods[] = {
    {"enter_sub", scope_enter_sub, METH_O, "a submodule's call begins: True when taken here"},
    {"leave_sub", scope_leave_sub, METH_NOARGS, "a submodule's call ends: True when taken here"},
    {NULL, NULL, 0, NULL}};

/* An object field of a C base, None while NULL. */
#define OBJECT_FIELD(STRUCT, NAME, FIELD, DOC) {NAME, T_OBJECT, offsetof(STRUCT, FIELD), 0, DOC}

#define SESSION_FIELD(NAME, FIELD, DOC) OBJECT_FIELD(SessionState, NAME, FIELD, DOC)
static PyMemberDef session_members[] = {
    SESSION_FIELD("_segment", segment, "the open segment (None when none is)"),
    SESSION_FIELD("_serial", serial, "the last segment's serial (switch adds one)"),
    SESSION_FIELD("segment_class", segment_class, "what switch makes (segments.Segment)"),
    SESSION_FIELD("writer", writer, "the FileSetWriter"),
    SESSION_FIELD("host_name", host_name, "the writer's host name"),
    SESSION_FIELD("encoder", encoder, "the encoder.Encoder"),
    SESSION_FIELD("registry", registry, "the registry.GraphRegistry"),
    {"watch_nonfinite", T_BOOL, offsetof(SessionState, watch), 0,
     "stop_on_nonfinite is watching (a bool)"},
    {NULL, 0, 0, 0, NULL}};
#undef SESSION_FIELD

#define SEGMENT_FIELD(NAME, FIELD, DOC) OBJECT_FIELD(SegmentState, NAME, FIELD, DOC)
static PyMemberDef segment_members[] = {
    SEGMENT_FIELD("session", session, "the capture session"),
    SEGMENT_FIELD("serial", serial, "a number unique per segment of the session"),
    SEGMENT_FIELD("name", name, "the execution's op_type; None for a run of eager ops"),
    {"is_graph", T_BOOL, offsetof(SegmentState, is_graph), 0, "a graph execution's segment"},
    SEGMENT_FIELD("stack_ids", stack_ids, "frame ids of the call that started the execution"),
    SEGMENT_FIELD("step", step, "the training step marked when the segment opened"),
    {"wall_time", T_DOUBLE, offsetof(SegmentState, wall_time), 0, "when it opened"},
    SEGMENT_FIELD("ops", ops, "the graph's op records"),
    SEGMENT_FIELD("prior_ops", prior_ops, "the op records of the last execution of the name"),
    SEGMENT_FIELD("traces", traces, "the graph execution traces' records"),
    SEGMENT_FIELD("eager", eager, "the eager ops' records"),
    SEGMENT_FIELD("input_ids", input_ids, "tensor ids of the values that entered"),
    SEGMENT_FIELD("output_ids", output_ids, "tensor ids of the values the call returned"),
    SEGMENT_FIELD("arg_ids", arg_ids, "tensor ids of the call's arguments"),
    SEGMENT_FIELD("_counters", counters, "op name prefix -> names counted"),
    SEGMENT_FIELD("_placeholders", placeholders, "an outside value's key -> its name"),
    SEGMENT_FIELD("_placeholder_names", placeholder_names, "the placeholders' names"),
    {NULL, 0, 0, 0, NULL}};
#undef SEGMENT_FIELD

#define ENCODER_FIELD(NAME, FIELD, DOC) OBJECT_FIELD(EncoderState, NAME, FIELD, DOC)
static PyMemberDef encoder_members[] = {
    {"graph_values", T_BOOL, offsetof(EncoderState, graph_values), 0,
     "graph traces carry values (all modes but NO_TENSOR)"},
    {"dtype_ok", T_OBJECT_EX, offsetof(EncoderState, dtype_ok), 0,
     "torch.dtype -> traced, the cache Encoder.dtype_traced fills"},
    ENCODER_FIELD("cpu_rows", cpu_rows,
                  "the health batch's CPU rows the C recording computes rows into"),
    ENCODER_FIELD("cuda_rows", cuda_rows, "its rows on the first CUDA device (None: none yet)"),
    ENCODER_FIELD("mode", mode, "the tensor debug mode's name"),
    ENCODER_FIELD("mode_enum", mode_enum, "its TensorDebugMode number"),
    {"kernel_mode", T_BOOL, offsetof(EncoderState, kernel_mode), 0, "a health mode (a bool)"},
    ENCODER_FIELD("c_record", c_record, "the _record extension that encodes, or None"),
    ENCODER_FIELD("_trace_places", trace_places,
                  "graph id -> [(name, slot, device, prefix) per trace place]: the C encoding's"),
    ENCODER_FIELD("_trace_prefixes", trace_prefixes,
                  "(graph id, op name, slot, device) -> encoded fields"),
    {NULL, 0, 0, 0, NULL}};
#undef ENCODER_FIELD

/* The object fields of `self`'s C base (the first static type of its bases), in turn. */
static PyObject** next_field(PyObject* self, PyMemberDef** member) {
  if (*member == NULL) {
    PyTypeObject* base = Py_TYPE(self);
    while (base->tp_flags & Py_TPFLAGS_HEAPTYPE) base = base->tp_base;
    *member = base->tp_members;
  } else {
    (*member)++;
  }
  for (; (*member)->name != NULL; (*member)++)
    if ((*member)->type == T_OBJECT || (*member)->type == T_OBJECT_EX)
      return (PyObject**)((char*)self + (*member)->offset);
  return NULL;
}

static int fields_traverse(PyObject* self, visitproc visit, void* arg) {
  PyMemberDef* member = NULL;
  for (PyObject** field; (field = next_field(self, &member)) != NULL;) Py_VISIT(*field);
  return 0;
}

static int fields_clear(PyObject* self) {
  PyMemberDef* member = NULL;
  for (PyObject** field; (field = next_field(self, &member)) != NULL;) Py_CLEAR(*field);
  return 0;
}

static void fields_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  fields_clear(self);
  Py_TYPE(self)->tp_free(self);
}

#define STATE_BASE(NAME, STRUCT, MEMBERS, METHODS, INIT, DOC)                             \
  PyTypeObject NAME##Type = {                                                             \
      PyVarObject_HEAD_INIT(NULL, 0)                                                      \
      .tp_name = "tb_numerics_plugin.torch._record." #NAME,                               \
      .tp_basicsize = sizeof(STRUCT),                                                     \
      .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,          \
      .tp_doc = DOC,                                                                      \
      .tp_traverse = fields_traverse,                                                     \
      .tp_clear = fields_clear,                                                           \
      .tp_members = MEMBERS,                                                              \
      .tp_methods = METHODS,                                                              \
      .tp_init = INIT,                                                                    \
      .tp_new = PyType_GenericNew,                                                        \
      .tp_dealloc = fields_dealloc,                                                       \
  };

STATE_BASE(ScopeState, ScopeState, scope_members, scope_methods, NULL,
           "The base of hooks.Scopes: depth, in_optimizer, stack, thread, gate and paths as "
           "fields; enter_sub and leave_sub, its module hooks' common case.")
STATE_BASE(SessionState, SessionState, session_members, session_methods, NULL,
           "The base of capture.Session: _segment, _serial, segment_class, writer, host_name, "
           "encoder, registry and watch_nonfinite as fields; switch, the end of a segment "
           "and the start of the next.")
STATE_BASE(SegmentState, SegmentState, segment_members, segment_methods, segment_init,
           "The base of segments.Segment: its records as fields, made by __init__(session, "
           "serial, name, stack_ids=()); finish.")
STATE_BASE(EncoderState, EncoderState, encoder_members, NULL, NULL,
           "The base of encoder.Encoder: graph_values, dtype_ok, its rows, mode, mode_enum, "
           "kernel_mode, c_record and its trace prefix tables as fields.")

int state_types_ready(PyObject* module) {
  static PyTypeObject* const types[] = {&TokenType,      &IdsType,          &ForwardOpsType,
                                        &ScopeStateType, &SessionStateType, &EncoderStateType,
                                        &SegmentStateType, &CountsType};
  for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
    const char* name = strrchr(types[i]->tp_name, '.') + 1;  /* "..._record.Token": Token */
    if (PyType_Ready(types[i]) < 0 ||
        PyModule_AddObjectRef(module, name, (PyObject*)types[i]) < 0)
      return -1;
  }
  return 0;
}
