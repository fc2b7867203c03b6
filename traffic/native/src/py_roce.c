/* RoceSender and RoceReceiver for Python: the native state machines behind the reference's
 * interface (traffic/transports/rocev2.py), for the differential tests and the sans-I/O
 * tests run against both. */
#include "py_roce.h"

#include <stdio.h>

static int read_dcqcn(PyObject *d, fl_dcqcn_cfg *o) {
    int64_t fast;
    if (fl_attr_double(d, "line_rate_bps", &o->line_rate_bps) || fl_attr_double(d, "g", &o->g) ||
        fl_attr_double(d, "alpha_period_s", &o->alpha_period_s) ||
        fl_attr_double(d, "rate_period_s", &o->rate_period_s) ||
        fl_attr_int(d, "byte_counter", &o->byte_counter) ||
        fl_attr_int(d, "fast_recovery_stages", &fast) ||
        fl_attr_double(d, "rate_ai_bps", &o->rate_ai_bps) ||
        fl_attr_double(d, "rate_hai_bps", &o->rate_hai_bps) ||
        fl_attr_double(d, "min_rate_bps", &o->min_rate_bps) ||
        fl_attr_bool(d, "clamp_target", &o->clamp_target) ||
        fl_attr_double(d, "cut_interval_s", &o->cut_interval_s))
        return -1;
    o->fast_recovery_stages = (int)fast;
    return 0;
}

static int read_hpcc(PyObject *h, fl_hpcc_cfg *o) {
    int64_t stage;
    if (fl_attr_double(h, "line_rate_bps", &o->line_rate_bps) ||
        fl_attr_double(h, "base_rtt_s", &o->base_rtt_s) || fl_attr_int(h, "mss", &o->mss) ||
        fl_attr_int(h, "bdp_bytes", &o->bdp_bytes) ||
        fl_attr_int(h, "additive_bytes", &o->additive_bytes) ||
        fl_attr_double(h, "eta", &o->eta) || fl_attr_int(h, "max_stage", &stage))
        return -1;
    o->max_stage = (int)stage;
    return 0;
}

static int read_swift(PyObject *s, fl_swift_cfg *o) {
    return fl_attr_double(s, "line_rate_bps", &o->line_rate_bps) ||
           fl_attr_double(s, "base_rtt_s", &o->base_rtt_s) || fl_attr_int(s, "mss", &o->mss) ||
           fl_attr_int(s, "bdp_bytes", &o->bdp_bytes) ||
           fl_attr_double(s, "target_factor", &o->target_factor) ||
           fl_attr_double(s, "ai", &o->ai) || fl_attr_double(s, "beta", &o->beta) ||
           fl_attr_double(s, "max_mdf", &o->max_mdf);
}

static int read_part(PyObject *cfg, const char *name, int (*read)(PyObject *, void *),
                     void *out) {
    PyObject *part = PyObject_GetAttrString(cfg, name);
    if (!part)
        return -1;
    int bad = read(part, out);
    Py_DECREF(part);
    return bad;
}

int fl_read_roce_cfg(PyObject *cfg, fl_roce_cfg *o) {
    memset(o, 0, sizeof *o);
    if (fl_attr_int(cfg, "mss", &o->mss) || fl_attr_double(cfg, "rto_s", &o->rto_s) ||
        fl_attr_int(cfg, "max_outstanding", &o->max_outstanding) ||
        fl_attr_int(cfg, "ack_every", &o->ack_every) ||
        fl_attr_double(cfg, "ack_delay_s", &o->ack_delay_s) ||
        fl_attr_double(cfg, "cnp_interval_s", &o->cnp_interval_s) ||
        fl_attr_bool(cfg, "spray", &o->spray) || fl_attr_int(cfg, "entropies", &o->entropies) ||
        fl_attr_double(cfg, "line_rate_bps", &o->line_rate_bps))
        return -1;
    PyObject *cc = PyObject_GetAttrString(cfg, "congestion_control");
    if (!cc)
        return -1;
    const char *name = PyUnicode_AsUTF8(cc);
    if (!name) {
        Py_DECREF(cc);
        return -1;
    }
    o->cc = !strcmp(name, "dcqcn") ? CC_DCQCN : !strcmp(name, "hpcc") ? CC_HPCC
            : !strcmp(name, "swift") ? CC_SWIFT : CC_OFF;
    Py_DECREF(cc);
    if (o->cc == CC_DCQCN)
        return read_part(cfg, "dcqcn", (int (*)(PyObject *, void *))read_dcqcn, &o->dcqcn);
    if (o->cc == CC_HPCC)
        return read_part(cfg, "hpcc", (int (*)(PyObject *, void *))read_hpcc, &o->hpcc);
    if (o->cc == CC_SWIFT)
        return read_part(cfg, "swift", (int (*)(PyObject *, void *))read_swift, &o->swift);
    return 0;
}

/* ---- RoceSender ----------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD fl_roce_sender s;
    bool ready;
} SenderObject;

static int sender_init(SenderObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"qp", "cfg", "now", "entropy", "seed", NULL};
    PyObject *qp, *cfg;
    double now;
    int entropy = 0;
    unsigned long long seed = 1;
    int src, ch;
    fl_roce_cfg c;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOd|iK", names, &qp, &cfg, &now, &entropy,
                                     &seed) ||
        fl_py_qp(qp, &src, &ch) || fl_read_roce_cfg(cfg, &c))
        return -1;
    if (self->ready)
        fl_roce_sender_free(&self->s);
    if (fl_roce_sender_init(&self->s, &c, src, ch, now, entropy, seed)) {
        PyErr_NoMemory();
        return -1;
    }
    self->ready = true;
    return 0;
}

static void sender_dealloc(SenderObject *self) {
    if (self->ready)
        fl_roce_sender_free(&self->s);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *sender_offer(SenderObject *self, PyObject *arg) {
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    int64_t end = fl_roce_offer(&self->s, n);
    return end < 0 ? PyErr_NoMemory() : PyLong_FromLongLong(end);
}

static PyObject *sender_poll(SenderObject *self, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    fl_packet p;
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    if (!fl_roce_poll(&self->s, now, &p))
        Py_RETURN_NONE;
    return fl_py_packet(&p);
}

static PyObject *sender_next_send_time(SenderObject *self, PyObject *unused) {
    double at;
    bool have = fl_roce_next_send_time(&self->s, &at);
    return fl_py_time(have, at);
}

static PyObject *sender_on_packet(SenderObject *self, PyObject *args) {
    PyObject *pkt;
    double now;
    fl_packet p;
    if (!PyArg_ParseTuple(args, "Od", &pkt, &now) || fl_py_to_packet(pkt, &p))
        return NULL;
    fl_roce_sender_on_packet(&self->s, &p, now);
    Py_RETURN_NONE;
}

static PyObject *sender_timer(SenderObject *self, PyObject *unused) {
    double at;
    bool have = fl_roce_sender_timer(&self->s, &at);
    return fl_py_time(have, at);
}

static PyObject *sender_on_timer(SenderObject *self, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    fl_roce_sender_on_timer(&self->s, now);
    Py_RETURN_NONE;
}

PyObject *fl_py_roce_stats(const fl_roce_sender *s) {
    return Py_BuildValue("{sLsLsLsLsLsLsLsL}", "packets", s->st_packets, "bytes", s->st_bytes,
                         "retransmitted", s->st_retx, "retransmitted_bytes", s->st_retx_bytes,
                         "naks", s->st_naks, "cnps", s->st_cnps, "timeouts", s->st_timeouts,
                         "entropies", s->n_entropies);
}

static PyObject *sender_stats(SenderObject *self, void *unused) {
    return fl_py_roce_stats(&self->s);
}

PyObject *fl_py_roce_summary(const fl_roce_sender *s) {
    PyObject *out = fl_py_roce_stats(s);
    if (!out)
        return NULL;
    PyObject *cuts = PyLong_FromLongLong(s->has_cc ? s->cc.cuts : 0);
    if (!cuts || PyDict_SetItemString(out, "rate_cuts", cuts))
        goto fail;
    Py_DECREF(cuts);
    if (s->window_cc) {
        PyObject *w = PyLong_FromLongLong((long long)s->cc.window);
        if (!w || PyDict_SetItemString(out, "cwnd_bytes", w)) {
            Py_XDECREF(w);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(w);
    }
    return out;
fail:
    Py_XDECREF(cuts);
    Py_DECREF(out);
    return NULL;
}

static PyObject *sender_summary(SenderObject *self, PyObject *unused) {
    return fl_py_roce_summary(&self->s);
}

PyObject *fl_py_roce_describe(const fl_roce_sender *s) {
    char text[256];
    snprintf(text, sizeof text,
             "%lld/%zu packets acknowledged, next %lld, rate %.3f Mbit/s, %lld timeouts",
             (long long)s->una, s->lengths.len, (long long)s->nxt, fl_roce_rate_bps(s) / 1e6,
             (long long)s->st_timeouts);
    return PyUnicode_FromString(text);
}

static PyObject *sender_describe(SenderObject *self, PyObject *unused) {
    return fl_py_roce_describe(&self->s);
}

static PyObject *sender_lengths(SenderObject *self, void *unused) {
    PyObject *out = PyList_New((Py_ssize_t)self->s.lengths.len);
    for (size_t i = 0; out && i < self->s.lengths.len; i++)
        PyList_SET_ITEM(out, i, PyLong_FromLong(FL_AT(self->s.lengths, int32_t, i)));
    return out;
}

static PyObject *sender_una(SenderObject *self, void *u) { return PyLong_FromLongLong(self->s.una); }
static PyObject *sender_nxt(SenderObject *self, void *u) { return PyLong_FromLongLong(self->s.nxt); }
static PyObject *sender_high(SenderObject *self, void *u) { return PyLong_FromLongLong(self->s.high); }
static PyObject *sender_rate(SenderObject *self, void *u) {
    return PyFloat_FromDouble(fl_roce_rate_bps(&self->s));
}
static PyObject *sender_window(SenderObject *self, void *u) {
    if (!self->s.window_cc)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(self->s.cc.window);
}

static PyMethodDef sender_methods[] = {
    {"offer", (PyCFunction)sender_offer, METH_O, "queue a message; the PSN it ends before"},
    {"poll", (PyCFunction)sender_poll, METH_O, "the packet to send now, or None"},
    {"next_send_time", (PyCFunction)sender_next_send_time, METH_NOARGS, NULL},
    {"on_packet", (PyCFunction)sender_on_packet, METH_VARARGS, NULL},
    {"timer", (PyCFunction)sender_timer, METH_NOARGS, NULL},
    {"on_timer", (PyCFunction)sender_on_timer, METH_O, NULL},
    {"summary", (PyCFunction)sender_summary, METH_NOARGS, NULL},
    {"describe", (PyCFunction)sender_describe, METH_NOARGS, NULL},
    {NULL}};

static PyGetSetDef sender_getset[] = {
    {"una", (getter)sender_una, NULL, NULL, NULL},
    {"acked", (getter)sender_una, NULL, NULL, NULL},
    {"nxt", (getter)sender_nxt, NULL, NULL, NULL},
    {"high", (getter)sender_high, NULL, NULL, NULL},
    {"rate_bps", (getter)sender_rate, NULL, NULL, NULL},
    {"window", (getter)sender_window, NULL, "HPCC's or Swift's window (None: DCQCN)", NULL},
    {"lengths", (getter)sender_lengths, NULL, NULL, NULL},
    {"stats", (getter)sender_stats, NULL, NULL, NULL},
    {NULL}};

PyTypeObject fl_RoceSenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "traffic.native._engine.RoceSender",
    .tp_basicsize = sizeof(SenderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The requester side of a RoCEv2-like queue pair (compiled)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sender_init,
    .tp_dealloc = (destructor)sender_dealloc,
    .tp_methods = sender_methods,
    .tp_getset = sender_getset,
};

/* ---- RoceReceiver --------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD fl_roce_receiver r;
} ReceiverObject;

static int receiver_init(ReceiverObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"qp", "cfg", NULL};
    PyObject *qp, *cfg;
    int src, ch;
    fl_roce_cfg c;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO", names, &qp, &cfg) ||
        fl_py_qp(qp, &src, &ch) || fl_read_roce_cfg(cfg, &c))
        return -1;
    fl_roce_receiver_init(&self->r, &c, src, ch);
    return 0;
}

static PyObject *receiver_on_packet(ReceiverObject *self, PyObject *args) {
    PyObject *pkt;
    double now;
    fl_packet p, out[2];
    if (!PyArg_ParseTuple(args, "Od", &pkt, &now) || fl_py_to_packet(pkt, &p))
        return NULL;
    return fl_py_packets(out, fl_roce_receiver_on_packet(&self->r, &p, now, out));
}

static PyObject *receiver_timer(ReceiverObject *self, PyObject *unused) {
    double at;
    bool have = fl_roce_receiver_timer(&self->r, &at);
    return fl_py_time(have, at);
}

static PyObject *receiver_on_timer(ReceiverObject *self, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    fl_packet out[1];
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    return fl_py_packets(out, fl_roce_receiver_on_timer(&self->r, now, out));
}

static PyObject *receiver_stats(ReceiverObject *self, void *unused) {
    return fl_py_roce_rx_stats(&self->r);
}

PyObject *fl_py_roce_rx_stats(const fl_roce_receiver *r) {
    return Py_BuildValue("{sLsLsLsLsLsLsL}", "packets", r->st_packets, "out_of_order",
                         r->st_ooo, "duplicates", r->st_dups, "naks", r->st_naks, "cnps",
                         r->st_cnps, "ce", r->st_ce, "trimmed", r->st_trimmed);
}

static PyObject *receiver_delivered(ReceiverObject *self, void *u) {
    return PyLong_FromLongLong(self->r.delivered);
}
static PyObject *receiver_expected(ReceiverObject *self, void *u) {
    return PyLong_FromLongLong(self->r.expected);
}

static PyMethodDef receiver_methods[] = {
    {"on_packet", (PyCFunction)receiver_on_packet, METH_VARARGS, "the replies to a DATA packet"},
    {"timer", (PyCFunction)receiver_timer, METH_NOARGS, NULL},
    {"on_timer", (PyCFunction)receiver_on_timer, METH_O, NULL},
    {NULL}};

static PyGetSetDef receiver_getset[] = {
    {"delivered", (getter)receiver_delivered, NULL, NULL, NULL},
    {"expected", (getter)receiver_expected, NULL, NULL, NULL},
    {"stats", (getter)receiver_stats, NULL, NULL, NULL},
    {NULL}};

PyTypeObject fl_RoceReceiverType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "traffic.native._engine.RoceReceiver",
    .tp_basicsize = sizeof(ReceiverObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The responder side of a RoCEv2-like queue pair (compiled)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)receiver_init,
    .tp_methods = receiver_methods,
    .tp_getset = receiver_getset,
};
