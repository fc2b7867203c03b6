/* The wire format, growable arrays and Python's Mersenne Twister (see common.h). */
#include "common.h"

#include <stdlib.h>
#include <string.h>

/* ---- the wire format ---------------------------------------------------------------- */
static void put16(uint8_t *o, uint16_t v) { o[0] = v >> 8; o[1] = v; }
static void put32(uint8_t *o, uint32_t v) { put16(o, v >> 16); put16(o + 2, v); }
static void put64(uint8_t *o, uint64_t v) { put32(o, v >> 32); put32(o + 4, (uint32_t)v); }
static uint16_t get16(const uint8_t *i) { return (uint16_t)(i[0] << 8 | i[1]); }
static uint32_t get32(const uint8_t *i) { return (uint32_t)get16(i) << 16 | get16(i + 2); }
static uint64_t get64(const uint8_t *i) { return (uint64_t)get32(i) << 32 | get32(i + 4); }

void fl_packet_init(fl_packet *p, int kind, int src, int ch) {
    memset(p, 0, sizeof *p);
    p->kind = (uint8_t)kind;
    p->src = (uint16_t)src;
    p->ch = (uint16_t)ch;
}

size_t fl_encode(const fl_packet *p, uint8_t *o) {
    o[0] = p->kind;
    o[1] = p->flags;
    put16(o + 2, FL_VERSION);
    put16(o + 4, p->src);
    put16(o + 6, p->ch);
    put32(o + 8, (uint32_t)p->psn);
    put32(o + 12, (uint32_t)p->ack);
    put16(o + 16, p->entropy);
    for (int i = 0; i < FL_MAX_ECHO - 1; i++)
        put16(o + 18 + 2 * i, i < p->n_echo ? p->echo[i] : FL_NO_ENTROPY);
    o[24] = p->ce_mask;
    put64(o + 25, p->sack);
    put64(o + 33, p->sent_ns);
    put32(o + 41, p->length);
    if (!(p->flags & F_INT))
        return FL_HEADER_SIZE;
    uint8_t *a = o + FL_HEADER_SIZE;
    memset(a, 0, FL_INT_SIZE);
    a[0] = p->n_hops;
    for (int i = 0; i < p->n_hops && i < FL_INT_HOPS; i++) {
        uint8_t *h = a + FL_INT_HEAD_SIZE + i * FL_INT_HOP_SIZE;
        put64(h, p->hops[i].ts_ns);
        put32(h + 8, p->hops[i].tx_bytes);
        put32(h + 12, p->hops[i].qlen_bytes);
        put32(h + 16, p->hops[i].rate_kbps);
    }
    return FL_HEADER_SIZE + FL_INT_SIZE;
}

size_t fl_filler(const fl_packet *p) {
    return p->length - ((p->flags & F_INT) ? FL_INT_SIZE : 0);
}

int fl_decode(const uint8_t *d, size_t n, fl_packet *p, const char **why) {
    if (n < FL_HEADER_SIZE) {
        *why = "datagram shorter than the header";
        return -1;
    }
    int kind = d[0];
    if (get16(d + 2) != FL_VERSION || kind < K_DATA || kind > K_PONG) {
        *why = "not a transport packet";
        return -1;
    }
    uint32_t length = get32(d + 41);
    size_t carried = n - FL_HEADER_SIZE;
    if (carried > length) {
        *why = "a datagram longer than it says";
        return -1;
    }
    memset(p, 0, sizeof *p);
    p->kind = (uint8_t)kind;
    p->flags = d[1];
    p->src = get16(d + 4);
    p->ch = get16(d + 6);
    p->psn = get32(d + 8);
    p->ack = get32(d + 12);
    p->entropy = get16(d + 16);
    for (int i = 0; i < FL_MAX_ECHO - 1; i++) {
        uint16_t e = get16(d + 18 + 2 * i);
        if (e != FL_NO_ENTROPY)
            p->echo[p->n_echo++] = e;
    }
    p->ce_mask = d[24];
    p->sack = get64(d + 25);
    p->sent_ns = get64(d + 33);
    p->length = length;
    p->trimmed = carried < length;
    if ((p->flags & F_INT) && carried >= FL_INT_SIZE) {
        const uint8_t *a = d + FL_HEADER_SIZE;
        p->n_hops = a[0] < FL_INT_HOPS ? a[0] : FL_INT_HOPS;
        for (int i = 0; i < p->n_hops; i++) {
            const uint8_t *h = a + FL_INT_HEAD_SIZE + i * FL_INT_HOP_SIZE;
            p->hops[i] = (fl_hop){get64(h), get32(h + 8), get32(h + 12), get32(h + 16)};
        }
    }
    return 0;
}

/* ---- growable arrays ---------------------------------------------------------------- */
int fl_vec_init(fl_vec *v, size_t item) {
    v->len = 0;
    v->cap = 64;
    v->item = item;
    v->data = calloc(v->cap, item);
    return v->data ? 0 : -1;
}

void fl_vec_free(fl_vec *v) {
    free(v->data);
    v->data = NULL;
    v->len = v->cap = 0;
}

int fl_vec_reserve(fl_vec *v, size_t n, const void *fill) {
    if (n <= v->len)
        return 0;
    if (n > v->cap) {
        size_t cap = v->cap;
        while (cap < n)
            cap *= 2;
        void *d = realloc(v->data, cap * v->item);
        if (!d)
            return -1;
        v->data = d;
        v->cap = cap;
    }
    for (size_t i = v->len; i < n; i++) {
        uint8_t *at = (uint8_t *)v->data + i * v->item;
        if (fill)
            memcpy(at, fill, v->item);
        else
            memset(at, 0, v->item);
    }
    v->len = n;
    return 0;
}

int fl_vec_push(fl_vec *v, const void *item) {
    if (fl_vec_reserve(v, v->len + 1, item))
        return -1;
    return 0;
}

/* ---- Python's random.Random ----------------------------------------------------------- */
static void init_genrand(fl_rng *r, uint32_t s) {
    r->mt[0] = s;
    for (int i = 1; i < 624; i++)
        r->mt[i] = 1812433253U * (r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) + (uint32_t)i;
    r->index = 624;
}

void fl_rng_seed(fl_rng *r, uint64_t seed) {
    /* random.seed(int): init_by_array over the absolute value's 32-bit words */
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    int keylen = key[1] ? 2 : 1;
    init_genrand(r, 19650218U);
    int i = 1, j = 0;
    for (int k = 624 > keylen ? 624 : keylen; k; k--) {
        r->mt[i] = (r->mt[i] ^ ((r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) * 1664525U)) + key[j] +
                   (uint32_t)j;
        i++;
        j++;
        if (i >= 624) {
            r->mt[0] = r->mt[623];
            i = 1;
        }
        if (j >= keylen)
            j = 0;
    }
    for (int k = 623; k; k--) {
        r->mt[i] = (r->mt[i] ^ ((r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) * 1566083941U)) -
                   (uint32_t)i;
        i++;
        if (i >= 624) {
            r->mt[0] = r->mt[623];
            i = 1;
        }
    }
    r->mt[0] = 0x80000000U;
    r->index = 624;
}

uint32_t fl_rng_u32(fl_rng *r) {
    static const uint32_t mag01[2] = {0x0U, 0x9908b0dfU};
    uint32_t y;
    if (r->index >= 624) {
        int kk;
        for (kk = 0; kk < 624 - 397; kk++) {
            y = (r->mt[kk] & 0x80000000U) | (r->mt[kk + 1] & 0x7fffffffU);
            r->mt[kk] = r->mt[kk + 397] ^ (y >> 1) ^ mag01[y & 1U];
        }
        for (; kk < 623; kk++) {
            y = (r->mt[kk] & 0x80000000U) | (r->mt[kk + 1] & 0x7fffffffU);
            r->mt[kk] = r->mt[kk + (397 - 624)] ^ (y >> 1) ^ mag01[y & 1U];
        }
        y = (r->mt[623] & 0x80000000U) | (r->mt[0] & 0x7fffffffU);
        r->mt[623] = r->mt[396] ^ (y >> 1) ^ mag01[y & 1U];
        r->index = 0;
    }
    y = r->mt[r->index++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    y ^= (y >> 18);
    return y;
}

uint32_t fl_rng_below(fl_rng *r, uint32_t n) {
    /* Random._randbelow_with_getrandbits: k = n.bit_length(), draw k bits until below n */
    int k = 0;
    for (uint32_t m = n; m; m >>= 1)
        k++;
    uint32_t v;
    do
        v = fl_rng_u32(r) >> (32 - k);
    while (v >= n);
    return v;
}

void fl_rng_shuffle(fl_rng *r, int32_t *x, size_t n) {
    for (size_t i = n - 1; i >= 1 && n > 1; i--) {
        size_t j = fl_rng_below(r, (uint32_t)(i + 1));
        int32_t t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
}
