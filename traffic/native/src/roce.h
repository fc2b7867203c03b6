/* RoCEv2-like go-back-N with DCQCN, HPCC or Swift: traffic/transports/rocev2.py and
 * rate_control.py, rule for rule. */
#ifndef FL_ROCE_H
#define FL_ROCE_H

#include "common.h"

enum fl_cc { CC_OFF = 0, CC_DCQCN, CC_HPCC, CC_SWIFT };

typedef struct {
    double line_rate_bps, g, alpha_period_s, rate_period_s;
    int64_t byte_counter;
    int fast_recovery_stages;
    double rate_ai_bps, rate_hai_bps, min_rate_bps;
    bool clamp_target;
    double cut_interval_s;
} fl_dcqcn_cfg;

typedef struct {
    double line_rate_bps, base_rtt_s;
    int64_t mss, bdp_bytes, additive_bytes;
    double eta;
    int max_stage;
} fl_hpcc_cfg;

typedef struct {
    double line_rate_bps, base_rtt_s;
    int64_t mss, bdp_bytes;
    double target_factor, ai, beta, max_mdf;
} fl_swift_cfg;

typedef struct {
    int64_t mss;
    double rto_s;
    int64_t max_outstanding;
    int64_t ack_every;
    double ack_delay_s, cnp_interval_s;
    int cc;
    fl_dcqcn_cfg dcqcn;
    fl_hpcc_cfg hpcc;
    fl_swift_cfg swift;
    bool spray;
    int64_t entropies;
    double line_rate_bps;
} fl_roce_cfg;

/* the rate control of a queue pair: one of three, by cfg->cc */
typedef struct {
    int kind;
    /* DCQCN */
    const fl_dcqcn_cfg *d;
    double rate, target, alpha;
    int64_t timer_stage, byte_stage, bytes_since;
    double alpha_due, rate_due, last_cut;
    int64_t cuts;
    /* HPCC and Swift: a window */
    const fl_hpcc_cfg *h;
    const fl_swift_cfg *s;
    double window, wc, u;
    int64_t stage, last_update_seq, updates;
    uint8_t n_links;
    fl_hop links[FL_INT_HOPS];
    double cut_until;
} fl_rate;

typedef struct {
    fl_roce_cfg cfg;
    int src, ch;
    int entropy;
    fl_rng rng;
    fl_vec lengths; /* int32 per PSN */
    fl_vec last;    /* uint8 per PSN: the last packet of a message */
    int64_t una, nxt, high;
    double pace_from;
    int64_t pace_bits;
    double progress_at;
    bool has_cc, window_cc;
    fl_rate cc;
    int64_t st_packets, st_bytes, st_retx, st_retx_bytes, st_naks, st_cnps, st_timeouts;
    fl_vec seen; /* uint8 per entropy value: used at least once */
    int64_t n_entropies;
} fl_roce_sender;

typedef struct {
    fl_roce_cfg cfg;
    int src, ch;
    int64_t expected, delivered, unacked;
    bool ack_pending;
    double ack_due;
    int64_t nak_for;
    double last_cnp;
    bool has_latest;
    fl_packet latest;
    int64_t st_packets, st_ooo, st_dups, st_naks, st_cnps, st_ce, st_trimmed;
} fl_roce_receiver;

int fl_roce_sender_init(fl_roce_sender *s, const fl_roce_cfg *cfg, int src, int ch, double now,
                        int entropy, uint64_t seed);
void fl_roce_sender_free(fl_roce_sender *s);
int64_t fl_roce_offer(fl_roce_sender *s, int64_t nbytes); /* -1: out of memory */
double fl_roce_rate_bps(const fl_roce_sender *s);
bool fl_roce_next_send_time(const fl_roce_sender *s, double *at); /* false: None */
bool fl_roce_poll(fl_roce_sender *s, double now, fl_packet *out);
void fl_roce_sender_on_packet(fl_roce_sender *s, const fl_packet *p, double now);
bool fl_roce_sender_timer(const fl_roce_sender *s, double *at);
void fl_roce_sender_on_timer(fl_roce_sender *s, double now);

void fl_roce_receiver_init(fl_roce_receiver *r, const fl_roce_cfg *cfg, int src, int ch);
/* replies into out (at most 2); returns how many */
int fl_roce_receiver_on_packet(fl_roce_receiver *r, const fl_packet *p, double now,
                               fl_packet *out);
bool fl_roce_receiver_timer(const fl_roce_receiver *r, double *at);
int fl_roce_receiver_on_timer(fl_roce_receiver *r, double now, fl_packet *out);

#endif
