/* A queue pair's sender and receiver as Python objects, whichever the transport: the
 * methods every one has (the reference's interface: offer, poll, next_send_time, on_packet,
 * timer, on_timer, summary, describe; a receiver's on_packet, timer, on_timer), each calling
 * its transport's state machine through a table (py_roce.c, py_uet.c fill them in). */
#ifndef FL_PY_QP_H
#define FL_PY_QP_H

#include "py_common.h"
#include "roce.h"
#include "uet.h"

typedef struct {
    int (*init)(void *s, PyObject *cfg, int src, int ch, double now, int entropy,
                uint64_t seed); /* -1 with an exception */
    void (*free)(void *s);
    int64_t (*offer)(void *s, int64_t nbytes);
    bool (*poll)(void *s, double now, fl_packet *out);
    bool (*next_send_time)(void *s, double *at);
    void (*on_packet)(void *s, const fl_packet *p, double now);
    bool (*timer)(void *s, double *at);
    void (*on_timer)(void *s, double now);
    PyObject *(*stats)(const void *s);
    PyObject *(*summary)(const void *s);
    PyObject *(*describe)(const void *s);
    const fl_vec *(*lengths)(const void *s);
    int64_t (*una)(const void *s);
    int64_t (*nxt)(const void *s);
} fl_sender_ops;

typedef struct {
    int (*init)(void *r, PyObject *cfg, int src, int ch); /* -1 with an exception */
    void (*free)(void *r);
    int (*on_packet)(void *r, const fl_packet *p, double now, fl_packet *out); /* -1: memory */
    bool (*timer)(void *r, double *at);
    int (*on_timer)(void *r, double now, fl_packet *out);
    PyObject *(*stats)(const void *r);
    int64_t (*delivered)(const void *r);
} fl_receiver_ops;

typedef struct {
    PyObject_HEAD const fl_sender_ops *ops;
    bool ready;
    union {
        fl_roce_sender roce;
        fl_uet_sender uet;
    } s;
} fl_SenderObject;

typedef struct {
    PyObject_HEAD const fl_receiver_ops *ops;
    bool ready;
    union {
        fl_roce_receiver roce;
        fl_uet_receiver uet;
    } r;
} fl_ReceiverObject;

/* tp_init of a sender or receiver type whose ops are given */
int fl_sender_init(fl_SenderObject *self, const fl_sender_ops *ops, PyObject *args,
                   PyObject *kw);
int fl_receiver_init(fl_ReceiverObject *self, const fl_receiver_ops *ops, PyObject *args,
                     PyObject *kw);
void fl_sender_dealloc(fl_SenderObject *self);
void fl_receiver_dealloc(fl_ReceiverObject *self);
extern PyMethodDef fl_sender_methods[], fl_receiver_methods[];
/* the getters every sender and receiver has (una, nxt, lengths, stats; delivered, stats) */
#define FL_SENDER_GETSET                                                                    \
    {"una", (getter)fl_sender_una, NULL, NULL, NULL},                                       \
        {"nxt", (getter)fl_sender_nxt, NULL, NULL, NULL},                                   \
        {"lengths", (getter)fl_sender_lengths, NULL, NULL, NULL},                           \
        {"stats", (getter)fl_sender_stats, NULL, NULL, NULL}
#define FL_RECEIVER_GETSET                                                                  \
    {"delivered", (getter)fl_receiver_delivered, NULL, NULL, NULL},                         \
        {"stats", (getter)fl_receiver_stats, NULL, NULL, NULL}
PyObject *fl_sender_una(fl_SenderObject *self, void *u);
PyObject *fl_sender_nxt(fl_SenderObject *self, void *u);
PyObject *fl_sender_lengths(fl_SenderObject *self, void *u);
PyObject *fl_sender_stats(fl_SenderObject *self, void *u);
PyObject *fl_receiver_delivered(fl_ReceiverObject *self, void *u);
PyObject *fl_receiver_stats(fl_ReceiverObject *self, void *u);

#endif
