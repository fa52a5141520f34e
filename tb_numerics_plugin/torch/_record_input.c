/* The names of a claimed op's inputs: each tensor's producer tag (tags.producer_tag)
 * and, for a value from outside the segment, its Placeholder op (Segment.input_name);
 * part of _record.c's extension. */
#include "_record.h"

static int is_tag(PyObject* tag) {
  return PyTuple_Check(tag) && PyTuple_GET_SIZE(tag) == TAG_SIZE;
}

/* getattr(t, TAG, None): a new reference. */
static PyObject* own_tag(PyObject* t) {
  PyObject* tag;
  int found = tag_read(t, &tag);
  return found == 0 ? Py_NewRef(Py_None) : tag;
}

/* A view's tag is stale once its base was written after it (tags.producer_tag):
 * 1 when `base_tag` names the producer instead of `tag`, 0 not, -1 on error. */
static int base_wins(PyObject* t, PyObject* tag, PyObject* base_tag) {
  if (tag == Py_None) return 1;
  if (!is_tag(tag) || !is_tag(base_tag)) return 0;
  PyObject* version = tensor_version(t);
  if (version == NULL) return -1;
  int moved = PyObject_RichCompareBool(PyTuple_GET_ITEM(tag, T_VERSION), version, Py_NE);
  int wins = 0;
  if (moved > 0) {
    wins = PyObject_RichCompareBool(PyTuple_GET_ITEM(base_tag, T_VERSION), version, Py_EQ);
    if (wins == 0)
      wins = PyObject_RichCompareBool(PyTuple_GET_ITEM(base_tag, T_TENSOR_ID),
                                      PyTuple_GET_ITEM(tag, T_TENSOR_ID), Py_GT);
  }
  Py_DECREF(version);
  return moved < 0 ? -1 : wins;
}

/* getattr(t, TAG, None), else tags.stand_in_tag(t) where there is one: a new reference,
 * or NULL with an error. */
static PyObject* own_or_stand_in(PyObject* t) {
  PyObject* tag = own_tag(t);
  if (tag != Py_None) return tag;
  PyObject* stand_in = PyDict_GetItemWithError(cfg.tags_globals, s_stand_in_tag);
  if (stand_in == NULL && PyErr_Occurred()) goto fail;
  if (stand_in != NULL && stand_in == native_stand_in && native_api->stand_in_tag != NULL) {
    Py_SETREF(tag, native_api->stand_in_tag(t));  /* the same answer, no Python call */
  } else if (stand_in != NULL && stand_in != Py_None) {
    Py_SETREF(tag, PyObject_CallOneArg(stand_in, t));
  }
  return tag;
fail:
  Py_DECREF(tag);
  return NULL;
}

/* tags.producer_tag(t) (None for an outside value); sets *view to t._is_view(). */
PyObject* producer_tag(PyObject* t, int* view) {
  PyObject* tag = own_or_stand_in(t);
  if (tag == NULL) return NULL;
  if ((*view = is_view(t)) < 0) goto fail;
  if (*view) {
    PyObject* base = PyObject_GetAttr(t, s_base);
    PyObject* base_tag = base ? own_or_stand_in(base) : NULL;
    Py_XDECREF(base);
    if (base_tag == NULL) goto fail;
    int wins = base_tag == Py_None ? 0 : base_wins(t, tag, base_tag);
    if (wins > 0) Py_SETREF(tag, Py_NewRef(base_tag));
    Py_DECREF(base_tag);
    if (wins < 0) goto fail;
  }
  return tag;
fail:
  Py_XDECREF(tag);
  return NULL;
}

/* The value of `obj` in a tags.WeakIdMap's table (id -> (weak reference, value)),
 * or None: WeakIdMap.get. */
PyObject* weak_id_get(PyObject* table, PyObject* obj) {
  PyObject* key = PyLong_FromVoidPtr(obj);  /* id(obj) */
  PyObject* entry = key ? PyDict_GetItemWithError(table, key) : NULL;
  Py_XDECREF(key);
  if (entry == NULL) return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
  if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2 ||
      !PyWeakref_Check(PyTuple_GET_ITEM(entry, 0))) {
    PyErr_SetString(PyExc_TypeError, "a WeakIdMap entry is (weak reference, value)");
    return NULL;
  }
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* alive;
  if (PyWeakref_GetRef(PyTuple_GET_ITEM(entry, 0), &alive) < 0) return NULL;
  Py_XDECREF(alive);  /* compared by identity only; `obj` keeps it alive */
#else
  PyObject* alive = PyWeakref_GetObject(PyTuple_GET_ITEM(entry, 0));  /* borrowed */
#endif
  return Py_NewRef(alive == obj ? PyTuple_GET_ITEM(entry, 1) : Py_None);
}

/* scopes.param_name(t), else that of the base of a view (a Linear's transposed
 * weight), read off the Scopes' table without a Python call. */
static PyObject* param_name(PyObject* session, PyObject* t, int view) {
  PyObject* table = bound_attr(session, B_PARAM_TABLE);
  if (table == NULL) return NULL;
  if (!PyDict_Check(table)) {
    Py_DECREF(table);
    PyErr_SetString(PyExc_TypeError, "Scopes.param_table must be a dict");
    return NULL;
  }
  PyObject* name = weak_id_get(table, t);
  if (name == Py_None && view) {
    PyObject* base = PyObject_GetAttr(t, s_base);
    Py_SETREF(name, base ? weak_id_get(table, base) : NULL);
    Py_XDECREF(base);
  }
  Py_DECREF(table);
  return name;
}

/* Segment._add_placeholder: a Placeholder op named `name` (made unique) for the
 * value `key` names; returns the name given (new reference). */
static PyObject* add_placeholder(PyObject* seg, PyObject* placeholders, PyObject* key,
                                 PyObject* name, PyObject* tensor_id, PyObject* dtype_enum) {
  PyObject *names = NULL, *input_ids = NULL, *dtypes = NULL, *op = NULL, *given = NULL;
  if ((names = segment_attr(seg, S_PLACEHOLDER_NAMES)) == NULL) goto done;
  int clash = PySet_Contains(names, name);
  if (clash < 0) goto done;
  given = clash ? PyUnicode_FromFormat("%S_%zd", name, PyDict_GET_SIZE(placeholders))
                : Py_NewRef(name);
  if (given == NULL) goto done;
  if (PyDict_SetItem(placeholders, key, given) < 0 || PySet_Add(names, given) < 0) goto fail;
  if ((input_ids = segment_attr(seg, S_INPUT_IDS)) == NULL) goto fail;
  if (PyList_Append(input_ids, tensor_id) < 0) goto fail;
  if ((dtypes = dtype_tuple(dtype_enum)) == NULL) goto fail;
  PyObject* parts[OP_ITEM_SIZE] = {cfg.placeholder_type, given, cfg.empty_tuple, one,
                                   cfg.empty_tuple, cfg.empty_str, dtypes};
  op = op_item(seg, parts);
  if (op == NULL || append_segment(seg, S_OPS, op) < 0) goto fail;
  goto done;
fail:
  Py_CLEAR(given);
done:
  Py_XDECREF(names); Py_XDECREF(input_ids); Py_XDECREF(dtypes); Py_XDECREF(op);
  return given;
}

/* The Placeholder of an outside value `t` with producer tag `tag` (or None):
 * found in the segment, else added; returns "name:0". */
static PyObject* placeholder(PyObject* session, PyObject* seg, PyObject* t, PyObject* tag,
                             int view) {
  PyObject *placeholders = NULL, *key = NULL, *name = NULL, *dtype = NULL, *number = NULL;
  PyObject* result = NULL;
  int tagged = is_tag(tag), ok = 0;
  if ((placeholders = segment_attr(seg, S_PLACEHOLDERS)) == NULL) goto done;
  if (!PyDict_CheckExact(placeholders)) {
    PyErr_SetString(PyExc_TypeError, "Segment._placeholders must be a dict");
    goto done;
  }
  if (tagged) {
    key = PyTuple_Pack(2, PyTuple_GET_ITEM(tag, T_SERIAL), PyTuple_GET_ITEM(tag, T_TENSOR_ID));
    if (key == NULL) goto done;
    if ((name = lookup(placeholders, key)) != NULL || PyErr_Occurred()) {
      ok = name != NULL;
      goto done;
    }
  } else if ((key = Py_BuildValue("(On)", cfg.untagged, PyDict_GET_SIZE(placeholders))) == NULL) {
    goto done;
  }
  PyObject* found = param_name(session, t, view);
  int named = found ? PyObject_IsTrue(found) : -1;
  if (named < 0) { Py_XDECREF(found); goto done; }
  if (named) name = found;
  else {
    Py_DECREF(found);
    name = placeholder_name(PyDict_GET_SIZE(placeholders));
    if (name == NULL) goto done;
  }
  if ((dtype = tensor_dtype(t)) == NULL) goto done;
  if ((number = dtype_number(dtype)) == NULL) goto done;
  PyObject* tensor_id = tagged ? Py_NewRef(PyTuple_GET_ITEM(tag, T_TENSOR_ID))
                               : PyLong_FromLong(-1);
  if (tensor_id == NULL) goto done;
  Py_SETREF(name, add_placeholder(seg, placeholders, key, name, tensor_id, number));
  Py_DECREF(tensor_id);
  ok = name != NULL;
done:
  if (ok) result = slot_name(name, 0);
  Py_XDECREF(placeholders); Py_XDECREF(key); Py_XDECREF(name);
  Py_XDECREF(dtype); Py_XDECREF(number);
  return result;
}

/* Segment.input_name: "producer:slot" for a tensor made in this segment (read
 * off its tag), else its Placeholder's "name:0". */
static PyObject* input_name(PyObject* session, PyObject* seg, PyObject* serial, PyObject* t) {
  int view = 0;
  PyObject* tag = producer_tag(t, &view);
  if (tag == NULL) return NULL;
  PyObject* name = NULL;
  int same = is_tag(tag) ? PyObject_RichCompareBool(PyTuple_GET_ITEM(tag, T_SERIAL), serial,
                                                    Py_EQ) : 0;
  if (same > 0) name = Py_NewRef(PyTuple_GET_ITEM(tag, T_INPUT_NAME));
  else if (same == 0) name = placeholder(session, seg, t, tag, view);
  Py_DECREF(tag);
  return name;
}

/* The number of tensors among `args` when they are the op's only tensors (no keyword
 * arguments, no list or tuple among them), else -1: then tensors_in collects them. */
static Py_ssize_t flat_tensors(PyObject* args, PyObject* kwargs) {
  if (!PyTuple_CheckExact(args) || (kwargs != Py_None && (!PyDict_Check(kwargs) ||
                                                          PyDict_GET_SIZE(kwargs) > 0)))
    return -1;
  Py_ssize_t n = 0;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); i++) {
    PyObject* a = PyTuple_GET_ITEM(args, i);
    if (PyList_CheckExact(a) || PyTuple_CheckExact(a)) return -1;
    n += is_tensor(a);
  }
  return n;
}

/* each(tensor, ctx) of the op's input tensors in order, in a new tuple (`tuple`) or
 * list; from the arguments themselves when they hold them flat (no list per op).
 * NULL on error. */
static PyObject* map_inputs(PyObject* args, PyObject* kwargs, int tuple,
                            PyObject* (*each)(PyObject* t, void* ctx), void* ctx) {
  Py_ssize_t n = flat_tensors(args, kwargs);
  PyObject* found = n < 0 ? tensors_in(args, kwargs) : Py_NewRef(args);
  if (found == NULL) return NULL;
  if (n < 0) n = PyList_GET_SIZE(found);
  PyObject* results = tuple ? PyTuple_New(n) : PyList_New(n);
  PyObject** items = PySequence_Fast_ITEMS(found);  /* a list, or the args tuple */
  for (Py_ssize_t i = 0, k = 0; results != NULL && k < n; i++) {
    if (found == args && !is_tensor(items[i])) continue;
    PyObject* value = each(items[i], ctx);
    if (value == NULL) Py_CLEAR(results);
    else if (tuple) PyTuple_SET_ITEM(results, k++, value);
    else PyList_SET_ITEM(results, k++, value);
  }
  Py_DECREF(found);
  return results;
}

/* The tensor id of `t`'s producer, -1 for an outside value. */
static PyObject* producer_id(PyObject* t, void* unused) {
  int view;
  PyObject* tag = producer_tag(t, &view);
  PyObject* id = NULL;
  if (tag == Py_None) id = PyLong_FromLong(-1);
  else if (tag != NULL) id = PySequence_GetItem(tag, T_TENSOR_ID);
  Py_XDECREF(tag);
  return id;
}

/* The producers' tensor ids of an eager op's input tensors, as
 * recorder.record_eager_op lists them. */
PyObject* input_ids(PyObject* args, PyObject* kwargs) {
  return map_inputs(args, kwargs, 0, producer_id, NULL);
}

typedef struct {
  PyObject *session, *seg, *serial;
} Naming;

static PyObject* named_input(PyObject* t, void* ctx) {
  Naming* naming = ctx;
  return input_name(naming->session, naming->seg, naming->serial, t);
}

/* The names of an op's `n` input tensors, all of them among `args`, in order: the tuple
 * the last execution's item at the op's place holds when its names are the same objects
 * (op_item hands out that item again: no tuple made and freed), else a new one. */
#define NAMES_INLINE 8
static PyObject* flat_names(PyObject* args, Py_ssize_t n, Naming* naming) {
  PyObject* names[NAMES_INLINE];
  Py_ssize_t k = 0;
  for (Py_ssize_t i = 0; k < n; i++) {
    PyObject* a = PyTuple_GET_ITEM(args, i);
    if (!is_tensor(a)) continue;
    if ((names[k] = named_input(a, naming)) == NULL) break;
    k++;
  }
  PyObject* result = NULL;
  if (k == n) {  /* after the naming: a Placeholder it added comes before the op */
    PyObject* prior = prior_part(naming->seg, OP_ITEM_INPUTS);  /* borrowed */
    int same = prior != NULL && PyTuple_CheckExact(prior) && PyTuple_GET_SIZE(prior) == n;
    for (Py_ssize_t i = 0; same && i < n; i++) same = PyTuple_GET_ITEM(prior, i) == names[i];
    if (same) {
      result = Py_NewRef(prior);
    } else if (!PyErr_Occurred() && (result = PyTuple_New(n)) != NULL) {
      for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(result, i, names[i]);
      return untracked(result);  /* it took the names */
    }
  }
  for (Py_ssize_t i = 0; i < k; i++) Py_DECREF(names[i]);
  return result;
}

/* The input names of the op (recorder.record_graph_op), in the order of its tensors. */
PyObject* input_names(PyObject* session, PyObject* seg, PyObject* serial, PyObject* args,
                      PyObject* kwargs) {
  Naming naming = {session, seg, serial};
  Py_ssize_t n = flat_tensors(args, kwargs);
  if (n >= 0 && n <= NAMES_INLINE) return flat_names(args, n, &naming);
  return untracked(map_inputs(args, kwargs, 1, named_input, &naming));
}

/* The items ops.nested_tensors walks in `value` below the top: a dict's values, a
 * dataclass's fields (None where one is unset), a list or tuple itself; a new
 * reference, Py_None for anything else, NULL on error. */
static PyObject* nested_items(PyObject* value) {
  if (PyTuple_CheckExact(value) || PyList_CheckExact(value)) return Py_NewRef(value);
  if (PyDict_CheckExact(value)) return PyDict_Values(value);
  if (PyDict_Check(value)) return PyObject_CallMethodNoArgs(value, s_values);
  PyObject* fields;
  int found = optional_attr(value, s_dataclass_fields, &fields);
  if (found < 0) return NULL;
  if (found == 0)
    return PyList_Check(value) || PyTuple_Check(value) ? Py_NewRef(value) : Py_NewRef(Py_None);
  PyObject* items = PyList_New(0);
  PyObject* iter = items ? PyObject_GetIter(fields) : NULL;
  PyObject* name;
  while (iter != NULL && (name = PyIter_Next(iter)) != NULL) {
    PyObject* item;
    int has = optional_attr(value, name, &item);
    Py_DECREF(name);
    if (has < 0 || PyList_Append(items, has ? item : Py_None) < 0) Py_CLEAR(items);
    if (has > 0) Py_DECREF(item);
    if (items == NULL) break;
  }
  if (iter == NULL || PyErr_Occurred()) Py_CLEAR(items);
  Py_XDECREF(iter);
  Py_DECREF(fields);
  return items;
}

/* ops.nested_tensors(value, found, depth): 0, or -1 on error. */
static int nested_tensors(PyObject* value, PyObject* found, int depth) {
  if (is_tensor(value)) return PyList_Append(found, value);
  if (depth >= 4) return 0;
  PyObject* items = nested_items(value);
  if (items == NULL || items == Py_None) {
    Py_XDECREF(items);
    return items == NULL ? -1 : 0;
  }
  PyObject* seq = PySequence_Fast(items, "nested items");
  Py_DECREF(items);
  if (seq == NULL) return -1;
  int rc = 0;
  for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(seq); i++)
    rc = nested_tensors(PySequence_Fast_GET_ITEM(seq, i), found, depth + 1);
  Py_DECREF(seq);
  return rc;
}

/* producer_ids(value[, serial]): segments.producer_ids, the tensor ids in the
 * producer tags of the tensors nested in `value` (those made in segment `serial`
 * only, when given). */
PyObject* producer_ids(PyObject* self, PyObject* args) {
  PyObject *value, *serial = Py_None;
  if (!PyArg_ParseTuple(args, "O|O:producer_ids", &value, &serial)) return NULL;
  PyObject* found = PyList_New(0);
  PyObject* ids = found ? PyList_New(0) : NULL;
  if (ids == NULL || nested_tensors(value, found, 0) < 0) goto fail;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(found); i++) {
    int view;
    PyObject* tag = producer_tag(PyList_GET_ITEM(found, i), &view);
    if (tag == NULL) goto fail;
    int keep = is_tag(tag) && (serial == Py_None || PyObject_RichCompareBool(
                                   PyTuple_GET_ITEM(tag, T_SERIAL), serial, Py_EQ));
    if (keep > 0) keep = PyList_Append(ids, PyTuple_GET_ITEM(tag, T_TENSOR_ID)) == 0 ? 1 : -1;
    Py_DECREF(tag);
    if (keep < 0) goto fail;
  }
  Py_DECREF(found);
  return ids;
fail:
  Py_XDECREF(found);
  Py_XDECREF(ids);
  return NULL;
}
