/* The Python bindings' shared conversions (see py_common.h). */
#include "py_common.h"

static PyObject *Packet, *Kind, *Hop;

int fl_py_import_packet(void) {
    if (Packet)
        return 0;
    PyObject *m = PyImport_ImportModule("traffic.transports.packet");
    if (!m)
        return -1;
    Packet = PyObject_GetAttrString(m, "Packet");
    Kind = PyObject_GetAttrString(m, "Kind");
    Hop = PyObject_GetAttrString(m, "Hop");
    Py_DECREF(m);
    return (Packet && Kind && Hop) ? 0 : -1;
}

PyObject *fl_py_packet(const fl_packet *p) {
    if (fl_py_import_packet())
        return NULL;
    PyObject *echo = PyTuple_New(p->n_echo);
    PyObject *hops = PyTuple_New(p->n_hops);
    if (!echo || !hops)
        goto fail;
    for (int i = 0; i < p->n_echo; i++)
        PyTuple_SET_ITEM(echo, i, PyLong_FromLong(p->echo[i]));
    for (int i = 0; i < p->n_hops; i++) {
        const fl_hop *h = &p->hops[i];
        PyObject *hop = PyObject_CallFunction(Hop, "KIII", (unsigned long long)h->ts_ns,
                                              h->tx_bytes, h->qlen_bytes, h->rate_kbps);
        if (!hop)
            goto fail;
        PyTuple_SET_ITEM(hops, i, hop);
    }
    PyObject *kind = PyObject_CallFunction(Kind, "i", p->kind);
    if (!kind)
        goto fail;
    PyObject *args = Py_BuildValue("(N(ii)LLILKKiOi)", kind, p->src, p->ch, (long long)p->psn,
                                   (long long)p->ack, p->length, (long long)p->entropy,
                                   (unsigned long long)p->sack,
                                   (unsigned long long)p->sent_ns, p->flags, echo, p->ce_mask);
    if (!args)
        goto fail;
    PyObject *kw = Py_BuildValue("{sOsO}", "trimmed", p->trimmed ? Py_True : Py_False,
                                 "hops", hops);
    PyObject *out = kw ? PyObject_Call(Packet, args, kw) : NULL;
    Py_DECREF(args);
    Py_XDECREF(kw);
    Py_DECREF(echo);
    Py_DECREF(hops);
    return out;
fail:
    Py_XDECREF(echo);
    Py_XDECREF(hops);
    return NULL;
}

PyObject *fl_py_packets(const fl_packet *ps, int n) {
    PyObject *list = PyList_New(n);
    if (!list)
        return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *p = fl_py_packet(&ps[i]);
        if (!p) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, p);
    }
    return list;
}

static int attr_ll(PyObject *o, const char *name, long long *out) {
    PyObject *v = PyObject_GetAttrString(o, name);
    if (!v)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

int fl_py_to_packet(PyObject *obj, fl_packet *p) {
    long long kind, psn, ack, length, entropy, flags, ce_mask;
    unsigned long long sack, sent_ns;
    memset(p, 0, sizeof *p);
    PyObject *qp = PyObject_GetAttrString(obj, "qp");
    if (!qp)
        return -1;
    int src, ch;
    int bad = fl_py_qp(qp, &src, &ch);
    Py_DECREF(qp);
    if (bad || attr_ll(obj, "kind", &kind) || attr_ll(obj, "psn", &psn) ||
        attr_ll(obj, "ack", &ack) || attr_ll(obj, "length", &length) ||
        attr_ll(obj, "entropy", &entropy) || attr_ll(obj, "flags", &flags) ||
        attr_ll(obj, "ce_mask", &ce_mask))
        return -1;
    PyObject *v = PyObject_GetAttrString(obj, "sack");
    if (!v)
        return -1;
    sack = PyLong_AsUnsignedLongLongMask(v);
    Py_DECREF(v);
    if (!(v = PyObject_GetAttrString(obj, "sent_ns")))
        return -1;
    sent_ns = PyLong_AsUnsignedLongLongMask(v);
    Py_DECREF(v);
    p->kind = (uint8_t)kind;
    p->flags = (uint8_t)flags;
    p->src = (uint16_t)src;
    p->ch = (uint16_t)ch;
    p->psn = psn;
    p->ack = ack;
    p->length = (uint32_t)length;
    p->entropy = (uint16_t)entropy;
    p->ce_mask = (uint8_t)ce_mask;
    p->sack = sack;
    p->sent_ns = sent_ns;
    if (!(v = PyObject_GetAttrString(obj, "trimmed")))
        return -1;
    p->trimmed = PyObject_IsTrue(v);
    Py_DECREF(v);
    PyObject *echo = PyObject_GetAttrString(obj, "echo");
    if (!echo)
        return -1;
    PyObject *seq = PySequence_Fast(echo, "echo: a tuple");
    Py_DECREF(echo);
    if (!seq)
        return -1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq) && i < FL_MAX_ECHO - 1; i++)
        p->echo[p->n_echo++] = (uint16_t)PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
    Py_DECREF(seq);
    PyObject *hops = PyObject_GetAttrString(obj, "hops");
    if (!hops)
        return -1;
    seq = PySequence_Fast(hops, "hops: a tuple");
    Py_DECREF(hops);
    if (!seq)
        return -1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq) && i < FL_INT_HOPS; i++) {
        PyObject *h = PySequence_Fast_GET_ITEM(seq, i);
        long long ts, tx, q, rate;
        if (attr_ll(h, "ts_ns", &ts) || attr_ll(h, "tx_bytes", &tx) ||
            attr_ll(h, "qlen_bytes", &q) || attr_ll(h, "rate_kbps", &rate)) {
            Py_DECREF(seq);
            return -1;
        }
        p->hops[p->n_hops++] = (fl_hop){(uint64_t)ts, (uint32_t)tx, (uint32_t)q,
                                        (uint32_t)rate};
    }
    Py_DECREF(seq);
    return PyErr_Occurred() ? -1 : 0;
}

int fl_attr_double(PyObject *o, const char *name, double *out) {
    PyObject *v = PyObject_GetAttrString(o, name);
    if (!v)
        return -1;
    *out = PyFloat_AsDouble(v);
    Py_DECREF(v);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

int fl_attr_int(PyObject *o, const char *name, int64_t *out) {
    long long v;
    if (attr_ll(o, name, &v))
        return -1;
    *out = v;
    return 0;
}

int fl_attr_bool(PyObject *o, const char *name, bool *out) {
    PyObject *v = PyObject_GetAttrString(o, name);
    if (!v)
        return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (t < 0)
        return -1;
    *out = t;
    return 0;
}

int fl_py_qp(PyObject *qp, int *src, int *ch) {
    if (!PyArg_ParseTuple(qp, "ii", src, ch))
        return -1;
    return 0;
}

PyObject *fl_py_time(bool have, double at) {
    if (!have)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(at);
}

PyObject *fl_py_counters(const char *const *names, const int64_t *values, int n) {
    PyObject *out = PyDict_New();
    for (int i = 0; out && i < n; i++) {
        PyObject *v = PyLong_FromLongLong(values[i]);
        if (!v || PyDict_SetItemString(out, names[i], v)) {
            Py_XDECREF(v);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(v);
    }
    return out;
}
