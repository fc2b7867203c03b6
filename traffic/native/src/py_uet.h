/* The UET-like state machines' Python types (py_uet.c). */
#ifndef FL_PY_UET_H
#define FL_PY_UET_H

#include "py_common.h"
#include "uet.h"

extern PyTypeObject fl_UetSenderType, fl_UetReceiverType;
int fl_read_uet_cfg(PyObject *cfg, fl_uet_cfg *out);
/* a sender's summary and counters, its state in a line; a receiver's counters */
PyObject *fl_py_uet_stats(const fl_uet_sender *s);
PyObject *fl_py_uet_summary(const fl_uet_sender *s);
PyObject *fl_py_uet_describe(const fl_uet_sender *s);
PyObject *fl_py_uet_rx_stats(const fl_uet_receiver *r);

#endif
