/* The UET-like sender's choice of entropy (entropy.py) and its window (uet_control.py). */
#include "uet.h"

#include <stdlib.h>
#include <string.h>

/* ---- the choice of entropy ------------------------------------------------------------ */
int fl_paths_init(fl_paths *p, int kind, int64_t n, fl_rng *rng) {
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->n = n;
    p->rng = rng;
    p->order = calloc((size_t)n, sizeof(int32_t));
    p->good = calloc((size_t)n, sizeof(int32_t));
    p->penalty = calloc((size_t)n, 1);
    p->index = n; /* past the end: the first choice draws an order */
    return (p->order && p->good && p->penalty) ? 0 : -1;
}

void fl_paths_free(fl_paths *p) {
    free(p->order);
    free(p->good);
    free(p->penalty);
    p->order = p->good = NULL;
    p->penalty = NULL;
}

static int next_in_order(fl_paths *p) {
    if (p->index >= p->n) {
        for (int64_t i = 0; i < p->n; i++)
            p->order[i] = (int32_t)i;
        fl_rng_shuffle(p->rng, p->order, (size_t)p->n);
        p->index = 0;
    }
    return p->order[p->index++];
}

int fl_paths_choose(fl_paths *p) {
    if (p->kind == E_REPS) {
        if (p->good_len && p->explored >= p->n) {
            p->recycled++;
            int e = p->good[p->good_head];
            p->good_head = (p->good_head + 1) % p->n;
            p->good_len--;
            return e;
        }
        p->explored++;
        return (int)fl_rng_below(p->rng, (uint32_t)p->n);
    }
    p->explored++;
    int e = next_in_order(p);
    if (p->kind == E_BITMAP) {
        bool first = true;
        for (int64_t i = 0; i < p->n; i++) {
            if (!p->penalty[e])
                break;
            if (first) {
                p->penalty[e]--;
                first = false;
            }
            e = next_in_order(p);
        }
    }
    return e;
}

void fl_paths_feedback(fl_paths *p, int entropy, int what) {
    if (p->kind == E_REPS) {
        if (what == FB_GOOD) { /* a deque of maxlen n: a full one drops its oldest */
            if (p->good_len == p->n) {
                p->good_head = (p->good_head + 1) % p->n;
                p->good_len--;
            }
            p->good[(p->good_head + p->good_len) % p->n] = entropy;
            p->good_len++;
        } else {
            p->penalised++;
        }
    } else if (p->kind == E_BITMAP) {
        int add = what == FB_ECN ? 1 : what == FB_NACK ? 4 : what == FB_TIMEOUT ? 15 : 0;
        if (add) {
            p->penalised++;
            int64_t slot = entropy % p->n;
            int v = p->penalty[slot] + add;
            p->penalty[slot] = (uint8_t)(v < 15 ? v : 15);
        }
    }
}

/* ---- the window ----------------------------------------------------------------------- */
void fl_window_init(fl_window *w, const fl_uet_cfg *cfg) {
    memset(w, 0, sizeof *w);
    w->nscc = cfg->nscc;
    w->mss = cfg->mss;
    w->ceiling = fl_imax(cfg->mss, (int64_t)(cfg->max_bdps * (double)cfg->bdp_bytes));
    if (!cfg->nscc) {
        w->cwnd = w->ceiling;
        return;
    }
    w->cwnd = fl_imax(cfg->mss, (int64_t)(cfg->init_bdps * (double)cfg->bdp_bytes));
    w->base_rtt_s = cfg->base_rtt_s;
    w->target_q = cfg->base_rtt_s * (cfg->target_factor - 1);
    w->period = cfg->base_rtt_s + w->target_q;
    w->md = cfg->md;
    w->gamma = cfg->gamma;
}

static bool quick_adapt(fl_window *w, double now) {
    if (!w->period_started) {
        w->period_started = true;
        w->period_end = now + w->period;
        return false;
    }
    if (now < w->period_end)
        return false;
    bool done = false;
    if (w->qa_pending && w->achieved < w->cwnd) {
        w->cwnd = fl_imax(w->mss, w->achieved);
        w->quick_adapts++;
        w->cuts++;
        done = true;
    }
    w->qa_pending = false;
    w->achieved = 0;
    w->period_end = now + w->period;
    return done;
}

void fl_window_on_ack(fl_window *w, int64_t acked_bytes, double rtt_s, bool ce, double now) {
    if (!w->nscc)
        return;
    double q = fl_max(0.0, rtt_s - w->base_rtt_s);
    w->avg_q += 0.125 * (q - w->avg_q);
    w->achieved += acked_bytes;
    if (q > 4 * w->target_q)
        w->qa_pending = true;
    if (quick_adapt(w, now))
        return;
    if (!ce && q < w->target_q) {
        w->cwnd += w->target_q > 0 ? fl_round((double)acked_bytes * (w->target_q - q) / w->target_q)
                                   : acked_bytes;
    } else if (!ce) {
        w->cwnd += fl_imax(1, w->mss * acked_bytes / w->cwnd);
    } else if (q >= w->target_q && now >= w->cut_until) {
        double avg = fl_max(w->avg_q, q);
        double factor = fl_max(1 - w->gamma * (avg - w->target_q) / avg, 1 - w->md);
        w->cwnd = fl_imax(w->mss, (int64_t)((double)w->cwnd * factor));
        w->cut_until = now + rtt_s;
        w->cuts++;
    }
    w->cwnd = fl_imin(w->cwnd, w->ceiling);
}

void fl_window_on_trim(fl_window *w, double rtt_s, double now) {
    if (!w->nscc)
        return;
    w->qa_pending = true;
    quick_adapt(w, now);
}

void fl_window_on_timeout(fl_window *w) {
    if (!w->nscc)
        return;
    w->cwnd = fl_imax(w->mss, w->cwnd / 2);
    w->cuts++;
}
