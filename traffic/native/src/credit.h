/* A receiving rank's credit scheduler (credit.c; rccc.py's CreditReceiver). */
#ifndef FL_CREDIT_H
#define FL_CREDIT_H

#include <sys/types.h>

#include "common.h"

typedef struct {
    int src, ch;
    int64_t wanted, granted, arrived;
} fl_demand;

typedef struct {
    double rate;
    int64_t window, grant_bytes, initial;
    fl_vec demand; /* fl_demand, in round-robin order */
    double next_grant_at;
    int64_t grants;
} fl_credit_rx;

int fl_credit_init(fl_credit_rx *c, double rate_bytes_s, int64_t window, int64_t grant_bytes,
                   int64_t initial);
void fl_credit_free(fl_credit_rx *c);
void fl_credit_on_request(fl_credit_rx *c, int src, int ch, int64_t wanted);
void fl_credit_on_data(fl_credit_rx *c, int src, int ch, int64_t nbytes);
/* the total granted to (src, ch) so far, true where it is beyond the initial credit */
bool fl_credit_granted(const fl_credit_rx *c, int src, int ch, int64_t *total);
bool fl_credit_next_time(const fl_credit_rx *c, double *at);
/* the grants due at now into out (at most ``most``): each queue pair with its total */
int fl_credit_poll(fl_credit_rx *c, double now, fl_demand *out, int most);

#endif
