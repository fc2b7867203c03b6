/* The UET-like sender (uet.py), rule for rule; see uet.h. */
#include "uet.h"

#include <stdlib.h>
#include <string.h>

#define LEN(s, psn) FL_AT((s)->lengths, int32_t, psn)
#define FLAGS(s, psn) FL_AT((s)->flags, uint8_t, psn)
#define OUT(s, psn) FL_AT((s)->out_entropy, int32_t, psn)
#define TSN(s, psn) FL_AT((s)->tsn_of, int64_t, psn)
#define SENT_AT(s, psn) FL_AT((s)->sent_at, double, psn)

int fl_uet_sender_init(fl_uet_sender *s, const fl_uet_cfg *cfg, int src, int ch, double now,
                       int entropy, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    s->src = src;
    s->ch = ch;
    s->entropy = entropy;
    fl_rng_seed(&s->rng, seed);
    if (fl_vec_init(&s->lengths, 4) || fl_vec_init(&s->flags, 1) ||
        fl_vec_init(&s->out_entropy, 4) || fl_vec_init(&s->tsn_of, 8) ||
        fl_vec_init(&s->sent_at, 8) || fl_vec_init(&s->message_end, 16) ||
        fl_vec_init(&s->retx, 8) || fl_vec_init(&s->sent_order, 16) ||
        fl_vec_init(&s->seen, 1) || fl_paths_init(&s->paths, cfg->entropy, cfg->entropies,
                                                  &s->rng)) {
        fl_uet_sender_free(s);
        return -1;
    }
    s->highest_acked_tsn = -1;
    s->latest_acked_sent = -FL_INF;
    s->reo_wnd = cfg->base_rtt_s;
    s->min_rtt = FL_INF;
    s->next_send = s->progress_at = now;
    s->probe_psn = -1;
    fl_window_init(&s->window, cfg);
    s->credit = cfg->rccc;
    s->credit_granted = cfg->rccc_initial_bytes;
    s->asked_at = -FL_INF;
    return 0;
}

void fl_uet_sender_free(fl_uet_sender *s) {
    fl_vec *vs[] = {&s->lengths, &s->flags, &s->out_entropy, &s->tsn_of, &s->sent_at,
                    &s->message_end, &s->retx, &s->sent_order, &s->seen};
    for (size_t i = 0; i < sizeof vs / sizeof *vs; i++)
        fl_vec_free(vs[i]);
    fl_paths_free(&s->paths);
}

int64_t fl_uet_offer(fl_uet_sender *s, int64_t nbytes) {
    int64_t first = (int64_t)s->lengths.len, mss = s->cfg.mss;
    int64_t stop = nbytes > 1 ? nbytes : 1;
    int32_t none = -1;
    int64_t never = -1;
    double not_sent = -FL_INF;
    for (int64_t off = 0; off < stop; off += mss) {
        int32_t len = (int32_t)(nbytes ? fl_imin(mss, nbytes - off) : 0);
        uint8_t no = 0;
        int64_t end[2] = {0, 0};
        if (fl_vec_push(&s->lengths, &len) || fl_vec_push(&s->flags, &no) ||
            fl_vec_push(&s->out_entropy, &none) || fl_vec_push(&s->tsn_of, &never) ||
            fl_vec_push(&s->sent_at, &not_sent) || fl_vec_push(&s->message_end, end))
            return -1;
    }
    int64_t end = (int64_t)s->lengths.len;
    FLAGS(s, end - 1) |= PF_LAST;
    s->wanted += nbytes;
    if (!fl_uet_reliable(&s->cfg))
        for (int64_t psn = first; psn < end; psn++) {
            FL_AT(s->message_end, int64_t, 2 * psn) = end;
            FL_AT(s->message_end, int64_t, 2 * psn + 1) = s->wanted;
        }
    return end;
}

int64_t fl_uet_retx_len(const fl_uet_sender *s) { return (int64_t)(s->retx.len - s->retx_head); }

double fl_uet_rto_s(const fl_uet_sender *s) {
    if (!s->has_srtt)
        return s->cfg.rto_s;
    return fl_max(s->cfg.rto_s, s->srtt + 4 * s->rttvar);
}

static bool acked(const fl_uet_sender *s, int64_t psn) {
    return psn >= 0 && psn < (int64_t)s->flags.len && (FLAGS(s, psn) & PF_ACKED);
}

static bool outstanding(const fl_uet_sender *s, int64_t psn) {
    return psn >= 0 && psn < (int64_t)s->out_entropy.len && OUT(s, psn) >= 0;
}

/* the PSN to send next (a resend first), or -1 */
static int64_t candidate(fl_uet_sender *s) {
    while (fl_uet_retx_len(s)) {
        int64_t head = FL_AT(s->retx, int64_t, s->retx_head);
        if (!(acked(s, head) || head < s->una))
            return head;
        FLAGS(s, head) &= ~PF_QUEUED;
        s->retx_head++;
    }
    if (s->retx_head && s->retx_head == s->retx.len)
        s->retx.len = s->retx_head = 0; /* emptied: start again at the front */
    return s->nxt < (int64_t)s->lengths.len ? s->nxt : -1;
}

static bool credit_blocked(fl_uet_sender *s) {
    int64_t psn = candidate(s);
    return s->credit && psn >= 0 && !(FLAGS(s, psn) & PF_QUEUED) &&
           !(s->credit_granted - s->credit_sent > 0);
}

static bool request_due(fl_uet_sender *s, double *at) {
    if (!s->credit || (s->announced >= s->wanted && !credit_blocked(s)))
        return false;
    *at = s->announced < s->wanted ? s->next_send : s->asked_at + fl_uet_rto_s(s);
    return true;
}

bool fl_uet_next_send_time(fl_uet_sender *s, double *at) {
    double request;
    bool has_request = request_due(s, &request);
    int64_t psn = candidate(s);
    if (psn < 0 || credit_blocked(s) ||
        (s->inflight + LEN(s, psn) > s->window.cwnd && s->n_outstanding)) {
        *at = request;
        return has_request;
    }
    *at = has_request ? fl_min(request, s->next_send) : s->next_send;
    return true;
}

static void make_request(fl_uet_sender *s, double now, fl_packet *out) {
    if (s->announced >= s->wanted)
        s->st_credit_stalls++;
    s->announced = s->wanted;
    s->asked_at = now;
    s->st_credit_requests++;
    s->next_send = fl_next_send(now, s->next_send,
                                (double)(fl_wire_bytes(0) * 8) / s->cfg.line_rate_bps);
    fl_packet_init(out, K_REQ, s->src, s->ch);
    out->sack = (uint64_t)s->wanted;
    out->sent_ns = (uint64_t)(int64_t)(now * 1e9);
}

static void see_entropy(fl_uet_sender *s, int entropy) {
    uint8_t zero = 0;
    if ((size_t)entropy >= s->seen.len && fl_vec_reserve(&s->seen, (size_t)entropy + 1, &zero))
        return;
    if (!FL_AT(s->seen, uint8_t, entropy)) {
        FL_AT(s->seen, uint8_t, entropy) = 1;
        s->n_entropies++;
    }
}

bool fl_uet_poll(fl_uet_sender *s, double now, fl_packet *out) {
    double due, request;
    if (!fl_uet_next_send_time(s, &due) || due > now)
        return false;
    if (request_due(s, &request) && request <= now) {
        make_request(s, now, out);
        return true;
    }
    int64_t psn = candidate(s);
    if (!s->n_outstanding)
        s->progress_at = now;
    bool retx = FLAGS(s, psn) & PF_QUEUED;
    if (retx) {
        s->retx_head++;
        FLAGS(s, psn) &= ~PF_QUEUED;
    } else {
        s->nxt++;
    }
    int entropy = (!s->cfg.spray || fl_uet_ordered(&s->cfg)) ? s->entropy
                                                             : fl_paths_choose(&s->paths);
    int64_t length = LEN(s, psn);
    if (s->credit && !retx)
        s->credit_sent += length;
    OUT(s, psn) = entropy;
    s->n_outstanding++;
    s->inflight += length;
    TSN(s, psn) = s->tsn;
    int64_t pair[2] = {s->tsn, psn};
    fl_vec_push(&s->sent_order, pair);
    s->tsn++;
    SENT_AT(s, psn) = now;
    s->next_send = fl_next_send(now, s->next_send,
                                (double)(fl_wire_bytes(length) * 8) / s->cfg.line_rate_bps);
    s->st_packets++;
    s->st_bytes += length;
    if (retx) {
        s->st_retx++;
        s->st_retx_bytes += length;
    }
    see_entropy(s, entropy);
    fl_packet_init(out, K_DATA, s->src, s->ch);
    out->flags = (uint8_t)((retx ? F_RETX : 0) | ((FLAGS(s, psn) & PF_LAST) ? F_LAST : 0));
    out->psn = psn;
    out->ack = FL_AT(s->message_end, int64_t, 2 * psn);
    out->sack = (uint64_t)FL_AT(s->message_end, int64_t, 2 * psn + 1);
    out->length = (uint32_t)length;
    out->entropy = (uint16_t)entropy;
    out->sent_ns = (uint64_t)(int64_t)(now * 1e9);
    return true;
}

static void forget(fl_uet_sender *s, int64_t psn) {
    if (outstanding(s, psn)) {
        OUT(s, psn) = -1;
        s->n_outstanding--;
        s->inflight -= LEN(s, psn);
    }
}

static void path_lost(fl_uet_sender *s, int64_t psn, int what) {
    if (s->cfg.spray && !fl_uet_ordered(&s->cfg))
        fl_paths_feedback(&s->paths, OUT(s, psn), what);
}

static void advance(fl_uet_sender *s) {
    while (acked(s, s->una)) {
        FLAGS(s, s->una) &= ~PF_ACKED;
        s->una++;
    }
}

static void queue_retx(fl_uet_sender *s, int64_t psn) {
    if ((FLAGS(s, psn) & (PF_QUEUED | PF_ACKED)) || psn < s->una)
        return;
    if (!fl_uet_reliable(&s->cfg)) {
        s->st_lost++;
        s->st_lost_bytes += LEN(s, psn);
        FLAGS(s, psn) |= PF_ACKED;
        advance(s);
        return;
    }
    FLAGS(s, psn) |= PF_QUEUED;
    fl_vec_push(&s->retx, &psn);
}

static void on_trimmed(fl_uet_sender *s, int64_t psn, double now) {
    s->st_trim_naks++;
    if (outstanding(s, psn)) {
        path_lost(s, psn, FB_NACK);
        forget(s, psn);
        queue_retx(s, psn);
        s->progress_at = now;
    }
    fl_window_on_trim(&s->window, s->has_srtt ? s->srtt : s->cfg.base_rtt_s, now);
}

static double rtt_or_base(const fl_uet_sender *s) {
    return s->has_srtt ? s->srtt : s->cfg.base_rtt_s;
}

static void detect_losses(fl_uet_sender *s, double now) {
    double rtt = rtt_or_base(s);
    s->has_reorder_due = false;
    while (s->order_head < s->sent_order.len) {
        int64_t tsn = FL_AT(s->sent_order, int64_t, 2 * s->order_head);
        int64_t psn = FL_AT(s->sent_order, int64_t, 2 * s->order_head + 1);
        bool current = outstanding(s, psn) && TSN(s, psn) == tsn;
        if (current) {
            if (tsn >= s->highest_acked_tsn)
                break;
            bool overtaken = s->highest_acked_tsn - tsn > s->cfg.reorder_threshold &&
                             s->latest_acked_sent - SENT_AT(s, psn) > s->reo_wnd;
            double due = SENT_AT(s, psn) + rtt + s->reo_wnd;
            if (!overtaken && now < due) {
                s->has_reorder_due = true;
                s->reorder_due = due;
                break;
            }
        }
        if (++s->order_head == s->sent_order.len)
            s->sent_order.len = s->order_head = 0; /* emptied: start again at the front */
        if (current && !(FLAGS(s, psn) & PF_QUEUED)) {
            s->st_sack_losses++;
            path_lost(s, psn, FB_NACK);
            forget(s, psn);
            queue_retx(s, psn);
            fl_window_on_trim(&s->window, rtt, now);
        }
    }
}

static void newly_acked(fl_uet_sender *s, int64_t psn, int64_t *acked_bytes) {
    FLAGS(s, psn) |= PF_ACKED;
    forget(s, psn);
    *acked_bytes += LEN(s, psn);
    s->highest_acked_tsn = fl_imax(s->highest_acked_tsn, TSN(s, psn));
    s->latest_acked_sent = fl_max(s->latest_acked_sent, SENT_AT(s, psn));
}

static void on_ack(fl_uet_sender *s, const fl_packet *p, double now) {
    if (p->flags & F_NACK) {
        s->st_naks++;
        if (outstanding(s, p->ack) && now - SENT_AT(s, p->ack) > rtt_or_base(s) + s->reo_wnd) {
            forget(s, p->ack);
            queue_retx(s, p->ack);
        }
    }
    int64_t acked_bytes = 0;
    if (outstanding(s, p->psn) && !acked(s, p->psn))
        newly_acked(s, p->psn, &acked_bytes);
    for (int64_t psn = s->una; psn < fl_imin(p->ack, s->nxt); psn++)
        if (!acked(s, psn))
            newly_acked(s, psn, &acked_bytes);
    for (int bit = 0; bit < FL_SACK_BITS; bit++) {
        int64_t psn = p->ack + bit + 1;
        if (((p->sack >> bit) & 1) && psn >= s->una && psn < s->nxt && !acked(s, psn))
            newly_acked(s, psn, &acked_bytes);
    }
    if ((p->flags & F_DUP) && p->psn != s->probe_psn) {
        s->st_spurious++;
        s->reo_wnd = fl_min(s->reo_wnd * 2, s->cfg.rto_s / 2);
    }
    advance(s);
    if (acked_bytes) {
        s->progress_at = now;
        s->probed = false;
    }
    double rtt = fl_max(0.0, now - (double)p->sent_ns / 1e9);
    if (!s->has_srtt) {
        s->has_srtt = true;
        s->srtt = rtt;
        s->rttvar = rtt / 2;
    } else {
        s->rttvar = 0.75 * s->rttvar + 0.25 * fabs(s->srtt - rtt);
        s->srtt = 0.875 * s->srtt + 0.125 * rtt;
    }
    bool ce = p->flags & F_CE;
    if (ce)
        s->st_ce_acks++;
    s->min_rtt = fl_min(s->min_rtt, rtt);
    if (s->cfg.spray && !fl_uet_ordered(&s->cfg)) {
        bool slow = s->cfg.path_slack > 0 &&
                    rtt > s->min_rtt + s->cfg.path_slack * s->cfg.base_rtt_s;
        for (int i = 0; i <= p->n_echo; i++) {
            int entropy = i ? p->echo[i - 1] : p->entropy;
            bool congested = ((p->ce_mask >> i) & 1) || (slow && i == 0);
            fl_paths_feedback(&s->paths, entropy, congested ? FB_ECN : FB_GOOD);
        }
    }
    fl_window_on_ack(&s->window, acked_bytes, rtt, ce, now);
    detect_losses(s, now);
}

void fl_uet_sender_on_packet(fl_uet_sender *s, const fl_packet *p, double now) {
    if (p->kind == K_ACK) {
        on_ack(s, p, now);
    } else if (p->kind == K_GRANT && s->credit) {
        s->st_grants++;
        s->credit_granted = fl_imax(s->credit_granted, (int64_t)p->sack);
        s->asked_at = now;
    } else if (p->kind == K_NAK && (p->flags & F_TRIMMED)) {
        on_trimmed(s, p->psn, now);
    } else if (p->kind == K_NAK) {
        s->st_naks++;
        if (fl_uet_ordered(&s->cfg))
            for (int64_t psn = fl_imax(p->ack, s->una); psn < s->nxt; psn++) {
                forget(s, psn);
                queue_retx(s, psn);
            }
    }
}

static bool probe_due(fl_uet_sender *s, double *at) {
    double t;
    if (s->probed || !s->n_outstanding || !s->has_srtt || fl_uet_retx_len(s) ||
        !fl_uet_reliable(&s->cfg))
        return false;
    if (fl_uet_next_send_time(s, &t))
        return false;
    *at = s->progress_at + 2 * s->srtt;
    return true;
}

bool fl_uet_sender_timer(fl_uet_sender *s, double *at) {
    if (!s->n_outstanding && !fl_uet_retx_len(s))
        return false;
    double t = s->progress_at + fl_uet_rto_s(s), probe;
    if (s->has_reorder_due)
        t = fl_min(t, s->reorder_due);
    if (probe_due(s, &probe))
        t = fl_min(t, probe);
    *at = t;
    return true;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

void fl_uet_sender_on_timer(fl_uet_sender *s, double now) {
    double probe;
    if (s->has_reorder_due && now >= s->reorder_due)
        detect_losses(s, now);
    if (probe_due(s, &probe) && now >= probe && now < s->progress_at + fl_uet_rto_s(s)) {
        int64_t psn = s->nxt - 1;
        while (!outstanding(s, psn))
            psn--;
        s->probed = true;
        s->probe_psn = psn;
        s->st_probes++;
        forget(s, psn);
        queue_retx(s, psn);
    }
    if ((s->n_outstanding || fl_uet_retx_len(s)) && now >= s->progress_at + fl_uet_rto_s(s)) {
        s->st_timeouts++;
        fl_window_on_timeout(&s->window);
        if (s->n_outstanding) {
            int64_t oldest = s->una;
            while (!outstanding(s, oldest))
                oldest++;
            path_lost(s, oldest, FB_TIMEOUT);
        }
        for (int64_t psn = s->una; psn < s->nxt && s->n_outstanding; psn++)
            if (outstanding(s, psn)) {
                forget(s, psn);
                queue_retx(s, psn);
            }
        qsort((int64_t *)s->retx.data + s->retx_head, (size_t)fl_uet_retx_len(s),
              sizeof(int64_t), cmp_i64);
        s->progress_at = now;
    }
}
