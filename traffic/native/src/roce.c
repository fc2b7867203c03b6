/* RoCEv2-like go-back-N with DCQCN, HPCC or Swift (see roce.h). */
#include "roce.h"

#include <string.h>

/* ---- DCQCN, HPCC, Swift --------------------------------------------------------------- */
static void rate_init(fl_rate *c, const fl_roce_cfg *cfg, double now) {
    memset(c, 0, sizeof *c);
    c->kind = cfg->cc;
    c->d = &cfg->dcqcn;
    c->h = &cfg->hpcc;
    c->s = &cfg->swift;
    if (c->kind == CC_DCQCN) {
        c->rate = c->target = c->d->line_rate_bps;
        c->alpha = 1.0;
        c->alpha_due = now + c->d->alpha_period_s;
        c->rate_due = now + c->d->rate_period_s;
        c->last_cut = -FL_INF;
    } else if (c->kind == CC_HPCC) {
        c->wc = (double)c->h->bdp_bytes;
        c->window = c->wc;
        c->u = c->h->eta;
    } else if (c->kind == CC_SWIFT) {
        c->window = (double)c->s->bdp_bytes;
        c->cut_until = 0.0;
    }
}

static double rate_of(const fl_rate *c) {
    if (c->kind == CC_DCQCN)
        return c->rate;
    if (c->kind == CC_HPCC)
        return fl_min(c->h->line_rate_bps, c->window * 8 / c->h->base_rtt_s);
    if (c->window >= (double)c->s->mss)
        return c->s->line_rate_bps;
    return c->window * 8 / (c->s->base_rtt_s * c->s->target_factor);
}

static void dcqcn_increase(fl_rate *c) {
    const fl_dcqcn_cfg *d = c->d;
    int64_t f = d->fast_recovery_stages;
    int64_t hi = fl_imax(c->timer_stage, c->byte_stage);
    int64_t lo = fl_imin(c->timer_stage, c->byte_stage);
    if (hi < f) {
        /* fast recovery: towards the target only */
    } else if (lo >= f) {
        c->target += (double)(lo - f + 1) * d->rate_hai_bps;
    } else {
        c->target += d->rate_ai_bps;
    }
    c->target = fl_min(c->target, d->line_rate_bps);
    c->rate = fl_min(d->line_rate_bps, (c->rate + c->target) / 2);
}

static void rate_on_cnp(fl_rate *c, double now) {
    if (c->kind != CC_DCQCN)
        return;
    const fl_dcqcn_cfg *d = c->d;
    if (now < c->last_cut + d->cut_interval_s)
        return;
    c->last_cut = now;
    if (d->clamp_target || c->timer_stage > 0)
        c->target = c->rate;
    c->rate = fl_max(d->min_rate_bps, c->rate * (1 - c->alpha / 2));
    c->alpha = (1 - d->g) * c->alpha + d->g;
    c->timer_stage = c->byte_stage = 0;
    c->bytes_since = 0;
    c->alpha_due = now + d->alpha_period_s;
    c->rate_due = now + d->rate_period_s;
    c->cuts++;
}

static void rate_on_sent(fl_rate *c, int64_t nbytes) {
    if (c->kind != CC_DCQCN)
        return;
    c->bytes_since += nbytes;
    if (c->bytes_since >= c->d->byte_counter) {
        c->bytes_since = 0;
        c->byte_stage++;
        dcqcn_increase(c);
    }
}

static double rate_timer(const fl_rate *c) {
    return c->kind == CC_DCQCN ? fl_min(c->alpha_due, c->rate_due) : FL_INF;
}

static void rate_on_timer(fl_rate *c, double now) {
    if (c->kind != CC_DCQCN)
        return;
    if (now >= c->alpha_due) {
        c->alpha *= 1 - c->d->g;
        c->alpha_due = now + c->d->alpha_period_s;
    }
    if (now >= c->rate_due) {
        c->timer_stage++;
        c->rate_due = now + c->d->rate_period_s;
        dcqcn_increase(c);
    }
}

/* HPCC's MeasureInflight; false where there is no previous sample of the same path */
static bool hpcc_utilization(fl_rate *c, const fl_packet *p) {
    const fl_hpcc_cfg *h = c->h;
    if (p->n_hops != c->n_links || !p->n_hops) {
        c->n_links = p->n_hops;
        memcpy(c->links, p->hops, sizeof c->links);
        return false;
    }
    double u = 0.0, tau = h->base_rtt_s;
    for (int i = 0; i < p->n_hops; i++) {
        const fl_hop *now = &p->hops[i], *then = &c->links[i];
        double dt = (double)(int64_t)(now->ts_ns - then->ts_ns) / 1e9;
        if (dt <= 0 || now->rate_kbps == 0)
            continue;
        uint32_t sent = now->tx_bytes - then->tx_bytes;
        double rate = (double)((uint64_t)now->rate_kbps * 1000) / 8;
        uint32_t q = now->qlen_bytes < then->qlen_bytes ? now->qlen_bytes : then->qlen_bytes;
        double u_hop = (double)q / (rate * h->base_rtt_s) + (double)sent / dt / rate;
        if (u_hop > u) {
            u = u_hop;
            tau = dt;
        }
    }
    tau = fl_min(tau, h->base_rtt_s);
    c->u = (1 - tau / h->base_rtt_s) * c->u + tau / h->base_rtt_s * u;
    c->n_links = p->n_hops;
    memcpy(c->links, p->hops, sizeof c->links);
    return true;
}

static void rate_on_ack(fl_rate *c, int64_t ack_psn, int64_t next_psn, const fl_packet *p,
                        double rtt_s, double now) {
    if (c->kind == CC_HPCC) {
        const fl_hpcc_cfg *h = c->h;
        if (!hpcc_utilization(c, p))
            return;
        bool update = ack_psn > c->last_update_seq;
        if (update) {
            c->last_update_seq = next_psn;
            c->updates++;
        }
        double w;
        if (c->u >= h->eta || c->stage >= h->max_stage) {
            w = (c->u > 0 ? c->wc / (c->u / h->eta) : 4.0 * (double)h->bdp_bytes) +
                (double)h->additive_bytes;
            if (update) {
                c->stage = 0;
                if (w < c->wc)
                    c->cuts++;
                c->wc = w;
            }
        } else {
            w = c->wc + (double)h->additive_bytes;
            if (update) {
                c->stage++;
                c->wc = w;
            }
        }
        c->window = fl_max((double)h->additive_bytes, fl_min(w, 4.0 * (double)h->bdp_bytes));
    } else if (c->kind == CC_SWIFT) {
        const fl_swift_cfg *s = c->s;
        double target = s->base_rtt_s * s->target_factor;
        int64_t acked = s->mss;
        if (rtt_s < target) {
            c->window += s->ai * (double)s->mss * (double)acked /
                         fl_max(c->window, (double)s->mss);
        } else if (now >= c->cut_until) {
            double factor = fl_max(1 - s->beta * (rtt_s - target) / rtt_s, 1 - s->max_mdf);
            c->window *= factor;
            c->cut_until = now + rtt_s;
            c->cuts++;
        }
        c->window = fl_max((double)s->mss / 16, fl_min(c->window, 4.0 * (double)s->bdp_bytes));
    }
}

/* ---- the sender ----------------------------------------------------------------------- */
int fl_roce_sender_init(fl_roce_sender *s, const fl_roce_cfg *cfg, int src, int ch, double now,
                        int entropy, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    s->src = src;
    s->ch = ch;
    s->entropy = entropy;
    fl_rng_seed(&s->rng, seed);
    if (fl_vec_init(&s->lengths, sizeof(int32_t)) || fl_vec_init(&s->last, 1) ||
        fl_vec_init(&s->seen, 1)) {
        fl_roce_sender_free(s);
        return -1;
    }
    s->pace_from = s->progress_at = now;
    s->has_cc = cfg->cc != CC_OFF;
    s->window_cc = cfg->cc == CC_HPCC || cfg->cc == CC_SWIFT;
    rate_init(&s->cc, &s->cfg, now);
    return 0;
}

void fl_roce_sender_free(fl_roce_sender *s) {
    fl_vec_free(&s->lengths);
    fl_vec_free(&s->last);
    fl_vec_free(&s->seen);
}

int64_t fl_roce_offer(fl_roce_sender *s, int64_t nbytes) {
    int64_t mss = s->cfg.mss;
    int64_t stop = nbytes > 1 ? nbytes : 1;
    for (int64_t off = 0; off < stop; off += mss) {
        int32_t len = (int32_t)(nbytes ? fl_imin(mss, nbytes - off) : 0);
        uint8_t no = 0;
        if (fl_vec_push(&s->lengths, &len) || fl_vec_push(&s->last, &no))
            return -1;
    }
    FL_AT(s->last, uint8_t, s->last.len - 1) = 1;
    return (int64_t)s->lengths.len;
}

double fl_roce_rate_bps(const fl_roce_sender *s) {
    return s->has_cc ? rate_of(&s->cc) : s->cfg.line_rate_bps;
}

static double next_send(const fl_roce_sender *s) {
    double rate = fl_roce_rate_bps(s);
    return s->pace_from + (rate < FL_INF ? (double)s->pace_bits / rate : 0.0);
}

bool fl_roce_next_send_time(const fl_roce_sender *s, double *at) {
    if (s->nxt >= (int64_t)s->lengths.len || s->nxt - s->una >= s->cfg.max_outstanding)
        return false;
    if (s->window_cc && s->nxt > s->una &&
        (double)((s->nxt - s->una + 1) * s->cfg.mss) > s->cc.window)
        return false;
    *at = next_send(s);
    return true;
}

bool fl_roce_poll(fl_roce_sender *s, double now, fl_packet *out) {
    double due;
    if (!fl_roce_next_send_time(s, &due) || due > now)
        return false;
    int64_t psn = s->nxt;
    if (s->una == psn)
        s->progress_at = now;
    int64_t length = FL_AT(s->lengths, int32_t, psn);
    int flags = (psn < s->high ? F_RETX : 0) | (FL_AT(s->last, uint8_t, psn) ? F_LAST : 0);
    if (s->cfg.cc == CC_HPCC && length >= FL_INT_SIZE)
        flags |= F_INT;
    int entropy = s->cfg.spray ? (int)fl_rng_below(&s->rng, (uint32_t)s->cfg.entropies)
                               : s->entropy;
    s->nxt++;
    s->high = fl_imax(s->high, s->nxt);
    int64_t wire = fl_wire_bytes(length);
    s->pace_from = fl_next_send(now, next_send(s), 0.0);
    s->pace_bits = wire * 8;
    if (s->has_cc)
        rate_on_sent(&s->cc, wire);
    s->st_packets++;
    s->st_bytes += length;
    if (flags & F_RETX) {
        s->st_retx++;
        s->st_retx_bytes += length;
    }
    uint8_t zero = 0;
    if ((size_t)entropy >= s->seen.len)
        fl_vec_reserve(&s->seen, (size_t)entropy + 1, &zero);
    if ((size_t)entropy < s->seen.len && !FL_AT(s->seen, uint8_t, entropy)) {
        FL_AT(s->seen, uint8_t, entropy) = 1;
        s->n_entropies++;
    }
    fl_packet_init(out, K_DATA, s->src, s->ch);
    out->psn = psn;
    out->length = (uint32_t)length;
    out->entropy = (uint16_t)entropy;
    out->flags = (uint8_t)flags;
    out->sent_ns = (uint64_t)(int64_t)(now * 1e9);
    return true;
}

void fl_roce_sender_on_packet(fl_roce_sender *s, const fl_packet *p, double now) {
    if (p->kind == K_ACK) {
        if (p->ack > s->una) {
            s->una = fl_imin(p->ack, s->high);
            s->progress_at = now;
            s->nxt = fl_imax(s->nxt, s->una);
        }
        if (s->window_cc && p->sent_ns)
            rate_on_ack(&s->cc, p->ack, s->nxt, p, now - (double)p->sent_ns / 1e9, now);
    } else if (p->kind == K_NAK) {
        s->st_naks++;
        if (p->ack > s->una) {
            s->una = p->ack;
            s->progress_at = now;
        }
        if (s->nxt > p->ack && p->ack >= s->una)
            s->nxt = p->ack;
    } else if (p->kind == K_CNP) {
        s->st_cnps++;
        if (s->has_cc)
            rate_on_cnp(&s->cc, now);
    }
}

bool fl_roce_sender_timer(const fl_roce_sender *s, double *at) {
    bool have = false;
    double t = FL_INF;
    if (s->has_cc) {
        t = rate_timer(&s->cc);
        have = true;
    }
    if (s->una < s->nxt) {
        t = fl_min(t, s->progress_at + s->cfg.rto_s);
        have = true;
    }
    *at = t;
    return have;
}

void fl_roce_sender_on_timer(fl_roce_sender *s, double now) {
    if (s->has_cc)
        rate_on_timer(&s->cc, now);
    if (s->una < s->nxt && now >= s->progress_at + s->cfg.rto_s) {
        s->st_timeouts++;
        s->nxt = s->una;
        s->progress_at = now;
    }
}

/* ---- the receiver --------------------------------------------------------------------- */
void fl_roce_receiver_init(fl_roce_receiver *r, const fl_roce_cfg *cfg, int src, int ch) {
    memset(r, 0, sizeof *r);
    r->cfg = *cfg;
    r->src = src;
    r->ch = ch;
    r->nak_for = -1;
    r->last_cnp = -FL_INF;
}

static void roce_ack(fl_roce_receiver *r, fl_packet *out) {
    r->unacked = 0;
    r->ack_pending = false;
    fl_packet_init(out, K_ACK, r->src, r->ch);
    out->ack = r->expected;
    if (!r->has_latest)
        return;
    const fl_packet *last = &r->latest;
    out->psn = last->psn;
    out->sent_ns = last->sent_ns;
    if (last->flags & F_INT) {
        out->length = FL_INT_SIZE;
        out->flags = F_INT;
        out->n_hops = last->n_hops;
        memcpy(out->hops, last->hops, sizeof out->hops);
    }
}

int fl_roce_receiver_on_packet(fl_roce_receiver *r, const fl_packet *p, double now,
                               fl_packet *out) {
    int n = 0;
    r->st_packets++;
    if (p->trimmed) {
        r->st_trimmed++;
        return 0;
    }
    if (p->flags & F_CE) {
        r->st_ce++;
        if (now - r->last_cnp >= r->cfg.cnp_interval_s) {
            r->last_cnp = now;
            r->st_cnps++;
            fl_packet_init(&out[n], K_CNP, r->src, r->ch);
            out[n++].ack = r->expected;
        }
    }
    if (p->psn <= r->expected) {
        r->latest = *p;
        r->has_latest = true;
    }
    if (p->psn == r->expected) {
        r->expected++;
        r->delivered += p->length;
        r->unacked++;
        if (r->unacked >= r->cfg.ack_every || (p->flags & F_LAST)) {
            roce_ack(r, &out[n++]);
        } else if (!r->ack_pending) {
            r->ack_pending = true;
            r->ack_due = now + r->cfg.ack_delay_s;
        }
    } else if (p->psn > r->expected) {
        r->st_ooo++;
        if (r->nak_for != r->expected) {
            r->nak_for = r->expected;
            r->st_naks++;
            fl_packet_init(&out[n], K_NAK, r->src, r->ch);
            out[n++].ack = r->expected;
        }
    } else {
        r->st_dups++;
        roce_ack(r, &out[n++]);
    }
    return n;
}

bool fl_roce_receiver_timer(const fl_roce_receiver *r, double *at) {
    *at = r->ack_due;
    return r->ack_pending;
}

int fl_roce_receiver_on_timer(fl_roce_receiver *r, double now, fl_packet *out) {
    if (r->ack_pending && now >= r->ack_due) {
        roce_ack(r, out);
        return 1;
    }
    return 0;
}
