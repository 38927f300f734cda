/*
 * The step recorder's state machine in C: the same rules as the pure-Python core in
 * stepscope/capture/recorder.py (_PyCore), for the calls capture makes on every step.
 *
 * Every hook call reads one clock and updates a handful of integers; a committed step is one
 * row appended to a growable int64 buffer. Python objects are only touched on the rare paths
 * (callbacks: on_commit, at_boundary, a phase listener, CUDA event timing, collectives).
 * Exceptions raised by a callback propagate, as in the Python core, with the same state.
 *
 * The tests run the recorder suites against both cores (tests/unit/capture/test_recorder*.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <stdlib.h>
#include <unistd.h>
#include <fcntl.h>
#include <errno.h>
#include <pthread.h>

#if defined(__linux__) && defined(CLOCK_MONOTONIC)
#define NATIVE_CLOCK 1
#endif

enum { OTHER, DATA_WAIT, FORWARD, BACKWARD, OPTIMIZER, COMMUNICATION, COMPILE, NPHASES };
enum { M_BATCH, M_FORWARD, M_BACKWARD, M_OPTIMIZER, M_EXPLICIT, NMODES };
static const char *MODE_NAMES[NMODES] = {"batch", "forward", "backward", "optimizer", "explicit"};
static const char *PHASE_NAMES[NPHASES] = {"other", "data_wait", "forward", "backward",
                                           "optimizer", "communication", "compile"};
/* one committed row: recorder.ROW */
enum { R_START, R_DURATION, R_WAIT, R_INIT, R_WAIT_CPU, R_FORWARD, R_BACKWARD, R_OPTIMIZER, R_COMM,
       R_OVERLAP, R_OTHER, R_COMPILE, R_BATCHES, R_SAMPLES, R_OPT_STEPS, WIDTH };

typedef struct {
    int64_t *items;
    Py_ssize_t len, cap;
} IdList;

/* an ended step (the pending one) or the open step's counters */
typedef struct {
    int64_t start, end;
    int64_t acc[NPHASES];
    int64_t overlap, init, wait_cpu, batches, samples, opt_steps;
    IdList optimizers;
    PyObject *events; /* DeviceTimer events, or NULL */
} Ended;

typedef struct {
    PyObject_HEAD
    PyObject *clock; /* NULL: the monotonic clock of time.perf_counter_ns */
    PyObject *listener, *on_commit, *at_boundary, *device, *comm;
    PyObject *weakreflist;
    PyObject *dict;
    unsigned long owner_thread;
    int mode;
    Py_ssize_t count;
    Py_ssize_t next_commit_call; /* on_commit is called for committed indexes >= this */
    int64_t *rows;
    Py_ssize_t rows_cap; /* in rows */
    long long foreign_thread_calls, trailing_ns, batch_mode_rows;
    long long backwards, model_forwards, model_forwards_no_grad, optimizer_steps;
    long long unseen_forward_steps; /* committed steps with a backward and no forward timed */
    /* phase stack */
    int phase, depth;
    int64_t *stack;
    Py_ssize_t stack_len, stack_cap;
    int has_start;
    int64_t start, last;
    /* the open step */
    int64_t acc[NPHASES];
    int64_t overlap, init, wait_cpu, batches, samples, opt_steps;
    int samples_known, wait_cpu_known, backward_done, has_lead, lead_done;
    uint64_t lead;
    IdList optimizers;
    int has_pending;
    Ended pending;
    int forward_depth; /* a root forward is running: the forward wrappers let inner calls through */
} Core;

/* -- small helpers ------------------------------------------------------------------------- */
static int
ids_contains(const IdList *list, int64_t id)
{
    for (Py_ssize_t i = 0; i < list->len; i++)
        if (list->items[i] == id)
            return 1;
    return 0;
}

static int
ids_add(IdList *list, int64_t id)
{
    if (ids_contains(list, id))
        return 0;
    if (list->len == list->cap) {
        Py_ssize_t cap = list->cap ? list->cap * 2 : 4;
        int64_t *items = PyMem_Realloc(list->items, cap * sizeof(int64_t));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        list->items = items;
        list->cap = cap;
    }
    list->items[list->len++] = id;
    return 0;
}

static int
read_clock(Core *self, int64_t *now)
{
#ifdef NATIVE_CLOCK
    if (self->clock == NULL) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts); /* what time.perf_counter_ns reads on Linux */
        *now = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
        return 0;
    }
#endif
    PyObject *value = PyObject_CallNoArgs(self->clock);
    if (value == NULL)
        return -1;
    long long v = PyLong_AsLongLong(value);
    Py_DECREF(value);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *now = v;
    return 0;
}

/* 1 when called from another thread than the recorder's (counted; the call is ignored) */
static inline int
foreign(Core *self)
{
    if (PyThread_get_thread_ident() == self->owner_thread)
        return 0;
    self->foreign_thread_calls++;
    return 1;
}

static inline int64_t
as_key(PyObject *obj, int *error)
{
    /* ids and small ints; masked so any int fits (keys are compared, never printed) */
    unsigned long long v = PyLong_AsUnsignedLongLongMask(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        *error = 1;
        return 0;
    }
    return (int64_t)v;
}

static int
call_listener(Core *self, const char *kind, const char *name)
{
    PyObject *result = PyObject_CallMethod(self->listener, kind, "s", name);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 0;
}

static void
reset_step(Core *self)
{
    memset(self->acc, 0, sizeof(self->acc));
    self->overlap = self->init = self->wait_cpu = self->batches = self->samples = self->opt_steps = 0;
    self->samples_known = self->wait_cpu_known = 1;
    self->optimizers.len = 0;
    self->backward_done = 0;
    self->has_lead = 0;
    self->lead = 0;
    self->lead_done = 0;
}

static int
mark(Core *self, int64_t now)
{
    if (self->device != NULL) {
        PyObject *r = PyObject_CallMethod(self->device, "boundary", "i", self->phase);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    if (!self->has_start) {
        self->has_start = 1;
        self->start = now;
        if (self->listener != NULL && call_listener(self, "start", "step") < 0) {
            self->last = now;
            return -1;
        }
    }
    else {
        self->acc[self->phase] += now - self->last;
    }
    self->last = now;
    return 0;
}

/* -- phases ------------------------------------------------------------------------------- */
static int
do_enter(Core *self, int phase, int64_t now)
{
    if (phase == self->phase && self->stack_len) {
        self->depth++;
        return 0;
    }
    if (self->device != NULL || !self->has_start) {
        if (mark(self, now) < 0)
            return -1;
    }
    else {
        self->acc[self->phase] += now - self->last;
        self->last = now;
    }
    if (self->stack_len == self->stack_cap) {
        Py_ssize_t cap = self->stack_cap ? self->stack_cap * 2 : 8;
        int64_t *stack = PyMem_Realloc(self->stack, cap * sizeof(int64_t));
        if (stack == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->stack = stack;
        self->stack_cap = cap;
    }
    self->stack[self->stack_len++] = (int64_t)self->phase * 1000 + self->depth;
    self->phase = phase;
    self->depth = 0;
    if (self->listener != NULL && phase != OTHER)
        return call_listener(self, "start", PHASE_NAMES[phase]);
    return 0;
}

static int
settle_backward_comm(Core *self, int64_t now)
{
    PyObject *result = PyObject_CallMethod(self->comm, "backward_done", "L", (long long)now);
    if (result == NULL)
        return -1;
    long long exposed, overlapped;
    if (!PyArg_ParseTuple(result, "LL", &exposed, &overlapped)) {
        Py_DECREF(result);
        return -1;
    }
    Py_DECREF(result);
    if (exposed > self->acc[BACKWARD])
        exposed = self->acc[BACKWARD];
    if (exposed < 0)
        exposed = 0;
    self->acc[BACKWARD] -= exposed;
    self->acc[COMMUNICATION] += exposed;
    self->overlap += overlapped > 0 ? overlapped : 0;
    return 0;
}

static int
do_leave(Core *self, int phase, int64_t now)
{
    if (phase != self->phase || !self->stack_len)
        return 0; /* unbalanced (an exception skipped a boundary): ignore */
    if (self->depth) {
        self->depth--;
        return 0;
    }
    if (self->device != NULL || !self->has_start) {
        if (mark(self, now) < 0)
            return -1;
    }
    else {
        self->acc[phase] += now - self->last;
        self->last = now;
    }
    int64_t top = self->stack[--self->stack_len];
    self->phase = (int)(top / 1000);
    self->depth = (int)(top % 1000);
    if (self->listener != NULL && phase != OTHER && call_listener(self, "stop", PHASE_NAMES[phase]) < 0)
        return -1;
    if (phase == BACKWARD && self->phase != BACKWARD) {
        if (self->comm != NULL && settle_backward_comm(self, now) < 0)
            return -1;
        self->backwards++;
        if (self->mode <= M_BACKWARD && !self->stack_len) {
            self->backward_done = 1;
            self->mode = M_BACKWARD;
        }
    }
    return 0;
}

/* -- committing --------------------------------------------------------------------------- */
static int
pad_device_columns(Core *self)
{
    PyObject *r = PyObject_CallMethod((PyObject *)self, "_pad_device_columns", NULL);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* the open step, ended at `end` (events taken from the device timer) */
static int
snapshot(Core *self, int64_t end, Ended *out)
{
    out->start = self->has_start ? self->start : end;
    out->end = end;
    memcpy(out->acc, self->acc, sizeof(self->acc));
    out->overlap = self->overlap;
    out->init = self->init;
    out->wait_cpu = self->wait_cpu_known ? self->wait_cpu : -1;
    out->batches = self->batches;
    out->samples = self->samples_known ? self->samples : -1;
    out->opt_steps = self->opt_steps;
    out->optimizers.len = 0;
    for (Py_ssize_t i = 0; i < self->optimizers.len; i++)
        if (ids_add(&out->optimizers, self->optimizers.items[i]) < 0)
            return -1;
    out->events = NULL;
    if (self->device != NULL) {
        out->events = PyObject_CallMethod(self->device, "take", NULL);
        if (out->events == NULL)
            return -1;
    }
    return 0;
}

/* append an ended step as a row; steals step->events */
static int
append(Core *self, Ended *step)
{
    if (self->count == self->rows_cap) {
        Py_ssize_t cap = self->rows_cap ? self->rows_cap * 2 : 256;
        int64_t *rows = PyMem_Realloc(self->rows, cap * WIDTH * sizeof(int64_t));
        if (rows == NULL) {
            Py_CLEAR(step->events);
            PyErr_NoMemory();
            return -1;
        }
        self->rows = rows;
        self->rows_cap = cap;
    }
    int64_t *row = self->rows + self->count * WIDTH;
    const int64_t *acc = step->acc;
    int64_t duration = step->end - step->start, wait = acc[DATA_WAIT];
    row[R_START] = step->start;
    row[R_DURATION] = duration;
    row[R_WAIT] = wait;
    row[R_INIT] = step->init < wait ? step->init : wait;
    row[R_WAIT_CPU] = step->wait_cpu;
    row[R_FORWARD] = acc[FORWARD];
    row[R_BACKWARD] = acc[BACKWARD];
    row[R_OPTIMIZER] = acc[OPTIMIZER];
    row[R_COMM] = acc[COMMUNICATION];
    row[R_OVERLAP] = step->overlap;
    row[R_OTHER] = duration - wait - acc[FORWARD] - acc[BACKWARD] - acc[OPTIMIZER] - acc[COMMUNICATION] - acc[COMPILE];
    row[R_COMPILE] = acc[COMPILE];
    row[R_BATCHES] = step->batches;
    row[R_SAMPLES] = step->batches ? step->samples : -1;
    row[R_OPT_STEPS] = step->opt_steps;
    if (acc[FORWARD] == 0 && acc[BACKWARD] > 0)
        self->unseen_forward_steps++;
    self->count++;
    PyObject *events = step->events;
    step->events = NULL;
    if (self->device != NULL) {
        if (pad_device_columns(self) < 0) {
            Py_XDECREF(events);
            return -1;
        }
        if (events != NULL) {
            PyObject *r = PyObject_CallMethod(self->device, "step_committed", "nO", self->count - 1, events);
            Py_DECREF(events);
            if (r == NULL)
                return -1;
            Py_DECREF(r);
        }
    }
    else {
        Py_XDECREF(events);
    }
    if (self->listener != NULL) {
        if (call_listener(self, "stop", "step") < 0 || call_listener(self, "start", "step") < 0)
            return -1;
    }
    if (self->on_commit != NULL && self->count - 1 >= self->next_commit_call) {
        PyObject *index = PyLong_FromSsize_t(self->count - 1);
        if (index == NULL)
            return -1;
        PyObject *r = PyObject_CallOneArg(self->on_commit, index);
        Py_DECREF(index);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

static int
commit_pending(Core *self)
{
    if (!self->has_pending)
        return 0;
    self->has_pending = 0;
    return append(self, &self->pending);
}

static int
commit_open(Core *self, int64_t now)
{
    Ended step = {0};
    int status = snapshot(self, now, &step);
    PyMem_Free(step.optimizers.items);
    step.optimizers.items = NULL;
    if (status == 0)
        status = append(self, &step);
    else
        Py_CLEAR(step.events);
    reset_step(self);
    self->has_start = 1;
    self->start = self->last = now;
    return status;
}

static int
fallback_step_done(Core *self, int by_batch)
{
    if (self->mode > M_BACKWARD || !self->has_start || self->stack_len)
        return 0;
    if (self->mode == M_BACKWARD)
        return self->backward_done;
    return by_batch ? self->batches != 0 : (self->lead_done && !self->batches);
}

static int
commit_fallback(Core *self, int64_t now)
{
    if (self->mode == M_BATCH && !self->batches && self->lead_done)
        self->mode = M_FORWARD;
    if (mark(self, now) < 0)
        return -1;
    int status = commit_open(self, now);
    self->batch_mode_rows++;
    return status;
}

static int
call_at_boundary(Core *self)
{
    if (self->at_boundary == NULL)
        return 0;
    PyObject *r = PyObject_CallNoArgs(self->at_boundary);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static int
batch_requested(Core *self, int64_t now)
{
    if (self->has_pending) {
        if (commit_pending(self) < 0)
            return -1;
    }
    else if (self->mode != M_OPTIMIZER && fallback_step_done(self, 1)) {
        if (commit_fallback(self, now) < 0)
            return -1;
    }
    return call_at_boundary(self);
}

static int
model_forward_started(Core *self, int64_t now, uint64_t key, int grad_enabled)
{
    self->model_forwards++;
    if (!grad_enabled)
        self->model_forwards_no_grad++;
    if (self->mode > M_BACKWARD)
        return 0;
    if ((self->has_lead && self->lead == key) || self->backward_done) {
        if (fallback_step_done(self, 0) && commit_fallback(self, now) < 0)
            return -1;
    }
    if (!self->has_lead) {
        self->has_lead = 1;
        self->lead = key;
    }
    return 0;
}

static void
batch_received(Core *self, long long batch_len)
{
    self->batches++;
    if (batch_len >= 0)
        self->samples += batch_len;
    else
        self->samples_known = 0;
}

static int
merge_pending_into_open(Core *self, int64_t now)
{
    if (!self->has_pending)
        return 0;
    self->has_pending = 0;
    Ended *p = &self->pending;
    PyObject *events = p->events;
    p->events = NULL;
    if (mark(self, now) < 0) {
        Py_XDECREF(events);
        return -1;
    }
    for (int i = 0; i < NPHASES; i++)
        self->acc[i] += p->acc[i];
    self->overlap += p->overlap;
    self->init += p->init;
    if (p->wait_cpu < 0)
        self->wait_cpu_known = 0;
    self->wait_cpu += p->wait_cpu > 0 ? p->wait_cpu : 0;
    self->batches += p->batches;
    if (p->samples < 0)
        self->samples_known = 0;
    self->samples += p->samples > 0 ? p->samples : 0;
    self->opt_steps += p->opt_steps;
    /* the open step's optimizers, then the pending step's new ones */
    IdList merged = {0};
    for (Py_ssize_t i = 0; i < self->optimizers.len; i++)
        if (ids_add(&merged, self->optimizers.items[i]) < 0)
            goto fail;
    for (Py_ssize_t i = 0; i < p->optimizers.len; i++)
        if (ids_add(&merged, p->optimizers.items[i]) < 0)
            goto fail;
    PyMem_Free(self->optimizers.items);
    self->optimizers = merged;
    self->start = p->start;
    self->has_start = 1;
    if (self->device != NULL && events != NULL) {
        PyObject *current = PyObject_GetAttrString(self->device, "current");
        if (current == NULL)
            goto fail_events;
        int status = PySequence_SetSlice(current, 0, 0, events);
        Py_DECREF(current);
        if (status < 0)
            goto fail_events;
    }
    Py_XDECREF(events);
    return 0;
fail:
    PyMem_Free(merged.items);
fail_events:
    Py_XDECREF(events);
    return -1;
}

static int
absorb_batch_mode_rows(Core *self)
{
    Py_ssize_t rows = (Py_ssize_t)self->batch_mode_rows;
    self->batch_mode_rows = 0;
    if (!rows)
        return 0;
    Py_ssize_t first = self->count - rows;
    static const int phase_column[NPHASES] = {R_OTHER, R_WAIT, R_FORWARD, R_BACKWARD, R_OPTIMIZER, R_COMM, R_COMPILE};
    for (Py_ssize_t r = first; r < self->count; r++) {
        const int64_t *row = self->rows + r * WIDTH;
        for (int i = 0; i < NPHASES; i++)
            self->acc[i] += row[phase_column[i]];
        self->overlap += row[R_OVERLAP];
        self->init += row[R_INIT];
        if (row[R_WAIT_CPU] < 0)
            self->wait_cpu_known = 0;
        else
            self->wait_cpu += row[R_WAIT_CPU];
        self->batches += row[R_BATCHES];
        if (row[R_SAMPLES] < 0)
            self->samples_known = 0;
        else
            self->samples += row[R_SAMPLES];
    }
    self->start = self->rows[first * WIDTH + R_START];
    self->has_start = 1;
    self->count = first;
    PyObject *r = PyObject_CallMethod((PyObject *)self, "_truncate_device_columns", "n", first);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static int
optimizer_started(Core *self, int64_t now, int64_t id)
{
    if (self->has_pending) {
        if (ids_contains(&self->pending.optimizers, id)) {
            if (commit_pending(self) < 0)
                return -1;
        }
        else if (merge_pending_into_open(self, now) < 0) /* another optimizer of the same iteration */
            return -1;
    }
    if (call_at_boundary(self) < 0)
        return -1;
    return do_enter(self, OPTIMIZER, now);
}

static int
optimizer_finished(Core *self, int64_t now, int64_t id)
{
    if (do_leave(self, OPTIMIZER, now) < 0)
        return -1;
    self->opt_steps++;
    self->optimizer_steps++;
    if (ids_add(&self->optimizers, id) < 0)
        return -1;
    if (self->mode == M_EXPLICIT)
        return 0;
    if (self->mode <= M_BACKWARD) {
        self->mode = M_OPTIMIZER;
        if (absorb_batch_mode_rows(self) < 0)
            return -1;
    }
    if (mark(self, now) < 0)
        return -1;
    if (self->has_pending) { /* cannot happen (a pending step is settled when an optimizer starts) */
        Py_CLEAR(self->pending.events);
        self->has_pending = 0;
    }
    if (snapshot(self, now, &self->pending) < 0)
        return -1;
    self->has_pending = 1;
    reset_step(self);
    self->has_start = 1;
    self->start = self->last = now;
    return 0;
}

/* -- Python methods ----------------------------------------------------------------------- */
#define NOW_OR_FAIL(now)              \
    int64_t now;                      \
    if (read_clock(self, &now) < 0)   \
        return NULL;

static int
parse_phase(PyObject *arg, int *phase)
{
    long value = PyLong_AsLong(arg);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (value < 0 || value >= NPHASES) {
        PyErr_Format(PyExc_ValueError, "unknown phase %ld", value);
        return -1;
    }
    *phase = (int)value;
    return 0;
}

static PyObject *
Core_enter(Core *self, PyObject *arg)
{
    int phase;
    if (parse_phase(arg, &phase) < 0)
        return NULL;
    NOW_OR_FAIL(now);
    if (!foreign(self) && do_enter(self, phase, now) < 0)
        return NULL;
    return PyLong_FromLongLong(now);
}

static PyObject *
Core_leave(Core *self, PyObject *arg)
{
    int phase;
    if (parse_phase(arg, &phase) < 0)
        return NULL;
    NOW_OR_FAIL(now);
    if (!foreign(self) && do_leave(self, phase, now) < 0)
        return NULL;
    return PyLong_FromLongLong(now);
}

/* The hot calls as C functions (the methods below and the frame-less hooks share them): each
 * reads the clock into *now and returns 0, or -1 with an exception. */
static int
fetch_begin_at(Core *self, int64_t *now)
{
    if (read_clock(self, now) < 0)
        return -1;
    if (!foreign(self) && (batch_requested(self, *now) < 0 || do_enter(self, DATA_WAIT, *now) < 0))
        return -1;
    return 0;
}

static int
fetch_end_at(Core *self, long long cpu, long long batch_len, int64_t *now)
{
    if (read_clock(self, now) < 0)
        return -1;
    if (foreign(self))
        return 0;
    if (cpu >= 0)
        self->wait_cpu += cpu;
    else
        self->wait_cpu_known = 0;
    if (do_leave(self, DATA_WAIT, *now) < 0)
        return -1;
    batch_received(self, batch_len);
    return 0;
}

static int
forward_begin_at(Core *self, uint64_t key, int grad, int64_t *now)
{
    if (read_clock(self, now) < 0)
        return -1;
    if (foreign(self))
        return 0;
    if (key && model_forward_started(self, *now, key, grad) < 0)
        return -1;
    return do_enter(self, FORWARD, *now);
}

static int
forward_end_at(Core *self, uint64_t key, int64_t *now)
{
    if (read_clock(self, now) < 0)
        return -1;
    if (foreign(self))
        return 0;
    if (do_leave(self, FORWARD, *now) < 0)
        return -1;
    if (key && self->has_lead && key == self->lead)
        self->lead_done = 1;
    return 0;
}

static PyObject *
Core_fetch_begin(Core *self, PyObject *Py_UNUSED(ignored))
{
    int64_t now;
    if (fetch_begin_at(self, &now) < 0)
        return NULL;
    return PyLong_FromLongLong(now);
}

static PyObject *
Core_fetch_end(Core *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "fetch_end(cpu_ns, batch_len)");
        return NULL;
    }
    long long cpu = PyLong_AsLongLong(args[0]);
    if (cpu == -1 && PyErr_Occurred())
        return NULL;
    long long batch_len = PyLong_AsLongLong(args[1]);
    if (batch_len == -1 && PyErr_Occurred())
        return NULL;
    int64_t now;
    if (fetch_end_at(self, cpu, batch_len, &now) < 0)
        return NULL;
    return PyLong_FromLongLong(now);
}

static PyObject *
Core_forward_begin(Core *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "forward_begin(key, grad_enabled)");
        return NULL;
    }
    int error = 0;
    uint64_t key = (uint64_t)as_key(args[0], &error);
    if (error)
        return NULL;
    int grad = PyObject_IsTrue(args[1]);
    if (grad < 0)
        return NULL;
    int64_t now;
    if (forward_begin_at(self, key, grad, &now) < 0)
        return NULL;
    return PyLong_FromLongLong(now);
}

static PyObject *
Core_forward_end(Core *self, PyObject *arg)
{
    int error = 0;
    uint64_t key = (uint64_t)as_key(arg, &error);
    if (error)
        return NULL;
    int64_t now;
    if (forward_end_at(self, key, &now) < 0)
        return NULL;
    return PyLong_FromLongLong(now);
}

static PyObject *
Core_optimizer_started(Core *self, PyObject *arg)
{
    int error = 0;
    int64_t id = as_key(arg, &error);
    if (error)
        return NULL;
    NOW_OR_FAIL(now);
    if (!foreign(self) && optimizer_started(self, now, id) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
Core_optimizer_finished(Core *self, PyObject *arg)
{
    int error = 0;
    int64_t id = as_key(arg, &error);
    if (error)
        return NULL;
    NOW_OR_FAIL(now);
    if (!foreign(self) && optimizer_finished(self, now, id) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
Core_batch_requested(Core *self, PyObject *Py_UNUSED(ignored))
{
    NOW_OR_FAIL(now);
    if (!foreign(self) && batch_requested(self, now) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
Core_batch_received(Core *self, PyObject *arg)
{
    long long batch_len = PyLong_AsLongLong(arg);
    if (batch_len == -1 && PyErr_Occurred())
        return NULL;
    if (!foreign(self))
        batch_received(self, batch_len);
    Py_RETURN_NONE;
}

static PyObject *
Core_model_forward_started(Core *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"key", "grad_enabled", NULL};
    PyObject *key_obj, *grad_obj = Py_True;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O", keywords, &key_obj, &grad_obj))
        return NULL;
    int error = 0;
    uint64_t key = (uint64_t)as_key(key_obj, &error);
    if (error)
        return NULL;
    int grad = PyObject_IsTrue(grad_obj);
    if (grad < 0)
        return NULL;
    NOW_OR_FAIL(now);
    if (!foreign(self) && model_forward_started(self, now, key, grad) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
Core_model_forward_finished(Core *self, PyObject *arg)
{
    int error = 0;
    uint64_t key = (uint64_t)as_key(arg, &error);
    if (error)
        return NULL;
    if (!foreign(self) && self->has_lead && key == self->lead)
        self->lead_done = 1;
    Py_RETURN_NONE;
}

static PyObject *
Core_loader_init(Core *self, PyObject *arg)
{
    long long value = PyLong_AsLongLong(arg);
    if (value == -1 && PyErr_Occurred())
        return NULL;
    if (!foreign(self))
        self->init += value;
    Py_RETURN_NONE;
}

static PyObject *
Core_loader_cpu(Core *self, PyObject *arg)
{
    long long value = PyLong_AsLongLong(arg);
    if (value == -1 && PyErr_Occurred())
        return NULL;
    if (!foreign(self))
        self->wait_cpu += value;
    Py_RETURN_NONE;
}

static PyObject *
Core_add_overlap(Core *self, PyObject *arg)
{
    long long value = PyLong_AsLongLong(arg);
    if (value == -1 && PyErr_Occurred())
        return NULL;
    self->overlap += value > 0 ? value : 0;
    Py_RETURN_NONE;
}

static PyObject *
Core_mark_step(Core *self, PyObject *Py_UNUSED(ignored))
{
    NOW_OR_FAIL(now);
    if (foreign(self))
        Py_RETURN_NONE;
    if (self->mode != M_EXPLICIT) {
        if (commit_pending(self) < 0)
            return NULL;
        self->mode = M_EXPLICIT;
    }
    if (!self->has_start) {
        self->has_start = 1;
        self->start = self->last = now;
        Py_RETURN_NONE;
    }
    if (mark(self, now) < 0 || commit_open(self, now) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
Core_finish(Core *self, PyObject *Py_UNUSED(ignored))
{
    NOW_OR_FAIL(now);
    if (commit_pending(self) < 0)
        return NULL;
    self->stack_len = 0; /* phases left open by an exception: the step ends here */
    if (fallback_step_done(self, self->batches != 0)) {
        if (commit_fallback(self, now) < 0)
            return NULL;
    }
    else if (self->has_start) {
        if (mark(self, now) < 0)
            return NULL;
        self->trailing_ns = now - self->start;
    }
    int had_start = self->has_start;
    self->has_start = 0;
    if (had_start && self->listener != NULL && call_listener(self, "stop", "step") < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
Core_in_data_wait(Core *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(self->phase == DATA_WAIT);
}

static PyObject *
Core_current_phase(Core *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(self->phase);
}

static PyObject *
Core_row_bytes(Core *self, PyObject *Py_UNUSED(ignored))
{
    return PyBytes_FromStringAndSize((const char *)self->rows, self->count * WIDTH * (Py_ssize_t)sizeof(int64_t));
}

static PyObject *
Core_row_value(Core *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "row_value(column, index)");
        return NULL;
    }
    Py_ssize_t column = PyLong_AsSsize_t(args[0]), index = PyLong_AsSsize_t(args[1]);
    if ((column == -1 || index == -1) && PyErr_Occurred())
        return NULL;
    if (index < 0)
        index += self->count;
    if (column < 0 || column >= WIDTH || index < 0 || index >= self->count) {
        PyErr_SetString(PyExc_IndexError, "no such step or column");
        return NULL;
    }
    return PyLong_FromLongLong(self->rows[index * WIDTH + column]);
}

static PyMethodDef Core_methods[] = {
    {"enter", (PyCFunction)Core_enter, METH_O, "Open a phase; returns the timestamp used."},
    {"leave", (PyCFunction)Core_leave, METH_O, "Close a phase; returns the timestamp used."},
    {"fetch_begin", (PyCFunction)Core_fetch_begin, METH_NOARGS, "A batch is requested: may end a step; data wait."},
    {"fetch_end", (PyCFunction)(void (*)(void))Core_fetch_end, METH_FASTCALL, "The batch arrived."},
    {"forward_begin", (PyCFunction)(void (*)(void))Core_forward_begin, METH_FASTCALL, "A root forward begins."},
    {"forward_end", (PyCFunction)Core_forward_end, METH_O, "The root forward returned."},
    {"optimizer_started", (PyCFunction)Core_optimizer_started, METH_O, "An optimizer step begins."},
    {"optimizer_finished", (PyCFunction)Core_optimizer_finished, METH_O, "An optimizer step ended."},
    {"batch_requested", (PyCFunction)Core_batch_requested, METH_NOARGS, "A batch is requested."},
    {"batch_received", (PyCFunction)Core_batch_received, METH_O, "A batch of n samples (-1: unknown) arrived."},
    {"model_forward_started", (PyCFunction)(void (*)(void))Core_model_forward_started, METH_VARARGS | METH_KEYWORDS,
     "A root forward of the model begins."},
    {"model_forward_finished", (PyCFunction)Core_model_forward_finished, METH_O, "The model's root forward ended."},
    {"loader_init", (PyCFunction)Core_loader_init, METH_O, "DataLoader start-up time (ns)."},
    {"loader_cpu", (PyCFunction)Core_loader_cpu, METH_O, "CPU time of the training thread inside a fetch (ns)."},
    {"add_overlap", (PyCFunction)Core_add_overlap, METH_O, "Collective time concurrent with another phase (ns)."},
    {"mark_step", (PyCFunction)Core_mark_step, METH_NOARGS, "Explicit step end (library API)."},
    {"finish", (PyCFunction)Core_finish, METH_NOARGS, "End of capture."},
    {"in_data_wait", (PyCFunction)Core_in_data_wait, METH_NOARGS, "Inside next(loader) right now."},
    {"current_phase", (PyCFunction)Core_current_phase, METH_NOARGS, "The innermost open phase."},
    {"row_bytes", (PyCFunction)Core_row_bytes, METH_NOARGS, "The committed rows (int64, native order)."},
    {"row_value", (PyCFunction)(void (*)(void))Core_row_value, METH_FASTCALL, "One committed value."},
    {NULL, NULL, 0, NULL},
};

/* -- attributes --------------------------------------------------------------------------- */
static PyObject *
get_object(PyObject *value)
{
    return Py_NewRef(value != NULL ? value : Py_None);
}

static int
set_object(PyObject **slot, PyObject *value)
{
    PyObject *old = *slot;
    *slot = (value == NULL || value == Py_None) ? NULL : Py_NewRef(value);
    Py_XDECREF(old);
    return 0;
}

#define OBJECT_ATTR(name)                                                                  \
    static PyObject *get_##name(Core *self, void *c) { return get_object(self->name); }   \
    static int set_##name(Core *self, PyObject *v, void *c) { return set_object(&self->name, v); }
OBJECT_ATTR(clock)
OBJECT_ATTR(listener)
OBJECT_ATTR(on_commit)
OBJECT_ATTR(at_boundary)
OBJECT_ATTR(device)
OBJECT_ATTR(comm)

static PyObject *
get_mode(Core *self, void *c)
{
    return PyUnicode_FromString(MODE_NAMES[self->mode]);
}

static int
set_mode(Core *self, PyObject *value, void *c)
{
    for (int i = 0; i < NMODES; i++) {
        if (value != NULL && PyUnicode_Check(value) && PyUnicode_CompareWithASCIIString(value, MODE_NAMES[i]) == 0) {
            self->mode = i;
            return 0;
        }
    }
    PyErr_SetString(PyExc_ValueError, "mode must be one of batch, forward, backward, optimizer, explicit");
    return -1;
}

static PyObject *
get_phase(Core *self, void *c)
{
    return PyLong_FromLong(self->phase);
}

static int
set_phase(Core *self, PyObject *value, void *c)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "cannot delete _phase");
        return -1;
    }
    return parse_phase(value, &self->phase);
}

static PyObject *
get_count(Core *self, void *c)
{
    return PyLong_FromSsize_t(self->count);
}

static PyObject *
get_pending(Core *self, void *c)
{
    return PyBool_FromLong(self->has_pending);
}

static PyGetSetDef Core_getset[] = {
    {"clock", (getter)get_clock, (setter)set_clock, "nanosecond clock (None: the native monotonic one)", NULL},
    {"listener", (getter)get_listener, (setter)set_listener, "phase listener", NULL},
    {"on_commit", (getter)get_on_commit, (setter)set_on_commit, "called with the index of each committed step", NULL},
    {"at_boundary", (getter)get_at_boundary, (setter)set_at_boundary, "called at batch requests and optimizer starts", NULL},
    {"device", (getter)get_device, (setter)set_device, "DeviceTimer or None", NULL},
    {"comm", (getter)get_comm, (setter)set_comm, "collective timing or None", NULL},
    {"mode", (getter)get_mode, (setter)set_mode, "step boundary mode", NULL},
    {"_phase", (getter)get_phase, (setter)set_phase, "innermost open phase", NULL},
    {"count", (getter)get_count, NULL, "committed steps", NULL},
    {"has_pending", (getter)get_pending, NULL, "an ended step awaits its commit", NULL},
    {NULL},
};

static PyMemberDef Core_members[] = {
    {"owner_thread", T_ULONG, offsetof(Core, owner_thread), READONLY, "the thread whose calls are recorded"},
    {"foreign_thread_calls", T_LONGLONG, offsetof(Core, foreign_thread_calls), 0, "calls from other threads (ignored)"},
    {"trailing_ns", T_LONGLONG, offsetof(Core, trailing_ns), 0, "the unfinished tail"},
    {"backwards", T_LONGLONG, offsetof(Core, backwards), 0, "outermost backward() calls"},
    {"model_forwards", T_LONGLONG, offsetof(Core, model_forwards), 0, "root forwards of the model"},
    {"model_forwards_no_grad", T_LONGLONG, offsetof(Core, model_forwards_no_grad), 0, "... under no_grad"},
    {"optimizer_steps", T_LONGLONG, offsetof(Core, optimizer_steps), 0, "optimizer steps"},
    {"unseen_forward_steps", T_LONGLONG, offsetof(Core, unseen_forward_steps), 0,
     "committed steps with a backward and no forward timed (a root module capture does not wrap)"},
    {"next_commit_call", T_PYSSIZET, offsetof(Core, next_commit_call), 0,
     "on_commit is called only for committed step indexes >= this (0: every commit)"},
    {"forward_depth", T_INT, offsetof(Core, forward_depth), 0,
     "non-zero while a root forward runs (the forward wrappers let the calls inside it through)"},
    {"__dictoffset__", T_PYSSIZET, offsetof(Core, dict), READONLY},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(Core, weakreflist), READONLY},
    {NULL},
};

/* -- lifecycle ---------------------------------------------------------------------------- */
static int
Core_init(Core *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"clock", "phase_listener", NULL};
    PyObject *clock = Py_None, *listener = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO", keywords, &clock, &listener))
        return -1;
    set_object(&self->clock, clock);
#ifndef NATIVE_CLOCK
    if (self->clock == NULL) { /* time.perf_counter_ns itself */
        PyObject *time = PyImport_ImportModule("time");
        if (time == NULL)
            return -1;
        self->clock = PyObject_GetAttrString(time, "perf_counter_ns");
        Py_DECREF(time);
        if (self->clock == NULL)
            return -1;
    }
#endif
    set_object(&self->listener, listener);
    self->owner_thread = PyThread_get_thread_ident();
    self->mode = M_BATCH;
    self->phase = OTHER;
    reset_step(self);
    return 0;
}

static int
Core_traverse(Core *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->clock);
    Py_VISIT(self->listener);
    Py_VISIT(self->on_commit);
    Py_VISIT(self->at_boundary);
    Py_VISIT(self->device);
    Py_VISIT(self->comm);
    Py_VISIT(self->pending.events);
    Py_VISIT(self->dict);
    return 0;
}

static int
Core_clear(Core *self)
{
    Py_CLEAR(self->clock);
    Py_CLEAR(self->listener);
    Py_CLEAR(self->on_commit);
    Py_CLEAR(self->at_boundary);
    Py_CLEAR(self->device);
    Py_CLEAR(self->comm);
    Py_CLEAR(self->pending.events);
    Py_CLEAR(self->dict);
    return 0;
}

static void
Core_dealloc(Core *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    Core_clear(self);
    PyMem_Free(self->rows);
    PyMem_Free(self->stack);
    PyMem_Free(self->optimizers.items);
    PyMem_Free(self->pending.optimizers.items);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyType_Slot Core_slots[] = {
    {Py_tp_doc, "The step recorder's state machine (see stepscope.capture.recorder)."},
    {Py_tp_init, Core_init},
    {Py_tp_dealloc, Core_dealloc},
    {Py_tp_traverse, Core_traverse},
    {Py_tp_clear, Core_clear},
    {Py_tp_methods, Core_methods},
    {Py_tp_getset, Core_getset},
    {Py_tp_members, Core_members},
    {0, NULL},
};

static PyType_Spec Core_spec = {
    .name = "stepscope.capture._fastrec.Core",
    .basicsize = sizeof(Core),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = Core_slots,
};

/* ---------------------------------------------------------------------------------------------
 * PhaseCall: a callable that times a phase around another callable, with no Python frame.
 *
 * PhaseCall(original, core, gate, phase): calling it calls original(*args, **kwargs) inside the
 * phase `phase` of `core` (enter before, leave after, also when original raises), when
 * `gate.live` is true and the call comes from the core's thread; otherwise it calls original
 * alone. Capture's backward() wrapper is one (capture/hooks.py): a Python wrapper costs a frame
 * per call and shows in the script's tracebacks; this costs neither.
 * ------------------------------------------------------------------------------------------- */

static PyTypeObject *CoreTypePtr = NULL;
static PyObject *LIVE = NULL; /* interned "live" */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original;
    Core *core;
    PyObject *gate;
    int phase;
    PyObject *dict;
    PyObject *weakreflist;
} PhaseCall;

static PyObject *
PhaseCall_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PhaseCall *self = (PhaseCall *)callable;
    PyObject *live = PyObject_GetAttr(self->gate, LIVE);
    if (live == NULL)
        return NULL;
    int on = PyObject_IsTrue(live);
    Py_DECREF(live);
    if (on < 0)
        return NULL;
    Core *core = self->core;
    if (!on || foreign(core))
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    int64_t now;
    if (read_clock(core, &now) < 0 || do_enter(core, self->phase, now) < 0)
        return NULL;
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    PyObject *type, *value, *traceback;
    if (result == NULL)
        PyErr_Fetch(&type, &value, &traceback);
    int left = read_clock(core, &now) < 0 ? -1 : do_leave(core, self->phase, now);
    if (result == NULL) {
        if (left < 0)
            PyErr_Clear(); /* the call's own exception is the one to see */
        PyErr_Restore(type, value, traceback);
        return NULL;
    }
    if (left < 0) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

static int
PhaseCall_init(PhaseCall *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"original", "core", "gate", "phase", NULL};
    PyObject *original, *core, *gate;
    int phase;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOi", keywords, &original, &core, &gate, &phase))
        return -1;
    if (!PyCallable_Check(original)) {
        PyErr_SetString(PyExc_TypeError, "PhaseCall: original must be callable");
        return -1;
    }
    if (CoreTypePtr == NULL || !PyObject_TypeCheck(core, CoreTypePtr)) {
        PyErr_SetString(PyExc_TypeError, "PhaseCall: core must be a _fastrec.Core");
        return -1;
    }
    if (phase < 0 || phase >= NPHASES) {
        PyErr_Format(PyExc_ValueError, "unknown phase %d", phase);
        return -1;
    }
    Py_INCREF(original);
    Py_XSETREF(self->original, original);
    Py_INCREF(core);
    Py_XSETREF(self->core, (Core *)core);
    Py_INCREF(gate);
    Py_XSETREF(self->gate, gate);
    self->phase = phase;
    self->vectorcall = PhaseCall_vectorcall;
    return 0;
}

static int
PhaseCall_traverse(PhaseCall *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->original);
    Py_VISIT(self->core);
    Py_VISIT(self->gate);
    Py_VISIT(self->dict);
    return 0;
}

static int
PhaseCall_clear(PhaseCall *self)
{
    Py_CLEAR(self->original);
    Py_CLEAR(self->core);
    Py_CLEAR(self->gate);
    Py_CLEAR(self->dict);
    return 0;
}

static void
PhaseCall_dealloc(PhaseCall *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    PhaseCall_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyMemberDef PhaseCall_members[] = {
    {"original", T_OBJECT, offsetof(PhaseCall, original), READONLY, "the callable timed"},
    {"phase", T_INT, offsetof(PhaseCall, phase), READONLY, "the phase it runs in"},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(PhaseCall, vectorcall), READONLY, NULL},
    {"__dictoffset__", T_PYSSIZET, offsetof(PhaseCall, dict), READONLY, NULL},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(PhaseCall, weakreflist), READONLY, NULL},
    {NULL},
};

static PyType_Slot PhaseCall_slots[] = {
    {Py_tp_doc, "original(*args, **kwargs) inside a phase of a Core, with no Python frame."},
    {Py_tp_init, PhaseCall_init},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_dealloc, PhaseCall_dealloc},
    {Py_tp_traverse, PhaseCall_traverse},
    {Py_tp_clear, PhaseCall_clear},
    {Py_tp_members, PhaseCall_members},
    {0, NULL},
};

static PyType_Spec PhaseCall_spec = {
    .name = "stepscope.capture._fastrec.PhaseCall",
    .basicsize = sizeof(PhaseCall),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = PhaseCall_slots,
};

/* ---------------------------------------------------------------------------------------------
 * OptimizerHook: torch.optim's global step pre/post hook, with no Python frame.
 *
 * OptimizerHook(core, gate, started, on_new=None): called by torch as hook(optimizer, args,
 * kwargs); when `gate.live`, marks the optimizer step started (or finished) in `core`, keyed by
 * id(optimizer). A pre hook calls on_new(optimizer) when a different optimizer steps than the
 * last one (capture keeps a weak reference to it).
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Core *core;
    PyObject *gate;
    PyObject *on_new;
    int started;
    int64_t last_key;
} OptimizerHook;

static PyObject *
OptimizerHook_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    OptimizerHook *self = (OptimizerHook *)callable;
    (void)kwnames; /* torch passes (optimizer, args, kwargs) positionally */
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "optimizer hook: hook(optimizer, args, kwargs)");
        return NULL;
    }
    PyObject *live = PyObject_GetAttr(self->gate, LIVE);
    if (live == NULL)
        return NULL;
    int on = PyObject_IsTrue(live);
    Py_DECREF(live);
    if (on < 0)
        return NULL;
    if (!on)
        Py_RETURN_NONE;
    PyObject *optimizer = args[0];
    int64_t key = (int64_t)(intptr_t)optimizer;
    if (self->started && key != self->last_key) {
        self->last_key = key;
        if (self->on_new != Py_None) {
            PyObject *result = PyObject_CallOneArg(self->on_new, optimizer);
            if (result == NULL)
                return NULL;
            Py_DECREF(result);
        }
    }
    Core *core = self->core;
    int64_t now;
    if (read_clock(core, &now) < 0)
        return NULL;
    if (!foreign(core)) {
        if ((self->started ? optimizer_started(core, now, key) : optimizer_finished(core, now, key)) < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

static int
OptimizerHook_init(OptimizerHook *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"core", "gate", "started", "on_new", NULL};
    PyObject *core, *gate, *on_new = Py_None;
    int started;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOp|O", keywords, &core, &gate, &started, &on_new))
        return -1;
    if (CoreTypePtr == NULL || !PyObject_TypeCheck(core, CoreTypePtr)) {
        PyErr_SetString(PyExc_TypeError, "OptimizerHook: core must be a _fastrec.Core");
        return -1;
    }
    Py_INCREF(core);
    Py_XSETREF(self->core, (Core *)core);
    Py_INCREF(gate);
    Py_XSETREF(self->gate, gate);
    Py_INCREF(on_new);
    Py_XSETREF(self->on_new, on_new);
    self->started = started;
    self->last_key = 0;
    self->vectorcall = OptimizerHook_vectorcall;
    return 0;
}

static int
OptimizerHook_traverse(OptimizerHook *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->core);
    Py_VISIT(self->gate);
    Py_VISIT(self->on_new);
    return 0;
}

static int
OptimizerHook_clear(OptimizerHook *self)
{
    Py_CLEAR(self->core);
    Py_CLEAR(self->gate);
    Py_CLEAR(self->on_new);
    return 0;
}

static void
OptimizerHook_dealloc(OptimizerHook *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    OptimizerHook_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyMemberDef OptimizerHook_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(OptimizerHook, vectorcall), READONLY, NULL},
    {NULL},
};

static PyType_Slot OptimizerHook_slots[] = {
    {Py_tp_doc, "torch.optim's global step pre/post hook recording into a Core, with no Python frame."},
    {Py_tp_init, OptimizerHook_init},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_dealloc, OptimizerHook_dealloc},
    {Py_tp_traverse, OptimizerHook_traverse},
    {Py_tp_clear, OptimizerHook_clear},
    {Py_tp_members, OptimizerHook_members},
    {0, NULL},
};

static PyType_Spec OptimizerHook_spec = {
    .name = "stepscope.capture._fastrec.OptimizerHook",
    .basicsize = sizeof(OptimizerHook),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = OptimizerHook_slots,
};

/* ---------------------------------------------------------------------------------------------
 * ForwardCall and NextCall: capture's root-forward and DataLoader __next__ wrappers, with no
 * Python frame (capture/hooks.py has the same wrappers in Python, for the Python core).
 *
 * Both are set as class attributes (a root module class's __call__, the loader iterator's
 * __next__): they bind like functions (a method descriptor; `obj.attr` gives a bound method) and
 * are called with the instance first.
 * ------------------------------------------------------------------------------------------- */

static PyObject *IS_COMPILING = NULL; /* interned "_is_compiling_flag" */
static PyObject *LOADER_INFO = NULL;  /* "_stepscope_loader" */
static PyObject *IN_PROCESS = NULL, *BATCHES = NULL, *WAIT_NS = NULL;

static PyObject *
bind_like_function(PyObject *self, PyObject *obj, PyObject *Py_UNUSED(type))
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

/* the truth of gate.live; -1 with an exception */
static int
gate_live(PyObject *gate)
{
    PyObject *live = PyObject_GetAttr(gate, LIVE);
    if (live == NULL)
        return -1;
    int on = PyObject_IsTrue(live);
    Py_DECREF(live);
    return on;
}

/* leave a hook after `result` (NULL: the wrapped call raised): `left` < 0 is the hook's own
 * failure, reported only when the call itself succeeded (its exception is the one to see) */
static PyObject *
finish_call(PyObject *result, PyObject *type, PyObject *value, PyObject *traceback, int left)
{
    if (result == NULL) {
        if (left < 0)
            PyErr_Clear();
        PyErr_Restore(type, value, traceback);
        return NULL;
    }
    if (left < 0) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original, *gate, *keys, *compiler, *grad_enabled, *has_parameters, *roots;
    Core *core;
    PyObject *dict;
    PyObject *weakreflist;
} ForwardCall;

/* the module's key: its id when it holds parameters (the model), else 0 (a loss module); found
 * once per module and kept in `keys` by id with a weak reference, as the Python wrapper does */
static int
module_key(ForwardCall *self, PyObject *module, uint64_t *key)
{
    PyObject *id = PyLong_FromVoidPtr(module);
    if (id == NULL)
        return -1;
    PyObject *known = PyDict_GetItemWithError(self->keys, id); /* borrowed */
    if (known != NULL && PyTuple_CheckExact(known) && PyTuple_GET_SIZE(known) == 2
        && PyWeakref_Check(PyTuple_GET_ITEM(known, 0))
        && PyWeakref_GET_OBJECT(PyTuple_GET_ITEM(known, 0)) == module) {
        Py_DECREF(id);
        int error = 0;
        *key = (uint64_t)as_key(PyTuple_GET_ITEM(known, 1), &error);
        return error ? -1 : 0;
    }
    if (known == NULL && PyErr_Occurred()) {
        Py_DECREF(id);
        return -1;
    }
    PyObject *has = PyObject_CallOneArg(self->has_parameters, module);
    int holds = has == NULL ? -1 : PyObject_IsTrue(has);
    Py_XDECREF(has);
    if (holds < 0) {
        Py_DECREF(id);
        return -1;
    }
    *key = holds ? (uint64_t)(uintptr_t)module : 0;
    PyObject *ref = PyWeakref_NewRef(module, NULL);
    if (ref == NULL) { /* not weakly referenceable: looked up every call */
        Py_DECREF(id);
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    PyObject *entry = Py_BuildValue("(NK)", ref, (unsigned long long)*key);
    int stored = entry == NULL ? -1 : PyDict_SetItem(self->keys, id, entry);
    Py_XDECREF(entry);
    Py_DECREF(id);
    return stored;
}

static PyObject *
ForwardCall_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    ForwardCall *self = (ForwardCall *)callable;
    Core *core = self->core;
    if (PyVectorcall_NARGS(nargsf) < 1 || core->forward_depth)
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    int on = gate_live(self->gate);
    if (on < 0)
        return NULL;
    if (on) {
        PyObject *flag = PyObject_GetAttr(self->compiler, IS_COMPILING);
        if (flag == NULL)
            return NULL;
        int compiling = PyObject_IsTrue(flag);
        Py_DECREF(flag);
        if (compiling < 0)
            return NULL;
        on = !compiling; /* under torch.compile / torch.export tracing: step aside */
    }
    if (!on)
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    PyObject *module = args[0];
    if (self->roots != Py_None && PySet_Add(self->roots, (PyObject *)Py_TYPE(module)) < 0)
        return NULL;
    uint64_t key;
    if (module_key(self, module, &key) < 0)
        return NULL;
    int grad = 1;
    if (key) {
        PyObject *enabled = PyObject_CallNoArgs(self->grad_enabled);
        grad = enabled == NULL ? -1 : PyObject_IsTrue(enabled);
        Py_XDECREF(enabled);
        if (grad < 0)
            return NULL;
    }
    int64_t now;
    if (forward_begin_at(core, key, grad, &now) < 0)
        return NULL;
    core->forward_depth = 1;
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    core->forward_depth = 0;
    PyObject *type = NULL, *value = NULL, *traceback = NULL;
    if (result == NULL)
        PyErr_Fetch(&type, &value, &traceback);
    return finish_call(result, type, value, traceback, forward_end_at(core, key, &now));
}

static int
ForwardCall_init(ForwardCall *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"original", "core", "gate", "keys", "compiler", "grad_enabled",
                               "has_parameters", "roots", NULL};
    PyObject *original, *core, *gate, *keys, *compiler, *grad_enabled, *has_parameters, *roots = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO!OOO|O", keywords, &original, &core, &gate,
                                     &PyDict_Type, &keys, &compiler, &grad_enabled, &has_parameters, &roots))
        return -1;
    if (!PyCallable_Check(original) || !PyCallable_Check(grad_enabled) || !PyCallable_Check(has_parameters)) {
        PyErr_SetString(PyExc_TypeError, "ForwardCall: original, grad_enabled and has_parameters must be callable");
        return -1;
    }
    if (CoreTypePtr == NULL || !PyObject_TypeCheck(core, CoreTypePtr)) {
        PyErr_SetString(PyExc_TypeError, "ForwardCall: core must be a _fastrec.Core");
        return -1;
    }
    if (roots != Py_None && !PySet_Check(roots)) {
        PyErr_SetString(PyExc_TypeError, "ForwardCall: roots must be a set or None");
        return -1;
    }
    Py_XSETREF(self->original, Py_NewRef(original));
    Py_XSETREF(self->core, (Core *)Py_NewRef(core));
    Py_XSETREF(self->gate, Py_NewRef(gate));
    Py_XSETREF(self->keys, Py_NewRef(keys));
    Py_XSETREF(self->compiler, Py_NewRef(compiler));
    Py_XSETREF(self->grad_enabled, Py_NewRef(grad_enabled));
    Py_XSETREF(self->has_parameters, Py_NewRef(has_parameters));
    Py_XSETREF(self->roots, Py_NewRef(roots));
    self->vectorcall = ForwardCall_vectorcall;
    return 0;
}

static int
ForwardCall_traverse(ForwardCall *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->original);
    Py_VISIT(self->core);
    Py_VISIT(self->gate);
    Py_VISIT(self->keys);
    Py_VISIT(self->compiler);
    Py_VISIT(self->grad_enabled);
    Py_VISIT(self->has_parameters);
    Py_VISIT(self->roots);
    Py_VISIT(self->dict);
    return 0;
}

static int
ForwardCall_clear(ForwardCall *self)
{
    Py_CLEAR(self->original);
    Py_CLEAR(self->core);
    Py_CLEAR(self->gate);
    Py_CLEAR(self->keys);
    Py_CLEAR(self->compiler);
    Py_CLEAR(self->grad_enabled);
    Py_CLEAR(self->has_parameters);
    Py_CLEAR(self->roots);
    Py_CLEAR(self->dict);
    return 0;
}

static void
ForwardCall_dealloc(ForwardCall *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    ForwardCall_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyMemberDef ForwardCall_members[] = {
    {"original", T_OBJECT, offsetof(ForwardCall, original), READONLY, "the __call__ wrapped"},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(ForwardCall, vectorcall), READONLY, NULL},
    {"__dictoffset__", T_PYSSIZET, offsetof(ForwardCall, dict), READONLY, NULL},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(ForwardCall, weakreflist), READONLY, NULL},
    {NULL},
};

static PyType_Slot ForwardCall_slots[] = {
    {Py_tp_doc, "A module class's __call__ timing root forwards in a Core, with no Python frame."},
    {Py_tp_init, ForwardCall_init},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_descr_get, bind_like_function},
    {Py_tp_dealloc, ForwardCall_dealloc},
    {Py_tp_traverse, ForwardCall_traverse},
    {Py_tp_clear, ForwardCall_clear},
    {Py_tp_members, ForwardCall_members},
    {0, NULL},
};

static PyType_Spec ForwardCall_spec = {
    .name = "stepscope.capture._fastrec.ForwardCall",
    .basicsize = sizeof(ForwardCall),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .slots = ForwardCall_slots,
};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original, *gate, *batch_length, *tensor;
    Core *core;
    Py_ssize_t cpu_every;
    PyObject *dict;
    PyObject *weakreflist;
} NextCall;

static int64_t
thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* the leading dimension of a tensor with one, else -2 (not a tensor), -1 (a 0-d tensor), or -3
 * with an exception */
static long long
tensor_length(NextCall *self, PyObject *obj)
{
    if ((PyObject *)Py_TYPE(obj) != self->tensor)
        return -2;
    PyObject *shape = PyObject_GetAttrString(obj, "shape");
    if (shape == NULL)
        return -3;
    long long length = -1;
    if (PyTuple_Check(shape) && PyTuple_GET_SIZE(shape) > 0) {
        length = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, 0));
        if (length == -1 && PyErr_Occurred())
            length = -3;
    }
    Py_DECREF(shape);
    return length;
}

/* batch_length(batch) of capture/hooks.py: a plain tensor, or a tuple/list whose first item is
 * one with a leading dimension, here; anything else by the Python function. Never raises: an
 * odd batch has an unknown length (-1). */
static long long
next_batch_length(NextCall *self, PyObject *batch)
{
    long long length = tensor_length(self, batch);
    if (length == -2 && (PyTuple_CheckExact(batch) || PyList_CheckExact(batch))
        && PySequence_Fast_GET_SIZE(batch) > 0) {
        length = tensor_length(self, PySequence_Fast_GET_ITEM(batch, 0));
        if (length == -1)
            length = -2; /* a 0-d first leaf: the Python rules look further */
    }
    if (length >= -1)
        return length;
    if (length == -2) {
        PyObject *found = PyObject_CallOneArg(self->batch_length, batch);
        length = found == NULL ? -1 : PyLong_AsLongLong(found);
        Py_XDECREF(found);
    }
    if (PyErr_Occurred()) {
        PyErr_Clear();
        length = -1;
    }
    return length;
}

/* info[key] += amount */
static int
add_to_item(PyObject *info, PyObject *key, long long amount)
{
    PyObject *old = PyObject_GetItem(info, key);
    if (old == NULL)
        return -1;
    PyObject *delta = PyLong_FromLongLong(amount);
    PyObject *sum = delta == NULL ? NULL : PyNumber_Add(old, delta);
    Py_DECREF(old);
    Py_XDECREF(delta);
    if (sum == NULL)
        return -1;
    int status = PyObject_SetItem(info, key, sum);
    Py_DECREF(sum);
    return status;
}

static PyObject *
NextCall_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    NextCall *self = (NextCall *)callable;
    Core *core = self->core;
    int on = PyVectorcall_NARGS(nargsf) == 1 && kwnames == NULL ? gate_live(self->gate) : 0;
    if (on < 0)
        return NULL;
    if (!on)
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    int64_t start, end;
    if (fetch_begin_at(core, &start) < 0) /* a batch request may end the previous step */
        return NULL;
    PyObject *info = PyObject_GetAttr(args[0], LOADER_INFO);
    if (info == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
    }
    else if (info == Py_None) {
        Py_CLEAR(info);
    }
    /* the training thread's CPU inside next() (num_workers=0), on one step in cpu_every */
    int measure = 0;
    if (info != NULL && self->cpu_every > 0 && core->count % self->cpu_every == 0) {
        PyObject *in_process = PyObject_GetItem(info, IN_PROCESS);
        measure = in_process == NULL ? -1 : PyObject_IsTrue(in_process);
        Py_XDECREF(in_process);
        if (measure < 0) {
            Py_DECREF(info);
            return NULL;
        }
    }
    int64_t cpu_start = measure ? thread_cpu_ns() : 0;
    /* everything under __next__ is data loading: nn.Module transforms called by the dataset or the
     * collate function are not the model's forward (the forward wrappers let them through) */
    int depth = core->forward_depth;
    core->forward_depth = 1;
    PyObject *batch = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    core->forward_depth = depth;
    if (batch == NULL) { /* StopIteration at the end of an epoch, or the loader's error */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        int left = read_clock(core, &end) < 0 ? -1 : foreign(core) ? 0 : do_leave(core, DATA_WAIT, end);
        Py_XDECREF(info);
        return finish_call(NULL, type, value, traceback, left);
    }
    long long cpu = measure ? (long long)(thread_cpu_ns() - cpu_start) : -1;
    if (fetch_end_at(core, cpu, next_batch_length(self, batch), &end) < 0
        || (info != NULL && (add_to_item(info, BATCHES, 1) < 0 || add_to_item(info, WAIT_NS, end - start) < 0))) {
        Py_XDECREF(info);
        Py_DECREF(batch);
        return NULL;
    }
    Py_XDECREF(info);
    return batch;
}

static int
NextCall_init(NextCall *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"original", "core", "gate", "batch_length", "tensor", "cpu_every", NULL};
    PyObject *original, *core, *gate, *batch_length, *tensor;
    Py_ssize_t cpu_every;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOn", keywords, &original, &core, &gate, &batch_length,
                                     &tensor, &cpu_every))
        return -1;
    if (!PyCallable_Check(original) || !PyCallable_Check(batch_length)) {
        PyErr_SetString(PyExc_TypeError, "NextCall: original and batch_length must be callable");
        return -1;
    }
    if (CoreTypePtr == NULL || !PyObject_TypeCheck(core, CoreTypePtr)) {
        PyErr_SetString(PyExc_TypeError, "NextCall: core must be a _fastrec.Core");
        return -1;
    }
    Py_XSETREF(self->original, Py_NewRef(original));
    Py_XSETREF(self->core, (Core *)Py_NewRef(core));
    Py_XSETREF(self->gate, Py_NewRef(gate));
    Py_XSETREF(self->batch_length, Py_NewRef(batch_length));
    Py_XSETREF(self->tensor, Py_NewRef(tensor));
    self->cpu_every = cpu_every;
    self->vectorcall = NextCall_vectorcall;
    return 0;
}

static int
NextCall_traverse(NextCall *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->original);
    Py_VISIT(self->core);
    Py_VISIT(self->gate);
    Py_VISIT(self->batch_length);
    Py_VISIT(self->tensor);
    Py_VISIT(self->dict);
    return 0;
}

static int
NextCall_clear(NextCall *self)
{
    Py_CLEAR(self->original);
    Py_CLEAR(self->core);
    Py_CLEAR(self->gate);
    Py_CLEAR(self->batch_length);
    Py_CLEAR(self->tensor);
    Py_CLEAR(self->dict);
    return 0;
}

static void
NextCall_dealloc(NextCall *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    NextCall_clear(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyMemberDef NextCall_members[] = {
    {"original", T_OBJECT, offsetof(NextCall, original), READONLY, "the __next__ wrapped"},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(NextCall, vectorcall), READONLY, NULL},
    {"__dictoffset__", T_PYSSIZET, offsetof(NextCall, dict), READONLY, NULL},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(NextCall, weakreflist), READONLY, NULL},
    {NULL},
};

static PyType_Slot NextCall_slots[] = {
    {Py_tp_doc, "A loader iterator's __next__ timing the data wait in a Core, with no Python frame."},
    {Py_tp_init, NextCall_init},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_descr_get, bind_like_function},
    {Py_tp_dealloc, NextCall_dealloc},
    {Py_tp_traverse, NextCall_traverse},
    {Py_tp_clear, NextCall_clear},
    {Py_tp_members, NextCall_members},
    {0, NULL},
};

static PyType_Spec NextCall_spec = {
    .name = "stepscope.capture._fastrec.NextCall",
    .basicsize = sizeof(NextCall),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .slots = NextCall_slots,
};

static int
fastrec_exec(PyObject *module)
{
    PyObject *type = PyType_FromModuleAndSpec(module, &Core_spec, NULL);
    if (type == NULL)
        return -1;
    CoreTypePtr = (PyTypeObject *)type;
    int status = PyModule_AddObject(module, "Core", type);
    if (status < 0) {
        Py_DECREF(type);
        return -1;
    }
    if (LIVE == NULL && (LIVE = PyUnicode_InternFromString("live")) == NULL)
        return -1;
    PyObject *phase_call = PyType_FromModuleAndSpec(module, &PhaseCall_spec, NULL);
    if (phase_call == NULL)
        return -1;
    if (PyModule_AddObject(module, "PhaseCall", phase_call) < 0) {
        Py_DECREF(phase_call);
        return -1;
    }
    PyObject *optimizer_hook = PyType_FromModuleAndSpec(module, &OptimizerHook_spec, NULL);
    if (optimizer_hook == NULL)
        return -1;
    if (PyModule_AddObject(module, "OptimizerHook", optimizer_hook) < 0) {
        Py_DECREF(optimizer_hook);
        return -1;
    }
    if ((IS_COMPILING == NULL && (IS_COMPILING = PyUnicode_InternFromString("_is_compiling_flag")) == NULL)
        || (LOADER_INFO == NULL && (LOADER_INFO = PyUnicode_InternFromString("_stepscope_loader")) == NULL)
        || (IN_PROCESS == NULL && (IN_PROCESS = PyUnicode_InternFromString("in_process")) == NULL)
        || (BATCHES == NULL && (BATCHES = PyUnicode_InternFromString("batches")) == NULL)
        || (WAIT_NS == NULL && (WAIT_NS = PyUnicode_InternFromString("wait_ns")) == NULL))
        return -1;
    PyObject *types[] = {PyType_FromModuleAndSpec(module, &ForwardCall_spec, NULL),
                         PyType_FromModuleAndSpec(module, &NextCall_spec, NULL)};
    const char *names[] = {"ForwardCall", "NextCall"};
    for (int i = 0; i < 2; i++) {
        if (types[i] == NULL || PyModule_AddObject(module, names[i], types[i]) < 0) {
            Py_XDECREF(types[i]);
            return -1;
        }
    }
    if (PyModule_AddIntConstant(module, "WIDTH", WIDTH) < 0)
        return -1;
#ifdef STEPSCOPE_SOURCE_SHA
    if (PyModule_AddStringConstant(module, "SOURCE_SHA", STEPSCOPE_SOURCE_SHA) < 0)
        return -1;
#endif
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * sched_sample(fd): the thread account's reading at one boundary (capture/account.py): the
 * monotonic clock, the calling thread's CPU clock, the run-queue wait of an open
 * /proc/.../schedstat and the process's CPU clock. The GIL is kept throughout: a read that released
 * it would hand it to another Python thread of the process and make the training thread wait for
 * it (up to the switch interval) -- the very contention the account measures.
 * ------------------------------------------------------------------------------------------- */
static int64_t
clock_ns(clockid_t clock)
{
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0)
        return -1;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* the run-queue wait (second field) of an open schedstat file; -1 with errno set */
static long long
read_runq(int fd)
{
    char buffer[128];
    ssize_t got = pread(fd, buffer, sizeof(buffer) - 1, 0);
    if (got <= 0)
        return -1;
    buffer[got] = 0;
    char *end = NULL;
    strtoull(buffer, &end, 10); /* the first field: on-CPU time, which lags for a running thread */
    return end != NULL ? (long long)strtoull(end, NULL, 10) : 0;
}

static PyObject *
sched_sample(PyObject *Py_UNUSED(module), PyObject *arg)
{
    int fd = (int)PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    /* The kernel credits a wait for a core to the run-queue counter when the thread runs again, and
     * the thread is most often preempted on its way back from a system call -- these reads included.
     * A wait between the first and the last read would be in the counter but not in the clocks read
     * before it (or the reverse): the clocks are read between two readings of the counter, again
     * until both agree, so a wait lands wholly in one interval. */
    long long runq = read_runq(fd), again = -1, wall = 0, cpu = 0, process = 0;
    for (int tries = 0; runq >= 0 && tries < 4; tries++) {
        wall = clock_ns(CLOCK_MONOTONIC);
        cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        process = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
        again = read_runq(fd);
        if (again == runq || again < 0)
            break;
        runq = again;
    }
    if (runq < 0 || again < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return Py_BuildValue("LLLL", wall, cpu, runq, process);
}

/* sched_runq(fd): one reading of another thread's run-queue wait (the account's intra-op peers),
 * keeping the GIL -- no clocks around it: a peer's counter is read at a step's start and end only. */
static PyObject *
sched_runq(PyObject *Py_UNUSED(module), PyObject *arg)
{
    int fd = (int)PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    long long runq = read_runq(fd);
    if (runq < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLongLong(runq);
}

/* -- what the training thread waits on: a wall-clock sampler off the GIL -----------------------
 *
 * The account's counters say how long the training thread was off CPU in each phase, not why. A
 * pthread of this module -- which never takes the GIL, so it neither adds a Python thread to the
 * contention it measures nor sees the thread stopped for its own sake -- reads every interval the
 * kernel function the thread sleeps in (/proc/self/task/<tid>/wchan, readable without ptrace
 * rights; "0" while it runs or is runnable: the account's counters have that time). Each sample
 * of a sleeping thread is kept with the recorder's open step and phase, read as they are at that
 * moment: a futex (a lock: the GIL, a condition variable), a sleep, a poll or select, a pipe or
 * socket read, the disk. One read of ~1 us per tick (the thread's stat file, ~3 us, would add only
 * the running/runnable split the account already measures).
 * wait_sampler_stop() hands back the samples: int64 (step << 8 | phase << 4 | class). */
enum { W_LOCK, W_SLEEP, W_POLL, W_PIPE, W_DISK, W_OTHER, W_UNKNOWN, NWAITS };

typedef struct {
    pthread_t thread;
    int running;
    int stop;
    Core *core;
    int wchan_fd;
    int64_t interval_ns;
    int64_t *samples;
    Py_ssize_t len, cap;
    long long ticks, dropped;
} WaitSampler;

static WaitSampler WAITS = {.wchan_fd = -1};

static int
starts_with(const char *text, const char *prefix)
{
    return strncmp(text, prefix, strlen(prefix)) == 0;
}

static int
wait_class(const char *wchan)
{
    static const char *const lock[] = {"futex", NULL};
    static const char *const sleep[] = {"hrtimer_nanosleep", "do_nanosleep", "clock_nanosleep", "nanosleep", NULL};
    static const char *const poll[] = {"do_select", "core_sys_select", "do_sys_poll", "do_poll", "ep_poll",
                                       "do_epoll_wait", "poll_schedule_timeout", NULL};
    static const char *const pipe[] = {"pipe_read", "pipe_wait", "pipe_write", "anon_pipe_", "sk_wait_data", "wait_woken",
                                       "unix_stream_read", "unix_stream_data_wait", "inet_csk_accept", "sock_", "tcp_",
                                       NULL};
    static const char *const disk[] = {"io_schedule", "folio_wait", "wait_on_page", "__lock_page", "__folio_lock",
                                       "bit_wait_io", "blk_", "wait_on_buffer", "__wait_on_buffer", "jbd2", NULL};
    static const char *const *const table[] = {lock, sleep, poll, pipe, disk};
    if (wchan[0] == '\0' || (wchan[0] == '0' && wchan[1] == '\0'))
        return W_UNKNOWN;
    for (int kind = 0; kind < 5; kind++)
        for (const char *const *name = table[kind]; *name != NULL; name++)
            if (starts_with(wchan, *name))
                return kind;
    return W_OTHER;
}

static void *
wait_loop(void *Py_UNUSED(arg))
{
    char buffer[128];
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    while (!__atomic_load_n(&WAITS.stop, __ATOMIC_ACQUIRE)) {
        int64_t due = (int64_t)next.tv_sec * 1000000000LL + next.tv_nsec + WAITS.interval_ns;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t now_ns = (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
        if (due < now_ns)
            due = now_ns + WAITS.interval_ns; /* late (a busy machine): no burst to catch up */
        next.tv_sec = due / 1000000000LL;
        next.tv_nsec = due % 1000000000LL;
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
        if (__atomic_load_n(&WAITS.stop, __ATOMIC_ACQUIRE))
            break;
        WAITS.ticks++;
        ssize_t n = pread(WAITS.wchan_fd, buffer, 127, 0);
        if (n <= 0)
            continue;
        buffer[n] = '\0';
        int kind = wait_class(buffer);
        if (kind == W_UNKNOWN)
            continue; /* running or runnable */
        int phase = __atomic_load_n(&WAITS.core->phase, __ATOMIC_RELAXED);
        int64_t step = (int64_t)__atomic_load_n(&WAITS.core->count, __ATOMIC_RELAXED);
        if (WAITS.len == WAITS.cap) {
            WAITS.dropped++;
            continue;
        }
        WAITS.samples[WAITS.len++] = (step << 8) | ((int64_t)(phase & 15) << 4) | kind;
    }
    return NULL;
}

static void
wait_release(void)
{
    if (WAITS.wchan_fd >= 0)
        close(WAITS.wchan_fd);
    WAITS.wchan_fd = -1;
    free(WAITS.samples);
    WAITS.samples = NULL;
    WAITS.len = WAITS.cap = 0;
    Py_CLEAR(WAITS.core);
}

/* A forked child (a DataLoader worker) has no sampler thread: it must never join one. Its copies
 * of the buffer and descriptors are left to it (the core's reference too: no GIL here). */
static void
wait_after_fork_child(void)
{
    WAITS.running = 0;
    WAITS.core = NULL;
    WAITS.samples = NULL;
    WAITS.len = WAITS.cap = 0;
    WAITS.wchan_fd = -1;
}

/* wait_sampler_start(core, tid, interval_ns, capacity) -> None */
static PyObject *
wait_sampler_start(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *core;
    long tid;
    long long interval, capacity;
    if (!PyArg_ParseTuple(args, "OlLL", &core, &tid, &interval, &capacity))
        return NULL;
    if (CoreTypePtr == NULL || !PyObject_TypeCheck(core, CoreTypePtr)) {
        PyErr_SetString(PyExc_TypeError, "wait_sampler_start: a recorder on the C core is needed");
        return NULL;
    }
    if (WAITS.running) {
        PyErr_SetString(PyExc_RuntimeError, "the wait sampler already runs");
        return NULL;
    }
    if (interval <= 0 || capacity <= 0) {
        PyErr_SetString(PyExc_ValueError, "wait_sampler_start: interval and capacity must be positive");
        return NULL;
    }
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/task/%ld/wchan", tid);
    WAITS.wchan_fd = open(path, O_RDONLY | O_CLOEXEC);
    if (WAITS.wchan_fd < 0)
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
    WAITS.samples = malloc((size_t)capacity * sizeof(int64_t));
    if (WAITS.samples == NULL) {
        wait_release();
        return PyErr_NoMemory();
    }
    WAITS.cap = (Py_ssize_t)capacity;
    WAITS.len = 0;
    WAITS.ticks = WAITS.dropped = 0;
    WAITS.interval_ns = interval;
    WAITS.stop = 0;
    WAITS.core = (Core *)Py_NewRef(core);
    static int fork_handler = 0;
    if (!fork_handler && pthread_atfork(NULL, NULL, wait_after_fork_child) == 0)
        fork_handler = 1;
    int error = pthread_create(&WAITS.thread, NULL, wait_loop, NULL);
    if (error != 0) {
        wait_release();
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    WAITS.running = 1;
    Py_RETURN_NONE;
}

/* wait_sampler_stop() -> (samples: bytes of int64, ticks, dropped); (b"", 0, 0) when not running */
static PyObject *
wait_sampler_stop(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    if (!WAITS.running)
        return Py_BuildValue("y#LL", "", (Py_ssize_t)0, 0LL, 0LL);
    __atomic_store_n(&WAITS.stop, 1, __ATOMIC_RELEASE);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(WAITS.thread, NULL);
    Py_END_ALLOW_THREADS
    WAITS.running = 0;
    PyObject *result = Py_BuildValue("y#LL", (const char *)WAITS.samples, WAITS.len * (Py_ssize_t)sizeof(int64_t),
                                     WAITS.ticks, WAITS.dropped);
    wait_release();
    return result;
}

static PyMethodDef fastrec_functions[] = {
    {"wait_sampler_start", wait_sampler_start, METH_VARARGS,
     "wait_sampler_start(core, tid, interval_ns, capacity): sample what thread tid sleeps in, off the GIL"},
    {"wait_sampler_stop", wait_sampler_stop, METH_NOARGS,
     "wait_sampler_stop() -> (int64 samples step<<8|phase<<4|class as bytes, ticks, dropped)"},
    {"sched_sample", sched_sample, METH_O,
     "sched_sample(fd) -> (monotonic ns, thread CPU ns, run-queue wait ns, process CPU ns), keeping the GIL"},
    {"sched_runq", sched_runq, METH_O, "sched_runq(fd) -> run-queue wait ns of an open schedstat file, keeping the GIL"},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot fastrec_slots[] = {
    {Py_mod_exec, fastrec_exec},
    {0, NULL},
};

static struct PyModuleDef fastrec_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "stepscope.capture._fastrec",
    .m_doc = "The step recorder's hot path in C (optional; recorder.py has the same core in Python).",
    .m_size = 0,
    .m_methods = fastrec_functions,
    .m_slots = fastrec_slots,
};

PyMODINIT_FUNC
PyInit__fastrec(void)
{
    return PyModuleDef_Init(&fastrec_module);
}
