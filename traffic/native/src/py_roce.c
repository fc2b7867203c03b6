/* RoceSender and RoceReceiver for Python: the compiled state machines behind the reference's
 * interface (traffic/transports/rocev2.py): its configuration read, its counters built, the
 * table py_qp.c calls through. */
#include "py_roce.h"
#include "py_qp.h"

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

/* ---- counters ------------------------------------------------------------------------ */
PyObject *fl_py_roce_stats(const fl_roce_sender *s) {
    return Py_BuildValue("{sLsLsLsLsLsLsLsL}", "packets", s->st_packets, "bytes", s->st_bytes,
                         "retransmitted", s->st_retx, "retransmitted_bytes", s->st_retx_bytes,
                         "naks", s->st_naks, "cnps", s->st_cnps, "timeouts", s->st_timeouts,
                         "entropies", s->n_entropies);
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
PyObject *fl_py_roce_describe(const fl_roce_sender *s) {
    char text[256];
    snprintf(text, sizeof text,
             "%lld/%zu packets acknowledged, next %lld, rate %.3f Mbit/s, %lld timeouts",
             (long long)s->una, s->lengths.len, (long long)s->nxt, fl_roce_rate_bps(s) / 1e6,
             (long long)s->st_timeouts);
    return PyUnicode_FromString(text);
}
PyObject *fl_py_roce_rx_stats(const fl_roce_receiver *r) {
    return Py_BuildValue("{sLsLsLsLsLsLsL}", "packets", r->st_packets, "out_of_order",
                         r->st_ooo, "duplicates", r->st_dups, "naks", r->st_naks, "cnps",
                         r->st_cnps, "ce", r->st_ce, "trimmed", r->st_trimmed);
}

/* ---- the tables and types ------------------------------------------------------------ */
static int tx_init(void *s, PyObject *cfg, int src, int ch, double now, int entropy,
                   uint64_t seed) {
    fl_roce_cfg c;
    if (fl_read_roce_cfg(cfg, &c))
        return -1;
    return fl_roce_sender_init(s, &c, src, ch, now, entropy, seed) ? (PyErr_NoMemory(), -1) : 0;
}
static const fl_vec *tx_lengths(const void *s) { return &((const fl_roce_sender *)s)->lengths; }
static int64_t tx_una(const void *s) { return ((const fl_roce_sender *)s)->una; }
static int64_t tx_nxt(const void *s) { return ((const fl_roce_sender *)s)->nxt; }

static const fl_sender_ops sender_ops = {
    tx_init,
    (void (*)(void *))fl_roce_sender_free,
    (int64_t (*)(void *, int64_t))fl_roce_offer,
    (bool (*)(void *, double, fl_packet *))fl_roce_poll,
    (bool (*)(void *, double *))fl_roce_next_send_time,
    (void (*)(void *, const fl_packet *, double))fl_roce_sender_on_packet,
    (bool (*)(void *, double *))fl_roce_sender_timer,
    (void (*)(void *, double))fl_roce_sender_on_timer,
    (PyObject * (*)(const void *)) fl_py_roce_stats,
    (PyObject * (*)(const void *)) fl_py_roce_summary,
    (PyObject * (*)(const void *)) fl_py_roce_describe,
    tx_lengths,
    tx_una,
    tx_nxt,
};

static int sender_init(fl_SenderObject *self, PyObject *args, PyObject *kw) {
    return fl_sender_init(self, &sender_ops, args, kw);
}

static PyObject *sender_high(fl_SenderObject *self, void *u) {
    return PyLong_FromLongLong(self->s.roce.high);
}
static PyObject *sender_rate(fl_SenderObject *self, void *u) {
    return PyFloat_FromDouble(fl_roce_rate_bps(&self->s.roce));
}
static PyObject *sender_window(fl_SenderObject *self, void *u) {
    if (!self->s.roce.window_cc)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(self->s.roce.cc.window);
}

static PyGetSetDef sender_getset[] = {
    FL_SENDER_GETSET,
    {"acked", (getter)fl_sender_una, NULL, "every PSN below is acknowledged", NULL},
    {"high", (getter)sender_high, NULL, NULL, NULL},
    {"rate_bps", (getter)sender_rate, NULL, NULL, NULL},
    {"window", (getter)sender_window, NULL, "HPCC's or Swift's window (None: DCQCN)", NULL},
    {NULL}};

PyTypeObject fl_RoceSenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "traffic.native._engine.RoceSender",
    .tp_basicsize = sizeof(fl_SenderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The requester side of a RoCEv2-like queue pair (compiled)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sender_init,
    .tp_dealloc = (destructor)fl_sender_dealloc,
    .tp_methods = fl_sender_methods,
    .tp_getset = sender_getset,
};

static int rx_init(void *r, PyObject *cfg, int src, int ch) {
    fl_roce_cfg c;
    if (fl_read_roce_cfg(cfg, &c))
        return -1;
    fl_roce_receiver_init(r, &c, src, ch);
    return 0;
}
static void rx_free(void *r) {}
static int64_t rx_delivered(const void *r) { return ((const fl_roce_receiver *)r)->delivered; }

static const fl_receiver_ops receiver_ops = {
    rx_init,
    rx_free,
    (int (*)(void *, const fl_packet *, double, fl_packet *))fl_roce_receiver_on_packet,
    (bool (*)(void *, double *))fl_roce_receiver_timer,
    (int (*)(void *, double, fl_packet *))fl_roce_receiver_on_timer,
    (PyObject * (*)(const void *)) fl_py_roce_rx_stats,
    rx_delivered,
};

static int receiver_init(fl_ReceiverObject *self, PyObject *args, PyObject *kw) {
    return fl_receiver_init(self, &receiver_ops, args, kw);
}

static PyObject *receiver_expected(fl_ReceiverObject *self, void *u) {
    return PyLong_FromLongLong(self->r.roce.expected);
}

static PyGetSetDef receiver_getset[] = {
    FL_RECEIVER_GETSET, {"expected", (getter)receiver_expected, NULL, NULL, NULL}, {NULL}};

PyTypeObject fl_RoceReceiverType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "traffic.native._engine.RoceReceiver",
    .tp_basicsize = sizeof(fl_ReceiverObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The responder side of a RoCEv2-like queue pair (compiled)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)receiver_init,
    .tp_dealloc = (destructor)fl_receiver_dealloc,
    .tp_methods = fl_receiver_methods,
    .tp_getset = receiver_getset,
};
