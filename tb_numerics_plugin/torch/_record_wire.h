/* Protobuf wire writing shared by _record_encode.c (graph execution traces) and
 * _record_exec.c (executions): a growing byte buffer, varints, length-delimited
 * fields, and the debug values of a tensor debug mode. */
#ifndef TBN_RECORD_WIRE_H
#define TBN_RECORD_WIRE_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The modes encoded in C, by their position in mode_code's names. */
enum { M_NO_TENSOR, M_CURT, M_CONCISE, M_FULL_HEALTH, M_SHAPE, M_FULL_NUMERICS };
#define SHAPE_MAX_RANK 6 /* health.SHAPE_MAX_RANK */
#define MAX_VALUES 17

typedef struct {
  unsigned char* data;
  size_t size, capacity;
  int borrowed;  /* data is the caller's storage (STACK_BUFFER): copied out to grow */
} Buffer;

/* A Buffer that starts in `n` bytes of the caller's stack frame and moves to the
 * heap only if it outgrows them (an execution's message is mostly well under):
 * no allocation per message. Released with buffer_free, as a heap one is. */
#define STACK_BUFFER(name, n) \
  unsigned char name##_storage[n]; \
  Buffer name = {name##_storage, 0, n, 1}

static inline void buffer_free(Buffer* b) {
  if (!b->borrowed) PyMem_Free(b->data);
}

static inline int put(Buffer* b, const void* bytes, size_t n) {
  if (b->size + n > b->capacity) {
    size_t capacity = b->capacity ? b->capacity * 2 : 256;
    while (capacity < b->size + n) capacity *= 2;
    unsigned char* data = b->borrowed ? PyMem_Malloc(capacity) : PyMem_Realloc(b->data, capacity);
    if (data == NULL) {
      PyErr_NoMemory();
      return -1;
    }
    if (b->borrowed) memcpy(data, b->data, b->size);
    b->borrowed = 0;
    b->data = data;
    b->capacity = capacity;
  }
  memcpy(b->data + b->size, bytes, n);
  b->size += n;
  return 0;
}

/* Writes a varint at `p`; returns the byte past it (at most 10 bytes). */
static inline unsigned char* write_varint(unsigned char* p, uint64_t v) {
  while (v > 0x7F) {
    *p++ = (unsigned char)((v & 0x7F) | 0x80);
    v >>= 7;
  }
  *p++ = (unsigned char)v;
  return p;
}

/* Writes `v` as 8 little-endian bytes (a protobuf double) at `p`; returns the byte past. */
static inline unsigned char* write_double(unsigned char* p, double v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  memcpy(p, &v, 8);  /* one store: the compiler did not merge the byte loop below */
  return p + 8;
#else
  uint64_t bits;
  memcpy(&bits, &v, 8);
  for (int k = 0; k < 8; k++) *p++ = (unsigned char)(bits >> (8 * k));
  return p;
#endif
}

static inline int put_varint(Buffer* b, uint64_t v) {
  unsigned char bytes[10];
  size_t n = (size_t)(write_varint(bytes, v) - bytes);  /* at most 10, told to the compiler */
  return put(b, bytes, n < sizeof(bytes) ? n : sizeof(bytes));
}

static inline size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v > 0x7F) {
    v >>= 7;
    n++;
  }
  return n;
}

/* A length-delimited field (wire type 2). */
static inline int put_field(Buffer* b, uint64_t tag, const void* bytes, size_t n) {
  return put_varint(b, tag) < 0 || put_varint(b, n) < 0 || put(b, bytes, n) < 0 ? -1 : 0;
}

static inline int put_str_field(Buffer* b, uint64_t tag, PyObject* text, int skip_empty) {
  Py_ssize_t n;
  const char* utf8 = PyUnicode_AsUTF8AndSize(text, &n);
  if (utf8 == NULL) return -1;
  return skip_empty && n == 0 ? 0 : put_field(b, tag, utf8, (size_t)n);
}

/* _record_encode.c */
int mode_code(PyObject* name);  /* a mode's M_ value, -1 for one not encoded in C */
/* health.debug_values into `v` (`raw`: the row, NULL for SHAPE): the count, -1 on error */
int debug_values(int mode, PyObject* tensor_id, const double* raw, PyObject* meta, double* v);
int put_values_proto(Buffer* b, const double* v, int n);  /* wire.values_tensor_proto */

#endif
