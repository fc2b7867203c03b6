/* One agent's queue pairs: the loop of traffic/agents/engine.py's UdpEngine (see host.h). */
#include "host.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

double fl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the two transports behind one face ------------------------------------------------ */
static bool tx_next(fl_host *h, fl_tx *t, double *at) {
    return h->transport == T_ROCE ? fl_roce_next_send_time(&t->s.roce, at)
                                  : fl_uet_next_send_time(&t->s.uet, at);
}
static bool tx_timer(fl_host *h, fl_tx *t, double *at) {
    return h->transport == T_ROCE ? fl_roce_sender_timer(&t->s.roce, at)
                                  : fl_uet_sender_timer(&t->s.uet, at);
}
static int64_t tx_una(fl_host *h, fl_tx *t) {
    return h->transport == T_ROCE ? t->s.roce.una : t->s.uet.una;
}
static int64_t tx_len(fl_host *h, fl_tx *t) {
    return (int64_t)(h->transport == T_ROCE ? t->s.roce.lengths.len : t->s.uet.lengths.len);
}
static bool rx_timer(fl_host *h, fl_rx *r, double *at) {
    return h->transport == T_ROCE ? fl_roce_receiver_timer(&r->r.roce, at)
                                  : fl_uet_receiver_timer(&r->r.uet, at);
}
static int64_t rx_delivered(fl_host *h, fl_rx *r) {
    return h->transport == T_ROCE ? r->r.roce.delivered : r->r.uet.delivered;
}

/* ---- queue pairs ---------------------------------------------------------------------- */
static int waits_push(fl_waits *w, int64_t threshold, int64_t token) {
    if (w->len == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 8;
        int64_t *d = realloc(w->data, 2 * cap * sizeof(int64_t));
        if (!d)
            return -1;
        w->data = d;
        w->cap = cap;
    }
    w->data[2 * w->len] = threshold;
    w->data[2 * w->len + 1] = token;
    w->len++;
    return 0;
}

/* the waits whose threshold ``reached`` passed: their tokens done */
static void waits_release(fl_host *h, fl_waits *w, int64_t reached) {
    while (w->head < w->len && reached >= w->data[2 * w->head]) {
        fl_done(h, w->data[2 * w->head + 1]);
        w->head++;
    }
    if (w->head == w->len)
        w->head = w->len = 0;
}

fl_tx *fl_find_tx(fl_host *h, int peer, int ch) {
    for (int i = 0; i < h->n_tx; i++)
        if (h->tx[i]->peer == peer && h->tx[i]->ch == ch)
            return h->tx[i];
    return NULL;
}

static fl_tx *sender(fl_host *h, int peer, int ch, const struct sockaddr_in *addr) {
    fl_tx *t = fl_find_tx(h, peer, ch);
    if (t)
        return t;
    if (h->n_tx == h->cap_tx) {
        int cap = h->cap_tx ? 2 * h->cap_tx : 16;
        fl_tx **d = realloc(h->tx, sizeof(fl_tx *) * (size_t)cap);
        if (!d)
            return NULL;
        h->tx = d;
        h->cap_tx = cap;
    }
    if (!(t = calloc(1, sizeof *t)))
        return NULL;
    t->peer = peer;
    t->ch = ch;
    t->addr = *addr;
    int entropy = (int)((peer * 31 + ch) % (h->n_pool ? h->n_pool : 1));
    uint64_t seed = (uint64_t)(h->rank * 1000 + peer * 10 + ch);
    int bad = h->transport == T_ROCE
                  ? fl_roce_sender_init(&t->s.roce, &h->roce, h->rank, ch, fl_now(), entropy,
                                        seed)
                  : fl_uet_sender_init(&t->s.uet, &h->uet, h->rank, ch, fl_now(), entropy,
                                       seed);
    if (bad) {
        free(t);
        return NULL;
    }
    h->tx[h->n_tx++] = t;
    return t;
}

fl_rx *fl_find_rx(fl_host *h, int src, int ch) {
    for (int i = 0; i < h->n_rx; i++)
        if (h->rx[i]->src == src && h->rx[i]->ch == ch)
            return h->rx[i];
    return NULL;
}

fl_rx *fl_receiver(fl_host *h, int src, int ch) {
    fl_rx *r = fl_find_rx(h, src, ch);
    if (r || src < 0 || src >= h->n_ranks || ch < 0 || ch > 4095)
        return r;
    if (h->n_rx == h->cap_rx) {
        int cap = h->cap_rx ? 2 * h->cap_rx : 16;
        fl_rx **d = realloc(h->rx, sizeof(fl_rx *) * (size_t)cap);
        if (!d)
            return NULL;
        h->rx = d;
        h->cap_rx = cap;
    }
    if (!(r = calloc(1, sizeof *r)))
        return NULL;
    r->src = src;
    r->ch = ch;
    if (h->transport == T_ROCE)
        fl_roce_receiver_init(&r->r.roce, &h->roce, src, ch);
    else if (fl_uet_receiver_init(&r->r.uet, &h->uet, src, ch)) {
        free(r);
        return NULL;
    }
    h->rx[h->n_rx++] = r;
    return r;
}

/* a queue pair's cached times and finished messages, after anything touched it
 * (engine.py's _refresh, for one) */
static void refresh_tx(fl_host *h, fl_tx *t, double now) { fl_touched_tx(h, t, now); }

void fl_touched_tx(fl_host *h, fl_tx *t, double now) {
    int64_t una = tx_una(h, t);
    if (!t->has_progress || t->progress_una != una || una >= tx_len(h, t)) {
        t->has_progress = true;
        t->progress_una = una;
        t->progress_since = now;
    }
    t->has_send_at = tx_next(h, t, &t->send_at);
    t->ready_at = now;
    t->has_timer = tx_timer(h, t, &t->timer_at);
    waits_release(h, &t->waits, una);
}

void fl_refresh_rx(fl_host *h, fl_rx *r) {
    r->has_timer = rx_timer(h, r, &r->timer_at);
    waits_release(h, &r->waits, rx_delivered(h, r));
}

/* ---- the loop's steps ------------------------------------------------------------------ */
static void commands(fl_host *h) {
    for (size_t i = 0; i < h->n_cmds; i++) {
        fl_cmd *c = &h->cmds[i];
        double now = fl_now();
        if (c->kind == CMD_PING) {
            fl_packet p;
            fl_packet_init(&p, K_PING, h->rank, 0);
            p.sent_ns = (uint64_t)(now * 1e9);
            fl_io_reply(h, &p, &c->addr, now);
        } else if (c->kind == CMD_SEND) {
            fl_tx *t = sender(h, c->peer, c->ch, &c->addr);
            int64_t end = !t ? -1
                          : h->transport == T_ROCE ? fl_roce_offer(&t->s.roce, c->nbytes)
                                                   : fl_uet_offer(&t->s.uet, c->nbytes);
            if (end < 0 || waits_push(&t->waits, end, c->token)) {
                snprintf(h->error, sizeof h->error, "udp engine: out of memory");
                return;
            }
            refresh_tx(h, t, now);
        } else {
            fl_rx *r = fl_receiver(h, c->peer, c->ch);
            if (!r || waits_push(&r->waits, r->expected_total += c->nbytes, c->token)) {
                snprintf(h->error, sizeof h->error, "udp engine: out of memory");
                return;
            }
            fl_refresh_rx(h, r);
        }
    }
    h->n_cmds = 0;
}

static void check_stalls(fl_host *h, double now) {
    if (now < h->stall_check_at)
        return;
    h->stall_check_at = now + 1.0;
    for (int i = 0; i < h->n_tx; i++) {
        fl_tx *t = h->tx[i];
        if (t->has_progress && tx_una(h, t) < tx_len(h, t) &&
            now - t->progress_since > h->stall_limit_s) {
            snprintf(h->error, sizeof h->error,
                     "%s to rank %d channel %d: nothing acknowledged for %.0f s while "
                     "retransmitting; the peer is gone or every path to it cut",
                     h->transport == T_ROCE ? "rocev2" : "uet", t->peer, t->ch,
                     now - t->progress_since);
            return;
        }
    }
}

static void timers(fl_host *h, double now) {
    fl_packet out[2];
    for (int i = 0; i < h->n_tx; i++) {
        fl_tx *t = h->tx[i];
        if (t->has_timer && t->timer_at <= now) {
            if (h->transport == T_ROCE)
                fl_roce_sender_on_timer(&t->s.roce, now);
            else
                fl_uet_sender_on_timer(&t->s.uet, now);
            refresh_tx(h, t, now);
        }
    }
    for (int i = 0; i < h->n_rx; i++) {
        fl_rx *r = h->rx[i];
        if (!r->has_timer || r->timer_at > now)
            continue;
        int n = h->transport == T_ROCE ? fl_roce_receiver_on_timer(&r->r.roce, now, out)
                                       : fl_uet_receiver_on_timer(&r->r.uet, now, out);
        for (int k = 0; k < n && r->has_reply; k++)
            fl_io_reply(h, &out[k], &r->reply_to, now);
        fl_refresh_rx(h, r);
    }
}

static void grants(fl_host *h, double now) {
    if (!h->has_credit)
        return;
    fl_demand due[64];
    int n = fl_credit_poll(&h->credit, now, due, 64);
    for (int i = 0; i < n; i++) {
        fl_rx *r = fl_find_rx(h, due[i].src, due[i].ch);
        if (!r || !r->has_reply)
            continue;
        fl_packet p;
        fl_packet_init(&p, K_GRANT, due[i].src, due[i].ch);
        p.sack = (uint64_t)due[i].granted;
        fl_io_reply(h, &p, &r->reply_to, now);
    }
}

static void transmit(fl_host *h, double now) {
    if (now < h->backoff_until || !h->n_tx)
        return;
    if (h->has_held && !fl_io_send_data(h, h->held_fd, &h->held, &h->held_addr, now))
        return;
    h->turn = (h->turn + 1) % h->n_tx;
    bool sent = true;
    while (sent) { /* one packet per queue pair per round, while the NIC has room */
        sent = false;
        for (int i = 0; i < h->n_tx; i++) {
            if (h->nic_free_at - now > h->nic_slack_s)
                return;
            fl_tx *t = h->tx[(h->turn + i) % h->n_tx];
            if (!t->has_send_at || t->send_at > now)
                continue;
            fl_packet p;
            bool got = h->transport == T_ROCE ? fl_roce_poll(&t->s.roce, now, &p)
                                              : fl_uet_poll(&t->s.uet, now, &p);
            if (!got)
                continue;
            double from = fl_max(fl_max(t->send_at, t->ready_at),
                                 fl_max(h->unheld_at, h->nic_free_at - h->nic_slack_s));
            fl_late(h->late_tx, now - from);
            refresh_tx(h, t, now);
            if (!fl_io_send_data(h, h->pool[p.entropy % h->n_pool], &p, &t->addr, now))
                return;
            sent = true;
        }
    }
}

static double next_wake(fl_host *h, double now) {
    double wake = now + FL_IDLE_WAKE_S, t;
    if (h->backoff_until > now)
        wake = fl_min(wake, h->backoff_until);
    double send = FL_INF;
    for (int i = 0; i < h->n_tx; i++) {
        if (h->tx[i]->has_send_at)
            send = fl_min(send, h->tx[i]->send_at);
        if (h->tx[i]->has_timer)
            wake = fl_min(wake, h->tx[i]->timer_at);
    }
    if (send < FL_INF)
        wake = fl_min(wake, fl_max(send, h->nic_free_at - h->nic_slack_s));
    for (int i = 0; i < h->n_rx; i++)
        if (h->rx[i]->has_timer)
            wake = fl_min(wake, h->rx[i]->timer_at);
    if (h->has_credit && fl_credit_next_time(&h->credit, &t))
        wake = fl_min(wake, t);
    if (h->n_line)
        wake = fl_min(wake, h->line[0].due);
    return wake - now;
}

static void release(fl_host *h, double now) {
    fl_held held;
    while (fl_line_pop(h, now, &held)) {
        fl_late(h->late_rx, now - held.due);
        fl_deliver(h, &held.pkt, &held.from, held.data_socket, now);
    }
}

static void *loop(void *arg) {
    fl_host *h = arg;
    struct epoll_event ev[16];
    /* wake-ups on time: the kernel may otherwise defer a timed wait by 50 us (timer slack) */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    pthread_mutex_lock(&h->lock);
    while (!h->stop && !h->error[0]) {
        commands(h);
        double now = fl_now();
        release(h, now);
        check_stalls(h, now);
        timers(h, now);
        grants(h, now);
        transmit(h, now);
        fl_io_flush(h);
        double wait = fl_max(0.0, next_wake(h, fl_now()));
        pthread_mutex_unlock(&h->lock);
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        int n = epoll_pwait2(h->epoll_fd, ev, 16, &ts, NULL);
        if (n < 0 && errno == ENOSYS) /* a kernel before 5.11: milliseconds, rounded up */
            n = epoll_wait(h->epoll_fd, ev, 16, (int)(wait * 1e3 + 0.999));
        pthread_mutex_lock(&h->lock);
        if (n < 0 && errno != EINTR) {
            snprintf(h->error, sizeof h->error, "udp engine: epoll: %s", strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            int fd = ev[i].data.fd;
            if (fd == h->wake_fd) {
                uint64_t v;
                if (read(fd, &v, sizeof v) < 0) { /* nothing to read: already woken */
                }
            } else {
                fl_io_read(h, fd, fd == h->listen_fd, fl_now());
            }
        }
        release(h, fl_now());
        fl_io_flush(h);
    }
    fl_io_flush(h);
    pthread_mutex_unlock(&h->lock);
    uint64_t one = 1;
    if (write(h->done_fd, &one, sizeof one) < 0) { /* the waiter times out all the same */
    }
    return NULL;
}

/* ---- set-up, commands and completions --------------------------------------------------- */
int fl_host_init(fl_host *h) {
    pthread_mutex_init(&h->lock, NULL);
    h->rbuf = malloc((size_t)BATCH * FL_DATAGRAM_MAX);
    if (!h->rbuf)
        return -1;
    h->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    h->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    h->done_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (h->epoll_fd < 0 || h->wake_fd < 0 || h->done_fd < 0)
        return -1;
    int fds[2] = {h->wake_fd, h->listen_fd};
    for (int i = 0; i < 2 + h->n_pool; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = i < 2 ? fds[i] : h->pool[i - 2]};
        if (epoll_ctl(h->epoll_fd, EPOLL_CTL_ADD, ev.data.fd, &ev))
            return -1;
    }
    return 0;
}

int fl_host_start(fl_host *h) {
    if (pthread_create(&h->thread, NULL, loop, h))
        return -1;
    h->started = true;
    return 0;
}

static void wake(fl_host *h) {
    uint64_t one = 1;
    if (write(h->wake_fd, &one, sizeof one) < 0) { /* a full counter wakes it all the same */
    }
}

void fl_host_stop(fl_host *h) {
    if (!h->started)
        return;
    h->stop = 1;
    wake(h);
    pthread_join(h->thread, NULL);
    h->started = false;
}

void fl_host_free(fl_host *h) {
    for (int i = 0; i < h->n_tx; i++) {
        if (h->transport == T_ROCE)
            fl_roce_sender_free(&h->tx[i]->s.roce);
        else
            fl_uet_sender_free(&h->tx[i]->s.uet);
        free(h->tx[i]->waits.data);
        free(h->tx[i]);
    }
    for (int i = 0; i < h->n_rx; i++) {
        if (h->transport == T_UET)
            fl_uet_receiver_free(&h->rx[i]->r.uet);
        free(h->rx[i]->waits.data);
        free(h->rx[i]);
    }
    free(h->tx);
    free(h->rx);
    free(h->line);
    free(h->cmds);
    free(h->done);
    free(h->rbuf);
    if (h->has_credit)
        fl_credit_free(&h->credit);
    int fds[] = {h->epoll_fd, h->wake_fd, h->done_fd};
    for (int i = 0; i < 3; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    pthread_mutex_destroy(&h->lock);
}

int fl_host_command(fl_host *h, const fl_cmd *cmd) {
    pthread_mutex_lock(&h->lock);
    if (h->n_cmds == h->cap_cmds) {
        size_t cap = h->cap_cmds ? 2 * h->cap_cmds : 64;
        fl_cmd *d = realloc(h->cmds, cap * sizeof *d);
        if (!d) {
            pthread_mutex_unlock(&h->lock);
            return -1;
        }
        h->cmds = d;
        h->cap_cmds = cap;
    }
    h->cmds[h->n_cmds++] = *cmd;
    pthread_mutex_unlock(&h->lock);
    wake(h);
    return 0;
}

void fl_done(fl_host *h, int64_t token) {
    if (h->n_done == h->cap_done) {
        size_t cap = h->cap_done ? 2 * h->cap_done : 64;
        int64_t *d = realloc(h->done, cap * sizeof *d);
        if (!d) {
            snprintf(h->error, sizeof h->error, "udp engine: out of memory");
            return;
        }
        h->done = d;
        h->cap_done = cap;
    }
    h->done[h->n_done++] = token;
    uint64_t one = 1;
    if (write(h->done_fd, &one, sizeof one) < 0) { /* a full counter: the waiter is awake */
    }
}

int fl_host_take_done(fl_host *h, int64_t **out, size_t *n) {
    pthread_mutex_lock(&h->lock);
    *n = h->n_done;
    *out = NULL;
    if (h->n_done) {
        *out = malloc(h->n_done * sizeof(int64_t));
        if (*out)
            memcpy(*out, h->done, h->n_done * sizeof(int64_t));
        h->n_done = 0;
    }
    pthread_mutex_unlock(&h->lock);
    return (*n && !*out) ? -1 : 0;
}
