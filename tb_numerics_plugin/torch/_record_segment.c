/* A segment's life in C (part of _record.c's extension): its fields made
 * (segments.Segment.__init__'s work as SegmentState's tp_init), the open
 * segment finished and the next one opened (capture.Session.switch, a method
 * of SessionState), and a finished segment encoded and written
 * (segments.Segment.finish, a method of SegmentState).
 *
 * Executions switch about four times per training step (the forward, the loss's
 * eager op, the backward pass, the optimizer step); each switch ran about eighty
 * lines of the capture's Python, cold in a training step's caches. Here the
 * common case runs no Python but the health rows' fetch (in a health mode) and
 * the writer's call; the rest is Segment.finish_in_python's: a stop_on_nonfinite
 * watch, FULL_TENSOR and the Python recorder (Encoder.c_record None); a Segment
 * class whose finish is not this one (a test's spy) has its own called; and a
 * graph not the last of its name is GraphRegistry.graph_id's (which writes a new one). */
#include "_record.h"
#include "_record_wire.h"

#include <structmember.h>

static PyObject *s_step, *s_registry, *s_last, *s_graph_id, *s_finish, *s_finish_in_python,
    *s_trace_prefix, *s_write_groups, *s_fetch_rows, *s_traces_suffix,
    *s_execution_suffix;

static int segment_names(void) {
  if (s_step != NULL) return 0;
#define NAME(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1
  NAME(s_step, "step"); NAME(s_registry, "registry"); NAME(s_last, "_last");
  NAME(s_graph_id, "graph_id"); NAME(s_finish, "finish");
  NAME(s_finish_in_python, "finish_in_python"); NAME(s_trace_prefix, "trace_prefix");
  NAME(s_write_groups, "write_serialized_groups");
  NAME(s_fetch_rows, "fetch_rows");
  NAME(s_traces_suffix, "graph_execution_traces"); NAME(s_execution_suffix, "execution");
#undef NAME
  return 0;
}

/* registry._last.get(name): (ops tuple, graph id) of the last execution named
 * `name`, borrowed from the dict, or NULL (none, or an error). */
static PyObject* last_of(PyObject* registry, PyObject* name, PyObject** last_table) {
  *last_table = PyObject_GetAttr(registry, s_last);
  if (*last_table == NULL || !PyDict_CheckExact(*last_table)) return NULL;
  PyObject* last = PyDict_GetItemWithError(*last_table, name);
  return last != NULL && PyTuple_CheckExact(last) && PyTuple_GET_SIZE(last) == 2 ? last : NULL;
}

/* Segment.__init__(session, serial, name, stack_ids=()), GraphRegistry.last_ops inlined. */
int segment_init(PyObject* self, PyObject* args, PyObject* kwargs) {
  static char* keywords[] = {"session", "serial", "name", "stack_ids", NULL};
  PyObject *session, *serial, *name, *stack_ids = NULL;
  if (segment_names() < 0 ||
      !PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|O:Segment", keywords, &session, &serial,
                                   &name, &stack_ids))
    return -1;
  SegmentState* seg = (SegmentState*)self;
  PyObject* step = PyObject_GetAttr(session, s_step);
  PyObject* prior = NULL;
  if (step == NULL) return -1;
  if (name == Py_None) {
    prior = PyTuple_New(0);
  } else {
    SessionState* s = session_state(session) ? (SessionState*)session : NULL;
    PyObject* registry = s != NULL && s->registry != NULL ? Py_NewRef(s->registry)
                                                          : PyObject_GetAttr(session, s_registry);
    PyObject* table = NULL;
    PyObject* last = registry ? last_of(registry, name, &table) : NULL;
    if (!PyErr_Occurred()) prior = last ? Py_NewRef(PyTuple_GET_ITEM(last, 0)) : PyTuple_New(0);
    Py_XDECREF(table);
    Py_XDECREF(registry);
  }
  PyObject* now = prior ? wall_time() : NULL;
  seg->wall_time = now ? PyFloat_AsDouble(now) : -1.0;
  Py_XDECREF(now);
  if (now == NULL || PyErr_Occurred()) {
    Py_DECREF(step);
    Py_XDECREF(prior);
    return -1;
  }
  seg->is_graph = name != Py_None;
  Py_XSETREF(seg->session, Py_NewRef(session));
  Py_XSETREF(seg->serial, Py_NewRef(serial));
  Py_XSETREF(seg->name, Py_NewRef(name));
  Py_XSETREF(seg->stack_ids, stack_ids ? Py_NewRef(stack_ids) : PyTuple_New(0));
  Py_XSETREF(seg->step, step);
  Py_XSETREF(seg->prior_ops, prior);
  PyObject** lists[] = {&seg->ops, &seg->traces, &seg->eager, &seg->input_ids,
                        &seg->output_ids, &seg->arg_ids};
  int made = 1;
  for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
    Py_XSETREF(*lists[i], PyList_New(0));
    made = made && *lists[i] != NULL;
  }
  Py_XSETREF(seg->counters, counts_new());
  Py_XSETREF(seg->placeholders, PyDict_New());
  Py_XSETREF(seg->placeholder_names, PySet_New(NULL));
  return made && seg->stack_ids && seg->counters && seg->placeholders && seg->placeholder_names
             ? 0 : -1;
}

/* GraphRegistry.graph_id's common case: the ops equal the last execution's of the
 * segment's name (tuples compared as Python compares them): its id, the segment's
 * records kept as that name's latest (what the next execution's hands out again,
 * _record_op.c); else the registry's own call, which writes a new graph. */
static PyObject* graph_id_of(PyObject* registry, SegmentState* seg) {
  PyObject *table = NULL, *id = NULL;
  PyObject* ops = PyList_AsTuple(seg->ops);
  PyObject* last = ops ? Py_XNewRef(last_of(registry, seg->name, &table)) : NULL;
  if (ops == NULL || PyErr_Occurred()) goto done;
  int same = last != NULL ? PyObject_RichCompareBool(PyTuple_GET_ITEM(last, 0), ops, Py_EQ) : 0;
  if (same > 0) {
    id = Py_NewRef(PyTuple_GET_ITEM(last, 1));
    PyObject* latest = PyTuple_Pack(2, ops, id);
    if (latest == NULL || PyDict_SetItem(table, seg->name, latest) < 0) Py_CLEAR(id);
    Py_XDECREF(latest);
  } else if (same == 0) {
    id = PyObject_CallMethodObjArgs(registry, s_graph_id, seg->name, ops, NULL);
  }
done:
  Py_XDECREF(last);
  Py_XDECREF(table);
  Py_XDECREF(ops);
  return id;
}

/* wire.step_field(step): field 101 as a varint, or b"" for None. */
static PyObject* step_field(PyObject* step) {
  unsigned char bytes[20], *end = bytes;
  if (step != Py_None) {
    long long v = PyLong_AsLongLong(step);
    if (v == -1 && PyErr_Occurred()) return NULL;
    end = write_varint(write_varint(bytes, 101 << 3), (uint64_t)v);
  }
  return PyBytes_FromStringAndSize((const char*)bytes, end - bytes);
}

/* Segment._call_input_ids: the ids the call read, then its arguments it never read. */
static PyObject* call_input_ids(SegmentState* seg) {
  PyObject* ids = PyList_GetSlice(seg->input_ids, 0, PyList_GET_SIZE(seg->input_ids));
  if (ids == NULL || PyList_GET_SIZE(seg->arg_ids) == 0) return ids;
  PyObject* seen = PySet_New(seg->input_ids);
  for (Py_ssize_t i = 0; seen != NULL && i < PyList_GET_SIZE(seg->arg_ids); i++) {
    PyObject* id = PyList_GET_ITEM(seg->arg_ids, i);
    int known = PySet_Contains(seen, id);
    if (known < 0 || (!known && (PySet_Add(seen, id) < 0 || PyList_Append(ids, id) < 0)))
      Py_CLEAR(seen);
  }
  if (seen == NULL) Py_CLEAR(ids);
  Py_XDECREF(seen);
  return ids;
}

/* What the encoding of a segment reads of its session and encoder: new references, and
 * the mode's DebugEvent enum number. */
typedef struct {
  PyObject *mode, *host, *writer, *registry, *places, *prefixes, *encoder;
  long mode_enum;
} Parts;

static void parts_clear(Parts* p) {
  PyObject** all[] = {&p->mode,  &p->host,     &p->writer,  &p->registry,
                      &p->places, &p->prefixes, &p->encoder};
  for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) Py_CLEAR(*all[i]);
}

/* Whether the segment is encoded here: 1 (`p` filled from the fields of the session's
 * and its encoder's C bases), 0 Python's, -1 on error (a mode_enum that is no int). */
static int parts_of(PyObject* session, Parts* p) {
  if (!session_state(session)) return 0;
  SessionState* s = (SessionState*)session;
  EncoderState* e = (EncoderState*)s->encoder;
  if (s->watch || e == NULL || !encoder_state((PyObject*)e) ||
      s->host_name == NULL || s->writer == NULL || s->registry == NULL || e->c_record == NULL ||
      e->c_record == Py_None || e->mode == NULL || !PyUnicode_Check(e->mode) ||
      mode_code(e->mode) < 0 || e->mode_enum == NULL || e->trace_places == NULL ||
      !PyDict_Check(e->trace_places) || e->trace_prefixes == NULL)
    return 0;
  if ((p->mode_enum = PyLong_AsLong(e->mode_enum)) == -1 && PyErr_Occurred()) return -1;
  p->mode = Py_NewRef(e->mode);
  p->host = Py_NewRef(s->host_name);
  p->writer = Py_NewRef(s->writer);
  p->registry = Py_NewRef(s->registry);
  p->places = Py_NewRef(e->trace_places);
  p->prefixes = Py_NewRef(e->trace_prefixes);
  p->encoder = Py_NewRef((PyObject*)e);
  return 1;
}

/* Appends (suffix, events) to `groups`, stealing `events`: -1 on error. */
static int add_group(PyObject* groups, PyObject* suffix, PyObject* events) {
  PyObject* group = events ? PyTuple_Pack(2, suffix, events) : NULL;
  int status = group ? PyList_Append(groups, group) : -1;
  Py_XDECREF(group);
  Py_XDECREF(events);
  return status;
}

/* A segment's field as the encodings take it: None where it is unset. */
static PyObject* or_none(PyObject* field) { return field != NULL ? field : Py_None; }

/* The graph segment's groups: its traces, then its Execution. */
static int add_graph_groups(SegmentState* seg, PyObject* rows, const Parts* p,
                            PyObject* groups) {
  PyObject *make = NULL, *events = NULL, *ids = NULL, *event = NULL;
  PyObject *graph_id = graph_id_of(p->registry, seg), *step = step_field(seg->step);
  int status = -1;
  if (graph_id == NULL || step == NULL ||
      (make = PyObject_GetAttr(p->encoder, s_trace_prefix)) == NULL)
    goto done;
  events = traces_encoded(or_none(seg->traces), rows, graph_id, p->mode, step, p->places,
                          p->prefixes, make);
  if (add_group(groups, s_traces_suffix, events) < 0) goto done;
  if ((ids = call_input_ids(seg)) == NULL) goto done;
  event = graph_execution_encoded(or_none(seg->name), graph_id, ids, or_none(seg->output_ids),
                                  p->mode_enum, p->host, or_none(seg->stack_ids), seg->wall_time,
                                  or_none(seg->step));
  status = add_group(groups, s_execution_suffix, event ? PyTuple_Pack(1, event) : NULL);
done:
  Py_XDECREF(event);
  Py_XDECREF(ids);
  Py_XDECREF(make);
  Py_XDECREF(step);
  Py_XDECREF(graph_id);
  return status;
}

/* Segment.finish's common case: 1 written, 0 Python's (see the header), -1 on error. */
static int finish_here(SegmentState* seg, PyObject* rows) {
  Parts p = {0};
  PyObject *groups = NULL, *written = NULL;
  int status = parts_of(seg->session, &p);
  if (status <= 0) goto done;
  status = -1;
  if (!PyList_Check(seg->traces) || !PyList_Check(seg->eager) || !PyList_Check(seg->ops) ||
      !PyList_Check(seg->input_ids) || !PyList_Check(seg->arg_ids)) {
    PyErr_SetString(PyExc_TypeError, "a segment's records must be lists");
    goto done;
  }
  if ((groups = PyList_New(0)) == NULL ||
      (seg->is_graph && add_graph_groups(seg, rows, &p, groups) < 0))
    goto done;
  if (PyList_GET_SIZE(seg->eager) > 0 &&
      add_group(groups, s_execution_suffix,
                executions_encoded(seg->eager, rows, p.mode, p.mode_enum, p.host,
                                   or_none(seg->step))) < 0)
    goto done;
  status = 1;
  if (PyList_GET_SIZE(groups) > 0 &&
      (written = PyObject_CallMethodOneArg(p.writer, s_write_groups, groups)) == NULL)
    status = -1;
done:
  Py_XDECREF(written);
  Py_XDECREF(groups);
  parts_clear(&p);
  return status;
}

/* Segment.finish(rows): encodes and writes the segment, here or in Python. */
static PyObject* segment_finish(PyObject* self, PyObject* rows) {
  if (segment_names() < 0) return NULL;
  SegmentState* seg = (SegmentState*)self;
  if (seg->session == NULL) {
    PyErr_SetString(PyExc_TypeError, "Segment.finish: the segment was never initialized");
    return NULL;
  }
  int status = finish_here(seg, rows);
  if (status == 0) return PyObject_CallMethodOneArg(self, s_finish_in_python, rows);
  if (status < 0) return NULL;
  Py_RETURN_NONE;
}

PyMethodDef segment_methods[] = {
    {"finish", segment_finish, METH_O,
     "finish(rows): encodes and writes everything recorded, given the fetched health rows\n"
     "(Encoder.fetch_rows); in C, or by finish_in_python where that is Python's."},
    {NULL, NULL, 0, NULL}};

/* ---- Session.switch ------------------------------------------------------------------- */

/* The session's Encoder.fetch_rows(); [] without the call in a mode other than the health
 * modes (kernel_mode, a field of the encoder's C base), whose batch never holds rows. */
static PyObject* fetch_rows(SessionState* session) {
  PyObject* encoder = session->encoder;
  if (encoder == NULL) {
    PyErr_SetString(PyExc_AttributeError, "Session.switch: the session has no encoder");
    return NULL;
  }
  if (encoder_state(encoder) && !((EncoderState*)encoder)->kernel_mode)
    return PyList_New(0);
  Py_INCREF(encoder);  /* (the call runs Python code) */
  PyObject* rows = PyObject_CallMethodNoArgs(encoder, s_fetch_rows);
  Py_DECREF(encoder);
  return rows;
}

/* segment.finish(rows), called here when the segment's class keeps SegmentState's. */
static int finish_segment(PyObject* session, PyObject* segment) {
  static PyObject* own;  /* SegmentState's finish, its method descriptor (kept) */
  if (own == NULL && (own = PyObject_GetAttr((PyObject*)&SegmentStateType, s_finish)) == NULL)
    return -1;
  PyObject* rows = fetch_rows((SessionState*)session);
  PyObject* found = rows ? PyObject_GetAttr((PyObject*)Py_TYPE(segment), s_finish) : NULL;
  PyObject* done = NULL;
  if (found == own && PyObject_TypeCheck(segment, &SegmentStateType))
    done = segment_finish(segment, rows);
  else if (found != NULL)
    done = PyObject_CallMethodOneArg(segment, s_finish, rows);
  Py_XDECREF(found);
  Py_XDECREF(rows);
  Py_XDECREF(done);
  return done ? 0 : -1;
}

/* switch's arguments (name, stack_ids=(), open_new=True), by place or by keyword, into
 * `given` (borrowed; NULL where not given): its own parsing, which the Python hooks' calls
 * (six a training step) reach without CPython's keyword parser, cold in the step. */
static int switch_arguments(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                            PyObject** given) {
  static const char* names[] = {"name", "stack_ids", "open_new"};
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  if (nargs > 3) goto usage;
  for (Py_ssize_t i = 0; i < nargs; i++) given[i] = args[i];
  for (Py_ssize_t k = 0; k < nkw; k++) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    int i = 0;
    while (i < 3 && PyUnicode_CompareWithASCIIString(key, names[i]) != 0) i++;
    if (i == 3 || given[i] != NULL) goto usage;
    given[i] = args[nargs + k];
  }
  if (given[0] != NULL) return 0;
usage:
  PyErr_SetString(PyExc_TypeError, "switch(name, stack_ids=(), open_new=True)");
  return -1;
}

/* Session.switch(name, stack_ids=(), open_new=True): finishes the open segment, then
 * (open_new) opens the next: Segment(session, serial + 1, name, stack_ids). Returns
 * the open segment (None when none is). An error of the finish opens none. */
static PyObject* session_switch(PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                                PyObject* kwnames) {
  PyObject* given[3] = {NULL, NULL, NULL};  /* name, stack_ids, open_new */
  if (segment_names() < 0 || switch_arguments(args, nargs, kwnames, given) < 0) return NULL;
  PyObject *name = given[0], *stack_ids = given[1];
  int open_new = given[2] == NULL ? 1 : PyObject_IsTrue(given[2]);
  if (open_new < 0) return NULL;
  SessionState* s = (SessionState*)self;
  PyObject* segment = s->segment;
  s->segment = NULL;
  int failed = segment != NULL && segment != Py_None && finish_segment(self, segment) < 0;
  Py_XDECREF(segment);
  if (failed) return NULL;
  if (!open_new) Py_RETURN_NONE;
  if (s->segment_class == NULL || s->serial == NULL) {
    PyErr_SetString(PyExc_TypeError, "Session.switch: segment_class and _serial are unset");
    return NULL;
  }
  PyObject* serial = PyNumber_Add(s->serial, one);
  if (serial == NULL) return NULL;
  Py_SETREF(s->serial, serial);
  PyObject* opened = PyObject_CallFunctionObjArgs(
      s->segment_class, self, serial, name, stack_ids ? stack_ids : cfg.empty_tuple, NULL);
  if (opened == NULL) return NULL;
  Py_XSETREF(s->segment, Py_NewRef(opened));
  return opened;
}

PyMethodDef session_methods[] = {
    {"switch", (PyCFunction)(void (*)(void))session_switch, METH_FASTCALL | METH_KEYWORDS,
     "switch(name, stack_ids=(), open_new=True) -> the open segment, or None\n\n"
     "Finishes the open segment (its finish, given Encoder.fetch_rows()) and, with\n"
     "open_new, opens the next: segment_class(session, _serial + 1, name, stack_ids)."},
    {NULL, NULL, 0, NULL}};
