/* The UET-like receiver (uet_receiver.py), rule for rule; see uet.h. The placed PSNs and the
 * missing ones live in a ring from the cumulative PSN, grown as packets arrive further
 * ahead (at most FL_PSN_WINDOW). */
#include "uet.h"

#include <stdlib.h>
#include <string.h>

#define SLOT(r, psn) ((size_t)((psn) & ((r)->cap - 1)))

int fl_uet_receiver_init(fl_uet_receiver *r, const fl_uet_cfg *cfg, int src, int ch) {
    memset(r, 0, sizeof *r);
    r->cfg = *cfg;
    r->src = src;
    r->ch = ch;
    r->nacked = -1;
    r->highest = -1;
    r->gap_wait_s = cfg->rto_s / 2;
    r->tail_wait_s = 2 * cfg->rto_s;
    r->cap = 64;
    r->placed = malloc(sizeof(int32_t) * (size_t)r->cap);
    r->missing = malloc(sizeof(double) * (size_t)r->cap);
    if (!r->placed || !r->missing || fl_vec_init(&r->ends, 16)) {
        fl_uet_receiver_free(r);
        return -1;
    }
    for (int64_t i = 0; i < r->cap; i++) {
        r->placed[i] = -1;
        r->missing[i] = NAN;
    }
    return 0;
}

void fl_uet_receiver_free(fl_uet_receiver *r) {
    free(r->placed);
    free(r->missing);
    r->placed = NULL;
    r->missing = NULL;
    fl_vec_free(&r->ends);
}

/* make room for PSNs up to psn (psn - cum < FL_PSN_WINDOW); 0 or -1 */
static int reach(fl_uet_receiver *r, int64_t psn) {
    if (psn - r->cum < r->cap)
        return 0;
    int64_t cap = r->cap;
    while (psn - r->cum >= cap)
        cap *= 2;
    int32_t *placed = malloc(sizeof(int32_t) * (size_t)cap);
    double *missing = malloc(sizeof(double) * (size_t)cap);
    if (!placed || !missing) {
        free(placed);
        free(missing);
        return -1;
    }
    for (int64_t i = 0; i < cap; i++) {
        placed[i] = -1;
        missing[i] = NAN;
    }
    for (int64_t p = r->cum; p < r->cum + r->cap; p++) {
        placed[p & (cap - 1)] = r->placed[SLOT(r, p)];
        missing[p & (cap - 1)] = r->missing[SLOT(r, p)];
    }
    free(r->placed);
    free(r->missing);
    r->placed = placed;
    r->missing = missing;
    r->cap = cap;
    return 0;
}

static bool is_placed(const fl_uet_receiver *r, int64_t psn) {
    return psn >= r->cum && psn - r->cum < r->cap && r->placed[SLOT(r, psn)] >= 0;
}

static void unmiss(fl_uet_receiver *r, int64_t psn) {
    if (psn >= r->cum && psn - r->cum < r->cap && !isnan(r->missing[SLOT(r, psn)])) {
        r->missing[SLOT(r, psn)] = NAN;
        r->n_missing--;
    }
}

static int64_t *find_end(fl_uet_receiver *r, int64_t end) {
    for (size_t i = 0; i < r->ends.len; i++)
        if (FL_AT(r->ends, int64_t, 2 * i) == end)
            return &FL_AT(r->ends, int64_t, 2 * i);
    return NULL;
}

static void drop_end(fl_uet_receiver *r, int64_t *pair) {
    int64_t *last = &FL_AT(r->ends, int64_t, 2 * (r->ends.len - 1));
    pair[0] = last[0];
    pair[1] = last[1];
    r->ends.len--;
}

static void advance(fl_uet_receiver *r) {
    while (is_placed(r, r->cum)) {
        int64_t length = r->placed[SLOT(r, r->cum)];
        r->placed[SLOT(r, r->cum)] = -1;
        r->n_placed--;
        r->cum++;
        if (fl_uet_reliable(&r->cfg)) {
            r->delivered += length;
            continue;
        }
        r->message_received += length;
        int64_t *end = find_end(r, r->cum);
        if (end) {
            int64_t byte = end[1];
            drop_end(r, end);
            r->st_lost_bytes += byte - r->delivered - r->message_received;
            r->delivered = byte;
            r->message_received = 0;
        }
    }
}

static int uud_seen(fl_uet_receiver *r, const fl_packet *p, double now) {
    if (p->ack > 0 && !find_end(r, p->ack)) {
        int64_t pair[2] = {p->ack, (int64_t)p->sack};
        if (fl_vec_push(&r->ends, pair))
            return -1;
    }
    if (reach(r, p->psn))
        return -1;
    for (int64_t psn = fl_imax(r->highest + 1, r->cum); psn < p->psn; psn++)
        if (!is_placed(r, psn) && isnan(r->missing[SLOT(r, psn)])) {
            r->missing[SLOT(r, psn)] = now;
            r->n_missing++;
        }
    r->highest = fl_imax(r->highest, p->psn);
    r->last_arrival = now;
    return 0;
}

/* give up a PSN (UUD): placed as empty, lost; advance() after the last one */
static void give_up(fl_uet_receiver *r, int64_t psn) {
    unmiss(r, psn);
    if (psn >= r->cum && !is_placed(r, psn)) {
        r->placed[SLOT(r, psn)] = 0;
        r->n_placed++;
        r->st_lost++;
    }
}

static void make_ack(fl_uet_receiver *r, bool dup, fl_packet *out) {
    const fl_packet *last = &r->last;
    int covered = r->n_pending < FL_MAX_ECHO ? (int)r->n_pending : FL_MAX_ECHO;
    int flags = (r->any_ce ? F_CE : 0) | (dup ? F_DUP : 0);
    if (r->nack_due) {
        flags |= F_NACK;
        r->nack_due = false;
    }
    fl_packet_init(out, K_ACK, r->src, r->ch);
    for (int i = 0; i < covered; i++) {
        if (r->cov_ce[i])
            out->ce_mask |= (uint8_t)(1 << i);
        if (i)
            out->echo[out->n_echo++] = r->cov_entropy[i];
    }
    r->n_pending = 0;
    r->any_ce = false;
    r->ack_pending = false;
    for (int64_t psn = r->cum + 1; psn <= r->cum + FL_SACK_BITS; psn++)
        if (is_placed(r, psn))
            out->sack |= 1ULL << (psn - r->cum - 1);
    r->st_acks++;
    out->psn = last->psn;
    out->ack = r->cum;
    out->entropy = last->entropy;
    out->sent_ns = last->sent_ns;
    out->flags = (uint8_t)flags;
}

static void pend(fl_uet_receiver *r, const fl_packet *p) {
    memmove(r->cov_entropy + 1, r->cov_entropy, sizeof r->cov_entropy[0] * (FL_MAX_ECHO - 1));
    memmove(r->cov_ce + 1, r->cov_ce, sizeof r->cov_ce[0] * (FL_MAX_ECHO - 1));
    r->cov_entropy[0] = p->entropy;
    r->cov_ce[0] = p->flags & F_CE;
    r->any_ce |= r->cov_ce[0];
    r->last = *p;
    r->n_pending++;
}

int fl_uet_receiver_on_packet(fl_uet_receiver *r, const fl_packet *p, double now,
                              fl_packet *out) {
    r->st_packets++;
    if (p->psn - r->cum >= FL_PSN_WINDOW ||
        (!fl_uet_reliable(&r->cfg) && p->ack - r->cum >= FL_PSN_WINDOW))
        return 0; /* not a packet of this queue pair's */
    bool ce = p->flags & F_CE;
    r->st_ce += ce;
    int n = 0;
    if (p->trimmed) {
        r->st_trimmed++;
        if (!fl_uet_reliable(&r->cfg)) {
            if (uud_seen(r, p, now))
                return -1;
            give_up(r, p->psn);
            advance(r);
        }
        fl_packet_init(out, K_NAK, r->src, r->ch);
        out->psn = p->psn;
        out->ack = r->cum;
        out->entropy = p->entropy;
        out->sent_ns = p->sent_ns;
        out->flags = F_TRIMMED;
        return 1;
    }
    if (!fl_uet_reliable(&r->cfg) && uud_seen(r, p, now))
        return -1;
    if (fl_uet_ordered(&r->cfg) && p->psn > r->cum) {
        r->st_ooo++;
        if (r->nacked != r->cum) {
            r->nacked = r->cum;
            r->st_naks++;
            fl_packet_init(&out[n], K_NAK, r->src, r->ch);
            out[n].psn = r->cum;
            out[n++].ack = r->cum;
        }
        return n;
    }
    int64_t cum_before = r->cum;
    bool duplicate = p->psn < r->cum || is_placed(r, p->psn);
    if (duplicate) {
        r->st_dups++;
    } else {
        if (p->psn != r->cum)
            r->st_ooo++;
        if (reach(r, p->psn))
            return -1;
        r->placed[SLOT(r, p->psn)] = (int32_t)p->length;
        r->n_placed++;
        r->received_bytes += p->length;
        unmiss(r, p->psn);
        advance(r);
    }
    pend(r, p);
    if (r->n_placed >= r->cfg.reorder_threshold && r->nacked != r->cum) {
        r->nacked = r->cum;
        r->nack_due = true;
        r->st_naks++;
    }
    bool filled = r->cum > cum_before + 1;
    if (!duplicate && !filled && r->n_pending < r->cfg.ack_every && !(p->flags & F_LAST)) {
        if (!r->ack_pending) {
            r->ack_pending = true;
            r->ack_due = now + r->cfg.ack_delay_s;
        }
    } else {
        make_ack(r, duplicate, &out[n++]);
    }
    return n;
}

static bool tail_missing(const fl_uet_receiver *r, int64_t *tail) {
    bool any = false;
    *tail = 0;
    for (size_t i = 0; i < r->ends.len; i++) {
        int64_t end = FL_AT(r->ends, int64_t, 2 * i);
        if (end > r->highest + 1) {
            any = true;
            *tail = fl_imax(*tail, end);
        }
    }
    return any;
}

static bool gap_due(const fl_uet_receiver *r, double *at) {
    if (fl_uet_reliable(&r->cfg))
        return false;
    bool have = false;
    double t = FL_INF;
    for (int64_t psn = r->cum; r->n_missing && psn < r->cum + r->cap; psn++) {
        double since = r->missing[SLOT(r, psn)];
        if (!isnan(since)) {
            t = fl_min(t, since + r->gap_wait_s);
            have = true;
        }
    }
    int64_t tail;
    if (tail_missing(r, &tail)) {
        t = fl_min(t, r->last_arrival + r->tail_wait_s);
        have = true;
    }
    *at = t;
    return have;
}

bool fl_uet_receiver_timer(fl_uet_receiver *r, double *at) {
    double gap;
    bool has_gap = gap_due(r, &gap);
    if (r->ack_pending && has_gap)
        *at = fl_min(r->ack_due, gap);
    else if (r->ack_pending)
        *at = r->ack_due;
    else if (has_gap)
        *at = gap;
    return r->ack_pending || has_gap;
}

int fl_uet_receiver_on_timer(fl_uet_receiver *r, double now, fl_packet *out) {
    int n = 0;
    double due;
    if (gap_due(r, &due) && now >= due) {
        int64_t tail = 0, top = r->cum + r->cap;
        bool tail_aged = now >= r->last_arrival + r->tail_wait_s;
        if (tail_aged) {
            tail_missing(r, &tail);
            if (reach(r, tail))
                return -1;
            top = r->cum + r->cap;
        }
        int64_t from = r->highest + 1;
        for (int64_t psn = r->cum; psn < top; psn++) {
            double since = r->missing[SLOT(r, psn)];
            bool aged = !isnan(since) && now >= since + r->gap_wait_s;
            if (aged || (tail_aged && psn >= from && psn < tail))
                give_up(r, psn);
        }
        if (tail_aged)
            r->highest = fl_imax(r->highest, tail - 1);
        advance(r);
        if (r->n_pending)
            make_ack(r, false, &out[n++]);
    }
    if (r->ack_pending && now >= r->ack_due && r->n_pending)
        make_ack(r, false, &out[n++]);
    return n;
}
