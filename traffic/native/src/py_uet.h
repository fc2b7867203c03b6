/* The UET-like state machines' Python types (py_uet.c). */
#ifndef FL_PY_UET_H
#define FL_PY_UET_H

#include "py_common.h"
#include "uet.h"

extern PyTypeObject fl_UetSenderType, fl_UetReceiverType;
int fl_read_uet_cfg(PyObject *cfg, fl_uet_cfg *out);

#endif
