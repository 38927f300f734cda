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

static PyObject *
Core_fetch_begin(Core *self, PyObject *Py_UNUSED(ignored))
{
    NOW_OR_FAIL(now);
    if (!foreign(self) && (batch_requested(self, now) < 0 || do_enter(self, DATA_WAIT, now) < 0))
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
    NOW_OR_FAIL(now);
    if (foreign(self))
        return PyLong_FromLongLong(now);
    if (cpu >= 0)
        self->wait_cpu += cpu;
    else
        self->wait_cpu_known = 0;
    if (do_leave(self, DATA_WAIT, now) < 0)
        return NULL;
    batch_received(self, batch_len);
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
    NOW_OR_FAIL(now);
    if (foreign(self))
        return PyLong_FromLongLong(now);
    if (key && model_forward_started(self, now, key, grad) < 0)
        return NULL;
    if (do_enter(self, FORWARD, now) < 0)
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
    NOW_OR_FAIL(now);
    if (foreign(self))
        return PyLong_FromLongLong(now);
    if (do_leave(self, FORWARD, now) < 0)
        return NULL;
    if (key && self->has_lead && key == self->lead)
        self->lead_done = 1;
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
    {"next_commit_call", T_PYSSIZET, offsetof(Core, next_commit_call), 0,
     "on_commit is called only for committed step indexes >= this (0: every commit)"},
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
    if (PyModule_AddIntConstant(module, "WIDTH", WIDTH) < 0)
        return -1;
#ifdef STEPSCOPE_SOURCE_SHA
    if (PyModule_AddStringConstant(module, "SOURCE_SHA", STEPSCOPE_SOURCE_SHA) < 0)
        return -1;
#endif
    return 0;
}

static PyModuleDef_Slot fastrec_slots[] = {
    {Py_mod_exec, fastrec_exec},
    {0, NULL},
};

static struct PyModuleDef fastrec_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "stepscope.capture._fastrec",
    .m_doc = "The step recorder's hot path in C (optional; recorder.py has the same core in Python).",
    .m_size = 0,
    .m_slots = fastrec_slots,
};

PyMODINIT_FUNC
PyInit__fastrec(void)
{
    return PyModuleDef_Init(&fastrec_module);
}
