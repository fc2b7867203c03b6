// SPDX-License-Identifier: GPL-2.0
/* fabriclab ECN marker: one job, at a switch port's egress (clsact, before the qdisc).
 *
 * The port's real queue (HTB rate -> bfifo) cannot be read from here: clsact egress runs
 * before the qdisc enqueues. So the program keeps a virtual queue per port that mirrors it:
 * the same bytes (the skb's wire length, as HTB counts GSO super-packets), drained at the same
 * rate between packets, with HTB's burst as credit (an idle port sends up to burst bytes at
 * once, so the level may go that far below zero and the backlog is its positive part), and
 * dropped when the bfifo would drop. A packet of an ECN-capable transport
 * (ECT) is marked CE when the virtual backlog it joins is above its priority's threshold: a
 * step at K (DCTCP) or RED-like between kmin and kmax with probability up to pmax (DCQCN).
 * Priorities come from DSCP through the port's table, and the program steers each IP packet
 * into its priority's HTB class (skb->priority = 1:(0x10 + priority)) when the port has one
 * class per priority; packets that are not IP keep theirs (HTB's default class, or its direct
 * queue for the PFC agent's kick frames). A host NIC's entry only classifies (PORT_CLASSIFY):
 * hosts live in their own namespaces, where interface indexes repeat, so nothing per port is
 * kept for them. The loader writes each port's settings into fl_cfg; user space reads
 * fl_queue and fl_count, never a trace pipe.
 *
 * A link with random loss drops here too (drop_ppm, at every end of it: each direction meets it
 * once), so loss needs no netem. It drops IPv4 packets (the workload's) only: the emulator's
 * own frames (the controller's LLDP probes, the PFC agent's kicks) are not the link's traffic.
 *
 * rx_count runs at a switch port's ingress and counts packets per priority (fl_rx): the PFC
 * agent pauses the upstream ends whose packets of a lossless priority still arrive.
 *
 * An impaired link (ber_fe) corrupts frames at its bit-error rate, at every end of it: a
 * frame of L bytes is hit with probability BER x 8L. A corrupted frame still takes the link's
 * time; it carries the IPv4 header's reserved flag (with a valid checksum) and rx_count at the
 * other end drops it, as a receiver drops a frame whose FCS is bad (counted in bad_fcs). With
 * link-level retry (llr) the port replays it: the corrupted copy leaves first, the frame
 * itself right behind it (one more frame time on the link, nothing lost end to end).
 * testbed/model/spec.py (ImpairSpec.outcome) is the decision's reference.
 */
#include <stddef.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define MAX_PRIO 8
#define NS_PER_S 1000000000ULL
#define DRAIN_ALL_S 3600ULL
#define MODE_OFF 0
#define MODE_STEP 1
#define MODE_RED 2
#define PROB_SCALE 1000000U
#define PORT_CLASSIFY 1		/* flags: classify only (a host NIC) */
#define PORT_CLASSES 2		/* flags: one HTB class per priority, 1:(0x10 + priority) */
#define HTB_MAJOR 0x10000U
#define CLASS_BASE 0x10U

struct ecn_cfg {
	__u32 mode;
	__u32 k_bytes;		/* step */
	__u32 kmin_bytes;	/* red */
	__u32 kmax_bytes;
	__u32 pmax;		/* red: marking probability at kmax, x PROB_SCALE */
};

struct port_cfg {
	__u64 rate_bytes_s;	/* the HTB rate of the port */
	__u64 burst_bytes;	/* the HTB burst: credit an idle port builds up */
	__u64 limit_bytes;	/* the bfifo limit behind it (0: none mirrored) */
	__u32 flags;		/* PORT_CLASSIFY, PORT_CLASSES */
	__u32 drop_ppm;		/* random loss of the link, parts per million */
	__u8 dscp_prio[64];
	struct ecn_cfg ecn[MAX_PRIO];
	__u32 trim_threshold;	/* trim above this backlog, bytes (0: the port does not trim) */
	__u16 trim_size;	/* a trimmed frame's length, Ethernet header included */
	__u8 trim_dscp;		/* the DSCP a trimmed packet carries */
	__u8 trim_prios;	/* bit p: priority p is trimmable */
	__u64 ber_fe;		/* the link's bit-error rate, x 1e15 (0: a clean link) */
	__u32 llr;		/* link-level retry: a corrupted frame is replayed here */
	__u32 cbfc_prios;	/* bit p: count priority p's bytes by ingress (credit-based flow control) */
};

struct vqueue {
	struct bpf_spin_lock lock;
	__s64 level_bytes;	/* backlog when > 0, unused burst credit when < 0 */
	__u64 last_ns;
	__u64 max_bytes;
	__u64 tx_bytes;		/* bytes that joined the queue (sent, or being sent) */
};

/* In-band network telemetry (HPCC's INT; traffic/transports/packet.py is the reference): a
 * fabriclab transport DATA packet flagged INT begins its payload with a hop count and room for
 * INT_HOPS records; each switch port it leaves appends its own: the time, its bytes sent so
 * far, the backlog the packet waits behind and its rate. */
#define INT_HOPS 5
#define TP_HEADER 45		/* the transport's header (packet.py HEADER) */
#define TP_VERSION 4
#define TP_DATA 1
#define TP_FLAG_INT 64
#define UDP_PAYLOAD (sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct udphdr))
#define INT_OFF (UDP_PAYLOAD + TP_HEADER)
#define INT_HOP_OFF (INT_OFF + 4)
#define INT_HOP_SIZE 20
#define INT_SIZE (4 + INT_HOPS * INT_HOP_SIZE)

struct int_hop {
	__be64 ts_ns;
	__be32 tx_bytes;
	__be32 qlen_bytes;
	__be32 rate_kbps;
} __attribute__((packed));

struct count_key {
	__u32 ifindex;
	__u32 prio;
};

struct counters {
	__u64 packets;
	__u64 bytes;
	__u64 ect;		/* ECN-capable packets seen */
	__u64 marked;		/* set to CE here */
	__u64 ce_seen;		/* already CE when they arrived */
	__u64 vq_drops;		/* the mirrored bfifo would have dropped them */
	__u64 loss_drops;	/* dropped here: the link's random loss */
	__u64 trimmed;		/* forwarded as their first trim_size bytes instead of dropped */
	__u64 corrupted;	/* sent corrupted (bit errors): the other end drops them */
	__u64 llr_replays;	/* corrupted, and replayed by link-level retry */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct port_cfg);
} fl_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct vqueue);
} fl_queue SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096 * MAX_PRIO);
	__type(key, struct count_key);
	__type(value, struct counters);
} fl_count SEC(".maps");

/* Bytes a switch port enqueued from each ingress port of its switch, per priority (the CBFC
 * agent's credit accounting: testbed/plan/credits.py). */
struct enq_key {
	__u32 ifindex;
	__u32 ingress;
	__u32 prio;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct enq_key);
	__type(value, __u64);
} fl_enq SEC(".maps");

struct rx_counters {
	__u64 packets;
	__u64 bytes;
	__u64 bad_fcs;		/* corrupted frames dropped on arrival, as a bad FCS is */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096 * MAX_PRIO);
	__type(key, struct count_key);
	__type(value, struct rx_counters);
} fl_rx SEC(".maps");

/* The entry of a (port, priority) key in a counter map, created zeroed on first use. */
static __always_inline void *counter(void *map, struct count_key *key, void *zero)
{
	void *c = bpf_map_lookup_elem(map, key);

	if (c)
		return c;
	bpf_map_update_elem(map, key, zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, key);
}

/* The priority of an IPv4 packet through the port's DSCP table (-1: not IPv4). */
static __always_inline int ip_priority(struct __sk_buff *skb, const struct port_cfg *cfg,
				       __u8 *ecn)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);

	if ((void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return -1;
	*ecn = ip->tos & 0x3;
	return cfg->dscp_prio[(ip->tos >> 2) & 63] & (MAX_PRIO - 1);
}

/* Packet trimming (testbed/plan/trim.py is the reference): a UDP packet of a trimmable
 * priority longer than trim_size, joining a backlog above the threshold (or a full queue),
 * is cut to its first trim_size bytes, its IP and UDP lengths, DSCP and IP checksum rewritten
 * (the UDP checksum cleared: IPv4 allows none), and steered into the trim DSCP's class. */
static __always_inline int trimmable(struct __sk_buff *skb, const struct port_cfg *cfg,
				     int ip_prio, __u64 len)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + sizeof(struct ethhdr);

	if (!cfg->trim_threshold || ip_prio < 0 || !((cfg->trim_prios >> ip_prio) & 1) ||
	    len <= cfg->trim_size || skb->gso_segs > 1)
		return 0;
	if ((void *)(ip + 1) > data_end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
		return 0;
	return 1;
}

static __always_inline int trim(struct __sk_buff *skb, const struct port_cfg *cfg)
{
	__u32 size = cfg->trim_size;
	__u32 ip_off = sizeof(struct ethhdr);
	__u32 udp_off = ip_off + sizeof(struct iphdr);
	__be16 old_len, new_len, old_word, new_word, udp_len, zero = 0;
	__u8 tos;

	if (size < udp_off + sizeof(struct udphdr) || bpf_skb_change_tail(skb, size, 0))
		return 0;
	if (bpf_skb_load_bytes(skb, ip_off + offsetof(struct iphdr, tot_len), &old_len, 2) ||
	    bpf_skb_load_bytes(skb, ip_off, &old_word, 2))
		return 0;
	new_len = bpf_htons(size - ip_off);
	tos = ((__u8 *)&old_word)[1];
	new_word = old_word;
	((__u8 *)&new_word)[1] = (cfg->trim_dscp << 2) | (tos & 0x3);
	udp_len = bpf_htons(size - udp_off);
	if (bpf_l3_csum_replace(skb, ip_off + offsetof(struct iphdr, check), old_len, new_len, 2) ||
	    bpf_l3_csum_replace(skb, ip_off + offsetof(struct iphdr, check), old_word, new_word, 2) ||
	    bpf_skb_store_bytes(skb, ip_off + offsetof(struct iphdr, tot_len), &new_len, 2, 0) ||
	    bpf_skb_store_bytes(skb, ip_off, &new_word, 2, 0) ||
	    bpf_skb_store_bytes(skb, udp_off + offsetof(struct udphdr, len), &udp_len, 2, 0) ||
	    bpf_skb_store_bytes(skb, udp_off + offsetof(struct udphdr, check), &zero, 2, 0))
		return 0;
	return 1;
}

/* The packet's INT hop count, if it is a transport DATA packet asking for INT with room left
 * (-1: not one). */
static __always_inline int int_hops(struct __sk_buff *skb, __u64 len)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + sizeof(struct ethhdr);
	__u8 head[4], hops;

	if (len < INT_OFF + INT_SIZE || skb->gso_segs > 1)
		return -1;
	if ((void *)(ip + 1) > data_end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
		return -1;
	if (bpf_skb_load_bytes(skb, UDP_PAYLOAD, head, 4) ||
	    bpf_skb_load_bytes(skb, INT_OFF, &hops, 1))
		return -1;
	if (head[0] != TP_DATA || !(head[1] & TP_FLAG_INT) || head[2] != 0 ||
	    head[3] != TP_VERSION || hops >= INT_HOPS)
		return -1;
	return hops;
}

static __always_inline void int_stamp(struct __sk_buff *skb, __u8 hops, __u64 now,
				      __u64 tx_bytes, __u64 backlog, __u64 rate_bytes_s)
{
	struct int_hop hop = {
		.ts_ns = bpf_cpu_to_be64(now),
		.tx_bytes = bpf_htonl((__u32)tx_bytes),
		.qlen_bytes = bpf_htonl((__u32)backlog),
		.rate_kbps = bpf_htonl((__u32)(rate_bytes_s * 8 / 1000)),
	};
	__u8 next = hops + 1;
	__be16 zero = 0;

	if (hops >= INT_HOPS)
		return;
	if (bpf_skb_store_bytes(skb, INT_HOP_OFF + hops * INT_HOP_SIZE, &hop, sizeof(hop), 0) ||
	    bpf_skb_store_bytes(skb, INT_OFF, &next, 1, 0))
		return;
	/* the payload changed: the UDP checksum is cleared (IPv4 allows none), as trimming does */
	bpf_skb_store_bytes(skb, sizeof(struct ethhdr) + sizeof(struct iphdr) +
			    offsetof(struct udphdr, check), &zero, 2, 0);
}

#define IP_RESERVED_FLAG 0x8000	/* frag_off's reserved bit: "this frame is corrupted" */

static __always_inline int corrupted(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);

	if ((void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return 0;
	return (ip->frag_off & bpf_htons(IP_RESERVED_FLAG)) != 0;
}

/* Set or clear the corrupted mark, the IP checksum kept valid. */
static __always_inline int mark_corrupted(struct __sk_buff *skb, int on)
{
	__u32 off = sizeof(struct ethhdr) + offsetof(struct iphdr, frag_off);
	__be16 old, new;

	if (bpf_skb_load_bytes(skb, off, &old, 2))
		return -1;
	new = on ? old | bpf_htons(IP_RESERVED_FLAG) : old & ~bpf_htons(IP_RESERVED_FLAG);
	if (bpf_l3_csum_replace(skb, sizeof(struct ethhdr) + offsetof(struct iphdr, check),
				old, new, 2) || bpf_skb_store_bytes(skb, off, &new, 2, 0))
		return -1;
	return 0;
}

/* Bit errors on the way out: 1 when the frame goes out corrupted (no LLR), 0 otherwise (clean,
 * or replayed by LLR: its corrupted copy is already sent). */
static __always_inline int impair(struct __sk_buff *skb, const struct port_cfg *cfg, __u64 len,
				  struct count_key *key)
{
	struct counters *c, zero = {};
	__u64 ppm;

	if (!cfg->ber_fe || corrupted(skb))
		return 0;
	ppm = cfg->ber_fe * 8 * len / 1000000000ULL;
	if (ppm > PROB_SCALE)
		ppm = PROB_SCALE;
	if (bpf_get_prandom_u32() % PROB_SCALE >= ppm || mark_corrupted(skb, 1))
		return 0;
	c = counter(&fl_count, key, &zero);
	if (c)
		__sync_fetch_and_add(&c->corrupted, 1);
	if (!cfg->llr)
		return 1;
	/* the corrupted copy goes out first (it passes here again, marked: left alone) */
	bpf_clone_redirect(skb, skb->ifindex, 0);
	if (mark_corrupted(skb, 0))
		return 1;
	if (c)
		__sync_fetch_and_add(&c->llr_replays, 1);
	return 0;
}

static __always_inline int should_mark(const struct ecn_cfg *e, __u64 backlog)
{
	__u64 prob;

	if (e->mode == MODE_STEP)
		return backlog > e->k_bytes;
	if (e->mode != MODE_RED || backlog <= e->kmin_bytes)
		return 0;
	if (backlog >= e->kmax_bytes || e->kmax_bytes <= e->kmin_bytes)
		return 1;
	prob = (__u64)e->pmax * (backlog - e->kmin_bytes) / (e->kmax_bytes - e->kmin_bytes);
	return (bpf_get_prandom_u32() % PROB_SCALE) < prob;
}

/* The bytes a port of rate_bytes_s sends in elapsed ns, exactly however long (a time-scaled
 * fabric's queue can take seconds to drain, and a pause upstream can hold its arrivals off
 * for longer: capping the time at a second kept bytes the real queue had sent, and fed HPCC
 * a backlog that grew with the scale). Whole seconds and the rest apart, so that 64 bits
 * hold it at any rate below 18 GB/s; an hour drains any queue. */
static __always_inline __u64 drain(__u64 elapsed, __u64 rate_bytes_s)
{
	__u64 secs = elapsed / NS_PER_S;

	if (secs > DRAIN_ALL_S)
		secs = DRAIN_ALL_S;
	return secs * rate_bytes_s + elapsed % NS_PER_S * rate_bytes_s / NS_PER_S;
}

SEC("tc")
int ecn_marker(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	struct port_cfg *cfg = bpf_map_lookup_elem(&fl_cfg, &ifindex);
	struct count_key key = { .ifindex = ifindex, .prio = 0 };
	struct counters *c, zero = {};
	struct vqueue *q;
	__u64 len = skb->wire_len ? skb->wire_len : skb->len;
	__u64 now = bpf_ktime_get_ns(), elapsed, drained, backlog;
	__s64 level;
	__u8 ecn = 0;
	__u32 prio;
	int ip_prio, drop = 0, can_trim, cut = 0, hops;
	__u64 tx_bytes = 0, waits_behind;

	if (!cfg)
		return TC_ACT_OK;
	ip_prio = ip_priority(skb, cfg, &ecn);
	if (ip_prio >= 0) {
		key.prio = ip_prio;
		if (cfg->flags & PORT_CLASSES)
			skb->priority = HTB_MAJOR | (CLASS_BASE + key.prio);
	}
	if (ip_prio >= 0 && cfg->drop_ppm &&
	    bpf_get_prandom_u32() % PROB_SCALE < cfg->drop_ppm) {
		c = counter(&fl_count, &key, &zero);
		if (c)
			__sync_fetch_and_add(&c->loss_drops, 1);
		return TC_ACT_SHOT;
	}
	if (ip_prio >= 0)
		impair(skb, cfg, len, &key);
	if (cfg->flags & PORT_CLASSIFY)
		return TC_ACT_OK;
	can_trim = trimmable(skb, cfg, ip_prio, len);
	hops = ip_prio >= 0 ? int_hops(skb, len) : -1;
	q = bpf_map_lookup_elem(&fl_queue, &ifindex);
	if (!q)
		return TC_ACT_OK;

	bpf_spin_lock(&q->lock);
	elapsed = now > q->last_ns ? now - q->last_ns : 0;
	drained = drain(elapsed, cfg->rate_bytes_s);
	level = q->level_bytes - (__s64)drained;
	if (level < -(__s64)cfg->burst_bytes)
		level = -(__s64)cfg->burst_bytes;
	backlog = level > 0 ? level : 0;
	waits_behind = backlog;
	drop = cfg->limit_bytes && backlog + len > cfg->limit_bytes;
	if (can_trim && (drop || backlog > cfg->trim_threshold)) {
		/* trimmed instead, if even its header fits: the header joins the queue when it
		 * passes here again (below) */
		drop = cfg->limit_bytes && backlog + cfg->trim_size > cfg->limit_bytes;
		cut = !drop;
	} else if (!drop) {
		level += len;
		q->tx_bytes += len;
	}
	tx_bytes = q->tx_bytes;
	q->level_bytes = level;
	q->last_ns = now;
	backlog = level > 0 ? level : 0;
	if (backlog > q->max_bytes)
		q->max_bytes = backlog;
	bpf_spin_unlock(&q->lock);

	if (cut && trim(skb, cfg)) {
		/* The qdisc took the packet's length before this hook ran (qdisc_pkt_len_init in
		 * __dev_queue_xmit): queued now, the header would cost the shaper a whole packet's
		 * time. Sent through the port again, it is measured at its new length, passes
		 * here as a short packet of the trim DSCP's priority (counted, queued, steered into
		 * its class) and is not trimmed again. */
		c = counter(&fl_count, &key, &zero);
		if (c)
			__sync_fetch_and_add(&c->trimmed, 1);
		return bpf_redirect(skb->ifindex, 0);
	}
	if (hops >= 0 && !drop)
		int_stamp(skb, hops, now, tx_bytes, waits_behind, cfg->rate_bytes_s);
	/* every byte the qdisc gets: a lossless leaf holds more than the mirrored queue, whose
	 * "drop" the real queue does not make */
	if (ip_prio >= 0 && ((cfg->cbfc_prios >> key.prio) & 1)) {
		struct enq_key ek = { .ifindex = ifindex, .ingress = skb->ingress_ifindex,
				      .prio = key.prio };
		__u64 *n = bpf_map_lookup_elem(&fl_enq, &ek), first = len;

		if (n)
			__sync_fetch_and_add(n, len);
		else
			bpf_map_update_elem(&fl_enq, &ek, &first, BPF_NOEXIST);
	}
	c = counter(&fl_count, &key, &zero);
	if (!c)
		return TC_ACT_OK;
	__sync_fetch_and_add(&c->packets, 1);
	__sync_fetch_and_add(&c->bytes, len);
	if (drop)
		__sync_fetch_and_add(&c->vq_drops, 1);
	if (ip_prio < 0 || ecn == 0)
		return TC_ACT_OK;
	if (ecn == 3) {
		__sync_fetch_and_add(&c->ce_seen, 1);
		return TC_ACT_OK;
	}
	__sync_fetch_and_add(&c->ect, 1);
	prio = key.prio;
	if (prio >= MAX_PRIO)	/* bounded again for the verifier: the key lives on the stack */
		return TC_ACT_OK;
	if (!drop && should_mark(&cfg->ecn[prio], backlog) && bpf_skb_ecn_set_ce(skb))
		__sync_fetch_and_add(&c->marked, 1);
	return TC_ACT_OK;
}

SEC("tc")
int rx_count(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	struct port_cfg *cfg = bpf_map_lookup_elem(&fl_cfg, &ifindex);
	struct count_key key = { .ifindex = ifindex, .prio = 0 };
	struct rx_counters *c, zero = {};
	__u8 ecn = 0;
	int ip_prio;

	if (!cfg)
		return TC_ACT_UNSPEC;
	ip_prio = ip_priority(skb, cfg, &ecn);
	if (ip_prio > 0)
		key.prio = ip_prio;
	if (ip_prio >= 0 && corrupted(skb)) {	/* a bad FCS: dropped on arrival */
		c = counter(&fl_rx, &key, &zero);
		if (c)
			__sync_fetch_and_add(&c->bad_fcs, 1);
		return TC_ACT_SHOT;
	}
	if (cfg->flags & PORT_CLASSIFY)
		return TC_ACT_UNSPEC;
	c = counter(&fl_rx, &key, &zero);
	if (!c)
		return TC_ACT_UNSPEC;
	__sync_fetch_and_add(&c->packets, 1);
	__sync_fetch_and_add(&c->bytes, skb->len);
	return TC_ACT_UNSPEC;	/* on to the next filter: an eBPF switch's, where there is one */
}

char LICENSE[] SEC("license") = "GPL";
