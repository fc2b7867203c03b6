/* What the Python bindings share: the reference's Packet class and conversions to and from
 * it, reading a configuration dataclass's attributes. */
#ifndef FL_PY_COMMON_H
#define FL_PY_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "common.h"

/* traffic.transports.packet's Packet, Kind and Hop, imported once */
int fl_py_import_packet(void);
PyObject *fl_py_packet(const fl_packet *p);               /* a new Packet */
int fl_py_to_packet(PyObject *obj, fl_packet *p);         /* 0, or -1 with an exception */
PyObject *fl_py_packets(const fl_packet *ps, int n);     /* a new list of Packets */

/* a configuration's attribute; -1 with an exception set (AttributeError, TypeError) */
int fl_attr_double(PyObject *o, const char *name, double *out);
int fl_attr_int(PyObject *o, const char *name, int64_t *out);
int fl_attr_bool(PyObject *o, const char *name, bool *out);
/* a (src, ch) tuple */
int fl_py_qp(PyObject *qp, int *src, int *ch);
/* a dict of counters: names[i] -> values[i] */
PyObject *fl_py_counters(const char *const *names, const int64_t *values, int n);
/* Py_None for false, a float otherwise */
PyObject *fl_py_time(bool have, double at);

#endif
