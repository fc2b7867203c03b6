/* The RoCEv2-like state machines' Python types (py_roce.c). */
#ifndef FL_PY_ROCE_H
#define FL_PY_ROCE_H

#include "py_common.h"
#include "roce.h"

extern PyTypeObject fl_RoceSenderType, fl_RoceReceiverType;
int fl_read_roce_cfg(PyObject *cfg, fl_roce_cfg *out);
/* a sender's summary and counters, its state in a line; a receiver's counters */
PyObject *fl_py_roce_stats(const fl_roce_sender *s);
PyObject *fl_py_roce_summary(const fl_roce_sender *s);
PyObject *fl_py_roce_describe(const fl_roce_sender *s);
PyObject *fl_py_roce_rx_stats(const fl_roce_receiver *r);

#endif
