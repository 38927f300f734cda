/*
 * A batch of trace events read from its JSON bytes straight into columns (stepscope.traces._scan).
 *
 * The typed decode (stepscope/traces/typed.py) turns each batch into msgspec structs, and
 * _columns.c reads them into columns. Creating and freeing ~10 Python objects an event (the
 * structs, their strings and numbers) cost more than the rest of a load. This module reads the
 * batch's bytes once, keeps each event's fields as offsets and numbers, and writes the columns,
 * creating a Python string only for a name, category or value it has not seen before.
 *
 * parse(piece) reads a batch (a JSON array of event objects, as stepscope/traces/decode.py cuts
 * it) into a Parsed record, without side effects. It accepts only batches of the usual shape:
 * complete events ("ph": "X"), the phases the tables count but do not store (M, s, f, t, C),
 * instants without a duration (a [memory] one with a thread), every field the schema of typed.py
 * names of the type it declares, no escape in a string it reads, numbers without exponents and of
 * at most 18 digits, no duplicate field. Anything else returns None, malformed JSON included: the
 * caller then decodes the piece with msgspec exactly as before, so every error, every odd event
 * and every count is handled where it always was.
 *
 * Scanner.columns(parsed) builds the columns of the complete events with the checks, in the order,
 * and with the interning calls of fastpath._typed_columns_c, the [memory] instants' as
 * typed_memory_columns does, and the counts of the other phases and instants (TableBuilder.add_typed
 * is the order); or returns None where the typed path declines. The same columns and the same
 * symbols as the typed path are the contract (tests/unit/traces/test_scan.py compares them on every
 * reference trace and on randomly damaged batches).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define BIG ((int64_t)1 << 62)
#define FAR_TS_US 1e17
#define MAX_DEPTH 64
#define MAX_NUMBER 64
#define ONES 0x0101010101010101ULL
static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
#define HIGHS 0x8080808080808080ULL

/* ---------------------------------------------------------------- the parsed batch */

typedef struct {
    int32_t off, len; /* len -1: absent or null */
} Span;

enum { S_ABSENT = 0, S_INT = 1, S_STR = 2 }; /* pid / tid */

enum {
    H_TS = 1 << 0, H_DUR = 1 << 1, H_EXT = 1 << 2, H_EXTL = 1 << 3, H_CORR = 1 << 4, H_STREAM = 1 << 5,
    H_DEVICE = 1 << 6, H_BPS = 1 << 7, H_OCC = 1 << 8, H_WS = 1 << 9, H_WR = 1 << 10,
    /* a [memory] instant's */
    H_DTYPE = 1 << 11, H_DID = 1 << 12, H_ADDR = 1 << 13, H_BYTES = 1 << 14, H_ALLOC = 1 << 15, H_RESERVED = 1 << 16,
};

typedef struct {
    char ph; /* X M s f t C as in the file; 'm' a [memory] instant, 'i' any other instant */
    uint8_t pid_kind, tid_kind;
    uint32_t has;
    Span name, cat, stack, dims, pid_s, tid_s;
    int64_t pid, tid, ext, extl, corr, stream, device, ws, wr, dtype, did, addr;
    double ts, dur, bps, occ, bytes, alloc, reserved;
} Rec;

typedef struct {
    PyObject_HEAD
    Py_buffer view; /* the piece, held (and its size fixed) while the records point into it */
    Rec *recs;
    Py_ssize_t n;
} Parsed;

static void
parsed_dealloc(Parsed *self)
{
    if (self->view.obj != NULL)
        PyBuffer_Release(&self->view);
    PyMem_Free(self->recs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t
parsed_len(Parsed *self)
{
    return self->n;
}

static PySequenceMethods parsed_as_sequence = {.sq_length = (lenfunc)parsed_len};

static PyTypeObject ParsedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepscope.traces._scan.Parsed",
    .tp_basicsize = sizeof(Parsed),
    .tp_dealloc = (destructor)parsed_dealloc,
    .tp_as_sequence = &parsed_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A batch of events read by parse(): their fields as offsets into the piece and numbers.",
};

/* ---------------------------------------------------------------- the reader */

typedef struct {
    const unsigned char *base, *p, *end;
} Reader;

/* every failure: not the usual shape, or not JSON (the caller decodes the piece with msgspec) */
#define FAIL (-1)

static inline void
skip_ws(Reader *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\n' || *r->p == '\r' || *r->p == '\t'))
        r->p++;
}

static inline int
hex_value(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* the length of the valid UTF-8 sequence at s (lead byte >= 0x80), 0 when it is not one */
static int
utf8_length(const unsigned char *s, const unsigned char *end)
{
    unsigned char c = s[0];
    int len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F; /* no surrogates */
    }
    else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    }
    else
        return 0;
    if (end - s < len || s[1] < lo || s[1] > hi)
        return 0;
    for (int i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return len;
}

/* a string at r->p (its opening quote): its contents' span; *escaped set when it holds an escape */
static int
read_string(Reader *r, Span *span, int *escaped)
{
    const unsigned char *q = r->p + 1, *end = r->end;
    *escaped = 0;
    for (;;) {
        /* eight bytes at a time while none is a quote, a backslash, a control byte or non-ASCII */
        while (end - q >= 8) {
            uint64_t w;
            memcpy(&w, q, 8);
            uint64_t quote = w ^ (ONES * '"'), slash = w ^ (ONES * '\\');
            /* nonzero when some byte is < 0x20, '"', '\\' or >= 0x80 (the zero-byte tests of
             * Hacker's Delight: never a miss; a false alarm only above a true one) */
            uint64_t special = (((w - ONES * 0x20) & ~w) | ((quote - ONES) & ~quote) | ((slash - ONES) & ~slash) | w) &
                               HIGHS;
            if (special)
                break;
            q += 8;
        }
        while (q < end && *q >= 0x20 && *q != '"' && *q != '\\' && *q < 0x80)
            q++;
        if (q >= end)
            return FAIL;
        unsigned char c = *q;
        if (c == '"')
            break;
        if (c < 0x20)
            return FAIL;
        if (c == '\\') {
            *escaped = 1;
            if (end - q < 2)
                return FAIL;
            unsigned char e = q[1];
            if (e == 'u') {
                if (end - q < 6)
                    return FAIL;
                int code = 0;
                for (int i = 2; i < 6; i++) {
                    int h = hex_value(q[i]);
                    if (h < 0)
                        return FAIL;
                    code = code * 16 + h;
                }
                if (code >= 0xD800 && code <= 0xDFFF)
                    return FAIL; /* surrogates: msgspec decides */
                q += 6;
            }
            else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't')
                q += 2;
            else
                return FAIL;
            continue;
        }
        int len = utf8_length(q, end);
        if (len == 0)
            return FAIL;
        q += len;
    }
    span->off = (int32_t)(r->p + 1 - r->base);
    span->len = (int32_t)(q - (r->p + 1));
    r->p = q + 1;
    return 0;
}

static int
read_plain_string(Reader *r, Span *span)
{
    int escaped;
    if (read_string(r, span, &escaped) < 0 || escaped)
        return FAIL;
    return 0;
}

enum { N_INT = 1, N_DECIMAL = 2 };

typedef struct {
    const unsigned char *start, *digits, *end; /* the number, its first digit, its end */
    Py_ssize_t int_digits;                     /* the digits before any '.' */
    int negative, fraction, exponent;
} Number;

/* the JSON number at r->p, its grammar checked and r->p past it; FAIL where it is not one */
static int
scan_number(Reader *r, Number *n)
{
    const unsigned char *q = r->p, *end = r->end;
    n->start = q;
    n->negative = q < end && *q == '-';
    q += n->negative;
    n->digits = q;
    if (q < end && *q == '0')
        q++;
    else if (q < end && *q >= '1' && *q <= '9')
        while (q < end && *q >= '0' && *q <= '9')
            q++;
    else
        return FAIL;
    n->int_digits = q - n->digits;
    n->fraction = q < end && *q == '.';
    if (n->fraction) {
        const unsigned char *first = ++q;
        while (q < end && *q >= '0' && *q <= '9')
            q++;
        if (q == first)
            return FAIL;
    }
    n->exponent = q < end && (*q == 'e' || *q == 'E');
    if (n->exponent) {
        q++;
        if (q < end && (*q == '+' || *q == '-'))
            q++;
        const unsigned char *first = q;
        while (q < end && *q >= '0' && *q <= '9')
            q++;
        if (q == first)
            return FAIL;
    }
    n->end = r->p = q;
    return 0;
}

/* a JSON number at r->p: N_INT with *i (at most 18 digits), or N_DECIMAL with *d (no exponent);
 * FAIL for anything else (an exponent, more digits, not a number) */
static int
read_number(Reader *r, int64_t *i, double *d)
{
    Number n;
    if (scan_number(r, &n) < 0 || n.exponent)
        return FAIL;
    if (!n.fraction) {
        if (n.int_digits > 18)
            return FAIL;
        int64_t v = 0;
        for (const unsigned char *c = n.digits; c < n.end; c++)
            v = v * 10 + (*c - '0');
        *i = n.negative ? -v : v;
        *d = (double)*i;
        return N_INT;
    }
    /* at most 15 significant digits: the digits as an exact integer divided by an exact power of
     * ten, one correctly rounded division (Clinger's fast path) */
    int64_t mantissa = 0;
    int significant = 0, scale = 0, in_fraction = 0;
    for (const unsigned char *c = n.digits; c < n.end; c++) {
        if (*c == '.') {
            in_fraction = 1;
            continue;
        }
        if (significant || *c != '0')
            significant++;
        if (significant > 15)
            break;
        mantissa = mantissa * 10 + (*c - '0');
        scale += in_fraction;
    }
    if (significant <= 15 && scale <= 22) {
        double v = (double)mantissa / POW10[scale];
        *d = n.negative ? -v : v;
        return N_DECIMAL;
    }
    if (n.end - n.start >= MAX_NUMBER)
        return FAIL;
    char buffer[MAX_NUMBER];
    memcpy(buffer, n.start, (size_t)(n.end - n.start));
    buffer[n.end - n.start] = '\0';
    char *stop;
    double v = PyOS_string_to_double(buffer, &stop, NULL);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return FAIL;
    }
    if (*stop != '\0' || !isfinite(v))
        return FAIL;
    *d = v;
    return N_DECIMAL;
}

static inline int
is_literal(Reader *r, const char *word, Py_ssize_t len)
{
    if (r->end - r->p >= len && memcmp(r->p, word, (size_t)len) == 0) {
        r->p += len;
        return 1;
    }
    return 0;
}

/* after a member of a container: 1 when a comma follows (r->p at the next member), 0 when `close`
 * ends the container, FAIL otherwise */
static inline int
after_member(Reader *r, unsigned char close)
{
    skip_ws(r);
    if (r->p < r->end && *r->p == ',') {
        r->p++;
        skip_ws(r);
        return 1;
    }
    if (r->p < r->end && *r->p == close) {
        r->p++;
        return 0;
    }
    return FAIL;
}

/* an object's key at r->p and its colon: r->p at the value; *escaped as read_string sets it */
static int
read_key(Reader *r, Span *key, int *escaped)
{
    if (r->p >= r->end || *r->p != '"' || read_string(r, key, escaped) < 0)
        return FAIL;
    skip_ws(r);
    if (r->p >= r->end || *r->p != ':')
        return FAIL;
    r->p++;
    skip_ws(r);
    return 0;
}

static int skip_value(Reader *r, int depth);

static int
skip_container(Reader *r, int depth, unsigned char close, int keyed)
{
    if (depth > MAX_DEPTH)
        return FAIL;
    r->p++;
    skip_ws(r);
    if (r->p < r->end && *r->p == close) {
        r->p++;
        return 0;
    }
    for (;;) {
        Span key;
        int escaped, more;
        if ((keyed && read_key(r, &key, &escaped) < 0) || skip_value(r, depth + 1) < 0)
            return FAIL;
        if ((more = after_member(r, close)) <= 0)
            return more;
    }
}

/* any JSON value at r->p, checked and stepped over */
static int
skip_value(Reader *r, int depth)
{
    if (r->p >= r->end)
        return FAIL;
    switch (*r->p) {
    case '{':
        return skip_container(r, depth, '}', 1);
    case '[':
        return skip_container(r, depth, ']', 0);
    case '"': {
        Span span;
        int escaped;
        return read_string(r, &span, &escaped);
    }
    case 't':
        return is_literal(r, "true", 4) ? 0 : FAIL;
    case 'f':
        return is_literal(r, "false", 5) ? 0 : FAIL;
    case 'n':
        return is_literal(r, "null", 4) ? 0 : FAIL;
    default: {
        Number n; /* any number is valid here, an exponent or a long one too */
        return scan_number(r, &n);
    }
    }
}

/* null: 1 (None); an int: 0 with *v; FAIL otherwise (typed.py: Union[int, None]) */
static int
read_int_field(Reader *r, int64_t *v)
{
    if (is_literal(r, "null", 4))
        return 1;
    double d;
    return read_number(r, v, &d) == N_INT ? 0 : FAIL;
}

/* null: 1; a number: 0 with *v (Union[float, None]) */
static int
read_float_field(Reader *r, double *v)
{
    if (is_literal(r, "null", 4))
        return 1;
    int64_t i;
    return read_number(r, &i, v) == FAIL ? FAIL : 0;
}

/* null: 1 (span len -1); a string without escapes: 0 (Union[str, None]) */
static int
read_str_field(Reader *r, Span *span)
{
    span->len = -1;
    if (is_literal(r, "null", 4))
        return 1;
    if (r->p >= r->end || *r->p != '"')
        return FAIL;
    return read_plain_string(r, span);
}

/* the fields of typed.Args, by their JSON names: how each is read and where it goes */
enum { A_INT, A_FLOAT, A_DIMS, A_STR };
typedef struct {
    const char *name;
    Py_ssize_t len;
    int kind;
    uint32_t bit; /* set in rec->has when the value is not null */
    size_t slot;  /* the Rec member it is read into */
} ArgField;
#define ARG(text, kind, bit, slot) {text, sizeof(text) - 1, kind, bit, slot}
static const ArgField ARG_FIELDS[] = {
    ARG("External id", A_INT, H_EXT, offsetof(Rec, ext)),
    ARG("external id", A_INT, H_EXTL, offsetof(Rec, extl)),
    ARG("correlation", A_INT, H_CORR, offsetof(Rec, corr)),
    ARG("stream", A_INT, H_STREAM, offsetof(Rec, stream)),
    ARG("device", A_INT, H_DEVICE, offsetof(Rec, device)),
    ARG("blocks per SM", A_FLOAT, H_BPS, offsetof(Rec, bps)),
    ARG("est. achieved occupancy %", A_FLOAT, H_OCC, offsetof(Rec, occ)),
    ARG("Input Dims", A_DIMS, 0, offsetof(Rec, dims)),
    ARG("Call stack", A_STR, 0, offsetof(Rec, stack)),
    ARG("Bytes", A_FLOAT, H_BYTES, offsetof(Rec, bytes)),
    ARG("Total Allocated", A_FLOAT, H_ALLOC, offsetof(Rec, alloc)),
    ARG("Total Reserved", A_FLOAT, H_RESERVED, offsetof(Rec, reserved)),
    ARG("Device Type", A_INT, H_DTYPE, offsetof(Rec, dtype)),
    ARG("Device Id", A_INT, H_DID, offsetof(Rec, did)),
    ARG("Addr", A_INT, H_ADDR, offsetof(Rec, addr)),
    ARG("wait_on_stream", A_INT, H_WS, offsetof(Rec, ws)),
    ARG("wait_on_cuda_event_record_corr_id", A_INT, H_WR, offsetof(Rec, wr)),
};
#define N_ARG_FIELDS ((int)(sizeof(ARG_FIELDS) / sizeof(ARG_FIELDS[0])))

/* the value of ARG_FIELDS[field] at r->p into rec: 0 (a value), 1 (null), FAIL */
static int
read_arg(Reader *r, Rec *rec, int field)
{
    const ArgField *arg = &ARG_FIELDS[field];
    void *slot = (char *)rec + arg->slot;
    int got;
    switch (arg->kind) {
    case A_INT:
        got = read_int_field(r, (int64_t *)slot);
        break;
    case A_FLOAT:
        got = read_float_field(r, (double *)slot);
        break;
    case A_STR:
        return read_str_field(r, (Span *)slot);
    default: { /* A_DIMS: any value, kept as its bytes (null: none) */
        const unsigned char *start = r->p;
        if (skip_value(r, 1) < 0)
            return FAIL;
        if (!(r->p - start == 4 && memcmp(start, "null", 4) == 0)) {
            rec->dims.off = (int32_t)(start - r->base);
            rec->dims.len = (int32_t)(r->p - start);
        }
        return 0;
    }
    }
    if (got == 0)
        rec->has |= arg->bit;
    return got;
}

/* the args object at r->p: the fields of typed.Args read, the others stepped over */
static int
read_args(Reader *r, Rec *rec)
{
    uint32_t seen = 0;
    r->p++;
    skip_ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
        return 0;
    }
    for (;;) {
        Span key;
        int escaped, more;
        if (read_key(r, &key, &escaped) < 0 || escaped)
            return FAIL;
        const char *name = (const char *)r->base + key.off;
        int field = 0;
        while (field < N_ARG_FIELDS &&
               !(ARG_FIELDS[field].len == key.len && memcmp(ARG_FIELDS[field].name, name, (size_t)key.len) == 0))
            field++;
        if (field == N_ARG_FIELDS) {
            if (skip_value(r, 2) < 0)
                return FAIL;
        }
        else {
            if (seen & (1u << field))
                return FAIL; /* a field twice: msgspec decides */
            seen |= 1u << field;
            if (read_arg(r, rec, field) == FAIL)
                return FAIL;
        }
        if ((more = after_member(r, '}')) <= 0)
            return more;
    }
}

/* `key` (of `len` bytes) is `text` */
#define KEY(text) (len == (Py_ssize_t)sizeof(text) - 1 && memcmp(key, text, sizeof(text) - 1) == 0)

/* one event object at r->p into rec */
static int
read_event(Reader *r, Rec *rec)
{
    memset(rec, 0, sizeof(*rec));
    rec->name.len = rec->cat.len = rec->stack.len = rec->dims.len = rec->pid_s.len = rec->tid_s.len = -1;
    uint32_t seen = 0;
    Span ph = {0, -1};
    r->p++;
    skip_ws(r);
    if (r->p < r->end && *r->p == '}')
        return FAIL; /* no "ph" */
    for (;;) {
        Span span;
        int escaped, more;
        if (read_key(r, &span, &escaped) < 0 || escaped)
            return FAIL;
        const char *key = (const char *)r->base + span.off;
        Py_ssize_t len = span.len;
        int field = -1, got = 0;
        if (KEY("ph")) {
            field = 0;
            got = read_str_field(r, &ph);
        }
        else if (KEY("name")) {
            field = 1;
            got = read_str_field(r, &rec->name);
        }
        else if (KEY("cat")) {
            field = 2;
            got = read_str_field(r, &rec->cat);
        }
        else if (KEY("pid") || KEY("tid")) {
            int is_pid = KEY("pid");
            field = is_pid ? 3 : 4;
            uint8_t *kind = is_pid ? &rec->pid_kind : &rec->tid_kind;
            if (is_literal(r, "null", 4))
                got = 1;
            else if (r->p < r->end && *r->p == '"') {
                got = read_plain_string(r, is_pid ? &rec->pid_s : &rec->tid_s);
                *kind = S_STR;
            }
            else {
                double d;
                got = read_number(r, is_pid ? &rec->pid : &rec->tid, &d) == N_INT ? 0 : FAIL;
                *kind = S_INT;
            }
        }
        else if (KEY("ts")) {
            field = 5;
            got = read_float_field(r, &rec->ts);
            rec->has |= got == 0 ? H_TS : 0;
        }
        else if (KEY("dur")) {
            field = 6;
            got = read_float_field(r, &rec->dur);
            rec->has |= got == 0 ? H_DUR : 0;
        }
        else if (KEY("args")) {
            field = 7;
            got = r->p < r->end && *r->p == '{' ? read_args(r, rec) : FAIL; /* Args is not optional */
        }
        else
            got = skip_value(r, 1);
        if (got == FAIL)
            return FAIL;
        if (field >= 0) {
            if (seen & (1u << field))
                return FAIL;
            seen |= 1u << field;
        }
        if ((more = after_member(r, '}')) < 0)
            return FAIL;
        if (!more)
            break;
    }
    if (ph.len != 1)
        return FAIL;
    char c = (char)r->base[ph.off];
    if (c == 'i' || c == 'I') {
        /* an instant the typed path takes: no duration, a name, a time; a [memory] one with a thread */
        if ((rec->has & H_DUR) || rec->name.len < 0 || !(rec->has & H_TS) || fabs(rec->ts) >= FAR_TS_US)
            return FAIL;
        int memory = rec->name.len == 8 && memcmp(r->base + rec->name.off, "[memory]", 8) == 0;
        if (memory && rec->tid_kind == S_ABSENT)
            return FAIL;
        rec->ph = memory ? 'm' : 'i';
        return 0;
    }
    if (c != 'X' && c != 'M' && c != 's' && c != 'f' && c != 't' && c != 'C')
        return FAIL; /* another phase: the typed path decides */
    rec->ph = c;
    return 0;
}

/* parse(piece) -> Parsed | None */
static PyObject *
scan_parse(PyObject *module, PyObject *piece)
{
    Parsed *out = PyObject_New(Parsed, &ParsedType);
    if (out == NULL)
        return NULL;
    out->recs = NULL;
    out->n = 0;
    out->view.obj = NULL;
    if (PyObject_GetBuffer(piece, &out->view, PyBUF_SIMPLE) < 0) {
        out->view.obj = NULL;
        Py_DECREF(out);
        return NULL;
    }
    if (out->view.len >= INT32_MAX)
        goto decline;
    Reader r = {out->view.buf, out->view.buf, (const unsigned char *)out->view.buf + out->view.len};
    Py_ssize_t capacity = 0;
    skip_ws(&r);
    if (r.p >= r.end || *r.p != '[')
        goto decline;
    r.p++;
    skip_ws(&r);
    for (;;) {
        if (r.p >= r.end || *r.p != '{')
            goto decline; /* an empty batch, or an item that is not an object */
        if (out->n == capacity) {
            capacity = capacity ? 2 * capacity : 1024;
            Rec *grown = PyMem_Realloc(out->recs, (size_t)capacity * sizeof(Rec));
            if (grown == NULL) {
                Py_DECREF(out);
                return PyErr_NoMemory();
            }
            out->recs = grown;
        }
        if (read_event(&r, &out->recs[out->n]) < 0)
            goto decline;
        out->n++;
        int more = after_member(&r, ']');
        if (more < 0)
            goto decline;
        if (!more)
            break;
    }
    skip_ws(&r);
    if (r.p != r.end)
        goto decline;
    return (PyObject *)out;
decline:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- caches of ids */

/* an open-addressing map from byte strings (copied into an arena) or int64 values to int32 ids */
typedef struct {
    uint64_t hash;
    int64_t key; /* the value; for byte strings, the offset of the key in the arena */
    int32_t len; /* the byte string's length; -1: an int key; -2: an empty slot */
    int32_t id;
} Slot;

typedef struct {
    Slot *slots;
    size_t mask, used;
    char *arena;
    size_t arena_used, arena_size;
} Map;

static uint64_t
hash_bytes(const char *s, Py_ssize_t len)
{
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)len;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
        s += 8;
        len -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, (size_t)len);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 29);
}

static uint64_t
hash_int(int64_t v)
{
    uint64_t h = (uint64_t)v * 0x9E3779B97F4A7C15ULL;
    return h ^ (h >> 29);
}

static void
map_free(Map *m)
{
    PyMem_Free(m->slots);
    PyMem_Free(m->arena);
    memset(m, 0, sizeof(*m));
}

static int
map_grow(Map *m)
{
    size_t size = m->slots ? 2 * (m->mask + 1) : 256;
    Slot *slots = PyMem_Malloc(size * sizeof(Slot));
    if (slots == NULL)
        return -1;
    for (size_t i = 0; i < size; i++)
        slots[i].len = -2;
    for (size_t i = 0; m->slots && i <= m->mask; i++) {
        if (m->slots[i].len == -2)
            continue;
        size_t j = m->slots[i].hash & (size - 1);
        while (slots[j].len != -2)
            j = (j + 1) & (size - 1);
        slots[j] = m->slots[i];
    }
    PyMem_Free(m->slots);
    m->slots = slots;
    m->mask = size - 1;
    return 0;
}

/* the slot of a byte string (found: len >= 0) or where it would go (len == -2) */
static Slot *
map_find_bytes(Map *m, const char *s, int32_t len, uint64_t hash)
{
    size_t j = hash & m->mask;
    for (;;) {
        Slot *slot = &m->slots[j];
        if (slot->len == -2 ||
            (slot->hash == hash && slot->len == len && memcmp(m->arena + slot->key, s, (size_t)len) == 0))
            return slot;
        j = (j + 1) & m->mask;
    }
}

static Slot *
map_find_int(Map *m, int64_t v, uint64_t hash)
{
    size_t j = hash & m->mask;
    for (;;) {
        Slot *slot = &m->slots[j];
        if (slot->len == -2 || (slot->len == -1 && slot->key == v))
            return slot;
        j = (j + 1) & m->mask;
    }
}

static int
map_reserve(Map *m)
{
    if (m->slots == NULL || 2 * (m->used + 1) > m->mask + 1)
        return map_grow(m);
    return 0;
}

static int
map_put_bytes(Map *m, const char *s, int32_t len, uint64_t hash, int32_t id)
{
    if (m->arena_used + (size_t)len > m->arena_size) {
        size_t size = m->arena_size ? m->arena_size : 65536;
        while (m->arena_used + (size_t)len > size)
            size *= 2;
        char *arena = PyMem_Realloc(m->arena, size);
        if (arena == NULL)
            return -1;
        m->arena = arena;
        m->arena_size = size;
    }
    if (map_reserve(m) < 0)
        return -1;
    Slot *slot = map_find_bytes(m, s, len, hash);
    memcpy(m->arena + m->arena_used, s, (size_t)len);
    slot->hash = hash;
    slot->key = (int64_t)m->arena_used;
    slot->len = len;
    slot->id = id;
    m->arena_used += (size_t)len;
    m->used++;
    return 0;
}

static int
map_put_int(Map *m, int64_t v, uint64_t hash, int32_t id)
{
    if (map_reserve(m) < 0)
        return -1;
    Slot *slot = map_find_int(m, v, hash);
    slot->hash = hash;
    slot->key = v;
    slot->len = -1;
    slot->id = id;
    m->used++;
    return 0;
}

/* ---------------------------------------------------------------- the scanner */

typedef struct {
    PyObject_HEAD
    PyObject *ids, *intern, *scalar, *dims; /* dict str -> id; intern(str); scalar(value); dims(bytes) */
    Map symbols, str_scalars, int_scalars, raw_dims;
} Scanner;

static void
scanner_dealloc(Scanner *self)
{
    Py_XDECREF(self->ids);
    Py_XDECREF(self->intern);
    Py_XDECREF(self->scalar);
    Py_XDECREF(self->dims);
    map_free(&self->symbols);
    map_free(&self->str_scalars);
    map_free(&self->int_scalars);
    map_free(&self->raw_dims);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
scanner_init(Scanner *self, PyObject *args, PyObject *kwds)
{
    PyObject *ids, *intern, *scalar, *dims;
    if (!PyArg_ParseTuple(args, "O!OOO:Scanner", &PyDict_Type, &ids, &intern, &scalar, &dims))
        return -1;
    Py_INCREF(ids);
    Py_INCREF(intern);
    Py_INCREF(scalar);
    Py_INCREF(dims);
    Py_XSETREF(self->ids, ids);
    Py_XSETREF(self->intern, intern);
    Py_XSETREF(self->scalar, scalar);
    Py_XSETREF(self->dims, dims);
    return 0;
}

/* an id returned by Python, as int32; -1 with an exception */
static int
as_id(PyObject *value, int32_t *id)
{
    long v = PyLong_AsLong(value);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < INT32_MIN || v > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "symbol id beyond int32");
        return -1;
    }
    *id = (int32_t)v;
    return 0;
}

/* whether `m` holds the bytes s[0:len] (*id: their id); *hash: their hash either way */
static int
cached(Map *m, const char *s, int32_t len, uint64_t *hash, int32_t *id)
{
    *hash = hash_bytes(s, len);
    if (m->slots == NULL)
        return 0;
    Slot *slot = map_find_bytes(m, s, len, *hash);
    if (slot->len < 0)
        return 0;
    *id = slot->id;
    return 1;
}

/* the symbol id of a string's bytes: from the cache, else ids.get(str) or intern(str) */
static int
symbol_of(Scanner *self, const char *s, int32_t len, int32_t *id)
{
    uint64_t hash;
    if (cached(&self->symbols, s, len, &hash, id))
        return 0;
    PyObject *text = PyUnicode_DecodeUTF8(s, len, NULL);
    if (text == NULL)
        return -1;
    PyObject *found = PyDict_GetItemWithError(self->ids, text); /* borrowed */
    int status;
    if (found != NULL)
        status = as_id(found, id);
    else if (PyErr_Occurred())
        status = -1;
    else {
        PyObject *made = PyObject_CallOneArg(self->intern, text);
        status = made == NULL ? -1 : as_id(made, id);
        Py_XDECREF(made);
    }
    Py_DECREF(text);
    if (status < 0)
        return -1;
    return map_put_bytes(&self->symbols, s, len, hash, *id) < 0 ? (PyErr_NoMemory(), -1) : 0;
}

/* the id scalar(value) gives a pid or tid (an int, or a string's bytes) */
static int
scalar_of(Scanner *self, const char *base, uint8_t kind, int64_t v, Span span, int32_t *id)
{
    Map *m = kind == S_INT ? &self->int_scalars : &self->str_scalars;
    uint64_t hash;
    if (kind == S_INT) {
        hash = hash_int(v);
        Slot *slot = m->slots != NULL ? map_find_int(m, v, hash) : NULL;
        if (slot != NULL && slot->len != -2) {
            *id = slot->id;
            return 0;
        }
    }
    else if (cached(m, base + span.off, span.len, &hash, id))
        return 0;
    PyObject *value = kind == S_INT ? PyLong_FromLongLong(v) : PyUnicode_DecodeUTF8(base + span.off, span.len, NULL);
    if (value == NULL)
        return -1;
    PyObject *made = PyObject_CallOneArg(self->scalar, value);
    Py_DECREF(value);
    int status = made == NULL ? -1 : as_id(made, id);
    Py_XDECREF(made);
    if (status < 0)
        return -1;
    status = kind == S_INT ? map_put_int(m, v, hash, *id) : map_put_bytes(m, base + span.off, span.len, hash, *id);
    return status < 0 ? (PyErr_NoMemory(), -1) : 0;
}

/* the id of an Input Dims value's raw bytes: from the cache, else dims(bytes); 1 when that
 * declines (None) */
static int
dims_of(Scanner *self, const char *s, int32_t len, int32_t *id)
{
    uint64_t hash;
    if (cached(&self->raw_dims, s, len, &hash, id))
        return 0;
    PyObject *raw = PyBytes_FromStringAndSize(s, len);
    if (raw == NULL)
        return -1;
    PyObject *made = PyObject_CallOneArg(self->dims, raw);
    Py_DECREF(raw);
    if (made == NULL)
        return -1;
    if (made == Py_None) {
        Py_DECREF(made);
        return 1;
    }
    int status = as_id(made, id);
    Py_DECREF(made);
    if (status < 0)
        return -1;
    return map_put_bytes(&self->raw_dims, s, len, hash, *id) < 0 ? (PyErr_NoMemory(), -1) : 0;
}

/* a new bytes column of n items of `size` bytes */
static PyObject *
new_column(Py_ssize_t n, size_t size, void **data)
{
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)size);
    if (out != NULL)
        *data = PyBytes_AS_STRING(out);
    return out;
}

static inline int
in_range(int64_t v)
{
    return v < BIG && v > -BIG;
}

/* the complete events' columns (rows[0:m] of parsed) into `columns`, with the checks, order and
 * interning of fastpath._typed_columns_c: 0, 1 where it declines the batch, -1 with an exception */
static int
complete_columns(Scanner *self, Parsed *parsed, const Py_ssize_t *rows, Py_ssize_t m, int lower_ext,
                 PyObject *columns)
{
    const char *base = parsed->view.buf;
    /* the checks _typed_columns_c makes before it interns anything */
    for (Py_ssize_t j = 0; j < m; j++) {
        Rec *rec = &parsed->recs[rows[j]];
        if (rec->name.len < 0 || rec->pid_kind == S_ABSENT || rec->tid_kind == S_ABSENT)
            return 1;
        if ((rec->has & (H_TS | H_DUR)) != (H_TS | H_DUR))
            return 1;
        if (fabs(rec->ts) >= FAR_TS_US || rec->dur < 0 || rec->dur >= FAR_TS_US)
            return 1; /* read_number gives finite values only */
    }
    void *data;
    PyObject *column;
#define NEW_COLUMN(key, type)                                                                                  \
    if ((column = new_column(m, sizeof(type), &data)) == NULL || PyDict_SetItemString(columns, key, column) < 0) { \
        Py_XDECREF(column);                                                                                    \
        return -1;                                                                                            \
    }                                                                                                          \
    Py_DECREF(column);
    /* names, then categories: interned in that order, as the typed path does */
    NEW_COLUMN("name", int32_t);
    for (Py_ssize_t j = 0; j < m; j++) {
        Rec *rec = &parsed->recs[rows[j]];
        if (symbol_of(self, base + rec->name.off, rec->name.len, &((int32_t *)data)[j]) < 0)
            return -1;
    }
    NEW_COLUMN("cat", int32_t);
    for (Py_ssize_t j = 0; j < m; j++) {
        Rec *rec = &parsed->recs[rows[j]];
        ((int32_t *)data)[j] = -1;
        if (rec->cat.len >= 0 && symbol_of(self, base + rec->cat.off, rec->cat.len, &((int32_t *)data)[j]) < 0)
            return -1;
    }
    NEW_COLUMN("pid", int32_t);
    for (Py_ssize_t j = 0; j < m; j++) {
        Rec *rec = &parsed->recs[rows[j]];
        if (scalar_of(self, base, rec->pid_kind, rec->pid, rec->pid_s, &((int32_t *)data)[j]) < 0)
            return -1;
    }
    NEW_COLUMN("tid", int32_t);
    for (Py_ssize_t j = 0; j < m; j++) {
        Rec *rec = &parsed->recs[rows[j]];
        if (scalar_of(self, base, rec->tid_kind, rec->tid, rec->tid_s, &((int32_t *)data)[j]) < 0)
            return -1;
    }
    NEW_COLUMN("ts", double);
    for (Py_ssize_t j = 0; j < m; j++)
        ((double *)data)[j] = parsed->recs[rows[j]].ts;
    NEW_COLUMN("dur", double);
    for (Py_ssize_t j = 0; j < m; j++)
        ((double *)data)[j] = parsed->recs[rows[j]].dur;
    /* External id, else (older traces) external id where the batch has any */
    NEW_COLUMN("external_id", int64_t);
    for (Py_ssize_t j = 0; j < m; j++) {
        Rec *rec = &parsed->recs[rows[j]];
        int64_t v = rec->has & H_EXT ? rec->ext : lower_ext && (rec->has & H_EXTL) ? rec->extl : -1;
        if (((rec->has & H_EXT) || (lower_ext && (rec->has & H_EXTL))) && !in_range(v))
            return 1;
        ((int64_t *)data)[j] = v;
    }
    static const struct {
        const char *key;
        uint16_t bit;
        size_t offset;
    } ints[] = {{"correlation", H_CORR, offsetof(Rec, corr)},
                {"stream", H_STREAM, offsetof(Rec, stream)},
                {"device", H_DEVICE, offsetof(Rec, device)}};
    for (int k = 0; k < 3; k++) {
        NEW_COLUMN(ints[k].key, int64_t);
        for (Py_ssize_t j = 0; j < m; j++) {
            Rec *rec = &parsed->recs[rows[j]];
            int64_t v = *(int64_t *)((char *)rec + ints[k].offset);
            if ((rec->has & ints[k].bit) && !in_range(v))
                return 1;
            ((int64_t *)data)[j] = rec->has & ints[k].bit ? v : -1;
        }
    }
    NEW_COLUMN("blocks_per_sm", double);
    for (Py_ssize_t j = 0; j < m; j++) {
        Rec *rec = &parsed->recs[rows[j]];
        ((double *)data)[j] = rec->has & H_BPS ? rec->bps : Py_NAN;
    }
    NEW_COLUMN("occupancy", double);
    for (Py_ssize_t j = 0; j < m; j++) {
        Rec *rec = &parsed->recs[rows[j]];
        ((double *)data)[j] = rec->has & H_OCC ? rec->occ : Py_NAN;
    }
    NEW_COLUMN("input_dims", int32_t);
    for (Py_ssize_t j = 0; j < m; j++) {
        Rec *rec = &parsed->recs[rows[j]];
        ((int32_t *)data)[j] = -1;
        if (rec->dims.len < 0)
            continue;
        int status = dims_of(self, base + rec->dims.off, rec->dims.len, &((int32_t *)data)[j]);
        if (status < 0)
            return -1;
        if (status > 0)
            return 1;
    }
    NEW_COLUMN("call_stack", int32_t);
    for (Py_ssize_t j = 0; j < m; j++) {
        Rec *rec = &parsed->recs[rows[j]];
        ((int32_t *)data)[j] = -1;
        if (rec->stack.len >= 0 && symbol_of(self, base + rec->stack.off, rec->stack.len, &((int32_t *)data)[j]) < 0)
            return -1;
    }
    /* the sparse CUDA-event waits (rows local to the batch's complete events) */
    Py_ssize_t waits = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        Rec *rec = &parsed->recs[rows[j]];
        if (rec->has & (H_WS | H_WR)) {
            if (((rec->has & H_WS) && !in_range(rec->ws)) || ((rec->has & H_WR) && !in_range(rec->wr)))
                return 1;
            waits++;
        }
    }
    if (waits) {
        void *rows_data = NULL, *stream_data = NULL, *record_data = NULL;
        PyObject *wait_rows = new_column(waits, sizeof(int64_t), &rows_data);
        PyObject *on_stream = new_column(waits, sizeof(int64_t), &stream_data);
        PyObject *on_record = new_column(waits, sizeof(int64_t), &record_data);
        int stored = wait_rows != NULL && on_stream != NULL && on_record != NULL &&
                     PyDict_SetItemString(columns, "wait_rows", wait_rows) == 0 &&
                     PyDict_SetItemString(columns, "wait_on_stream", on_stream) == 0 &&
                     PyDict_SetItemString(columns, "wait_on_record", on_record) == 0;
        Py_XDECREF(wait_rows);
        Py_XDECREF(on_stream);
        Py_XDECREF(on_record);
        if (!stored)
            return -1;
        Py_ssize_t w = 0;
        for (Py_ssize_t j = 0; j < m; j++) {
            Rec *rec = &parsed->recs[rows[j]];
            if (!(rec->has & (H_WS | H_WR)))
                continue;
            ((int64_t *)rows_data)[w] = j;
            ((int64_t *)stream_data)[w] = rec->has & H_WS ? rec->ws : -1;
            ((int64_t *)record_data)[w] = rec->has & H_WR ? rec->wr : -1;
            w++;
        }
    }
#undef NEW_COLUMN
    return 0;
}

/* the [memory] instants' columns (rows[0:m] of parsed) as typed_memory_columns gives them: a dict of
 * bytes, or NULL with an exception */
static PyObject *
memory_columns(Scanner *self, Parsed *parsed, const Py_ssize_t *rows, Py_ssize_t m)
{
    const char *base = parsed->view.buf;
    PyObject *columns = PyDict_New(), *column;
    void *data;
    if (columns == NULL)
        return NULL;
#define MEMORY_COLUMN(key, type)                                                                               \
    if ((column = new_column(m, sizeof(type), &data)) == NULL || PyDict_SetItemString(columns, key, column) < 0) { \
        Py_XDECREF(column);                                                                                    \
        Py_DECREF(columns);                                                                                    \
        return NULL;                                                                                           \
    }                                                                                                          \
    Py_DECREF(column);
    MEMORY_COLUMN("ts", double);
    for (Py_ssize_t j = 0; j < m; j++)
        ((double *)data)[j] = parsed->recs[rows[j]].ts;
    MEMORY_COLUMN("tid", int32_t);
    for (Py_ssize_t j = 0; j < m; j++) {
        Rec *rec = &parsed->recs[rows[j]];
        if (scalar_of(self, base, rec->tid_kind, rec->tid, rec->tid_s, &((int32_t *)data)[j]) < 0) {
            Py_DECREF(columns);
            return NULL;
        }
    }
    static const struct {
        const char *key;
        uint32_t bit;
        size_t slot;
    } ints[] = {{"device_type", H_DTYPE, offsetof(Rec, dtype)}, {"device_id", H_DID, offsetof(Rec, did)},
                {"addr", H_ADDR, offsetof(Rec, addr)}},
      floats[] = {{"nbytes", H_BYTES, offsetof(Rec, bytes)}, {"total_allocated", H_ALLOC, offsetof(Rec, alloc)},
                  {"total_reserved", H_RESERVED, offsetof(Rec, reserved)}};
    for (int k = 0; k < 3; k++) {
        MEMORY_COLUMN(ints[k].key, int64_t);
        for (Py_ssize_t j = 0; j < m; j++) { /* -1: absent, or out of range (as ints(..., -1) stores it) */
            Rec *rec = &parsed->recs[rows[j]];
            int64_t v = *(int64_t *)((char *)rec + ints[k].slot);
            ((int64_t *)data)[j] = (rec->has & ints[k].bit) && in_range(v) ? v : -1;
        }
    }
    for (int k = 0; k < 3; k++) {
        MEMORY_COLUMN(floats[k].key, double);
        for (Py_ssize_t j = 0; j < m; j++) {
            Rec *rec = &parsed->recs[rows[j]];
            ((double *)data)[j] = rec->has & floats[k].bit ? *(double *)((char *)rec + floats[k].slot) : Py_NAN;
        }
    }
#undef MEMORY_COLUMN
    return columns;
}

/* Scanner.columns(parsed) -> (columns, ignored, instants, memory) | None */
static PyObject *
scanner_columns(Scanner *self, PyObject *arg)
{
    if (!Py_IS_TYPE(arg, &ParsedType)) {
        PyErr_SetString(PyExc_TypeError, "columns: expected a Parsed batch");
        return NULL;
    }
    Parsed *parsed = (Parsed *)arg;
    const char *base = parsed->view.buf;
    Py_ssize_t n = parsed->n, m = 0, kept = 0, instants = 0;
    PyObject *columns = NULL, *ignored = NULL, *memory = NULL, *result = NULL;
    /* the complete events' rows, then the [memory] instants' */
    Py_ssize_t *rows = PyMem_Malloc((size_t)(n ? 2 * n : 1) * sizeof(Py_ssize_t)), *memory_rows = rows + n;
    if (rows == NULL)
        return PyErr_NoMemory();
    /* the other phases' counts, in first-sight order (collections.Counter of their "ph") */
    char phases[8];
    Py_ssize_t counts[8];
    int kinds = 0, lower_ext = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Rec *rec = &parsed->recs[i];
        if (rec->ph == 'X') {
            rows[m++] = i;
            lower_ext |= (rec->has & H_EXTL) != 0;
            continue;
        }
        if (rec->ph == 'm' || rec->ph == 'i') {
            if (rec->ph == 'm')
                memory_rows[kept++] = i;
            else
                instants++;
            continue;
        }
        int k = 0;
        while (k < kinds && phases[k] != rec->ph)
            k++;
        if (k == kinds) {
            phases[kinds] = rec->ph;
            counts[kinds++] = 0;
        }
        counts[k]++;
    }
    if ((ignored = PyList_New(kinds)) == NULL)
        goto error;
    for (int k = 0; k < kinds; k++) {
        PyObject *pair = Py_BuildValue("(s#n)", &phases[k], (Py_ssize_t)1, counts[k]);
        if (pair == NULL)
            goto error;
        PyList_SET_ITEM(ignored, k, pair);
    }
    /* add_typed interns the [memory] instants' threads before the complete events' anything */
    for (Py_ssize_t j = 0; j < kept; j++) {
        Rec *rec = &parsed->recs[memory_rows[j]];
        int32_t id;
        if (scalar_of(self, base, rec->tid_kind, rec->tid, rec->tid_s, &id) < 0)
            goto error;
    }
    if ((columns = PyDict_New()) == NULL)
        goto error;
    int status = m ? complete_columns(self, parsed, rows, m, lower_ext, columns) : 0;
    if (status < 0)
        goto error;
    if (status > 0)
        goto decline;
    if (kept && (memory = memory_columns(self, parsed, memory_rows, kept)) == NULL)
        goto error;
    result = Py_BuildValue("(OOnO)", columns, ignored, instants, memory ? memory : Py_None);
error:
    PyMem_Free(rows);
    Py_XDECREF(columns);
    Py_XDECREF(ignored);
    Py_XDECREF(memory);
    return result;
decline:
    PyMem_Free(rows);
    Py_XDECREF(columns);
    Py_XDECREF(ignored);
    Py_RETURN_NONE;
}

static PyMethodDef scanner_methods[] = {
    {"columns", (PyCFunction)scanner_columns, METH_O,
     "columns(parsed) -> (columns, ignored, instants, memory) | None: the complete events' columns (bytes), "
     "the other phases' counts [(ph, count)], the other instants' count and the [memory] instants' columns "
     "(or None), or None where the typed path would decline the batch."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepscope.traces._scan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_dealloc = (destructor)scanner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanner(ids, intern, scalar, dims): one table's symbols, thread ids and Input Dims, cached.",
    .tp_methods = scanner_methods,
    .tp_init = (initproc)scanner_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef scan_methods[] = {
    {"parse", (PyCFunction)scan_parse, METH_O,
     "parse(piece) -> Parsed | None: a batch's events read from its JSON bytes, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef scan_module = {
    PyModuleDef_HEAD_INIT, "stepscope.traces._scan",
    "A batch of trace events read from its JSON bytes straight into columns.", -1, scan_methods,
};

PyMODINIT_FUNC
PyInit__scan(void)
{
    if (PyType_Ready(&ParsedType) < 0 || PyType_Ready(&ScannerType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&scan_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(module, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(&ScannerType);
        Py_DECREF(module);
        return NULL;
    }
#ifdef STEPSCOPE_SOURCE_SHA
    if (PyModule_AddStringConstant(module, "SOURCE_SHA", STEPSCOPE_SOURCE_SHA) < 0) {
        Py_DECREF(module);
        return NULL;
    }
#endif
    return module;
}
