/* The session's attributes that Session.__init__ binds for its life (its gate,
 * tensor ids, op facts, scopes, stacks, devices, forward nodes, encoder, the
 * stack tracker's caches and the scopes' parameter names), and the open
 * segment's (its kind, name, serial, name counters, record lists and
 * placeholders: fields of its C base, SegmentState, read without a lookup
 * where it is one), read once per
 * session or segment instead of once per op: a PyObject_GetAttr on an
 * instance costs about 220 instructions, and the recording of one op read
 * about fourteen of them (part of _record.c's extension). What changes while
 * a session runs (its open segment, the scopes' depth, stack and optimizer
 * flag, the encoder's values flag and dtype cache) are fields of their C bases
 * (_record_state.c: SessionState, ScopeState, EncoderState), read without a
 * lookup.
 *
 * One session and one segment are bound at a time, each held by a strong
 * reference so that its address cannot come back as another's; a call with
 * another binds that one. Session.stop calls unbind(). A read of a bound value
 * is inline (_record.h's bound_attr and segment_attr; a call per read was about
 * 300 instructions of a tight-loop op, some twenty reads); a miss comes here. */
#include "_record.h"

#include <stddef.h>

PyObject* bound_session;
PyObject* bound_values[B_COUNT];
PyObject* bound_segment;
PyObject* bound_segment_values[S_COUNT];
static PyObject** const segment_names[S_COUNT] = {
    [S_IS_GRAPH] = &s_is_graph, [S_NAME] = &s_name,     [S_SERIAL] = &s_serial,
    [S_COUNTERS] = &s_counters, [S_OPS] = &s_ops,       [S_TRACES] = &s_traces,
    [S_EAGER] = &s_eager,       [S_PLACEHOLDERS] = &s_placeholders,
    [S_PLACEHOLDER_NAMES] = &s_placeholder_names, [S_INPUT_IDS] = &s_input_ids,
    [S_PRIOR] = &s_prior,
};

/* The device (type and index, as the native hook reads them) of the last op's
 * first output, its torch.device and its name in the session. */
static struct {
  int type, index;
  PyObject *device, *name;
} last = {-1, -1, NULL, NULL};

/* Where each attribute is read from: the session, or an attribute bound before it. */
static const struct {
  PyObject** name;
  int owner;  /* -1: the session */
} places[B_COUNT] = {
    [B_GATE] = {&s_gate, -1},       [B_IDS] = {&s_tensor_ids, -1},
    [B_FACTS] = {&s_facts, -1},
    [B_SCOPES] = {&s_scopes, -1},   [B_STACKS] = {&s_stacks, -1},
    [B_SEQ_OPS] = {&s_seq_ops, -1}, [B_DEVICES] = {&s_devices, -1},
    [B_ENCODER] = {&s_encoder, -1}, [B_IS_USER] = {&s_is_user, B_STACKS},
    [B_SITES] = {&s_sites, B_STACKS},
    [B_PARAM_TABLE] = {&s_param_table, B_SCOPES},
};

static int bound_kind = -1;  /* the bound segment's segment_kind, -1 until read */

static void forget_segment(void) {
  bound_kind = -1;
  for (int i = 0; i < S_COUNT; i++) Py_CLEAR(bound_segment_values[i]);
  Py_CLEAR(bound_segment);
}

static void forget(void) {
  forget_segment();
  forget_call_sites();
  forget_facts();
  for (int i = 0; i < B_COUNT; i++) Py_CLEAR(bound_values[i]);
  Py_CLEAR(last.device);
  Py_CLEAR(last.name);
  last.type = last.index = -1;
  Py_CLEAR(bound_session);
}

static PyObject* owner_of(PyObject* session, int which);

PyObject* bind_attr(PyObject* session, int which) {
  if (session != bound_session) {
    forget();
    bound_session = Py_NewRef(session);
  }
  if (bound_values[which] == NULL) {
    PyObject* from = owner_of(session, which);
    if (from == NULL) return NULL;
    bound_values[which] = PyObject_GetAttr(from, *places[which].name);
    Py_DECREF(from);
    if (bound_values[which] == NULL) return NULL;
  }
  return Py_NewRef(bound_values[which]);
}

/* Where each attribute is in a _record.SegmentState (is_graph, a char, aside). */
static const Py_ssize_t segment_offsets[S_COUNT] = {
    [S_NAME] = offsetof(SegmentState, name),     [S_SERIAL] = offsetof(SegmentState, serial),
    [S_COUNTERS] = offsetof(SegmentState, counters), [S_OPS] = offsetof(SegmentState, ops),
    [S_TRACES] = offsetof(SegmentState, traces), [S_EAGER] = offsetof(SegmentState, eager),
    [S_PLACEHOLDERS] = offsetof(SegmentState, placeholders),
    [S_PLACEHOLDER_NAMES] = offsetof(SegmentState, placeholder_names),
    [S_INPUT_IDS] = offsetof(SegmentState, input_ids),
    [S_PRIOR] = offsetof(SegmentState, prior_ops),
};

/* Attribute `which` of a segment: read from its C base's field where it has one (no
 * lookup), else by getattr. A new reference, NULL on error. */
static PyObject* read_segment(PyObject* segment, int which) {
  if (!PyObject_TypeCheck(segment, &SegmentStateType))
    return PyObject_GetAttr(segment, *segment_names[which]);
  if (which == S_IS_GRAPH) return PyBool_FromLong(((SegmentState*)segment)->is_graph);
  PyObject* value = *(PyObject**)((char*)segment + segment_offsets[which]);
  if (value == NULL) PyErr_SetString(PyExc_AttributeError, "the segment was never initialized");
  return Py_XNewRef(value);
}

PyObject* bind_segment_attr(PyObject* segment, int which) {
  if (segment != bound_segment) {
    forget_segment();
    bound_segment = Py_NewRef(segment);
  }
  if (bound_segment_values[which] == NULL &&
      (bound_segment_values[which] = read_segment(segment, which)) == NULL)
    return NULL;
  return Py_NewRef(bound_segment_values[which]);
}

int segment_kind(PyObject* segment) {
  if (segment == bound_segment && bound_kind >= 0) return bound_kind;
  PyObject* graph = segment_attr(segment, S_IS_GRAPH);  /* binds `segment` */
  int is_graph = graph ? PyObject_IsTrue(graph) : -1;
  Py_XDECREF(graph);
  if (is_graph <= 0) return is_graph < 0 ? -1 : (bound_kind = 0);
  PyObject* name = segment_attr(segment, S_NAME);
  int backward = name ? PyObject_RichCompareBool(name, cfg.backward_name, Py_EQ) : -1;
  Py_XDECREF(name);
  if (backward < 0) return -1;
  return bound_kind = SEG_GRAPH | (backward ? SEG_BACKWARD : 0);
}

int of_subtype(PyObject* obj, PyTypeObject* type, PassedType* passed) {
  if (!PyObject_TypeCheck(obj, type)) return 0;
  Py_XSETREF(passed->sub, (PyTypeObject*)Py_NewRef((PyObject*)Py_TYPE(obj)));
  passed->base = type;  /* a static type of this extension */
  return 1;
}

int session_state(PyObject* session) {
  static PassedType passed;
  return of_type(session, &SessionStateType, &passed);
}

int encoder_state(PyObject* encoder) {
  static PassedType passed;
  return of_type(encoder, &EncoderStateType, &passed);
}

PyObject* bound_of_type(PyObject* session, int which, PyTypeObject* type) {
  static PassedType passed[B_COUNT];  /* the session's scopes and encoder, by attribute */
  PyObject* value = bound_attr(session, which);
  if (value == NULL || of_type(value, type, &passed[which])) return value;
  PyErr_Format(PyExc_TypeError, "a session attribute is not a %s", type->tp_name);
  Py_DECREF(value);
  return NULL;
}

/* The owner of bound attribute `which`, a new reference. */
static PyObject* owner_of(PyObject* session, int which) {
  int owner = places[which].owner;
  return owner < 0 ? Py_NewRef(session) : bound_attr(session, owner);
}

int append_segment(PyObject* segment, int which, PyObject* item) {
  PyObject* list = segment_attr(segment, which);
  if (list == NULL) return -1;
  int status = PyList_Check(list) ? PyList_Append(list, item) : -1;
  if (status < 0 && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "not a list");
  Py_DECREF(list);
  return status;
}

int remembered_device(PyObject* session, const TbnMeta* meta, PyObject** device,
                      PyObject** name) {
  if (session != bound_session || last.device == NULL || meta->device_type != last.type ||
      meta->device_index != last.index)
    return 0;
  *device = Py_NewRef(last.device);
  *name = Py_NewRef(last.name);
  return 1;
}

void remember_device(PyObject* session, const TbnMeta* meta, PyObject* device, PyObject* name) {
  if (session != bound_session) return;
  Py_XSETREF(last.device, Py_NewRef(device));
  Py_XSETREF(last.name, Py_NewRef(name));
  last.type = meta->device_type;
  last.index = meta->device_index;
}

PyObject* unbind(PyObject* self, PyObject* session) {
  if (session == bound_session) forget();
  Py_RETURN_NONE;
}
