/* hfreduce._kernels: the fused fp32 sum of a tree root's chunk, in C.
 *
 * sum_into(out, sources, copies, divisor) computes, element by element,
 *     out = ((sources[0] + sources[1]) + sources[2]) + ...   (then out / divisor when divisor != 0)
 * and writes the same values to every buffer in `copies`, in one pass of cache-sized blocks: each block's
 * operands are read once, and the result is written to `out` and the copies while it is still in L1.
 * The arithmetic is numpy's, in the same order (IEEE fp32 adds, one fp32 division), so results are
 * bit-identical to `np.add` chains followed by `np.divide`: no fast-math, no reassociation, no excess precision
 * (refused at compile time below).
 *
 * Why C: in a 64 MiB allreduce a root runs this over 64 blocks of 256 KiB per rank; as numpy calls that is
 * some 300 calls per op, each touching Python objects the streaming data has evicted from the cache (bench/results/hfreduce_allreduce.md,
 * "A compiled kernel for the roots' sums").
 *
 * The GIL is released during the loop. Any two buffers are either the very same buffer (out is a source: in
 * place; a copy is a source: a local rank's input, overwritten by the result) or do not overlap. A block's sum
 * is complete before its copies are written; where out is a source that a block reads after writing out (the
 * fourth or later), the block is summed in a scratch block first.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <stdint.h>
#include <string.h>

#if defined(__FAST_MATH__) || defined(__ASSOCIATIVE_MATH__) || defined(__RECIPROCAL_MATH__) \
    || __FINITE_MATH_ONLY__ || FLT_EVAL_METHOD != 0
#error "hfreduce._kernels must match numpy's fp32 arithmetic: build it without fast-math and with SSE floats"
#endif

#define BLOCK_ELEMS 4096 /* 16 KiB of fp32 per stream: a block's streams stay in L1 */
#define MAX_BUFFERS 64   /* sources, and copies, each */

/* one vectorized clone per ISA, picked at load time (needs glibc's ifunc) */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__)
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* each loop reads and writes element i only: vectorize without runtime alias checks (the buffers may be
 * exactly the same, which those checks would reject) */
#if defined(__clang__)
#define INDEPENDENT _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define INDEPENDENT _Pragma("GCC ivdep")
#else
#define INDEPENDENT
#endif

VECTOR_CLONES
static void add2(float *dst, const float *a, const float *b, size_t n)
{
    INDEPENDENT
    for (size_t i = 0; i < n; i++)
        dst[i] = a[i] + b[i];
}

VECTOR_CLONES
static void add3(float *dst, const float *a, const float *b, const float *c, size_t n)
{
    INDEPENDENT
    for (size_t i = 0; i < n; i++)
        dst[i] = (a[i] + b[i]) + c[i];
}

VECTOR_CLONES
static void accumulate(float *dst, const float *a, size_t n)
{
    INDEPENDENT
    for (size_t i = 0; i < n; i++)
        dst[i] += a[i];
}

VECTOR_CLONES
static void divide(float *dst, float divisor, size_t n)
{
    INDEPENDENT
    for (size_t i = 0; i < n; i++)
        dst[i] /= divisor;
}

/* `staged`: sum each block in a scratch block, then copy it to out (out is a source read after out is
 * written); otherwise straight into out. */
static void sum_blocks(float *out, const float *const *src, int num_src, float *const *copies, int num_copies,
                       size_t n, int divide_by, float divisor, int staged)
{
    float scratch[BLOCK_ELEMS];
    for (size_t b0 = 0; b0 < n; b0 += BLOCK_ELEMS) {
        size_t m = n - b0 < BLOCK_ELEMS ? n - b0 : BLOCK_ELEMS;
        float *dst = staged ? scratch : out + b0;
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
        if (divide_by)
            divide(dst, divisor, m);
        if (staged)
            memcpy(out + b0, scratch, m * sizeof(float));
        for (int c = 0; c < num_copies; c++)
            if (copies[c] + b0 != out + b0)
                memcpy(copies[c] + b0, out + b0, m * sizeof(float));
    }
}

/* Replace the pending exception with a TypeError saying `what` is wanted, the original as its cause. */
static void wrong_buffer(const char *what, const char *wanted)
{
    PyObject *type, *cause, *tb;
    PyErr_Fetch(&type, &cause, &tb);
    PyErr_NormalizeException(&type, &cause, &tb);
    if (tb != NULL && cause != NULL)
        PyException_SetTraceback(cause, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    PyErr_Format(PyExc_TypeError, "%s must be a %s", what, wanted);
    if (cause == NULL)
        return;
    PyObject *etype, *err, *etb;
    PyErr_Fetch(&etype, &err, &etb);
    PyErr_NormalizeException(&etype, &err, &etb);
    PyException_SetContext(err, Py_NewRef(cause));
    PyException_SetCause(err, cause); /* steals the reference */
    PyErr_Restore(etype, err, etb);
}

/* An aligned, C-contiguous, native-endian fp32 buffer of `obj` (writable when asked); on failure sets a
 * TypeError naming `what`. */
static int get_f32(PyObject *obj, Py_buffer *view, int writable, const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        wrong_buffer(what, writable ? "writable C-contiguous float32 buffer" : "C-contiguous float32 buffer");
        return -1;
    }
    const char *fmt = view->format != NULL ? view->format : "B";
#if PY_BIG_ENDIAN
    const char native = '>';
#else
    const char native = '<';
#endif
    if (fmt[0] == native || fmt[0] == '=' || fmt[0] == '@' || (PY_BIG_ENDIAN && fmt[0] == '!'))
        fmt++;
    if (view->itemsize != 4 || strcmp(fmt, "f") != 0) {
        PyErr_Format(PyExc_TypeError, "%s must hold native float32, got format '%s'", what,
                     view->format != NULL ? view->format : "B");
        PyBuffer_Release(view);
        return -1;
    }
    if ((uintptr_t)view->buf % _Alignof(float) != 0) {
        PyErr_Format(PyExc_TypeError, "%s must be aligned to %d bytes", what, (int)_Alignof(float));
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

PyDoc_STRVAR(sum_into_doc,
             "sum_into(out, sources, copies, divisor)\n--\n\n"
             "out = ((sources[0] + sources[1]) + ...) / divisor (no division when divisor is 0), also written to "
             "each of copies; aligned native float32 buffers of one length. Any two are the same buffer (in place) "
             "or do not overlap.");

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
    /* tuples: immutable, and they own their items while buffers are taken (a buffer export runs Python code) */
    PyObject *sources = PySequence_Tuple(args[1]);
    if (sources == NULL)
        return NULL;
    PyObject *copies = PySequence_Tuple(args[2]);
    if (copies == NULL) {
        Py_DECREF(sources);
        return NULL;
    }
    Py_ssize_t num_src = PyTuple_GET_SIZE(sources), num_copies = PyTuple_GET_SIZE(copies);
    PyObject *result = NULL;
    Py_buffer views[1 + 2 * MAX_BUFFERS];
    int held = 0;
    if (num_src < 1 || num_src > MAX_BUFFERS || num_copies > MAX_BUFFERS) {
        PyErr_Format(PyExc_ValueError, "sum_into takes 1-%d sources and at most %d copies, got %zd and %zd",
                     MAX_BUFFERS, MAX_BUFFERS, num_src, num_copies);
        goto done;
    }
    if (get_f32(args[0], &views[held], 1, "out") < 0)
        goto done;
    held++;
    for (Py_ssize_t i = 0; i < num_src; i++) {
        if (get_f32(PyTuple_GET_ITEM(sources, i), &views[held], 0, "each source") < 0)
            goto done;
        held++;
    }
    for (Py_ssize_t i = 0; i < num_copies; i++) {
        if (get_f32(PyTuple_GET_ITEM(copies, i), &views[held], 1, "each copy") < 0)
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
    const float *src[MAX_BUFFERS];
    float *dst[MAX_BUFFERS];
    int staged = 0;
    for (Py_ssize_t i = 0; i < num_src; i++) {
        src[i] = views[1 + i].buf;
        staged |= i >= 3 && views[1 + i].len && views[1 + i].buf == views[0].buf;
    }
    for (Py_ssize_t i = 0; i < num_copies; i++)
        dst[i] = views[1 + num_src + i].buf;
    Py_BEGIN_ALLOW_THREADS;
    sum_blocks(views[0].buf, src, (int)num_src, dst, (int)num_copies, (size_t)views[0].len / sizeof(float),
               divisor != 0.0, (float)divisor, staged);
    Py_END_ALLOW_THREADS;
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
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
