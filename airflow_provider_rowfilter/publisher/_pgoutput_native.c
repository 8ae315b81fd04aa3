/*
 * The capture's hot loop in C: a fetch of the slot's rows joined into one buffer, and the INSERT,
 * UPDATE and DELETE messages among them decoded into the buffers of Arrow arrays.
 *
 * publisher/pgoutput_columns.py is the only caller and holds the numpy decoder this module must
 * equal (tests/publisher/test_pgoutput_columns.py compares them on random messages). Both loops run
 * without the GIL, so the capture ahead (a thread of the apply job) decodes while the apply's
 * Python runs.
 *
 * The format is pgoutput's TupleData (src/backend/replication/logical/proto.c logicalrep_write_tuple:
 * int16 column count, then per column a kind byte 't', 'n' or 'u', and for 't' an int32 length and
 * the text form).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* ---- join_rows ------------------------------------------------------------------------------- */

static const char join_rows_doc[] =
    "join_rows(rows, padding) -> (buffer, lsns, starts, ends) or None\n\n"
    "The slot's rows of one fetch, a list of (lsn: int, data: bytes), as one buffer of their data followed\n"
    "by `padding` zero bytes, and bytes of native int64: each row's LSN and where its data lies in buffer.\n"
    "None when a row is of another shape (the caller then does the same in Python).";

static PyObject *join_rows(PyObject *self, PyObject *args) {
    PyObject *rows;
    Py_ssize_t padding;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &rows, &padding))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows), total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 2 || !PyLong_Check(PyTuple_GET_ITEM(row, 0)) ||
            !PyBytes_Check(PyTuple_GET_ITEM(row, 1)))
            Py_RETURN_NONE;
        total += PyBytes_GET_SIZE(PyTuple_GET_ITEM(row, 1));
    }
    PyObject *buffer = PyBytes_FromStringAndSize(NULL, total + padding);
    PyObject *lsns = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *starts = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *ends = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!buffer || !lsns || !starts || !ends)
        goto failed;
    char *b = PyBytes_AS_STRING(buffer);
    int64_t *l = (int64_t *)PyBytes_AS_STRING(lsns), *s = (int64_t *)PyBytes_AS_STRING(starts),
            *e = (int64_t *)PyBytes_AS_STRING(ends);
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i), *data = PyTuple_GET_ITEM(row, 1);
        l[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(row, 0));
        if (l[i] == -1 && PyErr_Occurred())
            goto failed;
        Py_ssize_t size = PyBytes_GET_SIZE(data);
        memcpy(b + at, PyBytes_AS_STRING(data), size);
        s[i] = at;
        e[i] = at + size;
        at += size;
    }
    memset(b + at, 0, padding);
    return Py_BuildValue("NNNN", buffer, lsns, starts, ends);
failed:
    Py_XDECREF(buffer); Py_XDECREF(lsns); Py_XDECREF(starts); Py_XDECREF(ends);
    return NULL;
}

/* ---- decode_changes -------------------------------------------------------------------------- */

/* One row image per message (absent for some), laid out as two Arrow list arrays: the values
 * (binary, or large_binary past 2 GiB; NULL unless the column kind is 't') and the unchanged flags. */
typedef struct {
    Py_ssize_t cells, bytes, present;
    char *list_valid, *list_offsets, *valid, *offsets, *data, *unchanged;
    PyObject *objects[6];
} Image;

typedef struct {
    const unsigned char *b;
    const int64_t *starts, *ends;
    Py_ssize_t n;
    /* per message, filled by the first pass */
    int64_t *old_at, *new_at; /* where the old and new TupleData start, -1 when absent */
} Messages;

/* Walk one TupleData at `at`, which must end by `end`; count its cells and text bytes. Returns where it
 * ends, or -1 when it is not a regular tuple of text values (the numpy decoder's Irregular). */
static int64_t walk_tuple(const unsigned char *b, int64_t at, int64_t end, Py_ssize_t *cells, Py_ssize_t *bytes) {
    if (at + 2 > end)
        return -1;
    int count = (b[at] << 8) | b[at + 1];
    at += 2;
    for (int j = 0; j < count; j++) {
        if (at >= end)
            return -1;
        unsigned char kind = b[at];
        if (kind == 't') {
            if (at + 5 > end)
                return -1;
            int32_t length = (int32_t)be32(b + at + 1);
            if (length < 0 || at + 5 + (int64_t)length > end)
                return -1;
            *bytes += length;
            at += 5 + length;
        } else if (kind == 'n' || kind == 'u') {
            at += 1;
        } else {
            return -1;
        }
    }
    *cells += count;
    return at;
}

/* First pass: check every message and size both images. 0 when regular, -1 otherwise. */
static int survey(Messages *m, Image *new, Image *old) {
    const unsigned char *b = m->b;
    for (Py_ssize_t i = 0; i < m->n; i++) {
        int64_t s = m->starts[i], e = m->ends[i];
        if (e - s < 7)
            return -1;
        unsigned char kind = b[s], marker = b[s + 5];
        int has_old = marker == 'K' || marker == 'O';
        if (kind != 'I' && kind != 'U' && kind != 'D')
            return -1;
        if ((kind == 'D' && !has_old) || (kind != 'D' && !has_old && marker != 'N') || (kind == 'I' && has_old))
            return -1;
        int64_t at = s + 6;
        m->old_at[i] = m->new_at[i] = -1;
        if (has_old) {
            m->old_at[i] = at;
            at = walk_tuple(b, at, e, &old->cells, &old->bytes);
            if (at < 0)
                return -1;
            old->present++;
            if (kind == 'D') {
                if (at != e)
                    return -1;
                continue;
            }
            if (at >= e || b[at] != 'N')
                return -1;
            at += 1;
        }
        m->new_at[i] = at;
        at = walk_tuple(b, at, e, &new->cells, &new->bytes);
        if (at != e)
            return -1;
        new->present++;
    }
    return 0;
}

static int allocate(Image *image, Py_ssize_t n) {
    Py_ssize_t sizes[6] = {(n + 7) / 8, (n + 1) * 4, (image->cells + 7) / 8,
                           (image->cells + 1) * (image->bytes < ((Py_ssize_t)1 << 31) ? 4 : 8),
                           image->bytes, (image->cells + 7) / 8};
    char **targets[6] = {&image->list_valid, &image->list_offsets, &image->valid, &image->offsets, &image->data,
                         &image->unchanged};
    for (int k = 0; k < 6; k++) {
        image->objects[k] = PyBytes_FromStringAndSize(NULL, sizes[k]);
        if (!image->objects[k])
            return -1;
        *targets[k] = PyBytes_AS_STRING(image->objects[k]);
        if (k != 1 && k != 3 && k != 4)
            memset(*targets[k], 0, sizes[k]); /* the bitmaps */
    }
    return 0;
}

typedef struct {
    Py_ssize_t cell, byte;
} Cursor;

static void put_offset(Image *image, Py_ssize_t at, Py_ssize_t value) {
    if (image->bytes < ((Py_ssize_t)1 << 31))
        ((int32_t *)image->offsets)[at] = (int32_t)value;
    else
        ((int64_t *)image->offsets)[at] = (int64_t)value;
}

/* Second pass, for one image of message i: its cells into the buffers. */
static void fill(const unsigned char *b, int64_t at, Py_ssize_t i, Image *image, Cursor *c) {
    if (at >= 0) {
        image->list_valid[i >> 3] |= (char)(1 << (i & 7));
        int count = (b[at] << 8) | b[at + 1];
        at += 2;
        for (int j = 0; j < count; j++, c->cell++) {
            unsigned char kind = b[at];
            put_offset(image, c->cell, c->byte);
            if (kind == 't') {
                int32_t length = (int32_t)be32(b + at + 1);
                memcpy(image->data + c->byte, b + at + 5, length);
                image->valid[c->cell >> 3] |= (char)(1 << (c->cell & 7));
                c->byte += length;
                at += 5 + length;
            } else {
                if (kind == 'u')
                    image->unchanged[c->cell >> 3] |= (char)(1 << (c->cell & 7));
                at += 1;
            }
        }
    }
    ((int32_t *)image->list_offsets)[i + 1] = (int32_t)c->cell;
}

static PyObject *image_tuple(Image *image, Py_ssize_t n) {
    PyObject *t = Py_BuildValue("nnNNNNNNi", image->cells, n - image->present, image->objects[0],
                                image->objects[1], image->objects[2], image->objects[3], image->objects[4],
                                image->objects[5], image->bytes >= ((Py_ssize_t)1 << 31));
    for (int k = 0; k < 6; k++)
        image->objects[k] = NULL;
    return t;
}

static const char decode_changes_doc[] =
    "decode_changes(buffer, starts, ends) -> (relation_oid, old_kind, new, old) or None\n\n"
    "Decode the INSERT/UPDATE/DELETE messages at starts[i]:ends[i] (native int64 buffers) of buffer.\n"
    "relation_oid: bytes of int64 per message; old_kind: bytes of int8 (-1 none, 0 K, 1 O); new and old:\n"
    "(cells, absent, list validity bitmap, list offsets int32, value validity bitmap, value offsets\n"
    "int32 (int64 when large), value bytes, unchanged bitmap, large). None when a message is not a\n"
    "well-formed change of text values (the numpy decoder's Irregular).";

static PyObject *decode_changes(PyObject *self, PyObject *args) {
    Py_buffer buffer, starts, ends;
    if (!PyArg_ParseTuple(args, "y*y*y*", &buffer, &starts, &ends))
        return NULL;
    PyObject *result = NULL, *oids = NULL, *kinds = NULL;
    Image new = {0}, old = {0};
    Messages m = {buffer.buf, starts.buf, ends.buf, starts.len / 8, NULL, NULL};
    if (starts.len != ends.len || starts.len % 8) {
        PyErr_SetString(PyExc_ValueError, "decode_changes: starts and ends must be int64 buffers of one length");
        goto done;
    }
    for (Py_ssize_t i = 0; i < m.n; i++) {
        if (m.starts[i] < 0 || m.ends[i] < m.starts[i] || m.ends[i] > buffer.len) {
            PyErr_SetString(PyExc_ValueError, "decode_changes: a message outside the buffer");
            goto done;
        }
    }
    m.old_at = PyMem_RawMalloc((m.n + 1) * 8);
    m.new_at = PyMem_RawMalloc((m.n + 1) * 8);
    if (!m.old_at || !m.new_at) {
        PyErr_NoMemory();
        goto done;
    }
    int regular;
    Py_BEGIN_ALLOW_THREADS
    regular = survey(&m, &new, &old) == 0;
    Py_END_ALLOW_THREADS
    if (!regular) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    oids = PyBytes_FromStringAndSize(NULL, m.n * 8);
    kinds = PyBytes_FromStringAndSize(NULL, m.n);
    if (!oids || !kinds || allocate(&new, m.n) < 0 || allocate(&old, m.n) < 0)
        goto done;
    {
        int64_t *oid = (int64_t *)PyBytes_AS_STRING(oids);
        int8_t *kind = (int8_t *)PyBytes_AS_STRING(kinds);
        const unsigned char *b = m.b;
        Py_BEGIN_ALLOW_THREADS
        Cursor cn = {0, 0}, co = {0, 0};
        ((int32_t *)new.list_offsets)[0] = ((int32_t *)old.list_offsets)[0] = 0;
        for (Py_ssize_t i = 0; i < m.n; i++) {
            int64_t s = m.starts[i];
            oid[i] = (int64_t)be32(b + s + 1);
            kind[i] = m.old_at[i] < 0 ? -1 : (b[s + 5] == 'O' ? 1 : 0);
            fill(b, m.new_at[i], i, &new, &cn);
            fill(b, m.old_at[i], i, &old, &co);
        }
        put_offset(&new, cn.cell, cn.byte);
        put_offset(&old, co.cell, co.byte);
        Py_END_ALLOW_THREADS
    }
    {
        PyObject *n_image = image_tuple(&new, m.n), *o_image = image_tuple(&old, m.n);
        if (n_image && o_image) {
            result = Py_BuildValue("NNNN", oids, kinds, n_image, o_image);
            oids = kinds = NULL;
        } else {
            Py_XDECREF(n_image);
            Py_XDECREF(o_image);
        }
    }
done:
    for (int k = 0; k < 6; k++) {
        Py_XDECREF(new.objects[k]);
        Py_XDECREF(old.objects[k]);
    }
    Py_XDECREF(oids);
    Py_XDECREF(kinds);
    PyMem_RawFree(m.old_at);
    PyMem_RawFree(m.new_at);
    PyBuffer_Release(&buffer);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    return result;
}

static PyMethodDef methods[] = {
    {"join_rows", join_rows, METH_VARARGS, join_rows_doc},
    {"decode_changes", decode_changes, METH_VARARGS, decode_changes_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pgoutput_native",
    "A fetch of slot rows joined, and pgoutput change messages decoded into Arrow buffers without the GIL "
    "(publisher/pgoutput_columns.py).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__pgoutput_native(void) { return PyModule_Create(&module); }
