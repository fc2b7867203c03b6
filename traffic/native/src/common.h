/* The native transport engine's shared definitions: the wire format of
 * traffic/transports/packet.py, growable arrays, Python's Mersenne Twister.
 *
 * Every rule here mirrors the pure Python reference (the modules of traffic/transports) operation for
 * operation, in the same order, in doubles where it uses floats, so that the differential
 * tests (tests/unit/test_native_*.py) can demand identical packets and counters. */
#ifndef FL_COMMON_H
#define FL_COMMON_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FL_INF (INFINITY)

/* ---- the wire format (packet.py) ---------------------------------------------------- */
#define FL_HEADER_SIZE 45 /* struct "!BBHHHIIH3HBQQI" */
#define FL_VERSION 4
#define FL_MAX_ECHO 4
#define FL_NO_ENTROPY 0xFFFF
#define FL_INT_HOPS 5
#define FL_INT_HOP_SIZE 20
#define FL_INT_HEAD_SIZE 4
#define FL_INT_SIZE (FL_INT_HEAD_SIZE + FL_INT_HOPS * FL_INT_HOP_SIZE)
#define FL_FRAME_OVERHEAD (14 + 20 + 8)
#define FL_SACK_BITS 64
#define FL_PACE_CATCH_UP_S 0.003

enum fl_kind { K_DATA = 1, K_ACK, K_NAK, K_CNP, K_REQ, K_GRANT, K_PING, K_PONG };
enum fl_flag {
    F_CE = 1, F_RETX = 2, F_LAST = 4, F_NACK = 8, F_DUP = 16, F_TRIMMED = 32, F_INT = 64
};

typedef struct {
    uint64_t ts_ns;
    uint32_t tx_bytes, qlen_bytes, rate_kbps;
} fl_hop;

typedef struct {
    uint8_t kind, flags;
    uint16_t src, ch;
    int64_t psn, ack; /* on the wire: 32 bits */
    uint32_t length;
    uint16_t entropy;
    uint8_t n_echo;
    uint16_t echo[FL_MAX_ECHO - 1];
    uint8_t ce_mask;
    uint64_t sack;
    uint64_t sent_ns;
    bool trimmed;
    uint8_t n_hops;
    fl_hop hops[FL_INT_HOPS];
} fl_packet;

void fl_packet_init(fl_packet *p, int kind, int src, int ch);
/* The header (and INT area when flagged) into out (at least FL_HEADER_SIZE + FL_INT_SIZE);
 * returns the bytes written. The rest of ``length`` is filler (fl_filler). */
size_t fl_encode(const fl_packet *p, uint8_t *out);
size_t fl_filler(const fl_packet *p);
/* 0, or -1 for a short or foreign datagram (its reason in *why, a static string) */
int fl_decode(const uint8_t *data, size_t n, fl_packet *p, const char **why);

static inline int64_t fl_wire_bytes(int64_t payload) {
    return payload + FL_HEADER_SIZE + FL_FRAME_OVERHEAD;
}

static inline double fl_next_send(double now, double scheduled, double gap_s) {
    double from = now - FL_PACE_CATCH_UP_S;
    return (from > scheduled ? from : scheduled) + gap_s;
}

static inline double fl_max(double a, double b) { return a > b ? a : b; }
static inline double fl_min(double a, double b) { return a < b ? a : b; }
static inline int64_t fl_imax(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t fl_imin(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- growable arrays ---------------------------------------------------------------- */
/* A per-PSN array of fixed-size items, grown (zero or ``fill``ed) on demand. */
typedef struct {
    void *data;
    size_t len, cap, item;
} fl_vec;

int fl_vec_init(fl_vec *v, size_t item);
void fl_vec_free(fl_vec *v);
/* make index i exist (new items set to the byte pattern of *fill, or zero); 0 or -1 */
int fl_vec_reserve(fl_vec *v, size_t n, const void *fill);
int fl_vec_push(fl_vec *v, const void *item);
#define FL_AT(v, type, i) (((type *)(v).data)[i])

/* ---- Python's random.Random (MT19937, its seeding, randrange, shuffle) ---------------- */
typedef struct {
    uint32_t mt[624];
    int index;
} fl_rng;

void fl_rng_seed(fl_rng *r, uint64_t seed); /* random.Random(seed), seed >= 0 */
uint32_t fl_rng_u32(fl_rng *r);
uint32_t fl_rng_below(fl_rng *r, uint32_t n); /* randrange(n), n >= 1 */
void fl_rng_shuffle(fl_rng *r, int32_t *x, size_t n); /* random.shuffle */

/* Python's round() of a double to an integer (half to even) */
static inline int64_t fl_round(double x) { return (int64_t)nearbyint(x); }

#endif
