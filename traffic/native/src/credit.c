/* A receiving rank's credit scheduler (rccc.py's CreditReceiver), rule for rule: grants
 * round robin over the queue pairs that still need credit, paced at the link's rate, within
 * a window of credit outstanding. */
#include "credit.h"

#include <string.h>

int fl_credit_init(fl_credit_rx *c, double rate_bytes_s, int64_t window, int64_t grant_bytes,
                   int64_t initial) {
    memset(c, 0, sizeof *c);
    c->rate = rate_bytes_s;
    c->window = window;
    c->grant_bytes = grant_bytes;
    c->initial = initial;
    return fl_vec_init(&c->demand, sizeof(fl_demand));
}

void fl_credit_free(fl_credit_rx *c) { fl_vec_free(&c->demand); }

static fl_demand *demand_of(fl_credit_rx *c, int src, int ch) {
    for (size_t i = 0; i < c->demand.len; i++) {
        fl_demand *d = &FL_AT(c->demand, fl_demand, i);
        if (d->src == src && d->ch == ch)
            return d;
    }
    fl_demand d = {src, ch, 0, c->initial, 0};
    if (fl_vec_push(&c->demand, &d))
        return NULL;
    return &FL_AT(c->demand, fl_demand, c->demand.len - 1);
}

void fl_credit_on_request(fl_credit_rx *c, int src, int ch, int64_t wanted) {
    fl_demand *d = demand_of(c, src, ch);
    if (d)
        d->wanted = fl_imax(d->wanted, wanted);
}

void fl_credit_on_data(fl_credit_rx *c, int src, int ch, int64_t nbytes) {
    fl_demand *d = demand_of(c, src, ch);
    if (d)
        d->arrived += nbytes;
}

static int64_t outstanding(const fl_credit_rx *c) {
    int64_t total = 0;
    for (size_t i = 0; i < c->demand.len; i++) {
        const fl_demand *d = &FL_AT(c->demand, fl_demand, i);
        total += fl_imax(0, d->granted - fl_imax(d->arrived, c->initial));
    }
    return total;
}

bool fl_credit_granted(const fl_credit_rx *c, int src, int ch, int64_t *total) {
    for (size_t i = 0; i < c->demand.len; i++) {
        const fl_demand *d = &FL_AT(c->demand, fl_demand, i);
        if (d->src == src && d->ch == ch) {
            *total = d->granted;
            return d->granted > c->initial;
        }
    }
    return false;
}

static ssize_t first_needy(const fl_credit_rx *c) {
    for (size_t i = 0; i < c->demand.len; i++)
        if (FL_AT(c->demand, fl_demand, i).granted < FL_AT(c->demand, fl_demand, i).wanted)
            return (ssize_t)i;
    return -1;
}

bool fl_credit_next_time(const fl_credit_rx *c, double *at) {
    if (outstanding(c) + c->grant_bytes > c->window || first_needy(c) < 0)
        return false;
    *at = c->next_grant_at;
    return true;
}

int fl_credit_poll(fl_credit_rx *c, double now, fl_demand *out, int most) {
    int n = 0;
    while (n < most && now >= c->next_grant_at && outstanding(c) + c->grant_bytes <= c->window) {
        ssize_t i = first_needy(c);
        if (i < 0)
            break;
        fl_demand d = FL_AT(c->demand, fl_demand, i);
        d.granted = fl_imin(d.wanted, d.granted + c->grant_bytes);
        memmove(&FL_AT(c->demand, fl_demand, i), &FL_AT(c->demand, fl_demand, i + 1),
                sizeof(fl_demand) * (c->demand.len - (size_t)i - 1));
        FL_AT(c->demand, fl_demand, c->demand.len - 1) = d; /* round robin: last now */
        out[n++] = d;
        c->grants++;
        double gap = (double)c->grant_bytes / c->rate;
        c->next_grant_at = fl_max(c->next_grant_at, now - gap) + gap;
    }
    return n;
}
