/* What an op and its outputs are called: "scope/short_k" counted in the
 * segment, "name:slot" for an output (part of _record.c's extension).
 *
 * A model runs the same ops under the same names step after step, so the
 * names are made once and handed out again: the k-th name of a prefix and an
 * op's first output name are kept (up to NAMES_KEPT of each, all dropped
 * should a run pass that). A kept string's hash is computed once, and the
 * next execution's records hold the very same objects, so GraphRegistry's
 * lookup of an execution's op sequence (a tuple of every op's record) hashes
 * and compares them without reading their characters: about a thousand
 * instructions per op before (tight loop, callgrind). */
#include "_record.h"

#define NAMES_KEPT (1 << 17)
#define PREFIXES_MAX 16384  /* scopes whose prefixes are kept */

/* ":0" to ":7", the suffixes of most slot names. */
#define SLOT_SUFFIXES 8
static PyObject* slot_suffix[SLOT_SUFFIXES];

/* str(k) for small k, made once. */
#define DIGITS_KEPT 1024
static PyObject* digits_kept[DIGITS_KEPT];

static PyObject* prefixes;     /* scope -> short -> "scope/short_" */
static PyObject* counted;      /* "scope/short_" -> [its name 1, name 2, ...] */
static Py_ssize_t counted_size; /* names in `counted` */
static PyObject* first_slots;  /* op name -> "op name:0" */

int names_init(void) {
  for (int i = 0; i < SLOT_SUFFIXES; i++)
    if ((slot_suffix[i] = PyUnicode_FromFormat(":%d", i)) == NULL) return -1;
  if ((prefixes = PyDict_New()) == NULL || (counted = PyDict_New()) == NULL ||
      (first_slots = PyDict_New()) == NULL)
    return -1;
  return 0;
}

/* prefix + str(k) for k >= 0, by concatenation: PyUnicode_FromFormat goes
 * through printf for a number, at several times the cost. */
static PyObject* numbered(PyObject* prefix, Py_ssize_t k) {
  if (k < 0 || !PyUnicode_CheckExact(prefix)) return PyUnicode_FromFormat("%S%zd", prefix, k);
  if (k < DIGITS_KEPT) {
    if (digits_kept[k] == NULL && (digits_kept[k] = PyUnicode_FromFormat("%zd", k)) == NULL)
      return NULL;
    return PyUnicode_Concat(prefix, digits_kept[k]);
  }
  char digits[24];
  int n = 0;
  do {
    digits[sizeof(digits) - 1 - n++] = (char)('0' + k % 10);
    k /= 10;
  } while (k > 0);
  PyObject* tail = PyUnicode_FromStringAndSize(digits + sizeof(digits) - n, n);
  PyObject* joined = tail ? PyUnicode_Concat(prefix, tail) : NULL;
  Py_XDECREF(tail);
  return joined;
}

/* "input_k": the Placeholder name of a segment's k-th outside value without a
 * parameter name, kept for k < DIGITS_KEPT (no run of ever new names). */
PyObject* placeholder_name(Py_ssize_t k) {
  static PyObject* kept[DIGITS_KEPT];
  if (k < 0 || k >= DIGITS_KEPT) return numbered(cfg.input_prefix, k);
  if (kept[k] == NULL && (kept[k] = numbered(cfg.input_prefix, k)) == NULL) return NULL;
  return Py_NewRef(kept[k]);
}

/* counted[prefix] (borrowed: the memo holds it too) or NULL, behind a memo by the
 * prefix's address (about 110 instructions of a dict lookup per op), forgotten when
 * `counted` is emptied. */
#define COUNTED_MEMO_SIZE 64
static MemoEntry counted_memo[COUNTED_MEMO_SIZE];

static PyObject* kept_lists_of(PyObject* prefix) {
  PyObject* kept_lists = memo_lookup(counted_memo, COUNTED_MEMO_SIZE, counted, prefix);
  Py_XDECREF(kept_lists);  /* `counted` and the memo hold it */
  return kept_lists;
}

/* numbered(prefix, k) for k >= 0 and its first output's name ("...:0", which its
 * outputs' tags carry), the kept strings when there are: a prefix's names are kept
 * in order, 0 first, each beside its first output's (no dict lookup for that name
 * per op). `counted` maps a prefix to [names, first output names]. */
static PyObject* counted_name(PyObject* prefix, Py_ssize_t k, PyObject** first) {
  PyObject* kept_lists = kept_lists_of(prefix);  /* borrowed */
  if (kept_lists == NULL && PyErr_Occurred()) return NULL;
  PyObject* names = kept_lists ? PyList_GET_ITEM(kept_lists, 0) : NULL;
  PyObject* firsts = kept_lists ? PyList_GET_ITEM(kept_lists, 1) : NULL;
  Py_ssize_t kept = names ? PyList_GET_SIZE(names) : 0;
  if (k < kept) {
    *first = Py_NewRef(PyList_GET_ITEM(firsts, k));
    return Py_NewRef(PyList_GET_ITEM(names, k));
  }
  PyObject* name = numbered(prefix, k);
  if (name == NULL || (*first = PyUnicode_Concat(name, slot_suffix[0])) == NULL) goto fail;
  if (k != kept) return name;
  if (counted_size >= NAMES_KEPT) {  /* a run of ever new names: start again */
    memo_forget(counted_memo, COUNTED_MEMO_SIZE);
    PyDict_Clear(counted);
    counted_size = 0;
    kept_lists = NULL;
    if (k != 0) return name;
  }
  if (kept_lists == NULL) {
    if ((names = PyList_New(0)) == NULL || (firsts = PyList_New(0)) == NULL ||
        (kept_lists = PyList_New(2)) == NULL) {
      Py_XDECREF(names);
      Py_XDECREF(firsts);
      goto fail;
    }
    PyList_SET_ITEM(kept_lists, 0, names);
    PyList_SET_ITEM(kept_lists, 1, firsts);
    int stored = PyDict_SetItem(counted, prefix, kept_lists);
    Py_DECREF(kept_lists);  /* `counted` holds it */
    if (stored < 0) goto fail;
  }
  if (PyList_Append(names, name) < 0 || PyList_Append(firsts, *first) < 0) goto fail;
  counted_size++;
  return name;
fail:
  Py_XDECREF(name);
  Py_CLEAR(*first);
  return NULL;
}

/* "op_name:slot" (a tag's input name); an op's first output's is kept. */
PyObject* slot_name(PyObject* op_name, Py_ssize_t slot) {
  if (slot < 0 || slot >= SLOT_SUFFIXES || !PyUnicode_CheckExact(op_name))
    return PyUnicode_FromFormat("%S:%zd", op_name, slot);
  if (slot > 0) return PyUnicode_Concat(op_name, slot_suffix[slot]);
  PyObject* name = PyDict_GetItemWithError(first_slots, op_name);
  if (name != NULL) return Py_NewRef(name);
  if (PyErr_Occurred()) return NULL;
  if ((name = PyUnicode_Concat(op_name, slot_suffix[0])) == NULL) return NULL;
  if (PyDict_GET_SIZE(first_slots) >= NAMES_KEPT) PyDict_Clear(first_slots);
  if (PyDict_SetItem(first_slots, op_name, name) < 0) Py_CLEAR(name);
  return name;
}

/* "scope/short_" for (scope, short), kept across segments in a dict of dicts
 * (scope -> short -> prefix: string keys, whose hashes are cached, and no key
 * tuple to make per op). A model has a bounded set of scopes; the cache is
 * emptied should it pass PREFIXES_MAX scopes. */
static PyObject* made_prefix(PyObject* scope, PyObject* short_name) {
  PyObject* shorts = lookup(prefixes, scope);
  if (shorts == NULL) {
    if (PyErr_Occurred() || (shorts = PyDict_New()) == NULL) return NULL;
    if (PyDict_GET_SIZE(prefixes) >= PREFIXES_MAX) PyDict_Clear(prefixes);
    if (PyDict_SetItem(prefixes, scope, shorts) < 0) {
      Py_DECREF(shorts);
      return NULL;
    }
  }
  PyObject* prefix = lookup(shorts, short_name);
  if (prefix == NULL && !PyErr_Occurred() &&
      (prefix = PyUnicode_FromFormat("%S/%S_", scope, short_name)) != NULL &&
      PyDict_SetItem(shorts, short_name, prefix) < 0)
    Py_CLEAR(prefix);
  Py_DECREF(shorts);
  return prefix;
}

/* made_prefix behind a memo by the two strings' addresses (it holds them: an address
 * cannot stand for another string), which spares its two dict lookups per op (about 250
 * instructions). A prefix is a function of its strings: emptying `prefixes` leaves the
 * memo right. */
#define PREFIX_MEMO_SIZE 64
static struct {
  PyObject *scope, *short_name, *prefix;
} prefix_memo[PREFIX_MEMO_SIZE];

static PyObject* name_prefix(PyObject* scope, PyObject* short_name) {
  size_t slot = (((uintptr_t)scope >> 4) ^ ((uintptr_t)short_name >> 3)) % PREFIX_MEMO_SIZE;
  if (prefix_memo[slot].scope == scope && prefix_memo[slot].short_name == short_name)
    return Py_NewRef(prefix_memo[slot].prefix);
  PyObject* prefix = made_prefix(scope, short_name);
  if (prefix != NULL) {
    Py_XSETREF(prefix_memo[slot].scope, Py_NewRef(scope));
    Py_XSETREF(prefix_memo[slot].short_name, Py_NewRef(short_name));
    Py_XSETREF(prefix_memo[slot].prefix, Py_NewRef(prefix));
  }
  return prefix;
}

/* counters[prefix] (0 when absent), counted: a segment's counters as a mapping of
 * ints (a Segment whose fields are Python's). -1 on error. */
static Py_ssize_t dict_next(PyObject* counters, PyObject* prefix) {
  PyObject* count = lookup(counters, prefix);
  if (count == NULL && PyErr_Occurred()) return -1;
  Py_ssize_t k = count ? PyLong_AsSsize_t(count) : 0;
  Py_XDECREF(count);
  if (k < 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a negative op-name count");
    return -1;
  }
  PyObject* next = PyLong_FromSsize_t(k + 1);
  int stored = next == NULL ? -1 : PyObject_SetItem(counters, prefix, next);
  Py_XDECREF(next);
  return stored < 0 ? -1 : k;
}

/* Segment.op_name: "scope/short_k", k counting the prefix "scope/short_" in the
 * segment; *first set to its first output's name ("scope/short_k:0"). */
PyObject* op_name(PyObject* seg, PyObject* scope, PyObject* short_name, PyObject** first) {
  PyObject *counters = NULL, *prefix = NULL, *name = NULL;
  if ((counters = segment_attr(seg, S_COUNTERS)) == NULL) goto done;
  if ((prefix = name_prefix(scope, short_name)) == NULL) goto done;
  Py_ssize_t k = Py_IS_TYPE(counters, &CountsType) ? counts_next(counters, prefix)
                                                    : dict_next(counters, prefix);
  if (k >= 0) name = counted_name(prefix, k, first);
done:
  Py_XDECREF(counters);
  Py_XDECREF(prefix);
  return name;
}
