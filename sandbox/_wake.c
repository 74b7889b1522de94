/* mighty.sandbox._wake: the bells a sync tool call's hand-off waits on, with a bounded spin.
 *
 * The compiled form of mighty.sandbox._tools._PipeBell (which stays: the fallback when this
 * module cannot be imported or MIGHTY_PURE_PYTHON=1 is set, and the oracle of the tests).
 *
 * A Bell is a flag and a non-blocking pipe. ring() raises the flag; wait() takes it down and
 * returns True if it was up (every ring since the last wait that took it, one wake-up). A
 * wake-up is never an answer: the waiter looks at its job's state afterwards.
 *
 * Why C: on this project's VM, waking a thread whose vCPU went idle costs ~59 us, and a sync
 * tool call needs two such wake-ups (caller -> pool worker -> caller). wait() therefore first
 * spins for at most spin_ns on the flag (no system call; a sched_yield() now and then, so a
 * thread waiting for this CPU, perhaps the one we wait for, still runs), and only then parks in
 * poll() on the pipe. A waiter still spinning is woken by the flag alone, with no scheduler
 * wake-up at all; ring() writes the pipe only when its waiter is parked. Both sides give up the
 * GIL before they ring: wait(ring=other) rings `other` and then waits, all with the GIL
 * released, so the woken side (which needs the GIL to run Python) finds it free and never sleeps
 * on the GIL's own condition variable, which would be the expensive wake-up again. Nothing
 * between Py_BEGIN_ALLOW_THREADS and Py_END_ALLOW_THREADS touches a Python object.
 *
 * The flag (`state`): IDLE, RUNG (a ring not yet taken) or PARKED (the waiter sleeps in
 * poll()). ring: exchange to RUNG; if it was PARKED, write a byte. wait: take RUNG (exchange to
 * IDLE) while spinning; to park, move IDLE -> PARKED (failing means RUNG came: take it), poll,
 * drain the pipe, then exchange to IDLE: RUNG means a ring came. A byte written after a timed
 * out poll but before that exchange stays in the pipe: the next park drains it and returns
 * False (a spurious wake-up, which every caller must expect anyway).
 *
 * Signals: a signal that interrupts the park (EINTR) ends the wait, and a handler that raises
 * (Ctrl-C) raises out of it. One that lands while the waiter spins is run by Python when the
 * wait returns: at most its timeout later (the call scope waits in slices of 20 ms).
 *
 * A bell has one waiter at a time (a caller's instance makes one sync call at a time; a pool
 * thread waits on its own). Two waiting at once are not unsafe, but one of them may sleep
 * through a ring until its timeout.
 *
 * Closing: close() may come from another thread while a wait() or ring() runs. The bell's own
 * lock guards `closed`, `users` and every write: a ring never writes to a closed (perhaps
 * reused) descriptor, and a close while a wait() is parked on the pipe only marks the bell
 * closed; the last waiter closes the descriptors when it leaves.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#define MAX_SPIN_NS 10000000LL /* 10 ms: a spin longer than this is a mistake, not a setting */
#define MAX_TIMEOUT_NS (3600LL * 1000000000LL)

enum { IDLE = 0, RUNG = 1, PARKED = 2 };

typedef struct {
    PyObject_HEAD
    atomic_int state;          /* IDLE, RUNG or PARKED (see the top) */
    atomic_int cpu;            /* the CPU its waiter was on when it last woke, or -1 */
    int read_fd;
    int write_fd;
    int closed;                /* under lock */
    int users;                 /* waits reading the pipe right now; under lock */
    PyThread_type_lock lock;
} Bell;

static PyTypeObject Bell_Type;

static long long
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Both descriptors closed; the caller holds the lock, or is the only one left (dealloc). */
static void
close_fds(Bell *self)
{
    if (self->read_fd >= 0) {
        close(self->read_fd);
        self->read_fd = -1;
    }
    if (self->write_fd >= 0) {
        close(self->write_fd);
        self->write_fd = -1;
    }
}

static int
set_flags(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        return -1;
    }
    int fdf = fcntl(fd, F_GETFD);
    if (fdf < 0 || fcntl(fd, F_SETFD, fdf | FD_CLOEXEC) < 0) {
        return -1;
    }
    return 0;
}

static PyObject *
Bell_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":Bell", kwlist)) {
        return NULL;
    }
    Bell *self = (Bell *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    atomic_init(&self->state, IDLE);
    atomic_init(&self->cpu, -1);
    self->read_fd = self->write_fd = -1;
    self->closed = 0;
    self->users = 0;
    self->lock = PyThread_allocate_lock();
    if (self->lock == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    int fds[2];
    if (pipe(fds) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(self);
        return NULL;
    }
    self->read_fd = fds[0];
    self->write_fd = fds[1];
    if (set_flags(fds[0]) != 0 || set_flags(fds[1]) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(self); /* closes both */
        return NULL;
    }
    return (PyObject *)self;
}

static void
Bell_dealloc(Bell *self)
{
    /* Nobody can be inside ring() or wait(): each holds a reference while it runs. */
    close_fds(self);
    if (self->lock != NULL) {
        PyThread_free_lock(self->lock);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Raise the flag; a parked waiter also gets a byte, unless the bell is closed. No GIL
 * needed; a full pipe is fine (its waiter has bytes to read, so it is awake anyway). */
static void
ring_nogil(Bell *bell)
{
    if (atomic_exchange(&bell->state, RUNG) != PARKED) {
        return; /* the waiter is spinning (or not waiting yet): the flag is enough */
    }
    PyThread_acquire_lock(bell->lock, WAIT_LOCK);
    if (!bell->closed) {
        const char byte = 0;
        ssize_t n;
        do {
            n = write(bell->write_fd, &byte, 1);
        } while (n < 0 && errno == EINTR);
    }
    PyThread_release_lock(bell->lock);
}

static PyObject *
Bell_ring(Bell *self, PyObject *Py_UNUSED(ignored))
{
    /* The flag alone when the waiter spins: no reason to give up the GIL for that. */
    if (atomic_load(&self->state) == PARKED) {
        Py_BEGIN_ALLOW_THREADS
        ring_nogil(self);
        Py_END_ALLOW_THREADS
    }
    else {
        ring_nogil(self);
    }
    Py_RETURN_NONE;
}

/* Empty the pipe (its bytes only ever mean "look at the flag"). */
static void
drain(int fd)
{
    char buf[64];
    ssize_t n;
    do {
        n = read(fd, buf, sizeof buf);
    } while (n == (ssize_t)sizeof buf || (n < 0 && errno == EINTR));
}

static inline void
cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Spin up to spin_ns for a ring; 1 when one was taken. `other` (or NULL) is the bell just
 * rung, whose waiter is the thread that will ring us back. Every ~1 us of pauses the spin
 * yields the CPU (a thread of another process waiting for it runs), and it gives up at once
 * when that thread last woke on this very CPU: the other CPUs are busy, so spinning here
 * would only hold it off (a time slice at worst), and parking costs nothing extra. */
static int
spin_for_ring(Bell *self, Bell *other, long long spin_ns)
{
    long long start = now_ns();
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&self->state, memory_order_relaxed) == RUNG &&
            atomic_exchange(&self->state, IDLE) == RUNG) {
            return 1;
        }
        if ((i & 63) == 0) {
            if (now_ns() - start >= spin_ns) {
                return 0;
            }
            if (other != NULL &&
                atomic_load_explicit(&other->cpu, memory_order_relaxed) == sched_getcpu()) {
                return 0;
            }
            sched_yield();
        }
        cpu_relax();
    }
}

/* Sleep in poll() until a ring or timeout_ns (-1: forever). 1: rung, 0: not, -1: EINTR. */
static int
park(Bell *self, long long timeout_ns)
{
    int expected = IDLE;
    if (!atomic_compare_exchange_strong(&self->state, &expected, PARKED) && expected == RUNG) {
        atomic_store(&self->state, IDLE);
        return 1;
    } /* else PARKED: a second waiter beside the first (misuse, see the top: a late wake-up) */
    struct pollfd pfd = {.fd = self->read_fd, .events = POLLIN, .revents = 0};
    int ms = timeout_ns < 0 ? -1 : (int)((timeout_ns + 999999) / 1000000);
    int r = poll(&pfd, 1, ms);
    int interrupted = r < 0 && errno == EINTR;
    if (r > 0) {
        drain(self->read_fd);
    }
    if (atomic_exchange(&self->state, IDLE) == RUNG) {
        return 1;
    }
    return interrupted ? -1 : 0;
}

static PyObject *
Bell_wait(Bell *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"spin_ns", "timeout_ns", "ring", NULL};
    long long spin_ns, timeout_ns;
    PyObject *ring = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LL|O:wait", kwlist, &spin_ns, &timeout_ns,
                                     &ring)) {
        return NULL;
    }
    if (spin_ns < 0 || spin_ns > MAX_SPIN_NS) {
        PyErr_Format(PyExc_ValueError, "spin_ns must be in 0..%lld, got %lld", MAX_SPIN_NS,
                     spin_ns);
        return NULL;
    }
    if (timeout_ns < -1 || timeout_ns > MAX_TIMEOUT_NS) {
        PyErr_Format(PyExc_ValueError, "timeout_ns must be -1 (forever) or in 0..%lld, got %lld",
                     MAX_TIMEOUT_NS, timeout_ns);
        return NULL;
    }
    if (ring != Py_None && !PyObject_TypeCheck(ring, &Bell_Type)) {
        PyErr_Format(PyExc_TypeError, "ring must be a Bell or None, got %.100s",
                     Py_TYPE(ring)->tp_name);
        return NULL;
    }
    Bell *other = ring == Py_None ? NULL : (Bell *)ring;
    int got = 0, interrupted = 0, open;

    Py_BEGIN_ALLOW_THREADS
    if (other != NULL) {
        ring_nogil(other);
    }
    PyThread_acquire_lock(self->lock, WAIT_LOCK);
    open = !self->closed;
    if (open) {
        self->users++;
    }
    PyThread_release_lock(self->lock);
    if (open) {
        int r = 0; /* 1: rung, 0: not (yet), -1: a signal interrupted the park */
        if (atomic_load(&self->state) == RUNG && atomic_exchange(&self->state, IDLE) == RUNG) {
            r = 1; /* rung before we came */
        }
        else if (spin_ns > 0) {
            r = spin_for_ring(self, other, spin_ns);
        }
        if (r == 0 && timeout_ns != 0) {
            r = park(self, timeout_ns);
        }
        got = r > 0;
        interrupted = r < 0;
        if (got) {
            atomic_store_explicit(&self->cpu, sched_getcpu(), memory_order_relaxed);
        }
        PyThread_acquire_lock(self->lock, WAIT_LOCK);
        if (--self->users == 0 && self->closed) {
            close_fds(self); /* closed while we read it: ours to finish */
        }
        PyThread_release_lock(self->lock);
    }
    Py_END_ALLOW_THREADS

    if (interrupted && PyErr_CheckSignals() < 0) {
        return NULL; /* a signal's handler raised (Ctrl-C): the caller's wait unwinds */
    }
    return PyBool_FromLong(got);
}

static PyObject *
Bell_close(Bell *self, PyObject *Py_UNUSED(ignored))
{
    Py_BEGIN_ALLOW_THREADS
    ring_nogil(self); /* a waiter parked in poll() wakes (and leaves: the bell is closed) */
    PyThread_acquire_lock(self->lock, WAIT_LOCK);
    if (!self->closed) {
        self->closed = 1;
        if (self->users == 0) {
            close_fds(self);
        }
    }
    PyThread_release_lock(self->lock);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *
Bell_get_closed(Bell *self, void *Py_UNUSED(closure))
{
    PyThread_acquire_lock(self->lock, WAIT_LOCK);
    int closed = self->closed;
    PyThread_release_lock(self->lock);
    return PyBool_FromLong(closed);
}

static PyMethodDef Bell_methods[] = {
    {"ring", (PyCFunction)Bell_ring, METH_NOARGS,
     "ring()\n--\n\nWake the waiter: one byte, unless closed (the GIL released)."},
    {"wait", (PyCFunction)(void (*)(void))Bell_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(spin_ns, timeout_ns, ring=None)\n--\n\n"
     "Ring `ring` (a Bell) if given, then take the bytes that came, spinning up to spin_ns\n"
     "and then sleeping up to timeout_ns (-1: forever), all with the GIL released. True when\n"
     "a byte came. A closed bell returns False at once."},
    {"close", (PyCFunction)Bell_close, METH_NOARGS,
     "close()\n--\n\nClose the pipe (at once, or when the last wait leaves). Idempotent."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Bell_getset[] = {
    {"closed", (getter)Bell_get_closed, NULL, "Whether close() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Bell_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mighty.sandbox._wake.Bell",
    .tp_basicsize = sizeof(Bell),
    .tp_dealloc = (destructor)Bell_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Bell()\n--\n\nA wake-up pipe with a spin-then-park wait.",
    .tp_methods = Bell_methods,
    .tp_getset = Bell_getset,
    .tp_new = Bell_new,
};

static struct PyModuleDef wake_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "mighty.sandbox._wake",
    .m_doc = "Spin-then-park wake-up pipes for the sandbox's sync tool calls.",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__wake(void)
{
    if (PyType_Ready(&Bell_Type) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&wake_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "Bell", (PyObject *)&Bell_Type) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "MAX_SPIN_NS", (long)MAX_SPIN_NS) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
