/*
 * mighty.trace._speedups: the recorder's per-import taps, compiled.
 *
 * This is the compiled form of two pure-Python paths that stay in the package, as the
 * fallback (no compiler, or MIGHTY_PURE_PYTHON=1) and as the oracle the tests hold this
 * module to, byte for byte (tests/trace/test_speedups.py):
 *
 * - Queue: TraceWriter's queue of framed import records (_format.py: _queue, _frame_queued).
 *   push(payload) frames a payload (u32 length, CRC-32 of the payload, CRC-32 of those 8
 *   bytes, all big-endian, then the payload) onto one growing buffer; take() fills in the
 *   CRC-32s of all the frames it holds and hands the buffer's bytes to the writer. After a push it calls drain() (the writer's; it takes the
 *   writer's lock and writes) when the queue holds `limit` bytes or its oldest record is
 *   `interval` seconds old, as _queue does.
 * - Core: the state one instance's taps share with the recorder's Python paths: `step` and
 *   `fuel_limit` (InstanceRecording reads and sets both), and the fuel reading
 *   (wasmtime_context_get_fuel, called through the address ctypes gives for it).
 * - Tap: one import's tap (InstanceRecording.tap_import, _tap_plain/_tap_method). The gate
 *   calls it as tap(context_ptr, result, *args) after each call of the import that
 *   returned. It bumps the step, reads the fuel, encodes the import record from the bytes
 *   made once per import (head, mid, ...) and the values (emit_item/emit_result's shapes,
 *   _emit.py), frames it and queues it. For anything else (a value of another shape, a
 *   record over max_payload bytes, a closed queue, a fuel limit outside u64) it calls
 *   general(step, fuel, result, *args), the recorder's general path, which writes the same
 *   bytes or raises the error the pure path raises.
 *
 * Everything here runs holding the GIL. A record is encoded into a scratch buffer first and
 * copied into the queue in one step that calls no Python code, so nothing can interleave
 * with a half-written frame. No exception is lost: every failure returns NULL (or -1) with
 * one set.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* ---- CRC-32 (zlib's: reflected polynomial 0xEDB88320), slicing by 16 -------------------- */

/* crc_table[0] is the classic byte-at-a-time table; crc_table[k][b] is the CRC of byte b
 * followed by k zero bytes, so 16 (or 8) input bytes are folded in with one lookup each. */
static uint32_t crc_table[16][256];

static void
crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        }
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        for (int t = 1; t < 16; t++) {
            uint32_t c = crc_table[t - 1][i];
            crc_table[t][i] = (c >> 8) ^ crc_table[0][c & 0xFF];
        }
    }
}

static inline uint32_t
le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Four input bytes (as a little-endian word) folded in `k` bytes ahead of the end of a block:
 * the lookups for their positions k+3 .. k. */
#define FOLD(w, k)                                                                         \
    (crc_table[(k) + 3][(w) & 0xFF] ^ crc_table[(k) + 2][((w) >> 8) & 0xFF] ^             \
     crc_table[(k) + 1][((w) >> 16) & 0xFF] ^ crc_table[(k)][(w) >> 24])

/* zlib.crc32(data, crc): the running CRC-32 `crc` continued over n bytes at p. */
static uint32_t
crc32_update(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
    while (n >= 16) {
        uint32_t a = crc ^ le32(p), b = le32(p + 4), c = le32(p + 8), d = le32(p + 12);
        crc = FOLD(a, 12) ^ FOLD(b, 8) ^ FOLD(c, 4) ^ FOLD(d, 0);
        p += 16;
        n -= 16;
    }
    if (n >= 8) {
        uint32_t a = crc ^ le32(p), b = le32(p + 4);
        crc = FOLD(a, 4) ^ FOLD(b, 0);
        p += 8;
        n -= 8;
    }
    while (n--) {
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    }
    return ~crc;
}

static void
put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

#define FRAME_HEAD 12 /* u32 length, u32 crc32(payload), u32 crc32(the 8 bytes before) */

/* Fill in the frame head before a payload of n bytes (n < 2**32: checked by the callers). */
static void
frame_head(unsigned char *frame, size_t n)
{
    put_be32(frame, (uint32_t)n);
    put_be32(frame + 4, crc32_update(0, frame + FRAME_HEAD, n));
    put_be32(frame + 8, crc32_update(0, frame, 8));
}

static double
monotonic(void)
{
    /* The clock time.monotonic() reads on POSIX. */
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
        return 0.0; /* cannot fail for CLOCK_MONOTONIC; an age check then sees no age */
    }
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the scratch buffer a record is encoded into ----------------------------------------- */

#define LOCAL_BYTES 512

typedef struct {
    unsigned char *p;  /* local, or a PyMem block once it outgrew that */
    Py_ssize_t len;
    Py_ssize_t cap;
    Py_ssize_t max;    /* most bytes wanted: past this `full` is set and nothing more kept */
    int full;
    int failed;        /* out of memory: an exception is set */
    unsigned char local[LOCAL_BYTES];
} Out;

static void
out_init(Out *o, Py_ssize_t max)
{
    o->p = o->local;
    o->len = 0;
    o->cap = LOCAL_BYTES;
    o->max = max;
    o->full = 0;
    o->failed = 0;
}

static void
out_free(Out *o)
{
    if (o->p != o->local) {
        PyMem_Free(o->p);
    }
}

/* Room for n more bytes past a full buffer: 1, or 0 once full or failed (then the record
 * is not used). */
static int
out_grow(Out *o, Py_ssize_t n)
{
    if (o->full || o->failed) {
        return 0;
    }
    if (n > o->max - o->len) {
        o->full = 1;
        return 0;
    }
    Py_ssize_t need = o->len + n; /* <= max: no overflow */
    Py_ssize_t cap = o->cap;
    while (cap < need) {
        cap = cap > PY_SSIZE_T_MAX / 2 ? need : cap * 2;
    }
    unsigned char *p;
    if (o->p == o->local) {
        p = PyMem_Malloc((size_t)cap);
        if (p != NULL) {
            memcpy(p, o->local, (size_t)o->len);
        }
    }
    else {
        p = PyMem_Realloc(o->p, (size_t)cap);
    }
    if (p == NULL) {
        PyErr_NoMemory();
        o->failed = 1;
        return 0;
    }
    o->p = p;
    o->cap = cap;
    return 1;
}

/* Room for n more bytes within `max`: 1, or 0 (then `full` or `failed` is set). A later,
 * shorter piece may still find room, but a record whose Out is full or failed is never used:
 * the callers check both flags before they take its bytes. */
static inline int
out_room(Out *o, Py_ssize_t n)
{
    if (n <= o->cap - o->len && n <= o->max - o->len) {
        return 1;
    }
    return out_grow(o, n);
}

static inline void
put(Out *o, const void *data, Py_ssize_t n)
{
    if (out_room(o, n)) {
        memcpy(o->p + o->len, data, (size_t)n);
        o->len += n;
    }
}

static inline void
put_byte(Out *o, unsigned char b)
{
    if (out_room(o, 1)) {
        o->p[o->len++] = b;
    }
}

/* A CBOR head: major type and argument, in the shortest form (_emit.head). */
static inline void
put_head(Out *o, int major, uint64_t n)
{
    if (n < 24) {
        put_byte(o, (unsigned char)((major << 5) | (int)n));
        return;
    }
    unsigned char b[9];
    int size;
    unsigned char m = (unsigned char)(major << 5);
    if (n < 24) {
        b[0] = m | (unsigned char)n;
        size = 1;
    }
    else if (n <= 0xFF) {
        b[0] = m | 24;
        size = 2;
    }
    else if (n <= 0xFFFF) {
        b[0] = m | 25;
        size = 3;
    }
    else if (n <= 0xFFFFFFFFu) {
        b[0] = m | 26;
        size = 5;
    }
    else {
        b[0] = m | 27;
        size = 9;
    }
    for (int i = size - 1; i >= 1; i--) {
        b[i] = (unsigned char)n;
        n >>= 8;
    }
    put(o, b, size);
}

static inline void
put_bytes_object(Out *o, PyObject *bytes)
{
    put(o, PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes));
}

/* ---- values (the shapes of _emit.emit_item and emit_result) ------------------------------ */

/* Each returns 1 (written), 0 (not a shape taken here: the general path) or -1 (error). */

static PyObject *u64_max; /* 2**64 - 1 */
static PyObject *zero;
static PyObject *str_value; /* "value" */
static PyObject *str_ok; /* "ok" */

static int
put_int(Out *o, PyObject *v)
{
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow == 0) {
        if (x == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (x >= 0) {
            put_head(o, 0, (uint64_t)x);
        }
        else {
            put_head(o, 1, (uint64_t)(-(x + 1)));
        }
        return 1;
    }
    if (overflow < 0) {
        return 0; /* below -2**63: the general path */
    }
    int fits = PyObject_RichCompareBool(v, u64_max, Py_LE);
    if (fits <= 0) {
        return fits; /* over 2**64 - 1 (a bignum tag): the general path */
    }
    unsigned long long u = PyLong_AsUnsignedLongLong(v);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    put_head(o, 0, (uint64_t)u);
    return 1;
}

/* A str as CBOR text; 0 for one holding a lone surrogate (UTF-8 cannot carry it: the
 * general path raises the error the pure path raises), found before encoding so that no
 * exception is made and dropped. */
static int
put_text(Out *o, PyObject *v)
{
    Py_ssize_t n;
    int kind = PyUnicode_KIND(v);
    if (kind != PyUnicode_1BYTE_KIND) {
        const void *data = PyUnicode_DATA(v);
        Py_ssize_t length = PyUnicode_GET_LENGTH(v);
        for (Py_ssize_t i = 0; i < length; i++) {
            Py_UCS4 c = PyUnicode_READ(kind, data, i);
            if (c >= 0xD800 && c <= 0xDFFF) {
                return 0;
            }
        }
    }
    const char *utf8 = PyUnicode_AsUTF8AndSize(v, &n);
    if (utf8 == NULL) {
        return -1;
    }
    put_head(o, 3, (uint64_t)n);
    put(o, utf8, n);
    return 1;
}

/* _emit._simple_item, but for handles (the general path): bytes shorter than blob_min, an
 * int in CBOR's range, a str, None, a bool. */
static int
put_item(Out *o, PyObject *v, Py_ssize_t blob_min)
{
    PyTypeObject *t = Py_TYPE(v);
    if (t == &PyBytes_Type) {
        Py_ssize_t n = PyBytes_GET_SIZE(v);
        if (n >= blob_min) {
            return 0;
        }
        put_head(o, 2, (uint64_t)n);
        put(o, PyBytes_AS_STRING(v), n);
        return 1;
    }
    if (t == &PyLong_Type) {
        return put_int(o, v);
    }
    if (t == &PyUnicode_Type) {
        return put_text(o, v);
    }
    if (v == Py_None) {
        put_byte(o, 0xF6);
        return 1;
    }
    if (v == Py_True || v == Py_False) {
        put_byte(o, v == Py_True ? 0xF5 : 0xF4);
        return 1;
    }
    return 0;
}

#define TAG_OK 27002 /* _values.TAG_OK */

/* _emit.emit_result (= emit_simple): a flat list of items, an Ok of nothing or of an item,
 * a map of text keys to items (a WIT record: a clock's datetime), or an item. */
static int
put_result(Out *o, PyObject *v, Py_ssize_t blob_min, PyObject *ok_type)
{
    PyTypeObject *t = Py_TYPE(v);
    if ((PyObject *)t == ok_type) {
        PyObject *inner = PyObject_GetAttr(v, str_value);
        if (inner == NULL) {
            return -1;
        }
        put_head(o, 6, TAG_OK);
        int r;
        if (inner == Py_None) {
            put_byte(o, 0xF6);
            r = 1;
        }
        else {
            r = put_item(o, inner, blob_min);
        }
        Py_DECREF(inner);
        return r;
    }
    if (t == &PyList_Type) {
        Py_ssize_t n = PyList_GET_SIZE(v);
        put_head(o, 4, (uint64_t)n);
        for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(v); i++) {
            PyObject *item = PyList_GET_ITEM(v, i);
            Py_INCREF(item);
            int r = put_item(o, item, blob_min);
            Py_DECREF(item);
            if (r <= 0) {
                return r;
            }
        }
        /* No Python code runs above; should the list change anyway, the general path. */
        return PyList_GET_SIZE(v) == n;
    }
    if (t == &PyDict_Type) {
        Py_ssize_t n = PyDict_GET_SIZE(v), pos = 0, seen = 0;
        PyObject *key, *item;
        put_head(o, 5, (uint64_t)n);
        while (PyDict_Next(v, &pos, &key, &item)) {
            if (!PyUnicode_CheckExact(key)) {
                return 0;
            }
            Py_INCREF(key);
            Py_INCREF(item);
            int r = put_text(o, key);
            if (r > 0) {
                r = put_item(o, item, blob_min);
            }
            Py_DECREF(key);
            Py_DECREF(item);
            if (r <= 0) {
                return r;
            }
            seen++;
        }
        return seen == n && PyDict_GET_SIZE(v) == n;
    }
    return put_item(o, v, blob_min);
}

/* ---- Queue ------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *data;        /* a bytes object the frames are written into, or NULL */
    unsigned char *buf;    /* its bytes: the framed records, oldest first */
    Py_ssize_t used;
    Py_ssize_t cap;        /* its size */
    Py_ssize_t next_cap;   /* the size of the next one (the last one's, up to KEEP_BYTES) */
    Py_ssize_t count;      /* how many records `buf` holds */
    double oldest;         /* time.monotonic() when the first of them was queued */
    Py_ssize_t limit;      /* drain() once this many bytes are queued */
    double interval;       /* ... or once the oldest is this many seconds old */
    Py_ssize_t blob_min;   /* byte strings this long are blobs: not taken by taps */
    Py_ssize_t max_payload;
    int closed;            /* the writer is closed or failed: taps go the general way */
    PyObject *drain;
} QueueObject;

static PyTypeObject Queue_Type;

#define KEEP_BYTES (1 << 20) /* a new buffer starts at most this large */

/* Room for n more bytes at the end of the queue: where they go, or NULL with MemoryError
 * set. No Python code runs. */
static unsigned char *
queue_room(QueueObject *q, Py_ssize_t n)
{
    if (n > q->cap - q->used) {
        if (n > PY_SSIZE_T_MAX - q->used) {
            PyErr_NoMemory();
            return NULL;
        }
        Py_ssize_t need = q->used + n;
        Py_ssize_t cap = q->cap ? q->cap : q->next_cap;
        if (cap < 4096) {
            cap = 4096;
        }
        while (cap < need) {
            cap = cap > PY_SSIZE_T_MAX / 2 ? need : cap * 2;
        }
        /* A bytes object, so that take() hands it over without a copy (bytes are not
         * tracked by the garbage collector: allocating one runs no Python code). */
        PyObject *data = PyBytes_FromStringAndSize(NULL, cap);
        if (data == NULL) {
            return NULL;
        }
        unsigned char *buf = (unsigned char *)PyBytes_AS_STRING(data);
        if (q->used) {
            memcpy(buf, q->buf, (size_t)q->used);
        }
        Py_XSETREF(q->data, data);
        q->buf = buf;
        q->cap = cap;
    }
    return q->buf + q->used;
}

/* The frame of `size` bytes written at queue_room's pointer is queued: its length is set,
 * its two CRC-32s are left for take() to fill in (all of a queue's frames in one pass, with
 * the tables warm, instead of one frame at a time between the guest's imports). */
static void
queue_commit(QueueObject *q, Py_ssize_t size, double now)
{
    unsigned char *frame = q->buf + q->used;
    put_be32(frame, (uint32_t)(size - FRAME_HEAD));
    q->used += size;
    if (q->count++ == 0) {
        q->oldest = now;
    }
}

/* Fill in the CRC-32s of every queued frame (before they leave in take()). */
static void
queue_seal(QueueObject *q)
{
    unsigned char *p = q->buf, *end = q->buf + q->used;
    while (end - p >= FRAME_HEAD) {
        size_t n = ((size_t)p[0] << 24) | ((size_t)p[1] << 16) | ((size_t)p[2] << 8) | p[3];
        if (n > (size_t)(end - p - FRAME_HEAD)) {
            break; /* cannot happen: every frame was committed whole */
        }
        frame_head(p, n);
        p += FRAME_HEAD + n;
    }
}

/* After a frame went in: drain() when the queue is full or its oldest frame is old enough. */
static int
queue_check(QueueObject *q, double now)
{
    if (q->used < q->limit && now - q->oldest < q->interval) {
        return 0;
    }
    PyObject *drain = q->drain;
    if (drain == NULL) {
        return 0;
    }
    Py_INCREF(drain);
    PyObject *r = PyObject_CallNoArgs(drain);
    Py_DECREF(drain);
    if (r == NULL) {
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

static int
Queue_init(QueueObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"drain", "limit", "interval", "blob_min", "max_payload", NULL};
    PyObject *drain;
    Py_ssize_t limit, blob_min, max_payload;
    double interval;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Ondnn:Queue", kwlist, &drain, &limit,
                                     &interval, &blob_min, &max_payload)) {
        return -1;
    }
    if (!PyCallable_Check(drain)) {
        PyErr_SetString(PyExc_TypeError, "drain must be callable");
        return -1;
    }
    if (limit < 0 || blob_min < 0 || max_payload < 0 || max_payload > 0xFFFFFFFFLL ||
        max_payload > PY_SSIZE_T_MAX - FRAME_HEAD) {
        PyErr_SetString(PyExc_ValueError, "limit, blob_min and max_payload must be >= 0 "
                                          "(max_payload < 2**32)");
        return -1;
    }
    if (!(interval > 0.0)) {
        PyErr_SetString(PyExc_ValueError, "interval must be > 0");
        return -1;
    }
    Py_INCREF(drain);
    Py_XSETREF(self->drain, drain);
    self->limit = limit;
    self->interval = interval;
    self->blob_min = blob_min;
    self->max_payload = max_payload;
    return 0;
}

static int
Queue_traverse(QueueObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->drain);
    return 0;
}

static int
Queue_clear(QueueObject *self)
{
    Py_CLEAR(self->drain);
    return 0;
}

static void
Queue_dealloc(QueueObject *self)
{
    PyObject_GC_UnTrack(self);
    Queue_clear(self);
    Py_XDECREF(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Queue_push(QueueObject *self, PyObject *payload)
{
    if (!PyBytes_Check(payload)) {
        PyErr_Format(PyExc_TypeError, "payload must be bytes, not %.100s",
                     Py_TYPE(payload)->tp_name);
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(payload);
    if (n > self->max_payload) {
        PyErr_Format(PyExc_ValueError, "a payload of %zd bytes is over the %zd limit", n,
                     self->max_payload);
        return NULL;
    }
    unsigned char *frame = queue_room(self, FRAME_HEAD + n);
    if (frame == NULL) {
        return NULL;
    }
    memcpy(frame + FRAME_HEAD, PyBytes_AS_STRING(payload), (size_t)n);
    double now = monotonic();
    queue_commit(self, FRAME_HEAD + n, now);
    if (queue_check(self, now) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
Queue_take(QueueObject *self, PyObject *Py_UNUSED(ignored))
{
    queue_seal(self);
    PyObject *result = PyTuple_New(2);
    PyObject *count = PyLong_FromSsize_t(self->count);
    PyObject *data = NULL;
    if (result == NULL || count == NULL) {
        goto failed;
    }
    if (self->used == 0) {
        data = PyBytes_FromStringAndSize(NULL, 0);
        if (data == NULL) {
            goto failed;
        }
    }
    else {
        /* The queue's own bytes, cut to what it holds, handed over (it holds the only
         * reference); the next frame starts a new buffer. Should the cut fail (a shrinking
         * realloc), _PyBytes_Resize frees them: those frames are lost with a MemoryError,
         * as they would be by a copy that cannot be made. */
        data = self->data;
        Py_ssize_t used = self->used;
        self->next_cap = self->cap < KEEP_BYTES ? self->cap : KEEP_BYTES;
        self->data = NULL;
        self->buf = NULL;
        self->cap = 0;
        self->used = 0;
        self->count = 0;
        if (_PyBytes_Resize(&data, used) < 0) {
            goto failed;
        }
    }
    PyTuple_SET_ITEM(result, 0, data);
    PyTuple_SET_ITEM(result, 1, count);
    return result;

failed:
    Py_XDECREF(result);
    Py_XDECREF(count);
    return NULL;
}

static PyObject *
Queue_close(QueueObject *self, PyObject *Py_UNUSED(ignored))
{
    self->closed = 1;
    Py_RETURN_NONE;
}

static Py_ssize_t
Queue_len(QueueObject *self)
{
    return self->count;
}

static PyObject *
Queue_get_oldest(QueueObject *self, void *Py_UNUSED(closure))
{
    return PyFloat_FromDouble(self->oldest);
}

static PyObject *
Queue_get_closed(QueueObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->closed);
}

static PyObject *
Queue_get_nbytes(QueueObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->used);
}

static PyMethodDef Queue_methods[] = {
    {"push", (PyCFunction)Queue_push, METH_O,
     "push(payload): frame one record's payload and queue it; drain() when due."},
    {"take", (PyCFunction)Queue_take, METH_NOARGS,
     "take() -> (frames, count): every queued frame, oldest first, and how many; empties "
     "the queue."},
    {"close", (PyCFunction)Queue_close, METH_NOARGS,
     "close(): taps queue nothing more (they go the general way)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Queue_getset[] = {
    {"oldest", (getter)Queue_get_oldest, NULL, "time.monotonic() when the oldest was queued.",
     NULL},
    {"closed", (getter)Queue_get_closed, NULL, "Whether close() was called.", NULL},
    {"nbytes", (getter)Queue_get_nbytes, NULL, "Bytes queued.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Queue_as_sequence = {
    .sq_length = (lenfunc)Queue_len,
};

static PyTypeObject Queue_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mighty.trace._speedups.Queue",
    .tp_doc = "Queue(drain, limit, interval, blob_min, max_payload): a trace writer's queue "
              "of framed import records.",
    .tp_basicsize = sizeof(QueueObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Queue_init,
    .tp_dealloc = (destructor)Queue_dealloc,
    .tp_traverse = (traverseproc)Queue_traverse,
    .tp_clear = (inquiry)Queue_clear,
    .tp_methods = Queue_methods,
    .tp_getset = Queue_getset,
    .tp_as_sequence = &Queue_as_sequence,
};

/* ---- Core -------------------------------------------------------------------------------- */

typedef void *(*get_fuel_fn)(const void *context, uint64_t *fuel);
typedef void (*error_delete_fn)(void *error);

typedef struct {
    PyObject_HEAD
    long long step;
    PyObject *fuel_limit;  /* an int */
    uint64_t limit;        /* fuel_limit, when limit_fits */
    int limit_fits;        /* 0 <= fuel_limit < 2**64 */
    get_fuel_fn get_fuel;
    error_delete_fn error_delete;
} CoreObject;

static PyTypeObject Core_Type;

static int
Core_set_fuel_limit(CoreObject *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "fuel_limit cannot be deleted");
        return -1;
    }
    PyObject *limit = PyNumber_Index(value);
    if (limit == NULL) {
        return -1;
    }
    int fits = 0;
    uint64_t u = 0;
    int negative = PyObject_RichCompareBool(limit, zero, Py_LT);
    int small = negative < 0 ? -1 : PyObject_RichCompareBool(limit, u64_max, Py_LE);
    if (negative < 0 || small < 0) {
        Py_DECREF(limit);
        return -1;
    }
    if (!negative && small) {
        u = (uint64_t)PyLong_AsUnsignedLongLong(limit);
        if (u == (uint64_t)-1 && PyErr_Occurred()) {
            Py_DECREF(limit);
            return -1;
        }
        fits = 1;
    }
    Py_XSETREF(self->fuel_limit, limit);
    self->limit = u;
    self->limit_fits = fits;
    return 0;
}

static int
Core_init(CoreObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"get_fuel", "error_delete", NULL};
    PyObject *get_fuel, *error_delete;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!:Core", kwlist, &PyLong_Type, &get_fuel,
                                     &PyLong_Type, &error_delete)) {
        return -1;
    }
    /* The addresses of wasmtime_context_get_fuel and wasmtime_error_delete, from ctypes
     * (the caller vouches for them, as it would for a ctypes prototype). */
    void *fuel_at = PyLong_AsVoidPtr(get_fuel);
    void *delete_at = PyLong_AsVoidPtr(error_delete);
    if (PyErr_Occurred()) {
        return -1;
    }
    if (fuel_at == NULL || delete_at == NULL) {
        PyErr_SetString(PyExc_ValueError, "a function address must not be 0");
        return -1;
    }
    self->get_fuel = (get_fuel_fn)(uintptr_t)fuel_at;
    self->error_delete = (error_delete_fn)(uintptr_t)delete_at;
    self->step = 0;
    return Core_set_fuel_limit(self, zero, NULL);
}

static void
Core_dealloc(CoreObject *self)
{
    Py_XDECREF(self->fuel_limit);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Core_get_step(CoreObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->step);
}

static int
Core_set_step(CoreObject *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "step cannot be deleted");
        return -1;
    }
    if (!PyLong_Check(value)) {
        PyErr_Format(PyExc_TypeError, "step must be an int, not %.100s", Py_TYPE(value)->tp_name);
        return -1;
    }
    long long step = PyLong_AsLongLong(value);
    if (step == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (step < 0) {
        PyErr_SetString(PyExc_ValueError, "step must be >= 0");
        return -1;
    }
    self->step = step;
    return 0;
}

static PyObject *
Core_get_fuel_limit(CoreObject *self, void *Py_UNUSED(closure))
{
    if (self->fuel_limit == NULL) { /* made by __new__ alone */
        return PyLong_FromLong(0);
    }
    return Py_NewRef(self->fuel_limit);
}

static PyGetSetDef Core_getset[] = {
    {"step", (getter)Core_get_step, (setter)Core_set_step,
     "The instance's last step (the taps bump it).", NULL},
    {"fuel_limit", (getter)Core_get_fuel_limit, (setter)Core_set_fuel_limit,
     "The fuel of the export call in flight (fuel used = fuel_limit - fuel left).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Core_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mighty.trace._speedups.Core",
    .tp_doc = "Core(get_fuel, error_delete): one instance's step, fuel limit and fuel reading.",
    .tp_basicsize = sizeof(CoreObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_getset = Core_getset,
};

/* ---- Tap --------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    CoreObject *core;
    QueueObject *queue;
    PyObject *ok_type;
    PyObject *head;    /* bytes: the record up to its step */
    PyObject *mid;     /* bytes: from the step to the first argument (a method: to its rep) */
    PyObject *res;     /* bytes: between the arguments and the result */
    PyObject *ok;      /* bytes: between the result and the fuel */
    PyObject *tail;    /* bytes: after the fuel */
    PyObject *general; /* general(step, fuel, result, *args) */
    int nparams;       /* arguments after (context_ptr, result) */
    int method;        /* the first of them is the rep of the resource `mid` ends with */
} TapObject;

static PyTypeObject Tap_Type;

/* The general path, with the fuel as an int (from fuel_neg/fuel_arg, the CBOR form, or for
 * a limit outside u64, fuel_limit - left). */
static PyObject *
tap_general(TapObject *self, long long step, int fuel_known, int fuel_neg, uint64_t fuel_arg,
            uint64_t left, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *fuel;
    if (fuel_known) {
        fuel = PyLong_FromUnsignedLongLong(fuel_arg);
        if (fuel != NULL && fuel_neg) {
            Py_SETREF(fuel, PyNumber_Invert(fuel)); /* -1 - fuel_arg */
        }
    }
    else {
        PyObject *used = PyLong_FromUnsignedLongLong(left);
        fuel = used == NULL ? NULL : PyNumber_Subtract(self->core->fuel_limit, used);
        Py_XDECREF(used);
    }
    if (fuel == NULL) {
        return NULL;
    }
    PyObject *step_obj = PyLong_FromLongLong(step);
    if (step_obj == NULL) {
        Py_DECREF(fuel);
        return NULL;
    }
    /* nargs: the result and up to two arguments (Tap_vectorcall checked it) */
    PyObject *call[2 + 1 + 2];
    call[0] = step_obj;
    call[1] = fuel;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        call[2 + i] = args[i];
    }
    PyObject *r = PyObject_Vectorcall(self->general, call, (size_t)(2 + nargs), NULL);
    Py_DECREF(step_obj);
    Py_DECREF(fuel);
    return r;
}

static PyObject *
Tap_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    TapObject *self = (TapObject *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        PyErr_SetString(PyExc_TypeError, "a tap takes no keyword arguments");
        return NULL;
    }
    if (nargs != 2 + self->nparams) {
        PyErr_Format(PyExc_TypeError, "this tap takes %d arguments, got %zd",
                     2 + self->nparams, nargs);
        return NULL;
    }
    CoreObject *core = self->core;
    QueueObject *queue = self->queue;
    if (!PyLong_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "context_ptr must be an int");
        return NULL;
    }
    void *context = PyLong_AsVoidPtr(args[0]);
    if (context == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "context_ptr must not be 0");
        }
        return NULL;
    }
    if (core->step == LLONG_MAX) {
        PyErr_SetString(PyExc_OverflowError, "the step counter is exhausted");
        return NULL;
    }
    long long step = ++core->step;

    /* The fuel used since the export call began: fuel_limit - fuel left, -1 when the reading
     * fails (its error freed), as InstanceRecording._fuel_at. */
    uint64_t left = 0, fuel_arg;
    int fuel_neg, fuel_known = 1;
    void *error = core->get_fuel(context, &left);
    if (error != NULL) {
        core->error_delete(error);
        fuel_neg = 1;
        fuel_arg = 0; /* -1 */
    }
    else if (!core->limit_fits) {
        fuel_known = fuel_neg = 0;
        fuel_arg = 0;
    }
    else if (left <= core->limit) {
        fuel_neg = 0;
        fuel_arg = core->limit - left;
    }
    else {
        fuel_neg = 1;
        fuel_arg = left - core->limit - 1;
    }
    if (!fuel_known || queue->closed) {
        return tap_general(self, step, fuel_known, fuel_neg, fuel_arg, left, args + 1,
                           nargs - 1);
    }

    Out o;
    out_init(&o, FRAME_HEAD + queue->max_payload);
    o.len = FRAME_HEAD;
    put_bytes_object(&o, self->head);
    put_head(&o, 0, (uint64_t)step);
    put_bytes_object(&o, self->mid);
    int r = 1;
    Py_ssize_t i = 2;
    if (self->method) {
        /* The resource's rep: an int in 0..2**64-1 (the gate's are u32), else the general
         * path (which writes what the pure path writes for any other). */
        PyObject *rep = args[2];
        r = 0;
        if (PyLong_CheckExact(rep)) {
            r = PyObject_RichCompareBool(rep, zero, Py_GE);
            if (r > 0) {
                r = put_int(&o, rep);
            }
        }
        i = 3;
    }
    for (; r > 0 && i < nargs; i++) {
        r = put_item(&o, args[i], queue->blob_min);
    }
    if (r > 0) {
        put_bytes_object(&o, self->res);
        r = put_result(&o, args[1], queue->blob_min, self->ok_type);
    }
    if (r > 0) {
        put_bytes_object(&o, self->ok);
        put_head(&o, fuel_neg, fuel_arg);
        put_bytes_object(&o, self->tail);
    }
    if (o.failed) {
        r = -1;
    }
    if (r > 0 && !o.full) {
        unsigned char *frame = queue_room(queue, o.len);
        if (frame != NULL) {
            memcpy(frame, o.p, (size_t)o.len);
        }
        out_free(&o);
        if (frame == NULL) {
            return NULL;
        }
        double now = monotonic();
        queue_commit(queue, o.len, now);
        if (queue_check(queue, now) < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    out_free(&o);
    if (r < 0) {
        return NULL;
    }
    return tap_general(self, step, fuel_known, fuel_neg, fuel_arg, left, args + 1, nargs - 1);
}

static int
Tap_init(TapObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"core", "queue", "ok_type", "head", "mid", "res", "ok",
                             "tail", "nparams", "method", "general", NULL};
    PyObject *core, *queue, *ok_type, *head, *mid, *res, *ok, *tail, *general;
    int nparams, method;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!SSSSSipO:Tap", kwlist, &Core_Type,
                                     &core, &Queue_Type, &queue, &PyType_Type, &ok_type, &head,
                                     &mid, &res, &ok, &tail, &nparams, &method, &general)) {
        return -1;
    }
    if (((CoreObject *)core)->get_fuel == NULL) {
        PyErr_SetString(PyExc_TypeError, "core was never initialised");
        return -1;
    }
    if (nparams < 0 || nparams > 2 || (method && nparams == 0)) {
        PyErr_SetString(PyExc_ValueError, "a tap takes 0-2 arguments (a method 1-2)");
        return -1;
    }
    if (!PyCallable_Check(general)) {
        PyErr_SetString(PyExc_TypeError, "general must be callable");
        return -1;
    }
    Py_XSETREF(self->core, (CoreObject *)Py_NewRef(core));
    Py_XSETREF(self->queue, (QueueObject *)Py_NewRef(queue));
    Py_XSETREF(self->ok_type, Py_NewRef(ok_type));
    Py_XSETREF(self->head, Py_NewRef(head));
    Py_XSETREF(self->mid, Py_NewRef(mid));
    Py_XSETREF(self->res, Py_NewRef(res));
    Py_XSETREF(self->ok, Py_NewRef(ok));
    Py_XSETREF(self->tail, Py_NewRef(tail));
    Py_XSETREF(self->general, Py_NewRef(general));
    self->nparams = nparams;
    self->method = method;
    self->vectorcall = Tap_vectorcall;
    return 0;
}

static int
Tap_traverse(TapObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->core);
    Py_VISIT(self->queue);
    Py_VISIT(self->ok_type);
    Py_VISIT(self->general);
    return 0;
}

static int
Tap_clear(TapObject *self)
{
    self->vectorcall = NULL; /* a call now goes to Tap_call, which refuses it */
    Py_CLEAR(self->core);
    Py_CLEAR(self->queue);
    Py_CLEAR(self->ok_type);
    Py_CLEAR(self->head);
    Py_CLEAR(self->mid);
    Py_CLEAR(self->res);
    Py_CLEAR(self->ok);
    Py_CLEAR(self->tail);
    Py_CLEAR(self->general);
    return 0;
}

static void
Tap_dealloc(TapObject *self)
{
    PyObject_GC_UnTrack(self);
    Tap_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Tap_call(PyObject *self, PyObject *args, PyObject *kwds)
{
    if (((TapObject *)self)->core == NULL) {
        PyErr_SetString(PyExc_TypeError, "this tap was never initialised");
        return NULL;
    }
    return PyVectorcall_Call(self, args, kwds);
}

static PyTypeObject Tap_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mighty.trace._speedups.Tap",
    .tp_doc = "Tap(core, queue, ok_type, head, mid, res, ok, tail, nparams, method, general): "
              "one import's tap, called as tap(context_ptr, result, *args).",
    .tp_basicsize = sizeof(TapObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(TapObject, vectorcall),
    .tp_call = Tap_call,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Tap_init,
    .tp_dealloc = (destructor)Tap_dealloc,
    .tp_traverse = (traverseproc)Tap_traverse,
    .tp_clear = (inquiry)Tap_clear,
};

/* ---- module functions (the tests hold these to zlib and _emit) --------------------------- */

static PyObject *
sp_crc32(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer data;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I:crc32", &data, &value)) {
        return NULL;
    }
    uint32_t crc = crc32_update(value, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

static PyObject *
sp_frame(PyObject *Py_UNUSED(module), PyObject *payload)
{
    if (!PyBytes_Check(payload)) {
        PyErr_SetString(PyExc_TypeError, "payload must be bytes");
        return NULL;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(payload);
    if (n > 0xFFFFFFFFLL || n > PY_SSIZE_T_MAX - FRAME_HEAD) {
        PyErr_SetString(PyExc_ValueError, "a payload must be shorter than 2**32 bytes");
        return NULL;
    }
    PyObject *frame = PyBytes_FromStringAndSize(NULL, FRAME_HEAD + n);
    if (frame == NULL) {
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(frame);
    memcpy(p + FRAME_HEAD, PyBytes_AS_STRING(payload), (size_t)n);
    frame_head(p, (size_t)n);
    return frame;
}

static PyObject *
sp_encode(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *value, *ok_type;
    Py_ssize_t blob_min;
    int result;
    if (!PyArg_ParseTuple(args, "OnpO:encode", &value, &blob_min, &result, &ok_type)) {
        return NULL;
    }
    Out o;
    out_init(&o, PY_SSIZE_T_MAX);
    int r = result ? put_result(&o, value, blob_min, ok_type) : put_item(&o, value, blob_min);
    PyObject *out = NULL;
    if (r > 0 && !o.failed) {
        out = PyBytes_FromStringAndSize((const char *)o.p, o.len);
    }
    else if (r == 0 && !o.failed) {
        out = Py_NewRef(Py_None);
    }
    out_free(&o);
    return out;
}


/* ---- split: an import record's variable fields (host/trace/_template.py's _split) ---------
 *
 * The same function as the Python one, byte for byte: (call_start, call_end, i, s, res, out,
 * fuel) of a payload in the recorder's import layout whose result is simple, or None. The
 * Python _split documents the layout; tests/trace/test_template.py holds the two to the same
 * answer for valid, damaged and random payloads. */

static int
split_uint(const unsigned char *p, Py_ssize_t pos, Py_ssize_t end, int info, uint64_t *value,
           Py_ssize_t *stop)
{
    /* The argument of a head whose info is 24..27 (1, 2, 4, 8 bytes after it): 0 when cut. */
    Py_ssize_t after = pos + 1 + ((Py_ssize_t)1 << (info - 24));
    if (after > end) {
        return 0;
    }
    uint64_t v = 0;
    for (Py_ssize_t k = pos + 1; k < after; k++) {
        v = (v << 8) | p[k];
    }
    *value = v;
    *stop = after;
    return 1;
}

static int
split_small(const unsigned char *p, Py_ssize_t *pos, Py_ssize_t end, uint64_t *value)
{
    /* An unsigned int head at *pos (its first byte below 0x1C is the caller's check). */
    int b = p[*pos];
    if (b < 24) {
        *value = (uint64_t)b;
        *pos += 1;
        return 1;
    }
    if (b < 28) {
        return split_uint(p, *pos, end, b, value, pos);
    }
    return 0;
}

static PyObject *
sp_split(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "split(payload: bytes, ok_type: type)");
        return NULL;
    }
    PyObject *ok_type = args[1];
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t end = PyBytes_GET_SIZE(args[0]);
    static const unsigned char after_head[] = "\x61k\x66import\x61i";
    if (end < 24 || p[0] < 0xA6 || p[0] > 0xB7 || memcmp(p + 1, after_head, 11) != 0) {
        Py_RETURN_NONE;
    }
    Py_ssize_t pos = 12;
    uint64_t i, s;
    if (!split_small(p, &pos, end, &i)) {
        Py_RETURN_NONE;
    }
    if (pos + 2 > end || p[pos] != 0x61 || p[pos + 1] != 's') {
        Py_RETURN_NONE;
    }
    pos += 2;
    if (pos >= end || !split_small(p, &pos, end, &s)) {
        Py_RETURN_NONE;
    }
    Py_ssize_t call_start = pos, call_end = -1;
    for (Py_ssize_t k = pos; k + 4 <= end; k++) { /* payload.find(b"\x63res", pos) */
        if (p[k] == 0x63 && p[k + 1] == 'r' && p[k + 2] == 'e' && p[k + 3] == 's') {
            call_end = k;
            break;
        }
    }
    if (call_end < 0 || call_end + 4 >= end) {
        Py_RETURN_NONE;
    }
    pos = call_end + 4;
    int b = p[pos];
    PyObject *res = NULL;
    if (b < 0x1C || (b >= 0x40 && b < 0x5C)) { /* an unsigned int or a byte string */
        int info = b & 31;
        uint64_t n;
        if (info < 24) {
            n = (uint64_t)info;
            pos += 1;
        }
        else if (!split_uint(p, pos, end, info, &n, &pos)) {
            Py_RETURN_NONE;
        }
        if (b < 0x1C) {
            res = PyLong_FromUnsignedLongLong(n);
        }
        else {
            if (n > (uint64_t)(end - pos)) {
                Py_RETURN_NONE;
            }
            res = PyBytes_FromStringAndSize((const char *)p + pos, (Py_ssize_t)n);
            pos += (Py_ssize_t)n;
        }
    }
    else if (pos + 3 <= end && p[pos] == 0xD9 && p[pos + 1] == 0x69 && p[pos + 2] == 0x7A) {
        pos += 3; /* Ok(...) of null or an unsigned int */
        if (pos >= end) {
            Py_RETURN_NONE;
        }
        b = p[pos];
        PyObject *inner;
        uint64_t n;
        if (b == 0xF6) {
            inner = Py_NewRef(Py_None);
            pos += 1;
        }
        else if (b < 28 && split_small(p, &pos, end, &n)) {
            inner = PyLong_FromUnsignedLongLong(n);
        }
        else {
            Py_RETURN_NONE;
        }
        if (inner == NULL) {
            return NULL;
        }
        res = PyObject_CallOneArg(ok_type, inner);
        Py_DECREF(inner);
    }
    else if (b >= 0xF4 && b <= 0xF6) {
        res = Py_NewRef(b == 0xF4 ? Py_False : b == 0xF5 ? Py_True : Py_None);
        pos += 1;
    }
    else if (b >= 0xA0 && b <= 0xA8) { /* a WIT record of ints: text keys, unsigned ints */
        res = PyDict_New();
        if (res == NULL) {
            return NULL;
        }
        pos += 1;
        for (int k = 0; k < (b & 31); k++) {
            if (pos >= end || p[pos] < 0x60 || p[pos] >= 0x78) {
                goto none;
            }
            Py_ssize_t stop = pos + 1 + (p[pos] & 31);
            if (stop >= end) {
                goto none;
            }
            PyObject *key = PyUnicode_DecodeUTF8((const char *)p + pos + 1, stop - pos - 1,
                                                 "strict");
            if (key == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                    Py_DECREF(res);
                    return NULL;
                }
                PyErr_Clear();
                goto none;
            }
            int has = PyDict_Contains(res, key);
            uint64_t n;
            pos = stop;
            if (has != 0 || p[pos] >= 28 || !split_small(p, &pos, end, &n)) {
                Py_DECREF(key);
                if (has < 0) {
                    Py_DECREF(res);
                    return NULL;
                }
                goto none;
            }
            PyObject *v = PyLong_FromUnsignedLongLong(n);
            int set = v == NULL ? -1 : PyDict_SetItem(res, key, v);
            Py_XDECREF(v);
            Py_DECREF(key);
            if (set < 0) {
                Py_DECREF(res);
                return NULL;
            }
        }
    }
    else {
        Py_RETURN_NONE;
    }
    if (res == NULL) {
        return NULL;
    }
    PyObject *out;
    Py_ssize_t stop;
    static const unsigned char out_ok[] = "\x63out\x62ok";
    if (pos + 7 <= end && memcmp(p + pos, out_ok, 7) == 0) {
        out = Py_NewRef(str_ok);
        stop = pos + 7;
    }
    else {
        if (!(pos + 4 <= end && memcmp(p + pos, out_ok, 4) == 0)) {
            goto none;
        }
        pos += 4;
        if (pos >= end || p[pos] < 0x60 || p[pos] >= 0x78) {
            goto none;
        }
        stop = pos + 1 + (p[pos] & 31);
        if (stop > end) {
            goto none;
        }
        out = PyUnicode_DecodeUTF8((const char *)p + pos + 1, stop - pos - 1, "strict");
        if (out == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                Py_DECREF(res);
                return NULL;
            }
            PyErr_Clear();
            goto none;
        }
    }
    static const unsigned char key_fuel[] = "\x64" "fuel";
    uint64_t fuel;
    if (!(stop + 5 <= end && memcmp(p + stop, key_fuel, 5) == 0)) {
        goto none_out;
    }
    pos = stop + 5;
    if (pos >= end) {
        goto none_out;
    }
    b = p[pos];
    if (b < 24) {
        if (pos + 1 != end) {
            goto none_out;
        }
        fuel = (uint64_t)b;
    }
    else if (b < 28) {
        if (pos + 1 + ((Py_ssize_t)1 << (b - 24)) != end || !split_uint(p, pos, end, b, &fuel, &stop)) {
            goto none_out;
        }
    }
    else {
        goto none_out;
    }
    return Py_BuildValue("(nnKKNNK)", call_start, call_end, (unsigned long long)i,
                         (unsigned long long)s, res, out, (unsigned long long)fuel);
none_out:
    Py_DECREF(out);
none:
    Py_DECREF(res);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"crc32", sp_crc32, METH_VARARGS, "crc32(data, value=0): zlib.crc32's CRC-32."},
    {"frame", sp_frame, METH_O, "frame(payload): the trace frame of one payload."},
    {"encode", sp_encode, METH_VARARGS,
     "encode(value, blob_min, result, ok_type): a tap's CBOR of an argument (result False: "
     "emit_item's) or of a result (emit_result's), or None where the general path takes it."},
    {"split", (PyCFunction)(void (*)(void))sp_split, METH_FASTCALL,
     "split(payload, ok_type): _template._split of an import record, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "mighty.trace._speedups",
    .m_doc = "The recorder's per-import taps, compiled (see host/trace/_speedups.c).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    crc_init();
    if (PyType_Ready(&Queue_Type) < 0 || PyType_Ready(&Core_Type) < 0 ||
        PyType_Ready(&Tap_Type) < 0) {
        return NULL;
    }
    if (u64_max == NULL) {
        u64_max = PyLong_FromUnsignedLongLong(UINT64_MAX);
        zero = PyLong_FromLong(0);
        str_value = PyUnicode_InternFromString("value");
        str_ok = PyUnicode_InternFromString("ok");
        if (u64_max == NULL || zero == NULL || str_value == NULL || str_ok == NULL) {
            return NULL;
        }
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Queue", (PyObject *)&Queue_Type) < 0 ||
        PyModule_AddObjectRef(m, "Core", (PyObject *)&Core_Type) < 0 ||
        PyModule_AddObjectRef(m, "Tap", (PyObject *)&Tap_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
