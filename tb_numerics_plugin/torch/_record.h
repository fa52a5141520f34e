/* Shared by the sources of tb_numerics_plugin.torch._record (see _record.c). */
#ifndef TBN_RECORD_H
#define TBN_RECORD_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "_native_facts.h"

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject* Py_NewRef(PyObject* o) {
  Py_INCREF(o);
  return o;
}
#endif

/* getattr(obj, name) without an AttributeError for a missing attribute (raising and
 * clearing one costs more than the lookup): 1 with a new reference in *value, 0 when
 * absent (*value NULL), -1 on error. */
static inline int optional_attr(PyObject* obj, PyObject* name, PyObject** value) {
#if PY_VERSION_HEX >= 0x030D0000
  return PyObject_GetOptionalAttr(obj, name, value);
#else
  return _PyObject_LookupAttr(obj, name, value);
#endif
}

/* Items of a tag (tags.py; _record.c's header gives the whole layout). */
enum { T_SERIAL = 0, T_VERSION = 3, T_TENSOR_ID = 4, T_INPUT_NAME = 5, TAG_SIZE = 6 };

/* What configure() hands over once: torch objects and the layout of OpFacts. */
typedef struct {
  PyObject* tensor_type;     /* torch.Tensor */
  PyObject* is_grad_enabled; /* torch.is_grad_enabled */
  PyObject* sequence_nr;     /* torch._C._autograd._get_sequence_nr */
  PyObject* wall_clock;      /* time.time */
  int system_clock;          /* wall_clock is time.time itself */
  PyObject* dtype_enum;      /* torch.dtype -> DataType number (health.DTYPE_ENUM) */
  PyObject* backward_name;   /* segments.BACKWARD */
  PyObject* backward_prefix; /* "backward": the scope of backward ops */
  PyObject* backward_slash;  /* "backward/", before the forward op's name in their scopes */
  PyObject* autograd_node;   /* torch._C._current_autograd_node */
  PyObject* eager_name;      /* "eager": the scope of eager ops */
  PyObject* tags_globals;    /* the namespace of tags.py, where stand_in_tag is set */
  PyObject* set_eval_frame;  /* torch._C._dynamo.eval_frame.set_eval_frame */
  PyObject *placeholder_type, *untagged, *empty_tuple, *empty_str,  /* Placeholder op parts */
      *input_prefix;
  Py_ssize_t eager_batch;    /* recorder.EAGER_BATCH */
  Py_ssize_t f_op_type, f_short, f_skip, f_alias, f_traced, f_writes,  /* indices into an */
      f_max;                                                          /* OpFacts */
  int tag_in_dict;  /* a torch.Tensor's tag is its instance dict's entry (tag_read) */
  int ready;
} Config;
extern Config cfg;

/* isinstance(obj, torch.Tensor), by the type alone. PyObject_IsInstance calls the
 * metaclass's __instancecheck__ (about 800 instructions) for every object whose type
 * is not torch.Tensor itself: numbers, Parameters. The ops' values are real objects,
 * so a __class__ that differs from the type is not looked at. */
static inline int is_tensor(PyObject* obj) {
  PyTypeObject* tensor = (PyTypeObject*)cfg.tensor_type;
  if (Py_IS_TYPE(obj, tensor)) return 1;
  /* an op's scalar arguments: their types' MRO not walked */
  if (PyLong_CheckExact(obj) || PyFloat_CheckExact(obj) || obj == Py_None) return 0;
  return PyType_IsSubtype(Py_TYPE(obj), tensor);
}
extern PyObject *zero, *one;  /* output slot 0; the one output */

/* Interned attribute names (_record.c). */
extern PyObject *s_facts, *s_scopes, *s_segment, *s_stacks, *s_seq_ops,
    *s_encoder, *s_devices, *s_name, *s_is_graph,
    *s_serial, *s_counters, *s_ops, *s_traces, *s_tag, *s_is_view, *s_base,
    *s_version, *s_device, *s_dtype, *s_is_user, *s_user_code, *s_sites, *s_walk, *s_f_lasti,
    *s_dtype_traced, *s_payload, *s_sequence_nr,
    *s_eager, *s_stand_in_tag, *s_param_table, *s_placeholders, *s_placeholder_names,
    *s_input_ids, *s_gate, *s_take, *s_peek, *s_tensor_ids, *s_acquire, *s_on_op,
    *s_fail, *s_open_for_op, *s_values, *s_dataclass_fields, *s_prior;

/* getattr(t, TAG, None) (1 with a new reference in *tag, 0 absent, -1 on error) and
 * setattr(t, TAG, tag), through the instance dict for a torch.Tensor itself: configure
 * found that its type reads and writes attributes generically and has nothing named
 * TAG, so the attribute is the dict's entry. The generic machinery would look the name
 * up along the type's MRO first (about 250 instructions per recorded op, tight loop).
 * A read gives an untagged tensor an empty __dict__ (once), which the attribute
 * machinery would make at its first attribute anyway. */
static inline int tag_by_dict(PyObject* t) {  /* a Parameter or subclass: by attribute */
  return cfg.tag_in_dict && Py_IS_TYPE(t, (PyTypeObject*)cfg.tensor_type);
}

static inline int tag_read(PyObject* t, PyObject** tag) {
  if (!tag_by_dict(t)) return optional_attr(t, s_tag, tag);
  PyObject* dict = PyObject_GenericGetDict(t, NULL);
  if (dict == NULL) return -1;
  *tag = PyDict_GetItemWithError(dict, s_tag);  /* borrowed: `t` holds the dict */
  Py_DECREF(dict);
  if (*tag == NULL) return PyErr_Occurred() ? -1 : 0;
  Py_INCREF(*tag);
  return 1;
}

static inline int tag_write(PyObject* t, PyObject* tag) {
  if (!tag_by_dict(t)) return PyObject_SetAttr(t, s_tag, tag);
  PyObject* dict = PyObject_GenericGetDict(t, NULL);
  int status = dict ? PyDict_SetItem(dict, s_tag, tag) : -1;
  Py_XDECREF(dict);
  return status;
}

/* What take_op reads before it changes anything: new references, cleared by
 * release(). For a backward op, also its scope's stack_ids. */
typedef struct {
  PyObject *facts, *segment, *scope, *short_name, *serial, *stack_ids;
  PyObject* first_slot;  /* the op's first output's name, "name:0", once named */
  PyObject* outputs;  /* a list of the op's output tensors (ops.outputs_of), or NULL: */
  PyObject* single;   /* its one output, where it returned a tensor (no tuple per op) */
  int eager;          /* an eager op (recorder.record_eager_op) */
} Claim;

/* The number of outputs of a claimed op, and output `i` (borrowed). */
static inline Py_ssize_t claim_outputs_size(const Claim* c) {
  return c->outputs != NULL ? PyList_GET_SIZE(c->outputs) : 1;
}
static inline PyObject* claim_output(const Claim* c, Py_ssize_t i) {
  return c->outputs != NULL ? PyList_GET_ITEM(c->outputs, i) : c->single;
}

/* What claim() found: see there. */
enum { CLAIMED = 1, SKIPPED = 2, ALIASED = 3 };

/* A direct-mapped memo of one object's value by the object's address. An entry holds
 * both, so an address cannot stand for another object while the entry stays. */
typedef struct {
  PyObject *key, *value;
} MemoEntry;

static inline MemoEntry* memo_entry(MemoEntry* memo, size_t size, PyObject* key) {
  return &memo[((uintptr_t)key >> 4) % size];
}

static inline void memo_keep(MemoEntry* entry, PyObject* key, PyObject* value) {
  Py_XSETREF(entry->key, Py_NewRef(key));
  Py_XSETREF(entry->value, Py_NewRef(value));
}

/* _record.c: small helpers */
PyObject* lookup(PyObject* mapping, PyObject* key);
/* lookup(mapping, key) behind a MemoEntry memo of `size` entries (for keys that live
 * as long as the mapping's answer holds: torch's dtypes), and its emptying. */
PyObject* memo_lookup(MemoEntry* memo, size_t size, PyObject* mapping, PyObject* key);
void memo_forget(MemoEntry* memo, size_t size);
/* cfg.dtype_enum.get(dtype, 0), memoized: 0 for a dtype TensorFlow lacks; NULL with an error */
PyObject* dtype_number(PyObject* dtype);
PyObject* untracked(PyObject* tuple);
PyObject* untracked_but(PyObject* tuple, unsigned checked);
PyObject* wall_time(void);  /* cfg.wall_clock(), a new float */
int collect_tensors(PyObject* items, PyObject* found);
PyObject* tensors_in(PyObject* args, PyObject* kwargs);

/* _record_scope.c: where an op belongs and what it is called */
PyObject* call_site(PyObject* session);
void forget_call_sites(void);  /* the memo of the bound session's call sites */
void forget_facts(void);  /* the memo of the bound session's op facts */
int remember_forward(PyObject* session, PyObject* name, PyObject* stack_ids, long long first_id);
int claim(PyObject* session, PyObject* func, PyObject* args, PyObject* out, Claim* c);
void release(Claim* c);

/* _record.c */
extern const TbnNativeApi* native_api;  /* NULL until the native hook is loaded */
/* The hook module's stand_in_tag function, which native_api->stand_in_tag answers
 * for without a Python call (configure_facts); NULL until then. */
extern PyObject* native_stand_in;
void meta_hold(void);  /* take_op: the last tensor's meta is kept ... */
void meta_drop(void);  /* ... until here */
int read_meta(PyObject* t, TbnMeta* meta);  /* native_api->meta, 0 without the hook */
int is_view(PyObject* t);
PyObject* tensor_version(PyObject* t);
PyObject* tensor_dtype(PyObject* t);

/* _record_names.c: what an op and its outputs are called */
int names_init(void);
PyObject* placeholder_name(Py_ssize_t k);  /* "input_k" */
PyObject* slot_name(PyObject* op_name, Py_ssize_t slot);  /* "op_name:slot" */
/* "scope/short_k", and its first output's "scope/short_k:0" in *first */
PyObject* op_name(PyObject* seg, PyObject* scope, PyObject* short_name, PyObject** first);

/* _record_input.c: the names of an op's inputs */
PyObject* producer_tag(PyObject* t, int* view);
PyObject* input_ids(PyObject* args, PyObject* kwargs);  /* an eager op's inputs' tensor ids */
PyObject* producer_ids(PyObject* self, PyObject* args);  /* _record.producer_ids */
PyObject* input_names(PyObject* session, PyObject* seg, PyObject* serial, PyObject* args,
                      PyObject* kwargs);
/* tags.WeakIdMap.get on the map's table: the value of `obj`, or None (new references) */
PyObject* weak_id_get(PyObject* table, PyObject* obj);

/* _record_bound.c: the session's attributes bound for its life, read once */
enum { B_GATE, B_IDS, B_FACTS, B_SCOPES, B_STACKS, B_SEQ_OPS, B_DEVICES, B_ENCODER, B_IS_USER,
       B_SITES, B_PARAM_TABLE, B_COUNT };
/* The bound session and its attributes read so far (NULL: not yet), and the open
 * segment's: the common case is inline, a miss reads and binds. */
extern PyObject *bound_session, *bound_values[B_COUNT];
PyObject* bind_attr(PyObject* session, int which);
static inline PyObject* bound_attr(PyObject* session, int which) {  /* new reference, or NULL */
  PyObject* value = session == bound_session ? bound_values[which] : NULL;
  return value != NULL ? Py_NewRef(value) : bind_attr(session, which);
}
/* Whether `obj` is a `type` (PyObject_TypeCheck), the last subtype found to be one kept
 * in *passed (held: its address stands for it): the session's objects, Python subclasses
 * of the C bases, are checked without walking their MRO per op. */
typedef struct {
  PyTypeObject *sub, *base;
} PassedType;
int of_subtype(PyObject* obj, PyTypeObject* type, PassedType* passed);  /* the check, kept */
static inline int of_type(PyObject* obj, PyTypeObject* type, PassedType* passed) {
  if (Py_IS_TYPE(obj, type) || (Py_TYPE(obj) == passed->sub && type == passed->base)) return 1;
  return of_subtype(obj, type, passed);
}
int session_state(PyObject* session);  /* of_type SessionStateType (capture.Session) */
int encoder_state(PyObject* encoder);  /* of_type EncoderStateType (encoder.Encoder) */
/* bound_attr when the value is a `type` (a new reference), else NULL with a TypeError. */
PyObject* bound_of_type(PyObject* session, int which, PyTypeObject* type);
PyObject* unbind(PyObject* self, PyObject* session);
enum { S_IS_GRAPH, S_NAME, S_SERIAL, S_COUNTERS, S_OPS, S_TRACES, S_EAGER, S_PLACEHOLDERS,
       S_PLACEHOLDER_NAMES, S_INPUT_IDS, S_PRIOR, S_COUNT };
extern PyObject *bound_segment, *bound_segment_values[S_COUNT];
PyObject* bind_segment_attr(PyObject* segment, int which);
static inline PyObject* segment_attr(PyObject* segment, int which) {  /* as bound_attr */
  PyObject* value = segment == bound_segment ? bound_segment_values[which] : NULL;
  return value != NULL ? Py_NewRef(value) : bind_segment_attr(segment, which);
}
/* The kind of a segment, read once per segment: SEG_GRAPH for a graph execution's,
 * SEG_BACKWARD added for a backward pass's; -1 on error. */
enum { SEG_GRAPH = 1, SEG_BACKWARD = 2 };
int segment_kind(PyObject* segment);
int append_segment(PyObject* segment, int which, PyObject* item);  /* list `which` */
/* The torch.device and device name remembered for the device `meta` names, as
 * new references: 1, or 0 when another device (or session) was remembered. */
int remembered_device(PyObject* session, const TbnMeta* meta, PyObject** device,
                      PyObject** name);
void remember_device(PyObject* session, const TbnMeta* meta, PyObject* device, PyObject* name);

/* _record_entry.c: the hooks' entries */
int ready(void);
int take_op(PyObject* session, PyObject* func, PyObject* args, PyObject* kwargs,
            PyObject* out);
PyObject* record_entry(PyObject* self, PyObject* const* argv, Py_ssize_t argc);
PyObject* native_entry(PyObject* self, PyObject* const* argv, Py_ssize_t argc);

/* _record_state.c: state shared with Python, its fields read and written here */
typedef struct {
  PyObject_HEAD
  int taken;
} Token;  /* _record.Token: the recording token (gate.Token), free when 0 */
typedef struct {
  PyObject_HEAD
  long long next;
} Ids;  /* _record.Ids: a session's tensor ids (capture.Session.tensor_ids) */
typedef struct {
  PyObject_HEAD
  Py_ssize_t depth;
  char in_optimizer;
  PyObject* stack;  /* NULL until set */
  unsigned long thread;  /* the capturing thread's identity */
  PyObject* gate;   /* the session's recording token (NULL until set) */
  PyObject* paths;  /* the root call's module paths: a WeakIdMap's table, or NULL/None */
} ScopeState;  /* _record.ScopeState: hooks.Scopes' base */
typedef struct {
  PyObject_HEAD
  PyObject* segment;  /* NULL reads as None */
  PyObject* serial;   /* the last segment's serial, an int (NULL until set) */
  PyObject* segment_class;  /* segments.Segment (NULL until set) */
  PyObject *writer, *host_name, *encoder, *registry;  /* NULL until set */
  char watch;  /* watch_nonfinite */
} SessionState;  /* _record.SessionState: capture.Session's base */
typedef struct {
  PyObject_HEAD
  PyObject *session, *serial, *name, *stack_ids, *step, *ops, *prior_ops, *traces, *eager,
      *input_ids, *output_ids, *arg_ids, *counters, *placeholders, *placeholder_names;
  double wall_time;
  char is_graph;
} SegmentState;  /* _record.SegmentState: segments.Segment's base (_record_segment.c) */
typedef struct {
  PyObject_HEAD
  char graph_values;
  PyObject* dtype_ok;  /* NULL until set */
  PyObject* cpu_rows;  /* NULL reads as None */
  PyObject* cuda_rows;  /* NULL reads as None */
  PyObject *mode, *mode_enum, *c_record, *trace_places, *trace_prefixes;  /* NULL until set */
  char kernel_mode;
} EncoderState;  /* _record.EncoderState: encoder.Encoder's base */
extern PyTypeObject TokenType, IdsType, ScopeStateType, SessionStateType, EncoderStateType,
    SegmentStateType, CountsType;
PyObject* take_id(PyObject* ids);  /* the next id, counted: a new reference */
PyObject* peek_id(PyObject* ids);  /* the next id: a new reference */
long long next_id(PyObject* ids);  /* the next id as a C integer; -1 with an error */
int state_types_ready(PyObject* module);

/* _record_counts.c: a segment's op-name counters (_record.Counts, Segment._counters) */
PyObject* counts_new(void);
Py_ssize_t counts_next(PyObject* counts, PyObject* key);  /* the count, then counted; -1 */

/* _record_segment.c: a segment made, finished and switched (SegmentState, Session.switch) */
int segment_init(PyObject* self, PyObject* args, PyObject* kwargs);  /* SegmentState's tp_init */
extern PyMethodDef segment_methods[], session_methods[];

/* _record_forward.c: a session's forward ops by autograd node (capture.Session._seq_ops) */
typedef struct {
  long long seq;
  PyObject *name, *stack_ids;  /* NULL in a free slot */
  long long first_id;  /* the op's first output's tensor id: no int object per forward op */
} Forward;
typedef struct {
  PyObject_HEAD
  Forward* slots;
  Py_ssize_t size, limit;  /* powers of two; size 0 until the first entry */
} ForwardOps;  /* _record.ForwardOps */
extern PyTypeObject ForwardOpsType;
/* Remembers the forward op of node `seq` unless one is: 0, or -1 on error. */
int forward_remember(ForwardOps* self, long long seq, PyObject* name, PyObject* stack_ids,
                     long long first_id);
/* The forward op of node `seq`, or NULL (no error): valid until the next remember. */
const Forward* forward_op(const ForwardOps* self, long long seq);

/* _record_op.c: the records of a claimed op */
int record(PyObject* session, Claim* c, PyObject* args, PyObject* kwargs);
/* The last tensor object the recording tagged (borrowed, for identity) and its tag. */
extern PyObject *marked_object, *marked_tag;
#define DTYPES_KEPT 64
PyObject* dtype_tuple(PyObject* number);  /* (number,), kept for small numbers */
enum { OP_ITEM_SIZE = 7, OP_ITEM_INPUTS = 2 };  /* a Segment.ops item's fields (_record.c) */
/* A Segment.ops item of these parts, the previous execution's when the same. */
PyObject* op_item(PyObject* segment, PyObject* const parts[OP_ITEM_SIZE]);
/* Part `part` of the previous execution's item at the next op's place (borrowed), or
 * NULL: none (no error) or an error. */
PyObject* prior_part(PyObject* segment, int part);

/* _record_health.c: a traced tensor's payload, in C for a dense CPU tensor */
PyObject* configure_health(PyObject* self, PyObject* args);
PyObject* configure_facts(PyObject* self, PyObject* args);
int payload_parts(PyObject* encoder, PyObject* t, PyObject* device, PyObject* dtype,
                  PyObject** payload, PyObject** meta);
PyObject* payload_entry(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

/* _record_rows.c: the fetched health rows, read in place */
typedef struct {
  Py_buffer* views;  /* one per block */
  Py_ssize_t count;
} Rows;
int rows_acquire(PyObject* blocks, Rows* rows);
void rows_release(Rows* rows);
const double* row_at(const Rows* rows, PyObject* payload);

/* _record_encode.c: the encoding of a finished graph segment's traces; the entry's work
 * (traces_encoded) is what the C finish calls, without an argument tuple to parse */
PyObject* encode_traces(PyObject* self, PyObject* args);
PyObject* traces_encoded(PyObject* traces, PyObject* rows, PyObject* graph_id,
                         PyObject* mode_name, PyObject* step, PyObject* by_graph,
                         PyObject* prefixes, PyObject* make_prefix);

/* _record_exec.c: the encoding of executions (eager ops, a graph segment's call); the
 * entries' work (executions_encoded, graph_execution_encoded) as for encode_traces */
PyObject* encode_executions(PyObject* self, PyObject* args);
PyObject* encode_graph_execution(PyObject* self, PyObject* args);
PyObject* executions_encoded(PyObject* items, PyObject* rows, PyObject* mode_name,
                             long mode_enum, PyObject* host, PyObject* step);
PyObject* graph_execution_encoded(PyObject* op_type, PyObject* graph_id, PyObject* in_ids,
                                  PyObject* out_ids, long mode_enum, PyObject* host,
                                  PyObject* stack_ids, double wall, PyObject* step);

#endif
