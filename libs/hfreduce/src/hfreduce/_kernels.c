/* hfreduce._kernels: the fused fp32 sum of a tree root's chunk, in C.
 *
 * sum_into(out, sources, copies, divisor) computes, element by element,
 *     out = ((sources[0] + sources[1]) + sources[2]) + ...   (then out / divisor when divisor != 0)
 * and writes the same values to every buffer in `copies`, in one pass of cache-sized blocks: each block's
 * operands are read once, and the result is written to `out` and the copies while it is still in L1.
 * The arithmetic is numpy's, in the same order (IEEE fp32 adds, one fp32 division), so results are
 * bit-identical to `np.add` chains followed by `np.divide`: compiled without -ffast-math, no reassociation.
 *
 * Why C: in a 64 MiB allreduce a root runs this over 64 blocks of 256 KiB per rank; as numpy calls that is
 * some 300 calls per op, each touching Python objects the streaming data has evicted from the cache (README,
 * "A compiled kernel for the roots' sums").
 *
 * The GIL is released during the loop. Any two buffers are either the very same (out is a source: in place;
 * a copy is a source: a local rank's input, overwritten by the result) or do not overlap: each block is read
 * whole before any of it is written.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define BLOCK_ELEMS 4096 /* 16 KiB of fp32 per stream: a block's streams stay in L1 */
#define MAX_SOURCES 64

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif

VECTOR_CLONES
static void add2(float *dst, const float *a, const float *b, size_t n)
{
#pragma GCC ivdep
    for (size_t i = 0; i < n; i++)
        dst[i] = a[i] + b[i];
}

VECTOR_CLONES
static void add3(float *dst, const float *a, const float *b, const float *c, size_t n)
{
#pragma GCC ivdep
    for (size_t i = 0; i < n; i++)
        dst[i] = (a[i] + b[i]) + c[i];
}

VECTOR_CLONES
static void accumulate(float *dst, const float *a, size_t n)
{
#pragma GCC ivdep
    for (size_t i = 0; i < n; i++)
        dst[i] += a[i];
}

VECTOR_CLONES
static void divide(float *dst, float divisor, size_t n)
{
#pragma GCC ivdep
    for (size_t i = 0; i < n; i++)
        dst[i] /= divisor;
}

static void sum_blocks(float *out, const float *const *src, int num_src, float *const *copies, int num_copies,
                       size_t n, float divisor)
{
    for (size_t b0 = 0; b0 < n; b0 += BLOCK_ELEMS) {
        size_t m = n - b0 < BLOCK_ELEMS ? n - b0 : BLOCK_ELEMS;
        float *dst = out + b0;
        int k;
        if (num_src >= 3) {
            add3(dst, src[0] + b0, src[1] + b0, src[2] + b0, m);
            k = 3;
        } else if (num_src == 2) {
            add2(dst, src[0] + b0, src[1] + b0, m);
            k = 2;
        } else {
            if (dst != src[0] + b0)
                memcpy(dst, src[0] + b0, m * sizeof(float));
            k = 1;
        }
        for (; k < num_src; k++)
            accumulate(dst, src[k] + b0, m);
        if (divisor != 0.0f)
            divide(dst, divisor, m);
        for (int c = 0; c < num_copies; c++)
            if (copies[c] + b0 != dst)
                memcpy(copies[c] + b0, dst, m * sizeof(float));
    }
}

/* A C-contiguous fp32 buffer of `obj` (writable when asked); on failure sets an exception naming `what`. */
static int get_f32(PyObject *obj, Py_buffer *view, int writable, const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be a %sC-contiguous float32 buffer", what,
                     writable ? "writable " : "");
        return -1;
    }
    const char *fmt = view->format;
    if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@')
        fmt++;
    if (view->itemsize != 4 || strcmp(fmt, "f") != 0) {
        PyErr_Format(PyExc_TypeError, "%s must hold float32, got format '%s'", what, view->format);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int overlaps(const Py_buffer *a, const Py_buffer *b)
{
    const char *a0 = a->buf, *b0 = b->buf;
    return a->len && b->len && a0 < b0 + b->len && b0 < a0 + a->len;
}

static void release_all(Py_buffer *views, int count)
{
    for (int i = 0; i < count; i++)
        PyBuffer_Release(&views[i]);
}

PyDoc_STRVAR(sum_into_doc,
             "sum_into(out, sources, copies, divisor)\n--\n\n"
             "out = ((sources[0] + sources[1]) + ...) / divisor (no division when divisor is 0), also written to "
             "each of copies; float32 buffers of one length. out may be one of the sources, in place.");

static PyObject *sum_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "sum_into takes out, sources, copies, divisor");
        return NULL;
    }
    double divisor = PyFloat_AsDouble(args[3]);
    if (divisor == -1.0 && PyErr_Occurred())
        return NULL;
    PyObject *sources = PySequence_Fast(args[1], "sources must be a sequence");
    if (sources == NULL)
        return NULL;
    PyObject *copies = PySequence_Fast(args[2], "copies must be a sequence");
    if (copies == NULL) {
        Py_DECREF(sources);
        return NULL;
    }
    Py_ssize_t num_src = PySequence_Fast_GET_SIZE(sources), num_copies = PySequence_Fast_GET_SIZE(copies);
    PyObject *result = NULL;
    Py_buffer views[1 + 2 * MAX_SOURCES];
    int held = 0;
    if (num_src < 1 || num_src > MAX_SOURCES || num_copies > MAX_SOURCES) {
        PyErr_Format(PyExc_ValueError, "sum_into takes 1-%d sources and at most %d copies, got %zd and %zd",
                     MAX_SOURCES, MAX_SOURCES, num_src, num_copies);
        goto done;
    }
    if (get_f32(args[0], &views[held], 1, "out") < 0)
        goto done;
    held++;
    for (Py_ssize_t i = 0; i < num_src; i++) {
        if (get_f32(PySequence_Fast_GET_ITEM(sources, i), &views[held], 0, "each source") < 0)
            goto done;
        held++;
    }
    for (Py_ssize_t i = 0; i < num_copies; i++) {
        if (get_f32(PySequence_Fast_GET_ITEM(copies, i), &views[held], 1, "each copy") < 0)
            goto done;
        held++;
    }
    for (int i = 1; i < held; i++) {
        if (views[i].len != views[0].len) {
            PyErr_Format(PyExc_ValueError, "buffer lengths differ: out has %zd bytes, another %zd", views[0].len,
                         views[i].len);
            goto done;
        }
    }
    for (int i = 0; i < held; i++) {
        for (int j = i + 1; j < held; j++) {
            if (overlaps(&views[i], &views[j]) && views[i].buf != views[j].buf) {
                PyErr_SetString(PyExc_ValueError, "buffers overlap without being the same buffer");
                goto done;
            }
        }
    }
    const float *src[MAX_SOURCES];
    float *dst[MAX_SOURCES];
    for (Py_ssize_t i = 0; i < num_src; i++)
        src[i] = views[1 + i].buf;
    for (Py_ssize_t i = 0; i < num_copies; i++)
        dst[i] = views[1 + num_src + i].buf;
    Py_BEGIN_ALLOW_THREADS;
    sum_blocks(views[0].buf, src, (int)num_src, dst, (int)num_copies, (size_t)views[0].len / sizeof(float),
               (float)divisor);
    Py_END_ALLOW_THREADS;
    result = Py_NewRef(Py_None);
done:
    release_all(views, held);
    Py_DECREF(sources);
    Py_DECREF(copies);
    return result;
}

static PyMethodDef methods[] = {
    {"sum_into", (PyCFunction)(void (*)(void))sum_into, METH_FASTCALL, sum_into_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hfreduce._kernels",
    .m_doc = "Compiled fp32 kernels of the hfreduce pipeline.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__kernels(void)
{
    return PyModule_Create(&module);
}
