/* Ultra-Ethernet-like transport: traffic/transports/uet.py, uet_control.py, entropy.py,
 * uet_receiver.py and rccc.py's CreditSender, rule for rule. */
#ifndef FL_UET_H
#define FL_UET_H

#include "common.h"

/* a PSN this far or more beyond a receiver's cumulative one is not a packet of this queue
 * pair's (UET_PSN_WINDOW in uet_receiver.py) */
#define FL_PSN_WINDOW (1 << 20)

enum fl_delivery { D_RUD = 0, D_ROD, D_UUD };
enum fl_entropy_kind { E_OBLIVIOUS = 0, E_REPS, E_BITMAP };
enum fl_feedback { FB_GOOD = 0, FB_ECN, FB_NACK, FB_TIMEOUT };

typedef struct {
    int64_t mss;
    double line_rate_bps, base_rtt_s, rto_s;
    bool spray;
    int delivery;
    bool nscc, rccc;
    int64_t entropies;
    int entropy;
    int64_t reorder_threshold;
    double target_factor, md, gamma, max_bdps, init_bdps;
    int64_t ack_every;
    double ack_delay_s, path_slack;
    int64_t bdp_bytes, rccc_initial_bytes;
} fl_uet_cfg;

static inline bool fl_uet_ordered(const fl_uet_cfg *c) { return c->delivery == D_ROD; }
static inline bool fl_uet_reliable(const fl_uet_cfg *c) { return c->delivery != D_UUD; }

/* the choice of entropy (entropy.py) */
typedef struct {
    int kind;
    int64_t n;
    fl_rng *rng;
    int64_t recycled, explored, penalised;
    int32_t *order; /* oblivious and bitmap: this round's order */
    int64_t index;
    int32_t *good; /* reps: a ring of up to n entropies acknowledged without congestion */
    int64_t good_head, good_len;
    uint8_t *penalty; /* bitmap */
} fl_paths;

/* NSCC, or a fixed window (uet_control.py) */
typedef struct {
    bool nscc;
    int64_t cwnd, mss, ceiling;
    double base_rtt_s, target_q, avg_q, cut_until, period, period_end, md, gamma;
    bool period_started, qa_pending;
    int64_t cuts, quick_adapts, achieved;
} fl_window;

typedef struct {
    fl_uet_cfg cfg;
    int src, ch, entropy;
    fl_rng rng;
    fl_vec lengths;   /* int32 per PSN */
    fl_vec flags;     /* uint8 per PSN: PF_* below */
    fl_vec out_entropy; /* int32 per PSN: its entropy while in flight, else -1 */
    fl_vec tsn_of;    /* int64 per PSN, -1: never sent */
    fl_vec sent_at;   /* double per PSN, -inf: never sent */
    fl_vec message_end; /* UUD: int64 pairs (end PSN, end byte) per PSN */
    fl_vec retx;      /* int64: PSNs to resend, from retx_head */
    size_t retx_head;
    fl_vec sent_order; /* int64 pairs (tsn, PSN), from order_head */
    size_t order_head;
    int64_t una, nxt, tsn, inflight, n_outstanding;
    int64_t highest_acked_tsn;
    double latest_acked_sent, reo_wnd, srtt, min_rtt, rttvar, next_send, progress_at;
    bool has_srtt, has_reorder_due, probed;
    double reorder_due;
    int64_t probe_psn;
    fl_paths paths;
    fl_window window;
    bool credit;
    int64_t credit_granted, credit_sent, wanted, announced;
    double asked_at;
    int64_t st_packets, st_bytes, st_retx, st_retx_bytes, st_naks, st_timeouts,
        st_sack_losses, st_spurious, st_ce_acks, st_probes, st_trim_naks, st_credit_requests,
        st_grants, st_credit_stalls, st_lost, st_lost_bytes;
    fl_vec seen; /* uint8 per entropy value */
    int64_t n_entropies;
} fl_uet_sender;

enum { PF_LAST = 1, PF_ACKED = 2, PF_QUEUED = 4 };

int fl_paths_init(fl_paths *p, int kind, int64_t n, fl_rng *rng);
void fl_paths_free(fl_paths *p);
int fl_paths_choose(fl_paths *p);
void fl_paths_feedback(fl_paths *p, int entropy, int what);

void fl_window_init(fl_window *w, const fl_uet_cfg *cfg);
void fl_window_on_ack(fl_window *w, int64_t acked_bytes, double rtt_s, bool ce, double now);
void fl_window_on_trim(fl_window *w, double rtt_s, double now);
void fl_window_on_timeout(fl_window *w);

int fl_uet_sender_init(fl_uet_sender *s, const fl_uet_cfg *cfg, int src, int ch, double now,
                       int entropy, uint64_t seed);
void fl_uet_sender_free(fl_uet_sender *s);
int64_t fl_uet_offer(fl_uet_sender *s, int64_t nbytes); /* -1: out of memory */
bool fl_uet_next_send_time(fl_uet_sender *s, double *at);
bool fl_uet_poll(fl_uet_sender *s, double now, fl_packet *out);
void fl_uet_sender_on_packet(fl_uet_sender *s, const fl_packet *p, double now);
bool fl_uet_sender_timer(fl_uet_sender *s, double *at);
void fl_uet_sender_on_timer(fl_uet_sender *s, double now);
double fl_uet_rto_s(const fl_uet_sender *s);
int64_t fl_uet_retx_len(const fl_uet_sender *s);

/* the receiver (uet_rx.c) */
typedef struct {
    fl_uet_cfg cfg;
    int src, ch;
    int64_t cum, delivered, nacked, received_bytes, n_placed, highest, message_received;
    /* per PSN from ``base`` (a ring of ``cap`` slots, cap a power of two): placed (its
     * length, -1: not placed), missing since (NaN: not missing) */
    int64_t base, cap;
    int32_t *placed;
    double *missing;
    int64_t n_missing;
    fl_vec ends; /* int64 pairs (end PSN, end byte), UUD */
    bool nack_due, ack_pending;
    double ack_due, last_arrival, gap_wait_s, tail_wait_s;
    /* the packets received and not yet acknowledged: how many, the latest, the latest
     * FL_MAX_ECHO's entropies and CE (newest first), CE in any */
    int64_t n_pending;
    fl_packet last;
    uint16_t cov_entropy[FL_MAX_ECHO];
    bool cov_ce[FL_MAX_ECHO];
    bool any_ce;
    int64_t st_packets, st_ooo, st_dups, st_naks, st_ce, st_acks, st_trimmed, st_lost,
        st_lost_bytes;
} fl_uet_receiver;

int fl_uet_receiver_init(fl_uet_receiver *r, const fl_uet_cfg *cfg, int src, int ch);
void fl_uet_receiver_free(fl_uet_receiver *r);
/* replies into out (at most 2); -1: out of memory */
int fl_uet_receiver_on_packet(fl_uet_receiver *r, const fl_packet *p, double now,
                              fl_packet *out);
bool fl_uet_receiver_timer(fl_uet_receiver *r, double *at);
int fl_uet_receiver_on_timer(fl_uet_receiver *r, double now, fl_packet *out);

#endif
