/*
 * Columns of a batch of decoded trace events, read in C (stepscope.traces._columns).
 *
 * The typed decode (stepscope/traces/typed.py) turns each batch of trace events into msgspec
 * structs; the event table stores them as typed columns. Reading one field of every struct in a
 * Python list comprehension, then converting the list with numpy, cost more than the decode itself
 * (~40% of a trace's load). These functions read a field straight from each struct's slot (the
 * member descriptor gives its offset), check its type and write the column's bytes in one pass.
 *
 * Every function takes a list of structs of one type and a member descriptor of that type, and
 * returns None where the Python path (stepscope/traces/fastpath.py) would decline the batch (a
 * value of another type, an integer out of range): the caller then takes the careful path. The
 * same columns and the same symbols as the Python path are the contract
 * (tests/unit/traces/test_typed_decode.py runs both).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BIG ((int64_t)1 << 62)

/* the slot offset of `descr` for items of exactly its type; -1 with an exception otherwise */
static Py_ssize_t
slot_offset(PyObject *descr, PyTypeObject **owner)
{
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyErr_SetString(PyExc_TypeError, "expected a member descriptor (a struct field)");
        return -1;
    }
    PyMemberDescrObject *member = (PyMemberDescrObject *)descr;
    if (member->d_member->type != T_OBJECT_EX && member->d_member->type != T_OBJECT) {
        PyErr_SetString(PyExc_TypeError, "expected a field holding an object");
        return -1;
    }
    *owner = PyDescr_TYPE(descr);
    return member->d_member->offset;
}

/* the list and the field's offset; -1 with an exception when an item is not of the field's type */
static int
prepare(PyObject *seq, PyObject *descr, Py_ssize_t *offset)
{
    if (!PyList_CheckExact(seq)) {
        PyErr_SetString(PyExc_TypeError, "expected a list");
        return -1;
    }
    PyTypeObject *owner;
    if ((*offset = slot_offset(descr, &owner)) < 0)
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (Py_TYPE(PyList_GET_ITEM(seq, i)) != owner) {
            PyErr_Format(PyExc_TypeError, "item %zd is not a %s", i, owner->tp_name);
            return -1;
        }
    }
    return 0;
}

#define FIELD(item, offset) (*(PyObject **)((char *)(item) + (offset)))

static int
check_args(const char *name, Py_ssize_t nargs, Py_ssize_t want)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", name, want, nargs);
        return -1;
    }
    return 0;
}

/* objects(items, field) -> list: the field of every item */
static PyObject *
columns_objects(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t offset;
    if (check_args("objects", nargs, 2) < 0 || prepare(args[0], args[1], &offset) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(args[0]);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = FIELD(PyList_GET_ITEM(args[0], i), offset);
        if (value == NULL)
            value = Py_None; /* an unset slot reads as absent */
        Py_INCREF(value);
        PyList_SET_ITEM(out, i, value);
    }
    return out;
}

/* any_none(items, field) -> bool: whether some item's field is None (or unset) */
static PyObject *
columns_any_none(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t offset;
    if (check_args("any_none", nargs, 2) < 0 || prepare(args[0], args[1], &offset) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(args[0]);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = FIELD(PyList_GET_ITEM(args[0], i), offset);
        if (value == NULL || value == Py_None)
            Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

/* count_none(items, field) -> int: how many items' field is None (or unset) */
static PyObject *
columns_count_none(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t offset;
    if (check_args("count_none", nargs, 2) < 0 || prepare(args[0], args[1], &offset) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(args[0]), count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = FIELD(PyList_GET_ITEM(args[0], i), offset);
        count += value == NULL || value == Py_None;
    }
    return PyLong_FromSsize_t(count);
}

/* a bytes object of n items of `size` bytes, its buffer in *data */
static PyObject *
new_column(Py_ssize_t n, size_t size, char **data)
{
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)size);
    if (out != NULL)
        *data = PyBytes_AS_STRING(out);
    return out;
}

/* ints(items, field[, out_of_range]) -> bytes | None: int64 values, -1 for None; None when a
 * value is not an int (bool included), or when its magnitude reaches 2**62 and no out_of_range
 * value is given to store instead */
static PyObject *
columns_ints(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t offset;
    if (nargs != 3 && check_args("ints", nargs, 2) < 0)
        return NULL;
    if (prepare(args[0], args[1], &offset) < 0)
        return NULL;
    int clamp = nargs == 3;
    long long replacement = 0;
    if (clamp && (replacement = PyLong_AsLongLong(args[2])) == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(args[0]);
    char *data;
    PyObject *out = new_column(n, sizeof(int64_t), &data);
    if (out == NULL)
        return NULL;
    int64_t *column = (int64_t *)data;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = FIELD(PyList_GET_ITEM(args[0], i), offset);
        if (value == NULL || value == Py_None) {
            column[i] = -1;
            continue;
        }
        if (!PyLong_CheckExact(value))
            goto decline;
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
        if (overflow || v >= BIG || v <= -BIG) {
            if (!clamp)
                goto decline;
            v = replacement;
        }
        column[i] = (int64_t)v;
    }
    return out;
decline:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

/* floats(items, field, missing_ok) -> bytes | None: float64 values (ints converted), NaN for None
 * when missing_ok; None when a value is of another type, a missing one is not allowed, or an int
 * does not fit a double */
static PyObject *
columns_floats(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t offset;
    if (check_args("floats", nargs, 3) < 0 || prepare(args[0], args[1], &offset) < 0)
        return NULL;
    int missing_ok = PyObject_IsTrue(args[2]);
    if (missing_ok < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(args[0]);
    char *data;
    PyObject *out = new_column(n, sizeof(double), &data);
    if (out == NULL)
        return NULL;
    double *column = (double *)data;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = FIELD(PyList_GET_ITEM(args[0], i), offset);
        if (value != NULL && PyFloat_CheckExact(value)) {
            column[i] = PyFloat_AS_DOUBLE(value);
        }
        else if (value == NULL || value == Py_None) {
            if (!missing_ok)
                goto decline;
            column[i] = Py_NAN;
        }
        else if (PyLong_CheckExact(value)) {
            double v = PyLong_AsDouble(value);
            if (v == -1.0 && PyErr_Occurred()) {
                PyErr_Clear();
                goto decline;
            }
            column[i] = v;
        }
        else {
            goto decline;
        }
    }
    return out;
decline:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

/* the int id that `lookup` holds for `key`, or else what `make(key)` returns; -1 on error */
static int
symbol_id(PyObject *lookup, PyObject *make, PyObject *key, int32_t *id)
{
    PyObject *found = PyDict_GetItemWithError(lookup, key); /* borrowed */
    PyObject *made = NULL;
    if (found == NULL) {
        if (PyErr_Occurred())
            return -1;
        found = made = PyObject_CallOneArg(make, key);
        if (made == NULL)
            return -1;
    }
    long v = PyLong_AsLong(found);
    Py_XDECREF(made);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < INT32_MIN || v > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "symbol id beyond int32");
        return -1;
    }
    *id = (int32_t)v;
    return 0;
}

/* symbols(items, field, ids, intern, none_ok) -> bytes | None: int32 symbol ids of string values,
 * looked up in the dict `ids`, else interned by calling intern(value) (in item order, as the
 * Python path does); -1 for None when none_ok; None when a value is not a str or a None is not
 * allowed */
static PyObject *
columns_symbols(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t offset;
    if (check_args("symbols", nargs, 5) < 0 || prepare(args[0], args[1], &offset) < 0)
        return NULL;
    PyObject *ids = args[2], *intern = args[3];
    if (!PyDict_Check(ids)) {
        PyErr_SetString(PyExc_TypeError, "symbols: ids must be a dict");
        return NULL;
    }
    int none_ok = PyObject_IsTrue(args[4]);
    if (none_ok < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(args[0]);
    char *data;
    PyObject *out = new_column(n, sizeof(int32_t), &data);
    if (out == NULL)
        return NULL;
    int32_t *column = (int32_t *)data;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = FIELD(PyList_GET_ITEM(args[0], i), offset);
        if (value == NULL || value == Py_None) {
            if (!none_ok)
                goto decline;
            column[i] = -1;
            continue;
        }
        if (!PyUnicode_CheckExact(value))
            goto decline;
        if (symbol_id(ids, intern, value, &column[i]) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
decline:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

/* scalars(items, field, scalar) -> bytes | None: int32 ids of pid/tid values (ints or strs),
 * scalar(value) called once per distinct value in first-sight order; None when a value is
 * neither */
static PyObject *
columns_scalars(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t offset;
    if (check_args("scalars", nargs, 3) < 0 || prepare(args[0], args[1], &offset) < 0)
        return NULL;
    PyObject *scalar = args[2];
    Py_ssize_t n = PyList_GET_SIZE(args[0]);
    char *data;
    PyObject *out = new_column(n, sizeof(int32_t), &data);
    PyObject *seen = PyDict_New();
    if (out == NULL || seen == NULL)
        goto error;
    int32_t *column = (int32_t *)data;
    PyObject *last = NULL; /* runs of one pid or tid are the norm */
    int32_t last_id = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = FIELD(PyList_GET_ITEM(args[0], i), offset);
        if (value != NULL && value == last) {
            column[i] = last_id;
            continue;
        }
        if (value == NULL || !(PyLong_CheckExact(value) || PyUnicode_CheckExact(value))) {
            Py_DECREF(out);
            Py_DECREF(seen);
            Py_RETURN_NONE;
        }
        PyObject *found = PyDict_GetItemWithError(seen, value);
        if (found == NULL) {
            if (PyErr_Occurred())
                goto error;
            found = PyObject_CallOneArg(scalar, value);
            if (found == NULL)
                goto error;
            int stored = PyDict_SetItem(seen, value, found);
            Py_DECREF(found); /* the dict holds it */
            if (stored < 0)
                goto error;
        }
        long v = PyLong_AsLong(found);
        if (v == -1 && PyErr_Occurred())
            goto error;
        if (v < INT32_MIN || v > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "scalar id beyond int32");
            goto error;
        }
        column[i] = last_id = (int32_t)v;
        last = value;
    }
    Py_DECREF(seen);
    return out;
error:
    Py_XDECREF(out);
    Py_XDECREF(seen);
    return NULL;
}

/* raw_symbols(items, field, cache, convert) -> bytes | None: int32 ids of raw JSON values (any
 * buffer: msgspec.Raw), -1 for an empty one or null; each value's bytes looked up in the dict
 * `cache`, else convert(bytes) gives its id (stored in the cache) or None to decline the batch */
static PyObject *
columns_raw_symbols(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t offset;
    if (check_args("raw_symbols", nargs, 4) < 0 || prepare(args[0], args[1], &offset) < 0)
        return NULL;
    PyObject *cache = args[2], *convert = args[3];
    if (!PyDict_Check(cache)) {
        PyErr_SetString(PyExc_TypeError, "raw_symbols: cache must be a dict");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(args[0]);
    char *data;
    PyObject *out = new_column(n, sizeof(int32_t), &data);
    if (out == NULL)
        return NULL;
    int32_t *column = (int32_t *)data;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = FIELD(PyList_GET_ITEM(args[0], i), offset);
        column[i] = -1;
        if (value == NULL || value == Py_None)
            continue;
        Py_buffer view;
        if (PyObject_GetBuffer(value, &view, PyBUF_SIMPLE) < 0)
            goto error;
        if (view.len == 0 || (view.len == 4 && memcmp(view.buf, "null", 4) == 0)) {
            PyBuffer_Release(&view);
            continue;
        }
        PyObject *key = PyBytes_FromStringAndSize(view.buf, view.len);
        PyBuffer_Release(&view);
        if (key == NULL)
            goto error;
        PyObject *found = PyDict_GetItemWithError(cache, key); /* borrowed */
        PyObject *made = NULL;
        if (found == NULL) {
            if (PyErr_Occurred() || (made = PyObject_CallOneArg(convert, key)) == NULL) {
                Py_DECREF(key);
                goto error;
            }
            if (made == Py_None) {
                Py_DECREF(key);
                Py_DECREF(made);
                Py_DECREF(out);
                Py_RETURN_NONE;
            }
            if (PyDict_SetItem(cache, key, made) < 0) {
                Py_DECREF(key);
                Py_DECREF(made);
                goto error;
            }
            found = made;
        }
        Py_DECREF(key);
        long v = PyLong_AsLong(found);
        Py_XDECREF(made);
        if (v == -1 && PyErr_Occurred())
            goto error;
        if (v < INT32_MIN || v > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "symbol id beyond int32");
            goto error;
        }
        column[i] = (int32_t)v;
    }
    return out;
error:
    Py_DECREF(out);
    return NULL;
}

/* partition(items, field, value) -> (matching, others): the items whose field equals value, and
 * the rest, each in item order */
static PyObject *
columns_partition(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t offset;
    if (check_args("partition", nargs, 3) < 0 || prepare(args[0], args[1], &offset) < 0)
        return NULL;
    PyObject *seq = args[0], *target = args[2];
    Py_ssize_t n = PyList_GET_SIZE(seq);
    PyObject *matching = PyList_New(0), *others = PyList_New(0);
    if (matching == NULL || others == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(seq, i);
        PyObject *value = FIELD(item, offset);
        int equal = value == NULL ? 0 : PyObject_RichCompareBool(value, target, Py_EQ);
        if (equal < 0 || PyList_Append(equal ? matching : others, item) < 0)
            goto error;
    }
    return Py_BuildValue("(NN)", matching, others);
error:
    Py_XDECREF(matching);
    Py_XDECREF(others);
    return NULL;
}

static PyMethodDef columns_methods[] = {
    {"objects", (PyCFunction)(void (*)(void))columns_objects, METH_FASTCALL,
     "objects(items, field) -> list: the field of every item."},
    {"any_none", (PyCFunction)(void (*)(void))columns_any_none, METH_FASTCALL,
     "any_none(items, field) -> bool: whether some item's field is None."},
    {"count_none", (PyCFunction)(void (*)(void))columns_count_none, METH_FASTCALL,
     "count_none(items, field) -> int: how many items' field is None."},
    {"ints", (PyCFunction)(void (*)(void))columns_ints, METH_FASTCALL,
     "ints(items, field[, out_of_range]) -> bytes | None: int64 column, -1 for None."},
    {"floats", (PyCFunction)(void (*)(void))columns_floats, METH_FASTCALL,
     "floats(items, field, missing_ok) -> bytes | None: float64 column, NaN for None."},
    {"symbols", (PyCFunction)(void (*)(void))columns_symbols, METH_FASTCALL,
     "symbols(items, field, ids, intern, none_ok) -> bytes | None: int32 symbol ids of strings."},
    {"scalars", (PyCFunction)(void (*)(void))columns_scalars, METH_FASTCALL,
     "scalars(items, field, scalar) -> bytes | None: int32 ids of pid/tid values."},
    {"raw_symbols", (PyCFunction)(void (*)(void))columns_raw_symbols, METH_FASTCALL,
     "raw_symbols(items, field, cache, convert) -> bytes | None: int32 ids of raw JSON values."},
    {"partition", (PyCFunction)(void (*)(void))columns_partition, METH_FASTCALL,
     "partition(items, field, value) -> (matching, others)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef columns_module = {
    PyModuleDef_HEAD_INIT, "stepscope.traces._columns",
    "Columns of a batch of decoded trace events, read in C.", -1, columns_methods,
};

PyMODINIT_FUNC
PyInit__columns(void)
{
    PyObject *module = PyModule_Create(&columns_module);
    if (module == NULL)
        return NULL;
#ifdef STEPSCOPE_SOURCE_SHA
    if (PyModule_AddStringConstant(module, "SOURCE_SHA", STEPSCOPE_SOURCE_SHA) < 0) {
        Py_DECREF(module);
        return NULL;
    }
#endif
    return module;
}
