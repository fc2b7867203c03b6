/* The agent engine's datagrams: read in batches (recvmmsg, CE from the IP header's ECN bits),
 * DATA sent header and zeros (sendmsg), replies, the delay line, what arrived delivered to its
 * queue pair (engine.py's _read, _send, _reply, _deliver). */
#define _GNU_SOURCE
#include "host.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define READS_PER_WAKE 256
#define CE 0x3

static const uint8_t zeros[65536];

const double fl_late_edges_us[FL_LATE_BUCKETS - 1] = {25,   50,   100,  250,   500,  1000,
                                                       2000, 4000, 8000, 16000, 32000};

void fl_late(int64_t *hist, double late_s) {
    double us = late_s * 1e6;
    int i = 0;
    while (i < FL_LATE_BUCKETS - 1 && us > fl_late_edges_us[i])
        i++;
    hist[i]++;
}

int fl_peer_of(const fl_host *h, const struct sockaddr_in *addr) {
    for (int i = 0; i < h->n_ips; i++)
        if (h->ip_of[i] == addr->sin_addr.s_addr)
            return h->rank_of[i];
    return -1;
}

void fl_io_nic_sent(fl_host *h, double now, int64_t payload) {
    h->nic_free_at = fl_max(now, h->nic_free_at) +
                     (double)(fl_wire_bytes(payload) * 8) / h->nic_rate_bps;
}

bool fl_io_send_data(fl_host *h, int fd, const fl_packet *p, const struct sockaddr_in *to,
                     double now) {
    uint8_t head[FL_HEADER_SIZE + FL_INT_SIZE];
    struct iovec iov[2] = {{head, fl_encode(p, head)}, {(void *)zeros, fl_filler(p)}};
    struct msghdr msg = {.msg_name = (void *)to, .msg_namelen = sizeof *to, .msg_iov = iov,
                         .msg_iovlen = 2};
    if (sendmsg(fd, &msg, 0) < 0) {
        if (errno != EAGAIN && errno != ENOBUFS) {
            snprintf(h->error, sizeof h->error, "udp engine: send: %s", strerror(errno));
            return false;
        }
        h->has_held = true;
        h->held = *p;
        h->held_fd = fd;
        h->held_addr = *to;
        h->backoff_until = now + FL_BACKOFF_S;
        return false;
    }
    if (h->has_held) { /* the NIC took the held packet: a pause, not the agent */
        h->has_held = false;
        h->unheld_at = now;
    }
    fl_io_nic_sent(h, now, p->length);
    return true;
}

void fl_io_reply(fl_host *h, const fl_packet *p, const struct sockaddr_in *to, double now) {
    if (h->n_out == BATCH)
        fl_io_flush(h);
    int i = h->n_out++;
    h->out_len[i] = fl_encode(p, h->out_buf[i]);
    h->out_to[i] = *to;
    h->out_cnp[i] = p->kind == K_CNP; /* in its own class (the fabric may serve it first) */
    fl_io_nic_sent(h, now, 0);       /* replies take the NIC's time too */
}

void fl_io_flush(fl_host *h) {
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    char control[BATCH][CMSG_SPACE(sizeof(int))];
    for (int i = 0; i < h->n_out; i++) {
        iov[i] = (struct iovec){h->out_buf[i], h->out_len[i]};
        msgs[i].msg_hdr = (struct msghdr){.msg_name = &h->out_to[i],
                                          .msg_namelen = sizeof h->out_to[i],
                                          .msg_iov = &iov[i], .msg_iovlen = 1};
        if (h->out_cnp[i]) {
            memset(control[i], 0, sizeof control[i]);
            msgs[i].msg_hdr.msg_control = control[i];
            msgs[i].msg_hdr.msg_controllen = sizeof control[i];
            struct cmsghdr *c = CMSG_FIRSTHDR(&msgs[i].msg_hdr);
            c->cmsg_level = IPPROTO_IP;
            c->cmsg_type = IP_TOS;
            c->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(c), &h->cnp_tos, sizeof(int));
        }
    }
    int done = 0;
    while (done < h->n_out) {
        int n = sendmmsg(h->listen_fd, msgs + done, (unsigned)(h->n_out - done), 0);
        if (n > 0) {
            done += n;
            continue;
        }
        if (errno != EAGAIN && errno != ENOBUFS && errno != EINTR)
            snprintf(h->error, sizeof h->error, "udp engine: reply: %s", strerror(errno));
        else if (errno != EINTR) { /* the host's queue is full: a reply is lost, as on a NIC */
            h->local_drops++;
            done++;
            continue;
        }
        if (errno != EINTR)
            break;
    }
    h->n_out = 0;
}

/* ---- the delay line: a binary heap by (due, seq) ------------------------------------------ */
static bool before(const fl_held *a, const fl_held *b) {
    return a->due < b->due || (a->due == b->due && a->seq < b->seq);
}

void fl_line_hold(fl_host *h, double due, const fl_packet *p, const struct sockaddr_in *from,
                  bool data_socket) {
    if (h->n_line == h->cap_line) {
        size_t cap = h->cap_line ? 2 * h->cap_line : 256;
        fl_held *d = realloc(h->line, cap * sizeof *d);
        if (!d) {
            snprintf(h->error, sizeof h->error, "udp engine: out of memory");
            return;
        }
        h->line = d;
        h->cap_line = cap;
    }
    size_t i = h->n_line++;
    fl_held item = {due, h->line_seq++, *p, *from, data_socket};
    while (i && before(&item, &h->line[(i - 1) / 2])) {
        h->line[i] = h->line[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->line[i] = item;
}

bool fl_line_pop(fl_host *h, double now, fl_held *out) {
    if (!h->n_line || h->line[0].due > now)
        return false;
    *out = h->line[0];
    fl_held last = h->line[--h->n_line];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n_line)
            break;
        if (c + 1 < h->n_line && before(&h->line[c + 1], &h->line[c]))
            c++;
        if (!before(&h->line[c], &last))
            break;
        h->line[i] = h->line[c];
        i = c;
    }
    if (h->n_line)
        h->line[i] = last;
    return true;
}

/* ---- arrivals -------------------------------------------------------------------------- */
static void reply_all(fl_host *h, const fl_packet *out, int n, const struct sockaddr_in *to,
                      double now) {
    for (int i = 0; i < n; i++)
        fl_io_reply(h, &out[i], to, now);
}

void fl_deliver(fl_host *h, const fl_packet *p, const struct sockaddr_in *from,
                bool data_socket, double now) {
    fl_packet out[2];
    if (data_socket && p->kind == K_DATA) {
        fl_rx *r = fl_receiver(h, p->src, p->ch);
        if (!r)
            return; /* not a rank of the job's */
        r->reply_to = *from;
        r->has_reply = true;
        if (h->transport == T_ROCE) {
            reply_all(h, out, fl_roce_receiver_on_packet(&r->r.roce, p, now, out), from, now);
        } else {
            int64_t before_bytes = r->r.uet.received_bytes;
            int n = fl_uet_receiver_on_packet(&r->r.uet, p, now, out);
            if (n < 0) {
                snprintf(h->error, sizeof h->error, "udp engine: out of memory");
                return;
            }
            reply_all(h, out, n, from, now);
            if (h->has_credit)
                fl_credit_on_data(&h->credit, p->src, p->ch,
                                  r->r.uet.received_bytes - before_bytes);
        }
        fl_refresh_rx(h, r);
    } else if (data_socket && p->kind == K_PING) {
        fl_packet_init(&out[0], K_PONG, p->src, p->ch);
        out[0].sent_ns = p->sent_ns;
        fl_io_reply(h, &out[0], from, now);
    } else if (data_socket && p->kind == K_PONG) {
        int peer = fl_peer_of(h, from);
        double rtt = now - (double)p->sent_ns / 1e9;
        double delay = h->delays_s && peer >= 0 ? h->delays_s[peer] : 0.0;
        double excess = fl_max(0.0, rtt - 2 * delay);
        h->probe_min_s = h->has_probe ? fl_min(h->probe_min_s, excess) : excess;
        h->probe_max_s = h->has_probe ? fl_max(h->probe_max_s, excess) : excess;
        h->has_probe = true;
        h->pongs++;
    } else if (data_socket && p->kind == K_REQ && h->has_credit) {
        fl_rx *r = fl_receiver(h, p->src, p->ch);
        if (r) {
            r->reply_to = *from;
            r->has_reply = true;
        }
        fl_credit_on_request(&h->credit, p->src, p->ch, (int64_t)p->sack);
        int64_t total;
        if (fl_credit_granted(&h->credit, p->src, p->ch, &total)) {
            fl_packet_init(&out[0], K_GRANT, p->src, p->ch);
            out[0].sack = (uint64_t)total;
            fl_io_reply(h, &out[0], from, now);
        }
    } else if (!data_socket && p->kind != K_DATA) {
        int peer = fl_peer_of(h, from);
        fl_tx *t = fl_find_tx(h, peer, p->ch);
        if (p->kind == K_ACK && p->sent_ns && !(p->flags & F_RETX)) {
            double rtt = now - (double)p->sent_ns / 1e9;
            if (rtt > 0) {
                if (!h->has_rtt_min || rtt < h->rtt_min_s)
                    h->rtt_min_s = rtt;
                h->has_rtt_min = true;
                double unloaded = h->rtts_s && peer >= 0 ? h->rtts_s[peer] : 0.0;
                if (unloaded > 0 && (!h->has_rtt_ratio || rtt / unloaded < h->rtt_min_ratio)) {
                    h->rtt_min_ratio = rtt / unloaded;
                    h->has_rtt_ratio = true;
                }
            }
        }
        if (t) {
            if (h->transport == T_ROCE)
                fl_roce_sender_on_packet(&t->s.roce, p, now);
            else
                fl_uet_sender_on_packet(&t->s.uet, p, now);
            fl_touched_tx(h, t, now);
        }
    }
}

void fl_io_read(fl_host *h, int fd, bool data_socket, double now) {
    uint8_t (*bufs)[FL_DATAGRAM_MAX] = (uint8_t (*)[FL_DATAGRAM_MAX])h->rbuf;
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    struct sockaddr_in from[BATCH];
    char control[BATCH][CMSG_SPACE(sizeof(int))];
    for (int done = 0; done < READS_PER_WAKE;) {
        for (int i = 0; i < BATCH; i++) {
            iov[i] = (struct iovec){bufs[i], sizeof bufs[i]};
            msgs[i].msg_hdr = (struct msghdr){.msg_name = &from[i], .msg_namelen = sizeof from[i],
                                              .msg_iov = &iov[i], .msg_iovlen = 1,
                                              .msg_control = data_socket ? control[i] : NULL,
                                              .msg_controllen = data_socket ? sizeof control[i] : 0};
        }
        int n = recvmmsg(fd, msgs, BATCH, MSG_DONTWAIT, NULL);
        if (n <= 0)
            return;
        for (int i = 0; i < n; i++) {
            fl_packet p;
            const char *why;
            if (fl_decode(bufs[i], msgs[i].msg_len, &p, &why))
                continue; /* not ours */
            if (data_socket && p.kind == K_DATA)
                for (struct cmsghdr *c = CMSG_FIRSTHDR(&msgs[i].msg_hdr); c;
                     c = CMSG_NXTHDR(&msgs[i].msg_hdr, c))
                    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS &&
                        c->cmsg_len >= CMSG_LEN(1) && (CMSG_DATA(c)[0] & CE) == CE)
                        p.flags |= F_CE;
            int peer = h->delays_s ? fl_peer_of(h, &from[i]) : -1;
            double delay = peer >= 0 ? h->delays_s[peer] : 0.0;
            if (delay > 0)
                fl_line_hold(h, now + delay, &p, &from[i], data_socket);
            else
                fl_deliver(h, &p, &from[i], data_socket, now);
        }
        done += n;
        fl_io_flush(h); /* this batch's acknowledgements leave together */
        if (n < BATCH)
            return;
    }
}
