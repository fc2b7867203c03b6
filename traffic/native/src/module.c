/* traffic.native._engine: the compiled transport engine (docs/transports.md, "Engines"). */
#include "py_common.h"
#include "py_roce.h"
#include "py_uet.h"
#include "host.h"

extern PyTypeObject fl_HostType;

static PyObject *rng_draws(PyObject *mod, PyObject *args) {
    /* the first n draws of randrange(below) from random.Random(seed): for the tests that
     * check the generator against Python's */
    unsigned long long seed;
    unsigned int below;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "KIn", &seed, &below, &n))
        return NULL;
    if (below < 1) {
        PyErr_SetString(PyExc_ValueError, "below must be at least 1");
        return NULL;
    }
    fl_rng r;
    fl_rng_seed(&r, seed);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++)
        PyList_SET_ITEM(out, i, PyLong_FromUnsignedLong(fl_rng_below(&r, below)));
    return out;
}

static PyObject *rng_shuffled(PyObject *mod, PyObject *args) {
    unsigned long long seed;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "Kn", &seed, &n))
        return NULL;
    fl_rng r;
    fl_rng_seed(&r, seed);
    int32_t *x = PyMem_Malloc(sizeof(int32_t) * (n ? n : 1));
    if (!x)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++)
        x[i] = (int32_t)i;
    fl_rng_shuffle(&r, x, (size_t)n);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++)
        PyList_SET_ITEM(out, i, PyLong_FromLong(x[i]));
    PyMem_Free(x);
    return out;
}

static PyMethodDef methods[] = {
    {"rng_draws", rng_draws, METH_VARARGS, "randrange(below) n times from Random(seed)"},
    {"rng_shuffled", rng_shuffled, METH_VARARGS, "shuffle(list(range(n))) from Random(seed)"},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_engine",
                                    "The compiled transport engine", -1, methods};

PyMODINIT_FUNC PyInit__engine(void) {
    PyTypeObject *types[] = {&fl_RoceSenderType, &fl_RoceReceiverType, &fl_UetSenderType,
                             &fl_UetReceiverType, &fl_HostType};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    PyObject *edges = PyTuple_New(FL_LATE_BUCKETS - 1);
    for (int i = 0; edges && i < FL_LATE_BUCKETS - 1; i++)
        PyTuple_SET_ITEM(edges, i, PyLong_FromLong((long)fl_late_edges_us[i]));
    if (!edges || PyModule_AddObject(m, "LATENESS_EDGES_US", edges) < 0) {
        Py_XDECREF(edges);
        Py_DECREF(m);
        return NULL;
    }
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        const char *name = strrchr(types[i]->tp_name, '.') + 1;
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, name, (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]);
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
