/* Host for Python: one agent's compiled engine (host.c) behind the interface
 * traffic/agents/native.py gives the agent (UdpEngine's). */
#include <arpa/inet.h>
#include <poll.h>

#include "host.h"
#include "py_roce.h"
#include "py_uet.h"

typedef struct {
    PyObject_HEAD fl_host h;
    bool ready;
} HostObject;

static int doubles(PyObject *seq, double **out) {
    *out = NULL;
    if (seq == Py_None)
        return 0;
    PyObject *fast = PySequence_Fast(seq, "a list of floats");
    if (!fast)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    *out = PyMem_Calloc(n ? (size_t)n : 1, sizeof(double));
    for (Py_ssize_t i = 0; *out && i < n; i++) {
        PyObject *v = PySequence_Fast_GET_ITEM(fast, i);
        (*out)[i] = v == Py_None ? 0.0 : PyFloat_AsDouble(v);
    }
    Py_DECREF(fast);
    return (!*out || PyErr_Occurred()) ? -1 : 0;
}

static int address(const char *ip, int port, struct sockaddr_in *out) {
    memset(out, 0, sizeof *out);
    out->sin_family = AF_INET;
    out->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, ip, &out->sin_addr) != 1) {
        PyErr_Format(PyExc_ValueError, "not an IPv4 address: %s", ip);
        return -1;
    }
    return 0;
}

static int host_init(HostObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"transport", "cfg", "rank", "n_ranks", "addresses", "port",
                            "listen_fd", "pool_fds", "nic_rate_bps", "nic_slack_s", "cnp_tos",
                            "credit", "delays_s", "rtts_s", "stall_limit_s", NULL};
    const char *transport;
    PyObject *cfg, *addresses, *pool, *credit = Py_None, *delays = Py_None, *rtts = Py_None;
    int rank, n_ranks, port, listen_fd, cnp_tos;
    double nic_rate, nic_slack, stall_limit = 30.0;
    if (self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "a Host is set up once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sOiiOiiOddi|OOOd", names, &transport,
                                     &cfg, &rank, &n_ranks, &addresses, &port, &listen_fd,
                                     &pool, &nic_rate, &nic_slack, &cnp_tos, &credit, &delays,
                                     &rtts, &stall_limit))
        return -1;
    fl_host *h = &self->h;
    memset(h, 0, sizeof *h);
    h->epoll_fd = h->wake_fd = h->done_fd = -1;
    h->transport = !strcmp(transport, "rocev2") ? T_ROCE : T_UET;
    if (h->transport == T_ROCE ? fl_read_roce_cfg(cfg, &h->roce) : fl_read_uet_cfg(cfg, &h->uet))
        return -1;
    h->rank = rank;
    h->n_ranks = n_ranks;
    h->port = (uint16_t)port;
    h->listen_fd = listen_fd;
    h->nic_rate_bps = nic_rate;
    h->nic_slack_s = nic_slack;
    h->cnp_tos = cnp_tos;
    h->stall_limit_s = stall_limit;
    PyObject *fast = PySequence_Fast(pool, "pool_fds: a list of descriptors");
    if (!fast)
        return -1;
    h->n_pool = (int)PySequence_Fast_GET_SIZE(fast);
    h->pool = PyMem_Calloc((size_t)h->n_pool + 1, sizeof(int));
    for (int i = 0; h->pool && i < h->n_pool; i++)
        h->pool[i] = (int)PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
    Py_DECREF(fast);
    if (!(fast = PySequence_Fast(addresses, "addresses: (ip, rank) pairs")))
        return -1;
    h->n_ips = (int)PySequence_Fast_GET_SIZE(fast);
    h->ip_of = PyMem_Calloc((size_t)h->n_ips + 1, sizeof(uint32_t));
    h->rank_of = PyMem_Calloc((size_t)h->n_ips + 1, sizeof(int));
    for (int i = 0; h->ip_of && h->rank_of && i < h->n_ips; i++) {
        const char *ip;
        struct sockaddr_in a;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "si", &ip, &h->rank_of[i]) ||
            address(ip, 0, &a)) {
            Py_DECREF(fast);
            return -1;
        }
        h->ip_of[i] = a.sin_addr.s_addr;
    }
    Py_DECREF(fast);
    if (!h->pool || !h->ip_of || !h->rank_of || doubles(delays, &h->delays_s) ||
        doubles(rtts, &h->rtts_s))
        return PyErr_Occurred() ? -1 : (PyErr_NoMemory(), -1);
    if (h->delays_s) { /* all zero: no delay line */
        bool any = false;
        for (int i = 0; i < n_ranks; i++)
            any |= h->delays_s[i] > 0;
        if (!any) {
            PyMem_Free(h->delays_s);
            h->delays_s = NULL;
        }
    }
    if (credit != Py_None) {
        double rate;
        long long window, grant, initial;
        if (!PyArg_ParseTuple(credit, "dLLL", &rate, &window, &grant, &initial))
            return -1;
        if (fl_credit_init(&h->credit, rate, window, grant, initial))
            return (PyErr_NoMemory(), -1);
        h->has_credit = true;
    }
    if (fl_host_init(h)) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->ready = true;
    return 0;
}

static void host_dealloc(HostObject *self) {
    if (self->ready) {
        Py_BEGIN_ALLOW_THREADS fl_host_stop(&self->h);
        Py_END_ALLOW_THREADS fl_host_free(&self->h);
    }
    PyMem_Free(self->h.pool);
    PyMem_Free(self->h.ip_of);
    PyMem_Free(self->h.rank_of);
    PyMem_Free(self->h.delays_s);
    PyMem_Free(self->h.rtts_s);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *host_start(HostObject *self, PyObject *unused) {
    if (!self->ready || self->h.started || fl_host_start(&self->h))
        return PyErr_Format(PyExc_RuntimeError, "the engine cannot start");
    Py_RETURN_NONE;
}

static PyObject *host_stop(HostObject *self, PyObject *unused) {
    if (self->ready) {
        Py_BEGIN_ALLOW_THREADS fl_host_stop(&self->h);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *command(HostObject *self, int kind, PyObject *args) {
    fl_cmd c = {.kind = kind};
    const char *ip = NULL;
    long long nbytes = 0, token = 0;
    int ok = kind == CMD_PING ? PyArg_ParseTuple(args, "is", &c.peer, &ip)
             : kind == CMD_SEND
                 ? PyArg_ParseTuple(args, "iiLLs", &c.peer, &c.ch, &nbytes, &token, &ip)
                 : PyArg_ParseTuple(args, "iiLL", &c.peer, &c.ch, &nbytes, &token);
    if (!ok || (ip && address(ip, self->h.port, &c.addr)))
        return NULL;
    c.nbytes = nbytes;
    c.token = token;
    int bad;
    Py_BEGIN_ALLOW_THREADS bad = fl_host_command(&self->h, &c);
    Py_END_ALLOW_THREADS if (bad) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *host_send(HostObject *self, PyObject *args) {
    return command(self, CMD_SEND, args);
}
static PyObject *host_expect(HostObject *self, PyObject *args) {
    return command(self, CMD_EXPECT, args);
}
static PyObject *host_ping(HostObject *self, PyObject *args) {
    return command(self, CMD_PING, args);
}

static PyObject *host_wait(HostObject *self, PyObject *arg) {
    /* the tokens finished, waiting up to ``timeout`` seconds for one (without the GIL) */
    double timeout = PyFloat_AsDouble(arg);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    int64_t *done;
    size_t n;
    struct pollfd p = {self->h.done_fd, POLLIN, 0};
    Py_BEGIN_ALLOW_THREADS if (poll(&p, 1, (int)(timeout * 1e3)) > 0) {
        uint64_t v;
        if (read(self->h.done_fd, &v, sizeof v) < 0) { /* raced: nothing to read */
        }
    }
    Py_END_ALLOW_THREADS if (fl_host_take_done(&self->h, &done, &n)) return PyErr_NoMemory();
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++)
        PyList_SET_ITEM(out, (Py_ssize_t)i, PyLong_FromLongLong(done[i]));
    free(done);
    return out;
}

static PyObject *hist(const int64_t *h) {
    PyObject *out = PyList_New(FL_LATE_BUCKETS);
    for (int i = 0; out && i < FL_LATE_BUCKETS; i++)
        PyList_SET_ITEM(out, i, PyLong_FromLongLong(h[i]));
    return out;
}

static PyObject *opt(bool have, double v) { return fl_py_time(have, v); }

static PyObject *host_snapshot(HostObject *self, PyObject *unused) {
    /* every queue pair's counters and the engine's, read under the engine's lock.
     *
     * The lock order is the GIL, then the engine's lock: no thread may wait for the GIL while
     * it holds the engine's lock. The lock is taken here with the GIL held (the engine's own
     * thread never needs the GIL and holds its lock briefly), and nothing under it may let
     * the GIL go: the collector, which could run a finalizer's Python code (and with it hand
     * the GIL over), is off meanwhile. Taking the lock without the GIL and then waiting for
     * the GIL under it deadlocked against host_wait, which takes the lock with the GIL held:
     * an agent froze whole (its state publisher reads this while the completion thread
     * waits). */
    fl_host *h = &self->h;
    int collecting = PyGC_Disable();
    pthread_mutex_lock(&h->lock);
    PyObject *tx = PyList_New(0), *rx = PyList_New(0), *stalled = PyList_New(0),
             *keys = PyList_New(0);
    for (int i = 0; tx && stalled && keys && i < h->n_tx; i++) {
        fl_tx *t = h->tx[i];
        PyObject *key = Py_BuildValue("(ii)", t->peer, t->ch);
        PyList_Append(keys, key);
        Py_XDECREF(key);
        bool roce = h->transport == T_ROCE;
        PyObject *s = roce ? fl_py_roce_summary(&t->s.roce) : fl_py_uet_summary(&t->s.uet);
        PyList_Append(tx, s);
        Py_XDECREF(s);
        int64_t una = roce ? t->s.roce.una : t->s.uet.una;
        size_t len = roce ? t->s.roce.lengths.len : t->s.uet.lengths.len;
        if (una < (int64_t)len) {
            PyObject *d = roce ? fl_py_roce_describe(&t->s.roce) : fl_py_uet_describe(&t->s.uet);
            PyObject *row = Py_BuildValue("(siiN)", "tx", t->peer, t->ch, d);
            PyList_Append(stalled, row);
            Py_XDECREF(row);
        }
    }
    for (int i = 0; rx && stalled && i < h->n_rx; i++) {
        fl_rx *r = h->rx[i];
        bool roce = h->transport == T_ROCE;
        PyObject *s = roce ? fl_py_roce_rx_stats(&r->r.roce) : fl_py_uet_rx_stats(&r->r.uet);
        PyList_Append(rx, s);
        Py_XDECREF(s);
        if (r->waits.head < r->waits.len) {
            PyObject *row = Py_BuildValue(
                "(siiLL)", "rx", r->src, r->ch,
                (long long)(roce ? r->r.roce.delivered : r->r.uet.delivered),
                (long long)r->waits.data[2 * (r->waits.len - 1)]);
            PyList_Append(stalled, row);
            Py_XDECREF(row);
        }
    }
    PyObject *out = Py_BuildValue(
        "{sNsNsNsNsLsNsNsNsNsNsNsLsLss}", "senders", tx, "tx_keys", keys, "receivers", rx,
        "stalled", stalled,
        "local_drops", (long long)h->local_drops, "late_tx", hist(h->late_tx), "late_rx",
        hist(h->late_rx), "rtt_min_s", opt(h->has_rtt_min, h->rtt_min_s), "rtt_min_ratio",
        opt(h->has_rtt_ratio, h->rtt_min_ratio), "probe_min_s", opt(h->has_probe, h->probe_min_s),
        "probe_max_s", opt(h->has_probe, h->probe_max_s), "pongs", (long long)h->pongs,
        "grants", (long long)(h->has_credit ? h->credit.grants : 0), "error", h->error);
    pthread_mutex_unlock(&h->lock);
    if (collecting)
        PyGC_Enable();
    return out;
}

static PyObject *host_done_fd(HostObject *self, void *u) { return PyLong_FromLong(self->h.done_fd); }

static PyObject *host_error(HostObject *self, void *u) {
    char error[sizeof self->h.error];
    Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&self->h.lock);
    memcpy(error, self->h.error, sizeof error);
    pthread_mutex_unlock(&self->h.lock);
    Py_END_ALLOW_THREADS return PyUnicode_FromString(error);
}

static PyMethodDef host_methods[] = {
    {"start", (PyCFunction)host_start, METH_NOARGS, "start the engine's thread"},
    {"stop", (PyCFunction)host_stop, METH_NOARGS, "stop it and wait for it"},
    {"send", (PyCFunction)host_send, METH_VARARGS, "send(peer, channel, nbytes, token, ip)"},
    {"expect", (PyCFunction)host_expect, METH_VARARGS, "expect(peer, channel, nbytes, token)"},
    {"ping", (PyCFunction)host_ping, METH_VARARGS, "ping(peer, ip)"},
    {"wait", (PyCFunction)host_wait, METH_O, "the finished tokens (waits up to timeout s)"},
    {"snapshot", (PyCFunction)host_snapshot, METH_NOARGS, "every counter, and the stalled"},
    {NULL}};

static PyGetSetDef host_getset[] = {
    {"done_fd", (getter)host_done_fd, NULL, NULL, NULL},
    {"error", (getter)host_error, NULL, "why the engine stopped ('': it did not)", NULL},
    {NULL}};

PyTypeObject fl_HostType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "traffic.native._engine.Host",
    .tp_basicsize = sizeof(HostObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One agent's queue pairs over its sockets, in a thread without the GIL",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)host_init,
    .tp_dealloc = (destructor)host_dealloc,
    .tp_methods = host_methods,
    .tp_getset = host_getset,
};
