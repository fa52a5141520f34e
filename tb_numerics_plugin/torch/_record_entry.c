/* The hooks' entries in C: Session.record as the dispatch mode's `record` and the
 * native hook's `native_entry` (with Dynamo's frame callback off), and the
 * recording of one op they share (part of _record.c's extension). */
#include "_record.h"

/* tags.inherit_tag: an alias op's output gets the tag of the input it aliases. */
static int inherit_tag(PyObject* args, PyObject* out) {
  if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) == 0) return 0;
  PyObject* source = PyTuple_GET_ITEM(args, 0);
  if (!is_tensor(out) || !is_tensor(source)) return 0;
  int view;
  PyObject* tag = producer_tag(source, &view);
  if (tag == NULL) return -1;
  int status = tag == Py_None ? 0 : tag_write(out, tag);
  Py_DECREF(tag);
  return status;
}

/* Records the op or passes over it: 1 done, 0 left to Python, -1 on error. */
int take_op(PyObject* session, PyObject* func, PyObject* args, PyObject* kwargs,
            PyObject* out) {
  Claim c;
  meta_hold();
  int claimed = claim(session, func, args, out, &c);
  int status = claimed == ALIASED ? inherit_tag(args, out)
               : claimed == CLAIMED ? record(session, &c, args, kwargs) : 0;
  if (claimed == CLAIMED) release(&c);
  meta_drop();
  if (claimed < 0 || status < 0) return -1;
  return claimed != 0;
}

int ready(void) {
  if (!cfg.ready) PyErr_SetString(PyExc_RuntimeError, "_record.configure() was not called");
  return cfg.ready;
}

/* Takes the recording token (gate.RecordingGate.acquire): 1, 0 when not had, -1 on
 * error. A free token is taken here; a taken one is waited for in Python (the
 * flush thread may hold it). */
static int acquire(PyObject* session, Token* gate) {
  if (!gate->taken) {
    gate->taken = 1;
    return 1;
  }
  PyObject* got = PyObject_CallMethodNoArgs(session, s_acquire);
  int had = got ? PyObject_IsTrue(got) : -1;
  Py_XDECREF(got);
  return had;
}

/* Session.record, as the native hook's entry: `fail` counts an Exception of the
 * recording; a KeyboardInterrupt or SystemExit propagates. The token goes back
 * either way. */
static int record_under_token(PyObject* session, Token* gate, PyObject* func,
                              PyObject* args, PyObject* kwargs, PyObject* out) {
  int done = take_op(session, func, args, kwargs, out);
  if (done == 0) {
    PyObject* got = PyObject_CallMethodObjArgs(session, s_on_op, func, args, kwargs, out, NULL);
    done = got ? 1 : -1;
    Py_XDECREF(got);
  }
  if (done < 0 && PyErr_ExceptionMatches(PyExc_Exception)) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL) PyException_SetTraceback(value, traceback);
    PyObject* where = PyUnicode_FromFormat("op %S", func);
    PyObject* got = where ? PyObject_CallMethodObjArgs(session, s_fail, where, value, NULL) : NULL;
    done = got ? 1 : -1;
    Py_XDECREF(got); Py_XDECREF(where);
    Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(traceback);
  }
  gate->taken = 0;  /* gate.release */
  return done;
}

/* Session.record: 1 done or passed over (no token), -1 on error. */
static int record_op(PyObject* session, PyObject* func, PyObject* args, PyObject* kwargs,
                     PyObject* out) {
  PyObject* gate = bound_attr(session, B_GATE);
  if (gate != NULL && !Py_IS_TYPE(gate, &TokenType)) {  /* gate.Token is this module's */
    PyErr_SetString(PyExc_TypeError, "Session.gate is not a _record.Token");
    Py_CLEAR(gate);
  }
  int held = gate == NULL ? -1 : acquire(session, (Token*)gate);
  int done = held > 0 ? record_under_token(session, (Token*)gate, func, args, kwargs, out)
                      : held;
  Py_XDECREF(gate);
  return done;
}

/* The tag the recording last gave `out` (a new reference), or NULL; either way the
 * recording's note of it is dropped (mark(), _record_op.c). */
static PyObject* take_marked_tag(PyObject* out) {
  PyObject* tag = marked_tag;
  int mine = tag != NULL && marked_object == out;
  marked_object = NULL;
  marked_tag = NULL;
  if (mine) return tag;
  Py_XDECREF(tag);
  return NULL;
}

/* record(session, func, args, kwargs, out): Session.record in C, the dispatch mode's. */
PyObject* record_entry(PyObject* self, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 5) {
    PyErr_SetString(PyExc_TypeError, "record(session, func, args, kwargs, out) takes 5 arguments");
    return NULL;
  }
  int done = ready() ? record_op(argv[0], argv[1], argv[2], argv[3], argv[4]) : -1;
  Py_XDECREF(take_marked_tag(NULL));  /* the dispatch mode has no use for it */
  if (done < 0) return NULL;
  Py_RETURN_NONE;
}

/* Whether a thread may have Dynamo's frame callback set: torch's set_eval_frame
 * makes its shim the interpreter's frame evaluator while any thread has one, and
 * gives CPython's own back when none has. With CPython's own evaluator there is
 * nothing to turn off (two Python calls per recorded op saved). */
static int frame_callback_possible(void) {
#if PY_VERSION_HEX >= 0x03090000
  return _PyInterpreterState_GetEvalFrameFunc(PyInterpreterState_Get()) !=
         _PyEval_EvalFrameDefault;
#else
  return 1;
#endif
}

/* native_entry(session, func, args, out): native.NativeHook's entry in C (the
 * Python twin is native._entry_for). Dynamo's frame callback is off meanwhile:
 * it must not trace the recording's Python calls. Returns the tag the recording
 * gave `out` when it tagged that tensor (the hook keeps it for the output's
 * memory without reading the attribute back), else None. */
PyObject* native_entry(PyObject* self, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 4) {
    PyErr_SetString(PyExc_TypeError, "native_entry(session, func, args, out) takes 4 arguments");
    return NULL;
  }
  if (!ready()) return NULL;
  Py_XDECREF(take_marked_tag(NULL));
  const int switched = frame_callback_possible();
  PyObject* prior = switched ? PyObject_CallOneArg(cfg.set_eval_frame, Py_None) : NULL;
  if (switched && prior == NULL) return NULL;
  int done = record_op(argv[0], argv[1], argv[2], Py_None, argv[3]);
  if (switched) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject* back = PyObject_CallOneArg(cfg.set_eval_frame, prior);
    Py_DECREF(prior);
    if (back == NULL) {  /* the recording's own error comes first */
      if (type != NULL) PyErr_Clear();
      else done = -1;
    }
    Py_XDECREF(back);
    if (type != NULL) PyErr_Restore(type, value, traceback);
  }
  PyObject* tag = take_marked_tag(argv[3]);
  if (done < 0 || tag == NULL) {
    Py_XDECREF(tag);
    return done < 0 ? NULL : Py_NewRef(Py_None);
  }
  return tag;
}
