/*
 * mighty.engine._pages: the page copy of a rewind (_memory.rewind_memory), the page
 * compares of a capture (_memory._changed_ranges, _memory._changed_since) and the mappings of
 * a state's ranges (_memory._map_ranges), compiled.
 *
 * The compiled form of a pure-Python path that stays in the package as the fallback (no
 * compiler, or MIGHTY_PURE_PYTHON=1) and as the oracle the tests hold this module to
 * (tests/engine/test_rewind.py runs the rewind both ways): with the page map's entries of a
 * linear memory and a mask of pages that must be copied whatever the map says, copy each page
 * that is the memory's own (present and not a file page, or swapped out) or in the mask from
 * the reference mapping to the memory, skipping pages that already hold the reference's bytes
 * (a compare reads; a copy also writes, and most own pages of a short run were not changed).
 * In Python the same is a mask, a regex over it and one memmove per run of pages: ~0.3 ms of
 * the rewind's ~0.45 ms, hundreds of foreign calls.
 *
 * The GIL is released while pages are compared and copied: the arguments are bytes objects
 * the call holds, and the two addresses are mappings the caller keeps (the memory's store is
 * not running, the reference is the target state's view).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

static PyObject *
copy_back(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long dst, src;
    Py_buffer pagemap, mask;
    Py_ssize_t page;
    if (!PyArg_ParseTuple(args, "KKy*y*n", &dst, &src, &pagemap, &mask, &page)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t pages = pagemap.len / 8;
    if (page <= 0 || pagemap.len % 8 || (mask.len && mask.len != pages)) {
        PyErr_SetString(PyExc_ValueError,
                        "copy_back: a page map of whole entries, a mask of one byte per page");
        goto done;
    }
    const unsigned char *entries = pagemap.buf;
    const unsigned char *extra = mask.len ? mask.buf : NULL;
    unsigned char *to = (unsigned char *)(uintptr_t)dst;
    const unsigned char *from = (const unsigned char *)(uintptr_t)src;
    Py_ssize_t copied = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < pages; i++) {
        unsigned char top = entries[8 * i + 7]; /* bits 63 (present), 62 (swapped), 61 (file) */
        int own = ((top & 0x80) && !(top & 0x20)) || (top & 0x40);
        if (!own && !(extra && extra[i])) {
            continue;
        }
        size_t at = (size_t)i * (size_t)page;
        if (memcmp(to + at, from + at, (size_t)page) != 0) {
            memcpy(to + at, from + at, (size_t)page);
            copied++;
        }
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(copied);
done:
    PyBuffer_Release(&pagemap);
    PyBuffer_Release(&mask);
    return result;
}

/*
 * drop_same: the compare of a capture (_memory._changed_ranges), compiled. ``mask`` (writable,
 * one byte per page) marks the pages that may differ from the image (or from zeros past it);
 * each marked page that holds the image's bytes (below ``image_pages``, when ``reference``, a
 * mapping of the image, is not 0) or only zeros (from ``image_pages`` on) is unmarked. In
 * Python, one foreign memcmp per marked page: ~1 ms of a small session's ~3 ms fork.
 */
/* Whether the page at ``at`` holds ``source``'s bytes (only zeros when ``source`` is NULL). */
static int
holds(const unsigned char *at, const unsigned char *source, Py_ssize_t page)
{
    if (source != NULL) {
        return memcmp(at, source, (size_t)page) == 0;
    }
    const uint64_t *words = (const uint64_t *)at;
    uint64_t any = 0;
    for (Py_ssize_t w = 0; w < page / (Py_ssize_t)sizeof(uint64_t); w++) {
        any |= words[w];
    }
    return any == 0;
}

static PyObject *
drop_same(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long base, reference;
    Py_buffer mask;
    Py_ssize_t page, image_pages;
    if (!PyArg_ParseTuple(args, "KKw*nn", &base, &reference, &mask, &page, &image_pages)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (page <= 0 || page % (Py_ssize_t)sizeof(uint64_t) || image_pages < 0) {
        PyErr_SetString(PyExc_ValueError, "drop_same: a positive page size of whole words");
        goto done;
    }
    unsigned char *marks = mask.buf;
    const unsigned char *memory = (const unsigned char *)(uintptr_t)base;
    const unsigned char *image = (const unsigned char *)(uintptr_t)reference;
    Py_ssize_t kept = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < mask.len; i++) {
        if (!marks[i]) {
            continue;
        }
        size_t at = (size_t)i * (size_t)page;
        int same = i < image_pages ? image != NULL && holds(memory + at, image + at, page)
                                   : holds(memory + at, NULL, page);
        if (same) {
            marks[i] = 0;
        } else {
            kept++;
        }
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(kept);
done:
    PyBuffer_Release(&mask);
    return result;
}

/*
 * drop_same_at: the compare of a layered capture (_memory._changed_since), compiled. As
 * drop_same, but the reference is a previous state spread over several read-only views:
 * ``pieces`` are native unsigned 64-bit triples (first page, pages, address of the first
 * page's bytes), sorted and disjoint; a page in none of them is compared with ``reference``
 * (the image's view) below ``image_pages`` and with zeros from there on.
 */
static PyObject *
drop_same_at(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long base, reference;
    Py_buffer mask, pieces;
    Py_ssize_t page, image_pages;
    if (!PyArg_ParseTuple(args, "KKw*nny*", &base, &reference, &mask, &page, &image_pages,
                          &pieces)) {
        return NULL;
    }
    PyObject *result = NULL;
    const Py_ssize_t triple = 3 * (Py_ssize_t)sizeof(uint64_t);
    if (page <= 0 || page % (Py_ssize_t)sizeof(uint64_t) || image_pages < 0 ||
        pieces.len % triple) {
        PyErr_SetString(PyExc_ValueError,
                        "drop_same_at: a page size of whole words, pieces of whole triples");
        goto done;
    }
    unsigned char *marks = mask.buf;
    const unsigned char *memory = (const unsigned char *)(uintptr_t)base;
    const unsigned char *image = (const unsigned char *)(uintptr_t)reference;
    const unsigned char *spans = pieces.buf;
    Py_ssize_t count = pieces.len / triple, next = 0;
    Py_ssize_t kept = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < mask.len; i++) {
        if (!marks[i]) {
            continue;
        }
        uint64_t first = 0, length = 0, from = 0;
        /* Skip the pieces that end before this page (pages only go up). */
        while (next < count) {
            memcpy(&first, spans + next * triple, sizeof first);
            memcpy(&length, spans + next * triple + sizeof first, sizeof length);
            if (first + length > (uint64_t)i) {
                break;
            }
            next++;
        }
        size_t at = (size_t)i * (size_t)page;
        const unsigned char *source = NULL;
        if (next < count && first <= (uint64_t)i) {
            memcpy(&from, spans + next * triple + 2 * sizeof first, sizeof from);
            source = (const unsigned char *)(uintptr_t)from + ((uint64_t)i - first) * page;
        } else if (i < image_pages) {
            source = image;
            if (source == NULL) {
                kept++; /* no view of the image: keep it (a copy too many, never one too few) */
                continue;
            }
            source += at;
        }
        if (holds(memory + at, source, page)) {
            marks[i] = 0;
        } else {
            kept++;
        }
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(kept);
done:
    PyBuffer_Release(&mask);
    PyBuffer_Release(&pieces);
    return result;
}

/*
 * map_ranges(base, ranges, prot, flags): mmap each (offset, length, fd, offset in fd) of
 * `ranges` (native int64 quadruples) at base + offset, with the GIL released once for all of
 * them: a state has a few hundred ranges, and a foreign call per range gave the GIL up and
 * back each time (with another thread running Python, each wait for it was that thread's
 * switch interval, 5 ms). OSError at the first range the kernel refuses (the ones before it
 * stay mapped: the caller maps the memory anew or gives it up).
 */
static PyObject *
map_ranges(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long base;
    Py_buffer ranges;
    int prot, flags;
    if (!PyArg_ParseTuple(args, "Ky*ii", &base, &ranges, &prot, &flags)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (ranges.len % (4 * (Py_ssize_t)sizeof(int64_t))) {
        PyErr_SetString(PyExc_ValueError, "map_ranges: ranges of whole int64 quadruples");
        goto done;
    }
    Py_ssize_t count = ranges.len / (4 * (Py_ssize_t)sizeof(int64_t));
    const int64_t *quad = ranges.buf;
    Py_ssize_t mapped = 0;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; mapped < count; mapped++) {
        const int64_t *r = quad + 4 * mapped;
        if (r[0] < 0 || r[1] <= 0 || r[3] < 0 || r[2] < 0 || r[2] > INT32_MAX) {
            failed = EINVAL;
            break;
        }
        void *where = (void *)(uintptr_t)(base + (uint64_t)r[0]);
        void *got = mmap(where, (size_t)r[1], prot, flags, (int)r[2], (off_t)r[3]);
        if (got != where) {
            failed = got == MAP_FAILED ? errno : EFAULT;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        errno = failed;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = PyLong_FromSsize_t(mapped);
done:
    PyBuffer_Release(&ranges);
    return result;
}

static PyMethodDef methods[] = {
    {"copy_back", copy_back, METH_VARARGS,
     "copy_back(dst, src, pagemap, mask, page) -> pages copied"},
    {"drop_same", drop_same, METH_VARARGS,
     "drop_same(base, reference, mask, page, image_pages) -> pages kept"},
    {"drop_same_at", drop_same_at, METH_VARARGS,
     "drop_same_at(base, reference, mask, page, image_pages, pieces) -> pages kept"},
    {"map_ranges", map_ranges, METH_VARARGS,
     "map_ranges(base, ranges, prot, flags) -> ranges mapped"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pages", "A rewind's page copy, compiled.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__pages(void)
{
    return PyModule_Create(&module);
}
