/* The RoCEv2-like state machines' Python types (py_roce.c). */
#ifndef FL_PY_ROCE_H
#define FL_PY_ROCE_H

#include "py_common.h"
#include "roce.h"

extern PyTypeObject fl_RoceSenderType, fl_RoceReceiverType;
int fl_read_roce_cfg(PyObject *cfg, fl_roce_cfg *out);

#endif
