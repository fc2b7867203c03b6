/* The methods every queue pair's sender and receiver has, for Python (see py_qp.h). */
#include "py_qp.h"

static int parse_now(PyObject *arg, double *now) {
    *now = PyFloat_AsDouble(arg);
    return (*now == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

int fl_sender_init(fl_SenderObject *self, const fl_sender_ops *ops, PyObject *args,
                   PyObject *kw) {
    static char *names[] = {"qp", "cfg", "now", "entropy", "seed", NULL};
    PyObject *qp, *cfg;
    double now;
    int entropy = 0, src, ch;
    unsigned long long seed = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOd|iK", names, &qp, &cfg, &now, &entropy,
                                     &seed) ||
        fl_py_qp(qp, &src, &ch))
        return -1;
    if (self->ready)
        self->ops->free(&self->s);
    self->ready = false;
    self->ops = ops;
    if (ops->init(&self->s, cfg, src, ch, now, entropy, seed))
        return -1;
    self->ready = true;
    return 0;
}

void fl_sender_dealloc(fl_SenderObject *self) {
    if (self->ready)
        self->ops->free(&self->s);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *not_ready(void) {
    PyErr_SetString(PyExc_RuntimeError, "a queue pair not set up (its __init__ failed)");
    return NULL;
}

#define READY(self)                                                                         \
    if (!(self)->ready)                                                                     \
    return not_ready()

static PyObject *sender_offer(fl_SenderObject *self, PyObject *arg) {
    READY(self);
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    int64_t end = self->ops->offer(&self->s, n);
    return end < 0 ? PyErr_NoMemory() : PyLong_FromLongLong(end);
}

static PyObject *sender_poll(fl_SenderObject *self, PyObject *arg) {
    double now;
    fl_packet p;
    READY(self);
    if (parse_now(arg, &now))
        return NULL;
    if (!self->ops->poll(&self->s, now, &p))
        Py_RETURN_NONE;
    return fl_py_packet(&p);
}

static PyObject *sender_next_send_time(fl_SenderObject *self, PyObject *unused) {
    double at = 0;
    READY(self);
    bool have = self->ops->next_send_time(&self->s, &at);
    return fl_py_time(have, at);
}

static PyObject *sender_on_packet(fl_SenderObject *self, PyObject *args) {
    PyObject *pkt;
    double now;
    fl_packet p;
    READY(self);
    if (!PyArg_ParseTuple(args, "Od", &pkt, &now) || fl_py_to_packet(pkt, &p))
        return NULL;
    self->ops->on_packet(&self->s, &p, now);
    Py_RETURN_NONE;
}

static PyObject *sender_timer(fl_SenderObject *self, PyObject *unused) {
    double at = 0;
    READY(self);
    bool have = self->ops->timer(&self->s, &at);
    return fl_py_time(have, at);
}

static PyObject *sender_on_timer(fl_SenderObject *self, PyObject *arg) {
    double now;
    READY(self);
    if (parse_now(arg, &now))
        return NULL;
    self->ops->on_timer(&self->s, now);
    Py_RETURN_NONE;
}

static PyObject *sender_summary(fl_SenderObject *self, PyObject *unused) {
    READY(self);
    return self->ops->summary(&self->s);
}

static PyObject *sender_describe(fl_SenderObject *self, PyObject *unused) {
    READY(self);
    return self->ops->describe(&self->s);
}

PyObject *fl_sender_stats(fl_SenderObject *self, void *u) {
    READY(self);
    return self->ops->stats(&self->s);
}

PyObject *fl_sender_una(fl_SenderObject *self, void *u) {
    READY(self);
    return PyLong_FromLongLong(self->ops->una(&self->s));
}

PyObject *fl_sender_nxt(fl_SenderObject *self, void *u) {
    READY(self);
    return PyLong_FromLongLong(self->ops->nxt(&self->s));
}

PyObject *fl_sender_lengths(fl_SenderObject *self, void *u) {
    READY(self);
    const fl_vec *lengths = self->ops->lengths(&self->s);
    PyObject *out = PyList_New((Py_ssize_t)lengths->len);
    for (size_t i = 0; out && i < lengths->len; i++)
        PyList_SET_ITEM(out, (Py_ssize_t)i, PyLong_FromLong(FL_AT(*lengths, int32_t, i)));
    return out;
}

PyMethodDef fl_sender_methods[] = {
    {"offer", (PyCFunction)sender_offer, METH_O, "queue a message; the PSN it ends before"},
    {"poll", (PyCFunction)sender_poll, METH_O, "the packet to send now, or None"},
    {"next_send_time", (PyCFunction)sender_next_send_time, METH_NOARGS, NULL},
    {"on_packet", (PyCFunction)sender_on_packet, METH_VARARGS, NULL},
    {"timer", (PyCFunction)sender_timer, METH_NOARGS, NULL},
    {"on_timer", (PyCFunction)sender_on_timer, METH_O, NULL},
    {"summary", (PyCFunction)sender_summary, METH_NOARGS, NULL},
    {"describe", (PyCFunction)sender_describe, METH_NOARGS, NULL},
    {NULL}};

/* ---- receivers ------------------------------------------------------------------------- */
int fl_receiver_init(fl_ReceiverObject *self, const fl_receiver_ops *ops, PyObject *args,
                     PyObject *kw) {
    static char *names[] = {"qp", "cfg", NULL};
    PyObject *qp, *cfg;
    int src, ch;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO", names, &qp, &cfg) ||
        fl_py_qp(qp, &src, &ch))
        return -1;
    if (self->ready)
        self->ops->free(&self->r);
    self->ready = false;
    self->ops = ops;
    if (ops->init(&self->r, cfg, src, ch))
        return -1;
    self->ready = true;
    return 0;
}

void fl_receiver_dealloc(fl_ReceiverObject *self) {
    if (self->ready)
        self->ops->free(&self->r);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *receiver_on_packet(fl_ReceiverObject *self, PyObject *args) {
    PyObject *pkt;
    double now;
    fl_packet p, out[2];
    READY(self);
    if (!PyArg_ParseTuple(args, "Od", &pkt, &now) || fl_py_to_packet(pkt, &p))
        return NULL;
    int n = self->ops->on_packet(&self->r, &p, now, out);
    return n < 0 ? PyErr_NoMemory() : fl_py_packets(out, n);
}

static PyObject *receiver_timer(fl_ReceiverObject *self, PyObject *unused) {
    double at = 0;
    READY(self);
    bool have = self->ops->timer(&self->r, &at);
    return fl_py_time(have, at);
}

static PyObject *receiver_on_timer(fl_ReceiverObject *self, PyObject *arg) {
    double now;
    fl_packet out[2];
    READY(self);
    if (parse_now(arg, &now))
        return NULL;
    int n = self->ops->on_timer(&self->r, now, out);
    return n < 0 ? PyErr_NoMemory() : fl_py_packets(out, n);
}

PyObject *fl_receiver_stats(fl_ReceiverObject *self, void *u) {
    READY(self);
    return self->ops->stats(&self->r);
}

PyObject *fl_receiver_delivered(fl_ReceiverObject *self, void *u) {
    READY(self);
    return PyLong_FromLongLong(self->ops->delivered(&self->r));
}

PyMethodDef fl_receiver_methods[] = {
    {"on_packet", (PyCFunction)receiver_on_packet, METH_VARARGS, "the replies to a packet"},
    {"timer", (PyCFunction)receiver_timer, METH_NOARGS, NULL},
    {"on_timer", (PyCFunction)receiver_on_timer, METH_O, NULL},
    {NULL}};
