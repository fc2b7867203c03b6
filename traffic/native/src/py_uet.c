/* UetSender and UetReceiver for Python: the compiled state machines behind the reference's
 * interface (traffic/transports/uet.py, uet_receiver.py): the configuration read, the
 * counters built, the table py_qp.c calls through. */
#include "py_uet.h"
#include "py_qp.h"

#include <stdio.h>

static int pick(PyObject *cfg, const char *name, const char *const *choices, int *out) {
    PyObject *v = PyObject_GetAttrString(cfg, name);
    if (!v)
        return -1;
    const char *text = PyUnicode_AsUTF8(v);
    for (int i = 0; text && choices[i]; i++)
        if (!strcmp(text, choices[i])) {
            *out = i;
            Py_DECREF(v);
            return 0;
        }
    if (text)
        PyErr_Format(PyExc_ValueError, "%s %s: not known to the compiled engine", name, text);
    Py_DECREF(v);
    return -1;
}

int fl_read_uet_cfg(PyObject *cfg, fl_uet_cfg *o) {
    static const char *const deliveries[] = {"rud", "rod", "uud", NULL};
    static const char *const entropies[] = {"oblivious", "reps", "bitmap", NULL};
    memset(o, 0, sizeof *o);
    return (fl_attr_int(cfg, "mss", &o->mss) ||
            fl_attr_double(cfg, "line_rate_bps", &o->line_rate_bps) ||
            fl_attr_double(cfg, "base_rtt_s", &o->base_rtt_s) ||
            fl_attr_double(cfg, "rto_s", &o->rto_s) || fl_attr_bool(cfg, "spray", &o->spray) ||
            pick(cfg, "delivery", deliveries, &o->delivery) ||
            fl_attr_bool(cfg, "nscc", &o->nscc) || fl_attr_bool(cfg, "rccc", &o->rccc) ||
            fl_attr_int(cfg, "entropies", &o->entropies) ||
            pick(cfg, "entropy", entropies, &o->entropy) ||
            fl_attr_int(cfg, "reorder_threshold", &o->reorder_threshold) ||
            fl_attr_double(cfg, "target_factor", &o->target_factor) ||
            fl_attr_double(cfg, "md", &o->md) || fl_attr_double(cfg, "gamma", &o->gamma) ||
            fl_attr_double(cfg, "max_bdps", &o->max_bdps) ||
            fl_attr_double(cfg, "init_bdps", &o->init_bdps) ||
            fl_attr_int(cfg, "ack_every", &o->ack_every) ||
            fl_attr_double(cfg, "ack_delay_s", &o->ack_delay_s) ||
            fl_attr_double(cfg, "path_slack", &o->path_slack) ||
            fl_attr_int(cfg, "bdp_bytes", &o->bdp_bytes) ||
            fl_attr_int(cfg, "rccc_initial_bytes", &o->rccc_initial_bytes))
               ? -1
               : 0;
}

/* ---- counters ------------------------------------------------------------------------ */
PyObject *fl_py_uet_stats(const fl_uet_sender *s) {
    static const char *const names[] = {
        "packets", "bytes", "retransmitted", "retransmitted_bytes", "naks", "timeouts",
        "sack_losses", "spurious", "ce_acks", "probes", "trim_naks", "credit_requests",
        "grants", "credit_stalls", "lost", "lost_bytes", "entropies"};
    int64_t values[] = {s->st_packets, s->st_bytes, s->st_retx, s->st_retx_bytes, s->st_naks,
                        s->st_timeouts, s->st_sack_losses, s->st_spurious, s->st_ce_acks,
                        s->st_probes, s->st_trim_naks, s->st_credit_requests, s->st_grants,
                        s->st_credit_stalls, s->st_lost, s->st_lost_bytes, s->n_entropies};
    return fl_py_counters(names, values, sizeof values / sizeof *values);
}

PyObject *fl_py_uet_summary(const fl_uet_sender *s) {
    static const char *const names[] = {"rate_cuts", "cwnd_bytes", "entropies_recycled",
                                        "entropies_explored", "entropies_penalised"};
    int64_t values[] = {s->window.cuts, s->window.cwnd, s->paths.recycled, s->paths.explored,
                        s->paths.penalised};
    PyObject *out = fl_py_uet_stats(s);
    PyObject *more = fl_py_counters(names, values, sizeof values / sizeof *values);
    PyObject *ms = PyFloat_FromDouble(s->reo_wnd * 1e3);
    PyObject *rounded = ms ? PyObject_CallMethod(ms, "__round__", "i", 3) : NULL;
    Py_XDECREF(ms);
    if (!out || !more || !rounded || PyDict_Update(out, more) ||
        PyDict_SetItemString(out, "reorder_window_ms", rounded)) {
        Py_XDECREF(out);
        Py_XDECREF(more);
        Py_XDECREF(rounded);
        return NULL;
    }
    Py_DECREF(more);
    Py_DECREF(rounded);
    return out;
}

PyObject *fl_py_uet_describe(const fl_uet_sender *s) {
    char text[256];
    snprintf(text, sizeof text,
             "%lld/%zu packets acknowledged, %lld in flight, %lld to resend, window %lld B, "
             "timeout %.2f s, %lld timeouts",
             (long long)s->una, s->lengths.len, (long long)s->n_outstanding,
             (long long)fl_uet_retx_len(s), (long long)s->window.cwnd, fl_uet_rto_s(s),
             (long long)s->st_timeouts);
    return PyUnicode_FromString(text);
}

PyObject *fl_py_uet_rx_stats(const fl_uet_receiver *r) {
    static const char *const names[] = {"packets", "out_of_order", "duplicates", "naks", "ce",
                                        "acks", "trimmed", "lost", "lost_bytes"};
    int64_t values[] = {r->st_packets, r->st_ooo, r->st_dups, r->st_naks, r->st_ce,
                        r->st_acks, r->st_trimmed, r->st_lost, r->st_lost_bytes};
    return fl_py_counters(names, values, sizeof values / sizeof *values);
}

/* ---- the tables and types ------------------------------------------------------------ */
static int tx_init(void *s, PyObject *cfg, int src, int ch, double now, int entropy,
                   uint64_t seed) {
    fl_uet_cfg c;
    if (fl_read_uet_cfg(cfg, &c))
        return -1;
    if (c.entropies < 1) {
        PyErr_Format(PyExc_ValueError, "entropies must be at least 1, got %lld",
                     (long long)c.entropies);
        return -1;
    }
    return fl_uet_sender_init(s, &c, src, ch, now, entropy, seed) ? (PyErr_NoMemory(), -1) : 0;
}
static const fl_vec *tx_lengths(const void *s) { return &((const fl_uet_sender *)s)->lengths; }
static int64_t tx_una(const void *s) { return ((const fl_uet_sender *)s)->una; }
static int64_t tx_nxt(const void *s) { return ((const fl_uet_sender *)s)->nxt; }

static const fl_sender_ops sender_ops = {
    tx_init,
    (void (*)(void *))fl_uet_sender_free,
    (int64_t (*)(void *, int64_t))fl_uet_offer,
    (bool (*)(void *, double, fl_packet *))fl_uet_poll,
    (bool (*)(void *, double *))fl_uet_next_send_time,
    (void (*)(void *, const fl_packet *, double))fl_uet_sender_on_packet,
    (bool (*)(void *, double *))fl_uet_sender_timer,
    (void (*)(void *, double))fl_uet_sender_on_timer,
    (PyObject * (*)(const void *)) fl_py_uet_stats,
    (PyObject * (*)(const void *)) fl_py_uet_summary,
    (PyObject * (*)(const void *)) fl_py_uet_describe,
    tx_lengths,
    tx_una,
    tx_nxt,
};

static int sender_init(fl_SenderObject *self, PyObject *args, PyObject *kw) {
    return fl_sender_init(self, &sender_ops, args, kw);
}

#define GETTER(name, expr)                                                                  \
    static PyObject *sender_##name(fl_SenderObject *self, void *u) { return expr; }
GETTER(cwnd, PyLong_FromLongLong(self->s.uet.window.cwnd))
GETTER(in_flight, PyLong_FromLongLong(self->s.uet.n_outstanding))
GETTER(to_resend, PyLong_FromLongLong(fl_uet_retx_len(&self->s.uet)))
GETTER(inflight, PyLong_FromLongLong(self->s.uet.inflight))
GETTER(rto, PyFloat_FromDouble(fl_uet_rto_s(&self->s.uet)))
GETTER(reo_wnd, PyFloat_FromDouble(self->s.uet.reo_wnd))

static PyGetSetDef sender_getset[] = {
    FL_SENDER_GETSET,
    {"cwnd", (getter)sender_cwnd, NULL, "the window (bytes)", NULL},
    {"in_flight", (getter)sender_in_flight, NULL, "packets in flight", NULL},
    {"to_resend", (getter)sender_to_resend, NULL, "packets queued to resend", NULL},
    {"inflight", (getter)sender_inflight, NULL, "payload bytes in flight", NULL},
    {"rto_s", (getter)sender_rto, NULL, NULL, NULL},
    {"reo_wnd", (getter)sender_reo_wnd, NULL, NULL, NULL},
    {NULL}};

PyTypeObject fl_UetSenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "traffic.native._engine.UetSender",
    .tp_basicsize = sizeof(fl_SenderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The sending side of a UET-like queue pair (compiled)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sender_init,
    .tp_dealloc = (destructor)fl_sender_dealloc,
    .tp_methods = fl_sender_methods,
    .tp_getset = sender_getset,
};

static int rx_init(void *r, PyObject *cfg, int src, int ch) {
    fl_uet_cfg c;
    if (fl_read_uet_cfg(cfg, &c))
        return -1;
    return fl_uet_receiver_init(r, &c, src, ch) ? (PyErr_NoMemory(), -1) : 0;
}
static int64_t rx_delivered(const void *r) { return ((const fl_uet_receiver *)r)->delivered; }

static const fl_receiver_ops receiver_ops = {
    rx_init,
    (void (*)(void *))fl_uet_receiver_free,
    (int (*)(void *, const fl_packet *, double, fl_packet *))fl_uet_receiver_on_packet,
    (bool (*)(void *, double *))fl_uet_receiver_timer,
    (int (*)(void *, double, fl_packet *))fl_uet_receiver_on_timer,
    (PyObject * (*)(const void *)) fl_py_uet_rx_stats,
    rx_delivered,
};

static int receiver_init(fl_ReceiverObject *self, PyObject *args, PyObject *kw) {
    return fl_receiver_init(self, &receiver_ops, args, kw);
}

static PyObject *receiver_cum(fl_ReceiverObject *self, void *u) {
    return PyLong_FromLongLong(self->r.uet.cum);
}
static PyObject *receiver_received(fl_ReceiverObject *self, void *u) {
    return PyLong_FromLongLong(self->r.uet.received_bytes);
}

static PyGetSetDef receiver_getset[] = {
    FL_RECEIVER_GETSET,
    {"cum", (getter)receiver_cum, NULL, NULL, NULL},
    {"received_bytes", (getter)receiver_received, NULL, NULL, NULL},
    {NULL}};

PyTypeObject fl_UetReceiverType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "traffic.native._engine.UetReceiver",
    .tp_basicsize = sizeof(fl_ReceiverObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The receiving side of a UET-like queue pair (compiled)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)receiver_init,
    .tp_dealloc = (destructor)fl_receiver_dealloc,
    .tp_methods = fl_receiver_methods,
    .tp_getset = receiver_getset,
};
