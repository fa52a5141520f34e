/* TFRecord framing of one buffer in a single C pass (optional; see reader/wire.py).
 *
 * walk(buf, starts, lengths) follows the records of `buf` from its first byte
 * and checks both CRCs of each one:
 *
 *   uint64 LE length | uint32 LE masked_crc32c(length) | payload | uint32 LE masked_crc32c(payload)
 *
 * It writes each good record's payload start and length into the writable
 * int64 buffers `starts` and `lengths` (room for len(buf) / 16 + 1 records)
 * and returns (count, next_pos, bad):
 *   - count: good records written;
 *   - next_pos: where the walk stopped, the start of the first record that is
 *     incomplete (runs past the buffer) or damaged;
 *   - bad: 1 when the record at next_pos fails a CRC, else 0.
 * It decides nothing else: wire.frame hands damage to the canonical scanner
 * (records.scan_buffer), exactly as it does after the pure-Python walk.
 *
 * frame(payloads) is the other way: the records of a sequence of bytes objects,
 * joined, as records.encode frames each (the writer's flushes: about a microsecond
 * of Python per record, in the thread that flushes while the program trains).
 *
 * CRC-32C (Castagnoli) uses SSE4.2's crc32 instruction where the CPU has it
 * and a slicing-by-8 table elsewhere. The GIL is released during the walk.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HEADER_SIZE 12
#define FOOTER_SIZE 4
#define MASK_DELTA 0xA282EAD8u

static uint32_t table[8][256];
static int use_hw;

static void init_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (uint32_t i = 0; i < 256; i++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
}

static uint32_t crc_sw(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        w = __builtin_bswap64(w);
#endif
        w ^= c;
        c = table[7][w & 0xFF] ^ table[6][(w >> 8) & 0xFF] ^ table[5][(w >> 16) & 0xFF] ^
            table[4][(w >> 24) & 0xFF] ^ table[3][(w >> 32) & 0xFF] ^
            table[2][(w >> 40) & 0xFF] ^ table[1][(w >> 48) & 0xFF] ^ table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = (c >> 8) ^ table[0][(c ^ *p++) & 0xFF];
    return ~c;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>
__attribute__((target("sse4.2"))) static uint32_t crc_hw(const uint8_t *p, size_t n) {
    uint64_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = _mm_crc32_u8(c32, *p++);
    return ~c32;
}
#define HAVE_HW 1
#endif

static inline uint32_t mask(uint32_t c) { return ((c >> 15) | (c << 17)) + MASK_DELTA; }

static inline uint32_t masked_crc(const uint8_t *p, size_t n) {
#ifdef HAVE_HW
    if (use_hw)
        return mask(crc_hw(p, n));
#endif
    return mask(crc_sw(p, n));
}

static inline uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--)
        v = (v << 8) | p[k];
    return v;
}

static inline uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static PyObject *walk(PyObject *self, PyObject *args) {
    Py_buffer buf, starts, lengths;
    if (!PyArg_ParseTuple(args, "y*w*w*", &buf, &starts, &lengths))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = buf.len;
    Py_ssize_t room = n / (HEADER_SIZE + FOOTER_SIZE) + 1;
    if (starts.len < room * 8 || lengths.len < room * 8) {
        PyErr_SetString(PyExc_ValueError,
                        "starts and lengths need room for len(buf) // 16 + 1 int64");
        goto done;
    }
    const uint8_t *b = (const uint8_t *)buf.buf;
    int64_t *out_start = (int64_t *)starts.buf;
    int64_t *out_len = (int64_t *)lengths.buf;
    Py_ssize_t pos = 0, count = 0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    while (n - pos >= HEADER_SIZE + FOOTER_SIZE) {
        uint64_t length = le64(b + pos);
        if (length > (uint64_t)(n - pos - HEADER_SIZE - FOOTER_SIZE))
            break; /* incomplete, or a damaged length: the caller looks at the tail */
        if (masked_crc(b + pos, 8) != le32(b + pos + 8)) {
            bad = 1;
            break;
        }
        const uint8_t *payload = b + pos + HEADER_SIZE;
        if (masked_crc(payload, (size_t)length) != le32(payload + length)) {
            bad = 1;
            break;
        }
        out_start[count] = pos + HEADER_SIZE;
        out_len[count] = (int64_t)length;
        count++;
        pos += HEADER_SIZE + FOOTER_SIZE + (Py_ssize_t)length;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("nni", count, pos, bad);
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lengths);
    return result;
}

/* The low `bytes` bytes of v, little-endian (the framing's byte order on any host). */
static inline void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int k = 0; k < bytes; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

static PyObject *frame(PyObject *self, PyObject *payloads) {
    PyObject *items = PySequence_Fast(payloads, "frame() takes a sequence of bytes");
    if (items == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items), total = 0;
    PyObject **item = PySequence_Fast_ITEMS(items);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_Check(item[i])) {
            PyErr_Format(PyExc_TypeError, "frame(): item %zd is %.80s, not bytes", i,
                         Py_TYPE(item[i])->tp_name);
            Py_DECREF(items);
            return NULL;
        }
        total += HEADER_SIZE + PyBytes_GET_SIZE(item[i]) + FOOTER_SIZE;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) {
        Py_DECREF(items);
        return NULL;
    }
    uint8_t *w = (uint8_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(item[i]);
        uint64_t len = (uint64_t)PyBytes_GET_SIZE(item[i]);
        put_le(w, len, 8);
        put_le(w + 8, masked_crc(w, 8), 4);
        memcpy(w + HEADER_SIZE, p, (size_t)len);
        put_le(w + HEADER_SIZE + len, masked_crc(p, (size_t)len), 4);
        w += HEADER_SIZE + len + FOOTER_SIZE;
    }
    Py_DECREF(items);
    return out;
}

static PyObject *masked_crc32c(PyObject *self, PyObject *args) {
    Py_buffer buf;
    int software = 0;
    if (!PyArg_ParseTuple(args, "y*|p", &buf, &software))
        return NULL;
    const uint8_t *p = (const uint8_t *)buf.buf;
    uint32_t c = software ? mask(crc_sw(p, (size_t)buf.len)) : masked_crc(p, (size_t)buf.len);
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS,
     "walk(buf, starts, lengths) -> (count, next_pos, bad): records of buf, both CRCs checked."},
    {"frame", frame, METH_O,
     "frame(payloads) -> bytes: the TFRecord records of a sequence of bytes objects, joined."},
    {"masked_crc32c", masked_crc32c, METH_VARARGS,
     "masked_crc32c(data, software=False) -> int: TFRecord's masked CRC-32C; software=True\n"
     "takes the table path even where the CPU has a crc32 instruction (tests compare both)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_frames", "TFRecord framing in C (see _frames.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__frames(void) {
    init_table();
#ifdef HAVE_HW
    __builtin_cpu_init();
    use_hw = __builtin_cpu_supports("sse4.2") != 0;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m != NULL)
        PyModule_AddIntConstant(m, "HARDWARE_CRC", use_hw);
    return m;
}
