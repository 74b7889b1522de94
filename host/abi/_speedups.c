/* mighty.abi._speedups: the value codec's common types, compiled.
 *
 * The pure-Python codec (host/abi/_codec.py) stays the reference and the fallback: this module
 * compiles a type tree (a nested tuple that _codec.py builds from a WitType) into a tree of C
 * nodes that lower Python values into wasmtime_component_val_t slots and lift them back, with
 * no ctypes object per value. It covers bool, the integers, floats, char, string, list<u8>,
 * lists, records, tuples, options, results, enums and variants; a type with flags, maps or
 * resources anywhere in it is not compiled (the Python codec serves it).
 *
 * The slot contract is the Python codec's: a slot to lower into is zeroed (bool false, owns
 * nothing); a node writes the payload and then the kind; when it cannot lower a value it frees
 * what it allocated and leaves the slot as it was. "Cannot" is not an error here: lower()
 * returns 0 and the caller runs the Python codec, which either lowers the value (a Mapping
 * that is not a dict, a memoryview, a value this module does not try) or raises the precise
 * ArgumentError with its path. So every message a user sees comes from one place, and the C
 * path can only be faster, never different. Allocation failures are real errors (-1, set).
 *
 * Memory inside a value tree belongs to wasmtime's allocator: every byte vector, list, record
 * and box is made by wasmtime's own C functions, whose addresses init() receives from ctypes
 * (the library wasmtime-py loaded), and freed by wasmtime_component_val_delete.
 *
 * Lifting reads only; the owner frees the tree. wasmtime hands over values of the function's
 * own type, so a kind that does not match the node (which cannot happen unless this module
 * and wasmtime disagree about a layout) raises the error class init() was given.
 *
 * Depth: a type nests at most MAX_DEPTH deep (compile() refuses deeper ones, which then take
 * the Python path); values recurse along the type, so neither direction can run away.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 64

/* ---- wasmtime's C value layout (wasmtime/component/val.h), checked against ctypes ---- */

typedef struct {
    size_t size;
    char *data;
} byte_vec; /* wasm_byte_vec_t, wasm_name_t */

typedef struct val val;
typedef struct entry entry;

typedef struct {
    size_t size;
    val *data;
} val_list; /* vallist, valtuple */

typedef struct {
    size_t size;
    entry *data;
} val_record;

typedef struct {
    byte_vec discriminant;
    val *val;
} val_variant;

typedef struct {
    bool is_ok;
    val *val;
} val_result;

typedef union {
    bool boolean;
    int8_t s8;
    uint8_t u8;
    int16_t s16;
    uint16_t u16;
    int32_t s32;
    uint32_t u32;
    int64_t s64;
    uint64_t u64;
    float f32;
    double f64;
    uint32_t character;
    byte_vec string;
    val_list list;
    val_record record;
    val_list tuple;
    val_variant variant;
    byte_vec enumeration;
    val *option;
    val_result result;
} val_union;

struct val {
    uint8_t kind;
    val_union of;
};

struct entry {
    byte_vec name;
    val val;
};

enum {
    K_BOOL = 0,
    K_S8 = 1,
    K_U8 = 2,
    K_S16 = 3,
    K_U16 = 4,
    K_S32 = 5,
    K_U32 = 6,
    K_S64 = 7,
    K_U64 = 8,
    K_F32 = 9,
    K_F64 = 10,
    K_CHAR = 11,
    K_STRING = 12,
    K_LIST = 13,
    K_RECORD = 14,
    K_TUPLE = 15,
    K_VARIANT = 16,
    K_ENUM = 17,
    K_OPTION = 18,
    K_RESULT = 19,
};

_Static_assert(sizeof(val) == 32, "wasmtime_component_val_t is 32 bytes");
_Static_assert(offsetof(val, of) == 8, "the payload is at offset 8");
_Static_assert(sizeof(entry) == 48, "wasmtime_component_valrecord_entry_t is 48 bytes");

/* wasmtime's functions, by address (init) */
static struct {
    void (*byte_vec_new)(byte_vec *, size_t, const char *);
    void (*vallist_new_uninit)(val_list *, size_t);
    void (*valrecord_new_uninit)(val_record *, size_t);
    void (*valtuple_new_uninit)(val_list *, size_t);
    val *(*val_new)(val *);
    void (*val_free)(val *);
    void (*val_delete)(val *);
    void *(*func_call)(const void *, void *, const val *, size_t, val *, size_t);
    void *(*set_fuel)(void *, uint64_t);
    void *(*get_fuel)(const void *, uint64_t *);
    void (*set_epoch_deadline)(void *, uint64_t);
    void (*error_delete)(void *);
    int ready;
} fn;

static PyObject *Some_type, *Ok_type, *Err_type, *Variant_type; /* mighty.abi's value classes */
static PyObject *str_value, *str_case;
static PyObject *Mismatch; /* raised for a lifted value whose kind is not its node's (init) */

/* ---- nodes ---------------------------------------------------------------------------- */

enum {
    OP_BOOL,
    OP_SINT,
    OP_UINT,
    OP_F32,
    OP_F64,
    OP_CHAR,
    OP_STRING,
    OP_BYTES,
    OP_LIST,
    OP_RECORD,
    OP_TUPLE,
    OP_OPTION,
    OP_RESULT,
    OP_ENUM,
    OP_VARIANT,
};

typedef struct Node Node;
struct Node {
    int op;
    uint8_t kind;      /* the value kind written and expected */
    int width;         /* integers: bytes */
    int nested;        /* option: its payload is itself an option */
    long long lo;      /* signed integers */
    unsigned long long hi;
    Py_ssize_t n;      /* children (record fields, tuple elements, cases) */
    Node **kids;       /* n (list/option: 1; result: 2, ok then err), NULL where no payload */
    PyObject **names;  /* n interned str: record fields, enum names, variant cases */
    PyObject *index;   /* enum/variant: dict name -> int */
};

static void
node_free(Node *n)
{
    if (n == NULL) {
        return;
    }
    if (n->kids != NULL) {
        Py_ssize_t kids = n->op == OP_RESULT ? 2 : (n->op == OP_LIST || n->op == OP_OPTION) ? 1 : n->n;
        for (Py_ssize_t i = 0; i < kids; i++) {
            node_free(n->kids[i]);
        }
        PyMem_Free(n->kids);
    }
    if (n->names != NULL) {
        for (Py_ssize_t i = 0; i < n->n; i++) {
            Py_XDECREF(n->names[i]);
        }
        PyMem_Free(n->names);
    }
    Py_XDECREF(n->index);
    PyMem_Free(n);
}

static Node *node_build(PyObject *spec, int depth);

/* The child at spec[at], or NULL for None when `optional`. *ok says whether it worked. */
static Node *
child(PyObject *spec, Py_ssize_t at, int depth, int optional, int *ok)
{
    PyObject *s = PyTuple_GET_ITEM(spec, at);
    if (optional && s == Py_None) {
        *ok = 1;
        return NULL;
    }
    Node *c = node_build(s, depth + 1);
    *ok = c != NULL;
    return c;
}

static int
take_names(Node *n, PyObject *names, int with_index)
{
    if (!PyTuple_Check(names)) {
        PyErr_SetString(PyExc_TypeError, "names must be a tuple of str");
        return -1;
    }
    n->n = PyTuple_GET_SIZE(names);
    n->names = PyMem_Calloc(n->n ? (size_t)n->n : 1, sizeof(PyObject *));
    if (n->names == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (with_index && (n->index = PyDict_New()) == NULL) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < n->n; i++) {
        PyObject *s = PyTuple_GET_ITEM(names, i);
        if (!PyUnicode_CheckExact(s)) {
            PyErr_SetString(PyExc_TypeError, "names must be a tuple of str");
            return -1;
        }
        Py_INCREF(s);
        PyUnicode_InternInPlace(&s);
        n->names[i] = s;
        if (with_index) {
            PyObject *ix = PyLong_FromSsize_t(i);
            if (ix == NULL || PyDict_SetItem(n->index, s, ix) < 0) {
                Py_XDECREF(ix);
                return -1;
            }
            Py_DECREF(ix);
        }
    }
    return 0;
}

static const struct {
    const char *name;
    int op, kind, width;
} PRIMS[] = {
    {"bool", OP_BOOL, K_BOOL, 1}, {"s8", OP_SINT, K_S8, 1},    {"u8", OP_UINT, K_U8, 1},
    {"s16", OP_SINT, K_S16, 2},   {"u16", OP_UINT, K_U16, 2},  {"s32", OP_SINT, K_S32, 4},
    {"u32", OP_UINT, K_U32, 4},   {"s64", OP_SINT, K_S64, 8},  {"u64", OP_UINT, K_U64, 8},
    {"f32", OP_F32, K_F32, 4},    {"f64", OP_F64, K_F64, 8},   {"char", OP_CHAR, K_CHAR, 4},
    {"string", OP_STRING, K_STRING, 0}, {"bytes", OP_BYTES, K_LIST, 0},
};

static Node *
node_build(PyObject *spec, int depth)
{
    if (depth > MAX_DEPTH) {
        PyErr_SetString(PyExc_ValueError, "type nests too deeply for the compiled codec");
        return NULL;
    }
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 1 ||
        !PyUnicode_Check(PyTuple_GET_ITEM(spec, 0))) {
        PyErr_SetString(PyExc_TypeError, "a type spec is a tuple (name, ...)");
        return NULL;
    }
    const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 0));
    if (name == NULL) {
        return NULL;
    }
    Py_ssize_t size = PyTuple_GET_SIZE(spec);
    Node *n = PyMem_Calloc(1, sizeof(Node));
    if (n == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (size_t i = 0; i < sizeof(PRIMS) / sizeof(PRIMS[0]); i++) {
        if (strcmp(name, PRIMS[i].name) == 0) {
            if (size != 1) {
                goto bad;
            }
            n->op = PRIMS[i].op;
            n->kind = (uint8_t)PRIMS[i].kind;
            n->width = PRIMS[i].width;
            if (n->op == OP_SINT) {
                n->lo = -(1LL << (8 * n->width - 1));
                n->hi = (unsigned long long)((1ULL << (8 * n->width - 1)) - 1);
            }
            else if (n->op == OP_UINT) {
                n->hi = n->width == 8 ? UINT64_MAX : (1ULL << (8 * n->width)) - 1;
            }
            return n;
        }
    }
    int ok = 1;
    if (strcmp(name, "list") == 0 || strcmp(name, "option") == 0) {
        if (size != 2) {
            goto bad;
        }
        n->op = name[0] == 'l' ? OP_LIST : OP_OPTION;
        n->kind = n->op == OP_LIST ? K_LIST : K_OPTION;
        n->kids = PyMem_Calloc(1, sizeof(Node *));
        if (n->kids == NULL) {
            goto nomem;
        }
        n->kids[0] = child(spec, 1, depth, 0, &ok);
        if (!ok) {
            goto fail;
        }
        n->nested = n->op == OP_OPTION && n->kids[0]->op == OP_OPTION;
        return n;
    }
    if (strcmp(name, "result") == 0) {
        if (size != 3) {
            goto bad;
        }
        n->op = OP_RESULT;
        n->kind = K_RESULT;
        n->kids = PyMem_Calloc(2, sizeof(Node *));
        if (n->kids == NULL) {
            goto nomem;
        }
        n->kids[0] = child(spec, 1, depth, 1, &ok);
        if (ok) {
            n->kids[1] = child(spec, 2, depth, 1, &ok);
        }
        if (!ok) {
            goto fail;
        }
        return n;
    }
    if (strcmp(name, "record") == 0 || strcmp(name, "variant") == 0 ||
        strcmp(name, "tuple") == 0) {
        int is_tuple = name[0] == 't';
        if (size != (is_tuple ? 2 : 3)) {
            goto bad;
        }
        PyObject *kids = PyTuple_GET_ITEM(spec, is_tuple ? 1 : 2);
        if (!PyTuple_Check(kids)) {
            goto bad;
        }
        n->op = name[0] == 'r' ? OP_RECORD : is_tuple ? OP_TUPLE : OP_VARIANT;
        n->kind = n->op == OP_RECORD ? K_RECORD : is_tuple ? K_TUPLE : K_VARIANT;
        if (is_tuple) {
            n->n = PyTuple_GET_SIZE(kids);
        }
        else if (take_names(n, PyTuple_GET_ITEM(spec, 1), n->op == OP_VARIANT) < 0) {
            goto fail;
        }
        if (PyTuple_GET_SIZE(kids) != n->n) {
            goto bad;
        }
        n->kids = PyMem_Calloc(n->n ? (size_t)n->n : 1, sizeof(Node *));
        if (n->kids == NULL) {
            goto nomem;
        }
        for (Py_ssize_t i = 0; i < n->n && ok; i++) {
            n->kids[i] = child(kids, i, depth, n->op == OP_VARIANT, &ok);
        }
        if (!ok) {
            goto fail;
        }
        return n;
    }
    if (strcmp(name, "enum") == 0) {
        if (size != 2) {
            goto bad;
        }
        n->op = OP_ENUM;
        n->kind = K_ENUM;
        if (take_names(n, PyTuple_GET_ITEM(spec, 1), 1) < 0) {
            goto fail;
        }
        return n;
    }
    PyErr_Format(PyExc_ValueError, "no compiled codec for %s", name);
    goto fail;
bad:
    PyErr_Format(PyExc_TypeError, "malformed %s spec", name);
    goto fail;
nomem:
    PyErr_NoMemory();
fail:
    node_free(n);
    return NULL;
}

/* ---- lowering: 1 done, 0 the Python codec takes it (slot untouched), -1 error set ---- */

static int lower(const Node *n, PyObject *v, val *dst);

static void
zero_slot(val *v)
{
    memset(v, 0, sizeof(val));
}

/* Free a half-built container: its unfilled entries are zero (bool) values. */
static void
drop_container(val *dst, uint8_t kind)
{
    dst->kind = kind;
    fn.val_delete(dst);
    zero_slot(dst);
}

static int
set_name(byte_vec *out, PyObject *s)
{
    Py_ssize_t len;
    const char *utf8 = PyUnicode_AsUTF8AndSize(s, &len);
    if (utf8 == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
            PyErr_Clear();
            return 0; /* a lone surrogate: the Python codec says so */
        }
        return -1;
    }
    fn.byte_vec_new(out, (size_t)len, utf8);
    return 1;
}

static val *
boxed(const Node *n, PyObject *v, int *rc)
{
    val zero;
    zero_slot(&zero);
    val *box = fn.val_new(&zero);
    if (box == NULL) {
        PyErr_NoMemory();
        *rc = -1;
        return NULL;
    }
    *rc = lower(n, v, box);
    if (*rc != 1) {
        fn.val_free(box);
        return NULL;
    }
    return box;
}

/* v.value of one of our frozen dataclasses (a new reference), or NULL with an error set. */
static PyObject *
payload_of(PyObject *v)
{
    return PyObject_GetAttr(v, str_value);
}

static int
lower_int(const Node *n, PyObject *v, val *dst)
{
    if (!PyLong_Check(v) || PyBool_Check(v)) {
        return 0;
    }
    if (n->op == OP_SINT) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (x == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (overflow || x < n->lo || x > (long long)n->hi) {
            return 0;
        }
        switch (n->width) {
        case 1: dst->of.s8 = (int8_t)x; break;
        case 2: dst->of.s16 = (int16_t)x; break;
        case 4: dst->of.s32 = (int32_t)x; break;
        default: dst->of.s64 = (int64_t)x; break;
        }
    }
    else {
        unsigned long long x = PyLong_AsUnsignedLongLong(v);
        if (x == (unsigned long long)-1 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
                PyErr_Clear();
                return 0;
            }
            return -1;
        }
        if (x > n->hi) {
            return 0;
        }
        switch (n->width) {
        case 1: dst->of.u8 = (uint8_t)x; break;
        case 2: dst->of.u16 = (uint16_t)x; break;
        case 4: dst->of.u32 = (uint32_t)x; break;
        default: dst->of.u64 = (uint64_t)x; break;
        }
    }
    dst->kind = n->kind;
    return 1;
}

static int
lower_float(const Node *n, PyObject *v, val *dst)
{
    double x;
    if (PyFloat_Check(v)) {
        x = PyFloat_AS_DOUBLE(v);
    }
    else if (PyLong_Check(v) && !PyBool_Check(v)) {
        x = PyLong_AsDouble(v);
        if (x == -1.0 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
                PyErr_Clear();
                return 0;
            }
            return -1;
        }
    }
    else {
        return 0;
    }
    if (n->op == OP_F32) {
        float y = (float)x;
        if (isinf(y) && !isinf(x)) { /* as struct.pack("<f"): out of f32's range */
            return 0;
        }
        dst->of.f32 = y;
    }
    else {
        dst->of.f64 = x;
    }
    dst->kind = n->kind;
    return 1;
}

static int
lower_bytes(PyObject *v, val *dst)
{
    const unsigned char *data = NULL;
    Py_ssize_t len;
    int seq = 0;
    if (PyBytes_Check(v)) {
        data = (const unsigned char *)PyBytes_AS_STRING(v);
        len = PyBytes_GET_SIZE(v);
    }
    else if (PyByteArray_Check(v)) {
        data = (const unsigned char *)PyByteArray_AS_STRING(v);
        len = PyByteArray_GET_SIZE(v);
    }
    else if (PyList_Check(v) || PyTuple_Check(v)) {
        seq = 1;
        len = PySequence_Fast_GET_SIZE(v);
        PyObject **items = PySequence_Fast_ITEMS(v);
        for (Py_ssize_t i = 0; i < len; i++) { /* check first: nothing to free on a miss */
            PyObject *e = items[i];
            if (!PyLong_Check(e) || PyBool_Check(e)) {
                return 0;
            }
            int overflow;
            long x = PyLong_AsLongAndOverflow(e, &overflow);
            if (x == -1 && PyErr_Occurred()) {
                return -1;
            }
            if (overflow || x < 0 || x > 255) {
                return 0;
            }
        }
    }
    else {
        return 0; /* a memoryview and the like: the Python codec */
    }
    val_list lst;
    fn.vallist_new_uninit(&lst, (size_t)len);
    if (len) {
        memset(lst.data, 0, (size_t)len * sizeof(val));
        if (seq) {
            PyObject **items = PySequence_Fast_ITEMS(v);
            for (Py_ssize_t i = 0; i < len; i++) {
                lst.data[i].kind = K_U8;
                lst.data[i].of.u8 = (uint8_t)PyLong_AsLong(items[i]);
            }
        }
        else {
            for (Py_ssize_t i = 0; i < len; i++) {
                lst.data[i].kind = K_U8;
                lst.data[i].of.u8 = data[i];
            }
        }
    }
    dst->of.list = lst;
    dst->kind = K_LIST;
    return 1;
}

static int
lower_seq(const Node *n, PyObject *v, val *dst)
{
    /* list<T> (any length) and tuples (exactly n) from a list or a tuple */
    if (!PyList_Check(v) && !PyTuple_Check(v)) {
        return 0;
    }
    Py_ssize_t len = PySequence_Fast_GET_SIZE(v);
    int is_list = n->op == OP_LIST;
    if (!is_list && len != n->n) {
        return 0;
    }
    val_list lst;
    if (is_list) {
        fn.vallist_new_uninit(&lst, (size_t)len);
    }
    else {
        fn.valtuple_new_uninit(&lst, (size_t)len);
    }
    if (len) {
        memset(lst.data, 0, (size_t)len * sizeof(val));
    }
    dst->of.list = lst;
    for (Py_ssize_t i = 0; i < len; i++) {
        /* Borrowed items: a list could change under a __index__ or __float__ of an int or
         * float subclass, so hold the item, and re-read the length each time. */
        if (i >= PySequence_Fast_GET_SIZE(v)) {
            drop_container(dst, n->kind);
            return 0;
        }
        PyObject *e = PySequence_Fast_GET_ITEM(v, i);
        Py_INCREF(e);
        int rc = lower(is_list ? n->kids[0] : n->kids[i], e, &lst.data[i]);
        Py_DECREF(e);
        if (rc != 1) {
            drop_container(dst, n->kind);
            return rc;
        }
    }
    if (PySequence_Fast_GET_SIZE(v) != len) { /* changed while lowering: let Python judge */
        drop_container(dst, n->kind);
        return 0;
    }
    dst->kind = n->kind;
    return 1;
}

static int
lower_record(const Node *n, PyObject *v, val *dst)
{
    if (!PyDict_CheckExact(v) || PyDict_GET_SIZE(v) != n->n) {
        return 0; /* other Mappings, missing or unknown fields: the Python codec */
    }
    PyObject **fields = PyMem_Malloc(n->n ? (size_t)n->n * sizeof(PyObject *) : 1);
    if (fields == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n->n; i++) {
        PyObject *f = PyDict_GetItemWithError(v, n->names[i]);
        if (f == NULL) {
            PyMem_Free(fields);
            return PyErr_Occurred() ? -1 : 0;
        }
        fields[i] = f;
    }
    for (Py_ssize_t i = 0; i < n->n; i++) {
        Py_INCREF(fields[i]); /* the dict could change while a field is lowered */
    }
    val_record rec;
    fn.valrecord_new_uninit(&rec, (size_t)n->n);
    int rc = 1;
    if (n->n) {
        memset(rec.data, 0, (size_t)n->n * sizeof(entry));
        /* Names first: every entry is then a valid (name, bool) pair whatever fails below. */
        for (Py_ssize_t i = 0; i < n->n; i++) {
            Py_ssize_t len;
            const char *utf8 = PyUnicode_AsUTF8AndSize(n->names[i], &len);
            if (utf8 == NULL) {
                rc = -1;
                break;
            }
            fn.byte_vec_new(&rec.data[i].name, (size_t)len, utf8);
        }
    }
    dst->of.record = rec;
    for (Py_ssize_t i = 0; i < n->n && rc == 1; i++) {
        rc = lower(n->kids[i], fields[i], &rec.data[i].val);
    }
    for (Py_ssize_t i = 0; i < n->n; i++) {
        Py_DECREF(fields[i]);
    }
    PyMem_Free(fields);
    if (rc != 1) {
        drop_container(dst, K_RECORD);
        return rc;
    }
    dst->kind = K_RECORD;
    return 1;
}

static int
lower(const Node *n, PyObject *v, val *dst)
{
    switch (n->op) {
    case OP_BOOL:
        if (v != Py_True && v != Py_False) {
            return 0;
        }
        dst->of.boolean = v == Py_True;
        dst->kind = K_BOOL;
        return 1;
    case OP_SINT:
    case OP_UINT:
        return lower_int(n, v, dst);
    case OP_F32:
    case OP_F64:
        return lower_float(n, v, dst);
    case OP_CHAR: {
        if (!PyUnicode_Check(v) || PyUnicode_GET_LENGTH(v) != 1) {
            return 0;
        }
        Py_UCS4 c = PyUnicode_READ_CHAR(v, 0);
        if (c >= 0xD800 && c <= 0xDFFF) {
            return 0;
        }
        dst->of.character = (uint32_t)c;
        dst->kind = K_CHAR;
        return 1;
    }
    case OP_STRING: {
        if (!PyUnicode_Check(v)) {
            return 0;
        }
        int rc = set_name(&dst->of.string, v);
        if (rc == 1) {
            dst->kind = K_STRING;
        }
        return rc;
    }
    case OP_BYTES:
        return lower_bytes(v, dst);
    case OP_LIST:
    case OP_TUPLE:
        return lower_seq(n, v, dst);
    case OP_RECORD:
        return lower_record(n, v, dst);
    case OP_OPTION: {
        val *box = NULL;
        if (v != Py_None) {
            PyObject *inner;
            if (PyObject_TypeCheck(v, (PyTypeObject *)Some_type)) {
                inner = payload_of(v);
                if (inner == NULL) {
                    return -1;
                }
            }
            else if (n->nested) {
                return 0; /* must be written Some(...): the Python codec says so */
            }
            else {
                inner = Py_NewRef(v);
            }
            int rc;
            box = boxed(n->kids[0], inner, &rc);
            Py_DECREF(inner);
            if (rc != 1) {
                return rc;
            }
        }
        dst->of.option = box;
        dst->kind = K_OPTION;
        return 1;
    }
    case OP_RESULT: {
        int is_ok;
        if (PyObject_TypeCheck(v, (PyTypeObject *)Ok_type)) {
            is_ok = 1;
        }
        else if (PyObject_TypeCheck(v, (PyTypeObject *)Err_type)) {
            is_ok = 0;
        }
        else {
            return 0;
        }
        const Node *kid = n->kids[is_ok ? 0 : 1];
        PyObject *inner = payload_of(v);
        if (inner == NULL) {
            return -1;
        }
        val *box = NULL;
        int rc = 1;
        if (kid == NULL) {
            rc = inner == Py_None;
        }
        else {
            box = boxed(kid, inner, &rc);
        }
        Py_DECREF(inner);
        if (rc != 1) {
            return rc;
        }
        dst->of.result.is_ok = is_ok;
        dst->of.result.val = box;
        dst->kind = K_RESULT;
        return 1;
    }
    case OP_ENUM: {
        if (!PyUnicode_Check(v)) {
            return 0;
        }
        PyObject *ix = PyDict_GetItemWithError(n->index, v);
        if (ix == NULL) {
            return PyErr_Occurred() ? -1 : 0;
        }
        int rc = set_name(&dst->of.enumeration, n->names[PyLong_AsSsize_t(ix)]);
        if (rc == 1) {
            dst->kind = K_ENUM;
        }
        return rc;
    }
    case OP_VARIANT: {
        if (!PyObject_TypeCheck(v, (PyTypeObject *)Variant_type)) {
            return 0;
        }
        PyObject *c = PyObject_GetAttr(v, str_case);
        if (c == NULL) {
            return -1;
        }
        PyObject *ix = PyUnicode_Check(c) ? PyDict_GetItemWithError(n->index, c) : NULL;
        Py_DECREF(c);
        if (ix == NULL) {
            return PyErr_Occurred() ? -1 : 0;
        }
        Py_ssize_t i = PyLong_AsSsize_t(ix);
        PyObject *inner = payload_of(v);
        if (inner == NULL) {
            return -1;
        }
        val *box = NULL;
        int rc = 1;
        if (n->kids[i] == NULL) {
            rc = inner == Py_None;
        }
        else {
            box = boxed(n->kids[i], inner, &rc);
        }
        Py_DECREF(inner);
        if (rc != 1) {
            return rc;
        }
        rc = set_name(&dst->of.variant.discriminant, n->names[i]);
        if (rc != 1) {
            if (box != NULL) {
                fn.val_free(box);
            }
            return rc;
        }
        dst->of.variant.val = box;
        dst->kind = K_VARIANT;
        return 1;
    }
    }
    return 0;
}

/* ---- lifting -------------------------------------------------------------------------- */

static PyObject *
mismatch(const Node *n, const val *src)
{
    PyErr_Format(Mismatch, "a value of kind %d where kind %d was expected", (int)src->kind,
                 (int)n->kind);
    return NULL;
}

static PyObject *lift(const Node *n, const val *src);

static PyObject *
wrap(PyObject *type, PyObject *inner)
{
    if (inner == NULL) {
        return NULL;
    }
    PyObject *out = PyObject_CallOneArg(type, inner);
    Py_DECREF(inner);
    return out;
}

/* The index of a name among the node's names (enum and variant), or -1. */
static Py_ssize_t
find_name(const Node *n, const byte_vec *b)
{
    for (Py_ssize_t i = 0; i < n->n; i++) {
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(n->names[i], &len);
        if (s != NULL && (size_t)len == b->size && (len == 0 || memcmp(s, b->data, b->size) == 0)) {
            return i;
        }
    }
    return -1;
}

static PyObject *
lift(const Node *n, const val *src)
{
    if (src->kind != n->kind) {
        return mismatch(n, src);
    }
    switch (n->op) {
    case OP_BOOL:
        return PyBool_FromLong(src->of.boolean);
    case OP_SINT:
        switch (n->width) {
        case 1: return PyLong_FromLong(src->of.s8);
        case 2: return PyLong_FromLong(src->of.s16);
        case 4: return PyLong_FromLong(src->of.s32);
        default: return PyLong_FromLongLong(src->of.s64);
        }
    case OP_UINT:
        switch (n->width) {
        case 1: return PyLong_FromLong(src->of.u8);
        case 2: return PyLong_FromLong(src->of.u16);
        case 4: return PyLong_FromUnsignedLong(src->of.u32);
        default: return PyLong_FromUnsignedLongLong(src->of.u64);
        }
    case OP_F32:
        return PyFloat_FromDouble((double)src->of.f32);
    case OP_F64:
        return PyFloat_FromDouble(src->of.f64);
    case OP_CHAR:
        if (src->of.character > 0x10FFFF) {
            return mismatch(n, src);
        }
        return PyUnicode_FromOrdinal((int)src->of.character);
    case OP_STRING:
        return PyUnicode_DecodeUTF8(src->of.string.size ? src->of.string.data : "",
                                    (Py_ssize_t)src->of.string.size, "strict");
    case OP_BYTES: {
        size_t len = src->of.list.size;
        PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
        if (out == NULL) {
            return NULL;
        }
        char *p = PyBytes_AS_STRING(out);
        const val *data = src->of.list.data;
        for (size_t i = 0; i < len; i++) {
            p[i] = (char)data[i].of.u8;
        }
        return out;
    }
    case OP_LIST:
    case OP_TUPLE: {
        size_t len = src->of.list.size;
        if (n->op == OP_TUPLE && len != (size_t)n->n) {
            return mismatch(n, src);
        }
        PyObject *out = n->op == OP_LIST ? PyList_New((Py_ssize_t)len) : PyTuple_New((Py_ssize_t)len);
        if (out == NULL) {
            return NULL;
        }
        for (size_t i = 0; i < len; i++) {
            PyObject *e = lift(n->op == OP_LIST ? n->kids[0] : n->kids[i], &src->of.list.data[i]);
            if (e == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            if (n->op == OP_LIST) {
                PyList_SET_ITEM(out, (Py_ssize_t)i, e);
            }
            else {
                PyTuple_SET_ITEM(out, (Py_ssize_t)i, e);
            }
        }
        return out;
    }
    case OP_RECORD: {
        if (src->of.record.size != (size_t)n->n) {
            return mismatch(n, src);
        }
        PyObject *out = _PyDict_NewPresized(n->n);
        if (out == NULL) {
            return NULL;
        }
        for (Py_ssize_t i = 0; i < n->n; i++) {
            PyObject *e = lift(n->kids[i], &src->of.record.data[i].val);
            if (e == NULL || PyDict_SetItem(out, n->names[i], e) < 0) {
                Py_XDECREF(e);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(e);
        }
        return out;
    }
    case OP_OPTION: {
        const val *box = src->of.option;
        if (box == NULL) {
            Py_RETURN_NONE;
        }
        PyObject *inner = lift(n->kids[0], box);
        return n->nested ? wrap(Some_type, inner) : inner;
    }
    case OP_RESULT: {
        int is_ok = src->of.result.is_ok;
        const Node *kid = n->kids[is_ok ? 0 : 1];
        PyObject *inner;
        if (kid == NULL) {
            inner = Py_NewRef(Py_None);
        }
        else if (src->of.result.val == NULL) {
            return mismatch(n, src);
        }
        else {
            inner = lift(kid, src->of.result.val);
        }
        return wrap(is_ok ? Ok_type : Err_type, inner);
    }
    case OP_ENUM: {
        Py_ssize_t i = find_name(n, &src->of.enumeration);
        if (i < 0) {
            return mismatch(n, src);
        }
        return Py_NewRef(n->names[i]);
    }
    case OP_VARIANT: {
        Py_ssize_t i = find_name(n, &src->of.variant.discriminant);
        if (i < 0) {
            return mismatch(n, src);
        }
        const Node *kid = n->kids[i];
        if (kid == NULL) {
            return PyObject_CallOneArg(Variant_type, n->names[i]);
        }
        if (src->of.variant.val == NULL) {
            return mismatch(n, src);
        }
        PyObject *inner = lift(kid, src->of.variant.val);
        if (inner == NULL) {
            return NULL;
        }
        PyObject *out = PyObject_CallFunctionObjArgs(Variant_type, n->names[i], inner, NULL);
        Py_DECREF(inner);
        return out;
    }
    }
    return mismatch(n, src);
}

/* ---- Codec: one type ------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    Node *node;
} CodecObject;

static int
ready(void)
{
    if (!fn.ready || Mismatch == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "mighty.abi._speedups.init() was not called");
        return 0;
    }
    return 1;
}

static PyObject *
Codec_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"spec", NULL};
    PyObject *spec;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:Codec", kwlist, &spec) || !ready()) {
        return NULL;
    }
    Node *node = node_build(spec, 0);
    if (node == NULL) {
        return NULL;
    }
    CodecObject *self = (CodecObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        node_free(node);
        return NULL;
    }
    self->node = node;
    return (PyObject *)self;
}

static void
Codec_dealloc(CodecObject *self)
{
    node_free(self->node);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static val *
address_of(PyObject *address)
{
    void *p = PyLong_AsVoidPtr(address);
    if (p == NULL && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "a value address must not be 0");
    }
    return (val *)p;
}

static PyObject *
Codec_lower(CodecObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "lower(value, address) takes 2 arguments");
        return NULL;
    }
    val *dst = address_of(args[1]);
    if (dst == NULL) {
        return NULL;
    }
    int rc = lower(self->node, args[0], dst);
    if (rc < 0) {
        return NULL;
    }
    return PyBool_FromLong(rc);
}

static PyObject *
Codec_lift(CodecObject *self, PyObject *address)
{
    val *src = address_of(address);
    if (src == NULL) {
        return NULL;
    }
    return lift(self->node, src);
}

static PyMethodDef Codec_methods[] = {
    {"lower", (PyCFunction)(void (*)(void))Codec_lower, METH_FASTCALL,
     "lower(value, address): write value into the zeroed slot at address; False (slot "
     "untouched) when the Python codec must take it."},
    {"lift", (PyCFunction)Codec_lift, METH_O,
     "lift(address): the Python value of the slot at address (Mismatch: a kind not the type's)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Codec_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mighty.abi._speedups.Codec",
    .tp_basicsize = sizeof(CodecObject),
    .tp_dealloc = (destructor)Codec_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Codec(spec): one WIT type's compiled codec.",
    .tp_methods = Codec_methods,
    .tp_new = Codec_new,
};

/* ---- Params: an export call's lowered arguments ----------------------------------------- */

typedef struct {
    PyObject_HEAD
    Py_ssize_t size;
    val *vals; /* NULL once freed */
} ParamsObject;

static void
params_release(ParamsObject *self)
{
    if (self->vals != NULL) {
        for (Py_ssize_t i = 0; i < self->size; i++) {
            fn.val_delete(&self->vals[i]);
        }
        PyMem_Free(self->vals);
        self->vals = NULL;
    }
}

static void
Params_dealloc(ParamsObject *self)
{
    params_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Params_free(ParamsObject *self, PyObject *Py_UNUSED(ignored))
{
    params_release(self);
    Py_RETURN_NONE;
}

static PyObject *
Params_get_size(ParamsObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->size);
}

static PyMethodDef Params_methods[] = {
    {"free", (PyCFunction)Params_free, METH_NOARGS, "Free the values (once; then a no-op)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Params_getset[] = {
    {"size", (getter)Params_get_size, NULL, "How many arguments.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Params_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mighty.abi._speedups.Params",
    .tp_basicsize = sizeof(ParamsObject),
    .tp_dealloc = (destructor)Params_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An export call's lowered arguments (Func.lower); free() frees them.",
    .tp_methods = Params_methods,
    .tp_getset = Params_getset,
};

/* ---- Func: one function signature --------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    Py_ssize_t nparams;
    PyObject *params; /* tuple of Codec */
    PyObject *result; /* Codec or None */
} FuncObject;

static PyObject *
Func_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"params", "result", NULL};
    PyObject *params, *result;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O:Func", kwlist, &PyTuple_Type, &params,
                                     &result)) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(params); i++) {
        if (!Py_IS_TYPE(PyTuple_GET_ITEM(params, i), &Codec_Type)) {
            PyErr_SetString(PyExc_TypeError, "params must be a tuple of Codec");
            return NULL;
        }
    }
    if (result != Py_None && !Py_IS_TYPE(result, &Codec_Type)) {
        PyErr_SetString(PyExc_TypeError, "result must be a Codec or None");
        return NULL;
    }
    FuncObject *self = (FuncObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->nparams = PyTuple_GET_SIZE(params);
    self->params = Py_NewRef(params);
    self->result = Py_NewRef(result);
    return (PyObject *)self;
}

static void
Func_dealloc(FuncObject *self)
{
    Py_XDECREF(self->params);
    Py_XDECREF(self->result);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Func_lower(FuncObject *self, PyObject *args)
{
    /* The arguments (a tuple), lowered: a Params, or None when the Python codec must take them
     * (a count that does not match, a value this module leaves to it); nothing is kept then. */
    if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) != self->nparams) {
        Py_RETURN_NONE;
    }
    ParamsObject *out = PyObject_New(ParamsObject, &Params_Type);
    if (out == NULL) {
        return NULL;
    }
    out->size = 0;
    out->vals = PyMem_Calloc(self->nparams ? (size_t)self->nparams : 1, sizeof(val));
    if (out->vals == NULL) {
        Py_DECREF(out);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < self->nparams; i++) {
        CodecObject *c = (CodecObject *)PyTuple_GET_ITEM(self->params, i);
        int rc = lower(c->node, PyTuple_GET_ITEM(args, i), &out->vals[i]);
        if (rc != 1) {
            Py_DECREF(out); /* frees the first `size` values */
            if (rc < 0) {
                return NULL;
            }
            Py_RETURN_NONE;
        }
        out->size = i + 1;
    }
    return (PyObject *)out;
}

static const void *
buffer_address(PyObject *obj, Py_ssize_t need, int deref)
{
    /* The address of a ctypes object's memory (deref: the pointer a ctypes pointer holds). */
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const void *at = NULL;
    if (view.len < need) {
        PyErr_SetString(PyExc_TypeError, "a ctypes object of the wrong size");
    }
    else {
        at = deref ? *(void *const *)view.buf : view.buf;
        if (at == NULL) {
            PyErr_SetString(PyExc_ValueError, "a NULL pointer");
        }
    }
    PyBuffer_Release(&view);
    return at;
}

static PyObject *
Func_call(FuncObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* call(func, context, params, fuel=None): with ``fuel``, the store's fuel set to it and
     * its epoch deadline to the next tick (what the budget layer's Python path does with
     * three ctypes calls); then wasmtime_component_func_call with the GIL released, as ctypes
     * calls it; then, with ``fuel``, the fuel left read (a failed read counts as none left, as
     * the Python path's does). Returns (0, the lifted result or None, fuel left or None) or
     * (error address, None, fuel left or None). */
    if (nargs < 3 || nargs > 4 || !Py_IS_TYPE(args[2], &Params_Type)) {
        PyErr_SetString(PyExc_TypeError, "call(func, context, params: Params, fuel: int | None)");
        return NULL;
    }
    int fueled = nargs == 4 && args[3] != Py_None;
    unsigned long long fuel = 0;
    if (fueled) {
        fuel = PyLong_AsUnsignedLongLong(args[3]);
        if (fuel == (unsigned long long)-1 && PyErr_Occurred()) {
            return NULL;
        }
    }
    const void *func = buffer_address(args[0], 32, 0); /* wasmtime_component_func_t */
    if (func == NULL) {
        return NULL;
    }
    void *context = (void *)buffer_address(args[1], (Py_ssize_t)sizeof(void *), 1);
    if (context == NULL) {
        return NULL;
    }
    ParamsObject *params = (ParamsObject *)args[2];
    if (params->vals == NULL || params->size != self->nparams) {
        PyErr_SetString(PyExc_ValueError, "these arguments were freed or are not this function's");
        return NULL;
    }
    int has_result = self->result != Py_None;
    val result;
    zero_slot(&result);
    void *error = fueled ? fn.set_fuel(context, (uint64_t)fuel) : NULL;
    if (error == NULL) {
        if (fueled) {
            fn.set_epoch_deadline(context, 1);
        }
        Py_BEGIN_ALLOW_THREADS
        error = fn.func_call(func, context, params->vals, (size_t)params->size,
                             has_result ? &result : NULL, (size_t)has_result);
        Py_END_ALLOW_THREADS
    }
    uint64_t left = 0;
    if (fueled) {
        void *fuel_error = fn.get_fuel(context, &left);
        if (fuel_error != NULL) {
            fn.error_delete(fuel_error);
            left = 0;
        }
    }
    PyObject *value;
    if (error != NULL || !has_result) {
        fn.val_delete(&result); /* a zero slot, unless a failing call wrote one */
        value = Py_NewRef(Py_None);
    }
    else {
        value = lift(((CodecObject *)self->result)->node, &result);
        fn.val_delete(&result);
        if (value == NULL) {
            return NULL;
        }
    }
    PyObject *address = PyLong_FromVoidPtr(error);
    if (address == NULL) {
        Py_DECREF(value);
        return NULL;
    }
    PyObject *rest =
        fueled ? PyLong_FromUnsignedLongLong((unsigned long long)left) : Py_NewRef(Py_None);
    if (rest == NULL) {
        Py_DECREF(address);
        Py_DECREF(value);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(3, address, value, rest);
    Py_DECREF(address);
    Py_DECREF(value);
    Py_DECREF(rest);
    return out;
}

static PyMethodDef Func_methods[] = {
    {"lower", (PyCFunction)Func_lower, METH_O,
     "lower(args): the arguments lowered (Params), or None for the Python codec to take."},
    {"call", (PyCFunction)(void (*)(void))Func_call, METH_FASTCALL,
     "call(func, context, params, fuel=None): (error address or 0, lifted result, fuel left "
     "or None)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Func_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mighty.abi._speedups.Func",
    .tp_basicsize = sizeof(FuncObject),
    .tp_dealloc = (destructor)Func_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Func(params, result): one function signature's compiled codecs and call.",
    .tp_methods = Func_methods,
    .tp_new = Func_new,
};

/* ---- module ------------------------------------------------------------------------------ */

static void *
address_in(PyObject *functions, const char *name)
{
    PyObject *a = PyDict_GetItemString(functions, name);
    if (a == NULL || !PyLong_Check(a)) {
        PyErr_Format(PyExc_ValueError, "no address for %s", name);
        return NULL;
    }
    void *p = PyLong_AsVoidPtr(a);
    if (p == NULL && !PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "the address of %s is 0", name);
    }
    return p;
}

static PyObject *
sp_init(PyObject *Py_UNUSED(module), PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"functions", "sizes", "some", "ok", "err", "variant", "mismatch",
                             NULL};
    PyObject *functions, *sizes, *types[5];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!O!O!O!O!:init", kwlist, &PyDict_Type,
                                     &functions, &PyTuple_Type, &sizes, &PyType_Type, &types[0],
                                     &PyType_Type, &types[1], &PyType_Type, &types[2],
                                     &PyType_Type, &types[3], &PyType_Type, &types[4])) {
        return NULL;
    }
    /* ctypes' view of the layout (val size, payload offset, record entry size, entry value
     * offset): a wasmtime-py whose structs differ from ours must not be written through. */
    Py_ssize_t want[4] = {sizeof(val), offsetof(val, of), sizeof(entry), offsetof(entry, val)};
    if (PyTuple_GET_SIZE(sizes) != 4) {
        PyErr_SetString(PyExc_ValueError, "sizes: (val, payload offset, entry, entry value)");
        return NULL;
    }
    for (int i = 0; i < 4; i++) {
        Py_ssize_t got = PyLong_AsSsize_t(PyTuple_GET_ITEM(sizes, i));
        if (got == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (got != want[i]) {
            PyErr_Format(PyExc_ValueError,
                         "wasmtime's value layout differs from the compiled codec's (%zd: %zd, "
                         "not %zd)", (Py_ssize_t)i, got, want[i]);
            return NULL;
        }
    }
#define ADDRESS(field, name)                                                                   \
    do {                                                                                       \
        void *p_ = address_in(functions, name);                                                \
        if (p_ == NULL) {                                                                      \
            return NULL;                                                                       \
        }                                                                                      \
        memcpy(&fn.field, &p_, sizeof(p_));                                                    \
    } while (0)
    ADDRESS(byte_vec_new, "wasm_byte_vec_new");
    ADDRESS(vallist_new_uninit, "wasmtime_component_vallist_new_uninit");
    ADDRESS(valrecord_new_uninit, "wasmtime_component_valrecord_new_uninit");
    ADDRESS(valtuple_new_uninit, "wasmtime_component_valtuple_new_uninit");
    ADDRESS(val_new, "wasmtime_component_val_new");
    ADDRESS(val_free, "wasmtime_component_val_free");
    ADDRESS(val_delete, "wasmtime_component_val_delete");
    ADDRESS(func_call, "wasmtime_component_func_call");
    ADDRESS(set_fuel, "wasmtime_context_set_fuel");
    ADDRESS(get_fuel, "wasmtime_context_get_fuel");
    ADDRESS(set_epoch_deadline, "wasmtime_context_set_epoch_deadline");
    ADDRESS(error_delete, "wasmtime_error_delete");
#undef ADDRESS
    Py_XSETREF(Some_type, Py_NewRef(types[0]));
    Py_XSETREF(Ok_type, Py_NewRef(types[1]));
    Py_XSETREF(Err_type, Py_NewRef(types[2]));
    Py_XSETREF(Variant_type, Py_NewRef(types[3]));
    if (!PyType_IsSubtype((PyTypeObject *)types[4], (PyTypeObject *)PyExc_Exception)) {
        PyErr_SetString(PyExc_TypeError, "mismatch must be an exception class");
        return NULL;
    }
    Py_XSETREF(Mismatch, Py_NewRef(types[4]));
    fn.ready = 1;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"init", (PyCFunction)(void (*)(void))sp_init, METH_VARARGS | METH_KEYWORDS,
     "init(functions, sizes, some, ok, err, variant, mismatch): wasmtime's function addresses, ctypes' "
     "layout figures and mighty.abi's value classes; once, before any Codec is made."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "mighty.abi._speedups",
    .m_doc = "The value codec's common types, compiled (see host/abi/_speedups.c).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&Codec_Type) < 0 || PyType_Ready(&Params_Type) < 0 ||
        PyType_Ready(&Func_Type) < 0) {
        return NULL;
    }
    if (str_value == NULL) {
        str_value = PyUnicode_InternFromString("value");
        str_case = PyUnicode_InternFromString("case");
        if (str_value == NULL || str_case == NULL) {
            return NULL;
        }
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Codec", (PyObject *)&Codec_Type) < 0 ||
        PyModule_AddObjectRef(m, "Params", (PyObject *)&Params_Type) < 0 ||
        PyModule_AddObjectRef(m, "Func", (PyObject *)&Func_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
