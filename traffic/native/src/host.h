/* One agent's queue pairs over real sockets, in a thread of their own without the GIL:
 * traffic/agents/engine.py's UdpEngine, its loop, pacing, timers, delay line and credit
 * grants, with the transports' state machines compiled (roce.c, uet.c) and datagrams read in
 * batches (recvmmsg). */
#ifndef FL_HOST_H
#define FL_HOST_H

#include <netinet/in.h>
#include <pthread.h>

#include "credit.h"
#include "roce.h"
#include "uet.h"

#define FL_LATE_BUCKETS 12 /* testbed/plan/delayline.py's EDGES_US and the overflow */
extern const double fl_late_edges_us[FL_LATE_BUCKETS - 1];
#define FL_BACKOFF_S 0.001
#define FL_IDLE_WAKE_S 0.05
#define BATCH 64 /* datagrams per recvmmsg */
#define FL_DATAGRAM_MAX 65536

enum fl_transport { T_ROCE = 0, T_UET };

typedef struct {
    int64_t *data; /* pairs (threshold, token) */
    size_t len, head, cap;
} fl_waits;

typedef struct {
    int peer, ch;
    struct sockaddr_in addr;
    union {
        fl_roce_sender roce;
        fl_uet_sender uet;
    } s;
    fl_waits waits;
    bool has_send_at, has_timer, has_progress;
    double send_at, timer_at, ready_at, progress_since;
    int64_t progress_una;
} fl_tx;

typedef struct {
    int src, ch;
    union {
        fl_roce_receiver roce;
        fl_uet_receiver uet;
    } r;
    fl_waits waits;
    int64_t expected_total;
    struct sockaddr_in reply_to;
    bool has_reply, has_timer;
    double timer_at;
} fl_rx;

typedef struct {
    double due;
    uint64_t seq;
    fl_packet pkt;
    struct sockaddr_in from;
    bool data_socket;
} fl_held;

typedef struct {
    int kind; /* CMD_* */
    int peer, ch;
    int64_t nbytes, token;
    struct sockaddr_in addr;
} fl_cmd;

enum { CMD_SEND = 1, CMD_EXPECT, CMD_PING };

typedef struct {
    int transport, rank, n_ranks;
    fl_roce_cfg roce;
    fl_uet_cfg uet;
    uint16_t port;
    int listen_fd, epoll_fd, wake_fd, done_fd;
    int *pool;
    int n_pool;
    int cnp_tos;
    uint32_t *ip_of;  /* network order, parallel to rank_of */
    int *rank_of;
    int n_ips;
    fl_tx **tx;
    int n_tx, cap_tx;
    fl_rx **rx;
    int n_rx, cap_rx;
    /* the NIC */
    double nic_rate_bps, nic_slack_s, nic_free_at, backoff_until, unheld_at;
    bool has_held;
    fl_packet held;
    int held_fd;
    struct sockaddr_in held_addr;
    int turn;
    int64_t local_drops;
    double stall_check_at, stall_limit_s;
    /* receiver credits (uet with rccc) */
    bool has_credit;
    fl_credit_rx credit;
    /* the delay line and timing (traffic/transports/delayline.py) */
    double *delays_s, *rtts_s;
    fl_held *line;
    size_t n_line, cap_line;
    uint64_t line_seq;
    int64_t late_tx[FL_LATE_BUCKETS], late_rx[FL_LATE_BUCKETS];
    bool has_rtt_min, has_rtt_ratio, has_probe;
    double rtt_min_s, rtt_min_ratio, probe_min_s, probe_max_s;
    int64_t pongs;
    /* the thread, its commands and completions */
    pthread_t thread;
    bool started;
    volatile int stop;
    pthread_mutex_t lock; /* the state: the loop holds it but while it waits */
    fl_cmd *cmds;
    size_t n_cmds, cap_cmds;
    int64_t *done;
    size_t n_done, cap_done;
    uint8_t *rbuf; /* BATCH datagrams' room */
    /* replies (ACK, NAK, CNP, GRANT, PONG) waiting to leave together (sendmmsg) */
    int n_out;
    uint8_t out_buf[BATCH][FL_HEADER_SIZE + FL_INT_SIZE];
    struct sockaddr_in out_to[BATCH];
    size_t out_len[BATCH];
    bool out_cnp[BATCH];
    char error[512];
} fl_host;

int fl_host_init(fl_host *h);  /* after the fields above are set by the caller */
void fl_host_free(fl_host *h); /* after fl_host_stop */
int fl_host_start(fl_host *h);
void fl_host_stop(fl_host *h);
/* from any thread */
int fl_host_command(fl_host *h, const fl_cmd *cmd);
/* the tokens finished since the last call into out (malloc'ed; *n of them) */
int fl_host_take_done(fl_host *h, int64_t **out, size_t *n);

/* queue pairs (host.c) */
fl_tx *fl_find_tx(fl_host *h, int peer, int ch);
fl_rx *fl_find_rx(fl_host *h, int src, int ch);
fl_rx *fl_receiver(fl_host *h, int src, int ch); /* made on first use; NULL: not a rank's */
void fl_refresh_rx(fl_host *h, fl_rx *r);
void fl_touched_tx(fl_host *h, fl_tx *t, double now);

/* host.c's loop calls these (host_io.c) */
void fl_io_read(fl_host *h, int fd, bool data_socket, double now);
bool fl_io_send_data(fl_host *h, int fd, const fl_packet *p, const struct sockaddr_in *to,
                     double now);
void fl_io_reply(fl_host *h, const fl_packet *p, const struct sockaddr_in *to, double now);
void fl_io_nic_sent(fl_host *h, double now, int64_t payload);
void fl_io_flush(fl_host *h); /* the replies queued, sent */
void fl_deliver(fl_host *h, const fl_packet *p, const struct sockaddr_in *from,
                bool data_socket, double now);
int fl_peer_of(const fl_host *h, const struct sockaddr_in *addr);
void fl_line_hold(fl_host *h, double due, const fl_packet *p, const struct sockaddr_in *from,
                  bool data_socket);
bool fl_line_pop(fl_host *h, double now, fl_held *out);
void fl_late(int64_t *hist, double late_s);
double fl_now(void);
void fl_done(fl_host *h, int64_t token);

#endif
