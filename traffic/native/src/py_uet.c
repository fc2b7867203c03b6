/* UetSender and UetReceiver for Python: the native state machines behind the reference's
 * interface (traffic/transports/uet.py, uet_receiver.py). */
#include "py_uet.h"

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

static int parse_now(PyObject *arg, double *now) {
    *now = PyFloat_AsDouble(arg);
    return (*now == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* ---- UetSender ------------------------------------------------------------------------ */
typedef struct {
    PyObject_HEAD fl_uet_sender s;
    bool ready;
} SenderObject;

static int sender_init(SenderObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"qp", "cfg", "now", "entropy", "seed", NULL};
    PyObject *qp, *cfg;
    double now;
    int entropy = 0, src, ch;
    unsigned long long seed = 1;
    fl_uet_cfg c;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOd|iK", names, &qp, &cfg, &now, &entropy,
                                     &seed) ||
        fl_py_qp(qp, &src, &ch) || fl_read_uet_cfg(cfg, &c))
        return -1;
    if (c.entropies < 1) {
        PyErr_Format(PyExc_ValueError, "entropies must be at least 1, got %lld",
                     (long long)c.entropies);
        return -1;
    }
    if (self->ready)
        fl_uet_sender_free(&self->s);
    self->ready = false;
    if (fl_uet_sender_init(&self->s, &c, src, ch, now, entropy, seed)) {
        PyErr_NoMemory();
        return -1;
    }
    self->ready = true;
    return 0;
}

static void sender_dealloc(SenderObject *self) {
    if (self->ready)
        fl_uet_sender_free(&self->s);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *sender_offer(SenderObject *self, PyObject *arg) {
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    int64_t end = fl_uet_offer(&self->s, n);
    return end < 0 ? PyErr_NoMemory() : PyLong_FromLongLong(end);
}

static PyObject *sender_poll(SenderObject *self, PyObject *arg) {
    double now;
    fl_packet p;
    if (parse_now(arg, &now))
        return NULL;
    if (!fl_uet_poll(&self->s, now, &p))
        Py_RETURN_NONE;
    return fl_py_packet(&p);
}

static PyObject *sender_next_send_time(SenderObject *self, PyObject *unused) {
    double at;
    bool have = fl_uet_next_send_time(&self->s, &at);
    return fl_py_time(have, at);
}

static PyObject *sender_on_packet(SenderObject *self, PyObject *args) {
    PyObject *pkt;
    double now;
    fl_packet p;
    if (!PyArg_ParseTuple(args, "Od", &pkt, &now) || fl_py_to_packet(pkt, &p))
        return NULL;
    fl_uet_sender_on_packet(&self->s, &p, now);
    Py_RETURN_NONE;
}

static PyObject *sender_timer(SenderObject *self, PyObject *unused) {
    double at;
    bool have = fl_uet_sender_timer(&self->s, &at);
    return fl_py_time(have, at);
}

static PyObject *sender_on_timer(SenderObject *self, PyObject *arg) {
    double now;
    if (parse_now(arg, &now))
        return NULL;
    fl_uet_sender_on_timer(&self->s, now);
    Py_RETURN_NONE;
}

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

static PyObject *sender_stats(SenderObject *self, void *unused) {
    return fl_py_uet_stats(&self->s);
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

static PyObject *sender_summary(SenderObject *self, PyObject *unused) {
    return fl_py_uet_summary(&self->s);
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

static PyObject *sender_describe(SenderObject *self, PyObject *unused) {
    return fl_py_uet_describe(&self->s);
}

static PyObject *sender_lengths(SenderObject *self, void *unused) {
    PyObject *out = PyList_New((Py_ssize_t)self->s.lengths.len);
    for (size_t i = 0; out && i < self->s.lengths.len; i++)
        PyList_SET_ITEM(out, i, PyLong_FromLong(FL_AT(self->s.lengths, int32_t, i)));
    return out;
}

#define GETTER(name, expr)                                                                  \
    static PyObject *sender_##name(SenderObject *self, void *u) { return expr; }
GETTER(una, PyLong_FromLongLong(self->s.una))
GETTER(nxt, PyLong_FromLongLong(self->s.nxt))
GETTER(cwnd, PyLong_FromLongLong(self->s.window.cwnd))
GETTER(in_flight, PyLong_FromLongLong(self->s.n_outstanding))
GETTER(to_resend, PyLong_FromLongLong(fl_uet_retx_len(&self->s)))
GETTER(inflight, PyLong_FromLongLong(self->s.inflight))
GETTER(rto, PyFloat_FromDouble(fl_uet_rto_s(&self->s)))
GETTER(reo_wnd, PyFloat_FromDouble(self->s.reo_wnd))

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
    {"nxt", (getter)sender_nxt, NULL, NULL, NULL},
    {"cwnd", (getter)sender_cwnd, NULL, "the window (bytes)", NULL},
    {"in_flight", (getter)sender_in_flight, NULL, "packets in flight", NULL},
    {"to_resend", (getter)sender_to_resend, NULL, "packets queued to resend", NULL},
    {"inflight", (getter)sender_inflight, NULL, "payload bytes in flight", NULL},
    {"rto_s", (getter)sender_rto, NULL, NULL, NULL},
    {"reo_wnd", (getter)sender_reo_wnd, NULL, NULL, NULL},
    {"lengths", (getter)sender_lengths, NULL, NULL, NULL},
    {"stats", (getter)sender_stats, NULL, NULL, NULL},
    {NULL}};

PyTypeObject fl_UetSenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "traffic.native._engine.UetSender",
    .tp_basicsize = sizeof(SenderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The sending side of a UET-like queue pair (compiled)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sender_init,
    .tp_dealloc = (destructor)sender_dealloc,
    .tp_methods = sender_methods,
    .tp_getset = sender_getset,
};

/* ---- UetReceiver ---------------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD fl_uet_receiver r;
    bool ready;
} ReceiverObject;

static int receiver_init(ReceiverObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"qp", "cfg", NULL};
    PyObject *qp, *cfg;
    int src, ch;
    fl_uet_cfg c;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO", names, &qp, &cfg) ||
        fl_py_qp(qp, &src, &ch) || fl_read_uet_cfg(cfg, &c))
        return -1;
    if (self->ready)
        fl_uet_receiver_free(&self->r);
    self->ready = false;
    if (fl_uet_receiver_init(&self->r, &c, src, ch)) {
        PyErr_NoMemory();
        return -1;
    }
    self->ready = true;
    return 0;
}

static void receiver_dealloc(ReceiverObject *self) {
    if (self->ready)
        fl_uet_receiver_free(&self->r);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *receiver_on_packet(ReceiverObject *self, PyObject *args) {
    PyObject *pkt;
    double now;
    fl_packet p, out[2];
    if (!PyArg_ParseTuple(args, "Od", &pkt, &now) || fl_py_to_packet(pkt, &p))
        return NULL;
    int n = fl_uet_receiver_on_packet(&self->r, &p, now, out);
    return n < 0 ? PyErr_NoMemory() : fl_py_packets(out, n);
}

static PyObject *receiver_timer(ReceiverObject *self, PyObject *unused) {
    double at;
    bool have = fl_uet_receiver_timer(&self->r, &at);
    return fl_py_time(have, at);
}

static PyObject *receiver_on_timer(ReceiverObject *self, PyObject *arg) {
    double now;
    fl_packet out[2];
    if (parse_now(arg, &now))
        return NULL;
    int n = fl_uet_receiver_on_timer(&self->r, now, out);
    return n < 0 ? PyErr_NoMemory() : fl_py_packets(out, n);
}

PyObject *fl_py_uet_rx_stats(const fl_uet_receiver *r) {
    static const char *const names[] = {"packets", "out_of_order", "duplicates", "naks", "ce",
                                        "acks", "trimmed", "lost", "lost_bytes"};
    int64_t values[] = {r->st_packets, r->st_ooo, r->st_dups, r->st_naks, r->st_ce,
                        r->st_acks, r->st_trimmed, r->st_lost, r->st_lost_bytes};
    return fl_py_counters(names, values, sizeof values / sizeof *values);
}

static PyObject *receiver_stats(ReceiverObject *self, void *unused) {
    return fl_py_uet_rx_stats(&self->r);
}

static PyObject *receiver_delivered(ReceiverObject *self, void *u) {
    return PyLong_FromLongLong(self->r.delivered);
}
static PyObject *receiver_cum(ReceiverObject *self, void *u) {
    return PyLong_FromLongLong(self->r.cum);
}
static PyObject *receiver_received(ReceiverObject *self, void *u) {
    return PyLong_FromLongLong(self->r.received_bytes);
}

static PyMethodDef receiver_methods[] = {
    {"on_packet", (PyCFunction)receiver_on_packet, METH_VARARGS, "the replies to a packet"},
    {"timer", (PyCFunction)receiver_timer, METH_NOARGS, NULL},
    {"on_timer", (PyCFunction)receiver_on_timer, METH_O, NULL},
    {NULL}};

static PyGetSetDef receiver_getset[] = {
    {"delivered", (getter)receiver_delivered, NULL, NULL, NULL},
    {"cum", (getter)receiver_cum, NULL, NULL, NULL},
    {"received_bytes", (getter)receiver_received, NULL, NULL, NULL},
    {"stats", (getter)receiver_stats, NULL, NULL, NULL},
    {NULL}};

PyTypeObject fl_UetReceiverType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "traffic.native._engine.UetReceiver",
    .tp_basicsize = sizeof(ReceiverObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The receiving side of a UET-like queue pair (compiled)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)receiver_init,
    .tp_dealloc = (destructor)receiver_dealloc,
    .tp_methods = receiver_methods,
    .tp_getset = receiver_getset,
};
