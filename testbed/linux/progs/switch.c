// SPDX-License-Identifier: GPL-2.0
/* fabriclab eBPF switch: a switch is this program at the clsact ingress of each of its ports
 * plus its entries in the maps below; no process forwards. A packet's headers are looked up in
 * the switch's flow table compiled as tuple-space subtables (testbed/plan/tss.py: one exact-match
 * table per mask, tried in order of their highest priority, stopping as soon as the best match
 * outranks every table left); the action outputs to a port (bpf_redirect to its veth end, whose
 * egress qdiscs -- shaping, the ECN marker -- apply as on any port), through a group (a SELECT
 * group's weighted buckets by testbed/plan/groups.py's flow hash, skipping dead ports; fast
 * failover: the first live port; switch-local adaptive: the least-loaded live port for each
 * flowlet or each packet, testbed/plan/localroute.py; weighing the next switch, each port by
 * the longest of its queue, the path quality the next switch's group published (sw_quality)
 * and the queue of the link every way on takes, testbed/plan/lookahead.py), or drops. Every
 * port's load is a virtual queue of the bytes sent out of it, drained at its rate (sw_load).
 * It also keeps a rate estimate (the bytes sent to the port lately, fading as its line time
 * passes): reactive rebalancing moves a flowlet before its gap to a path that, carrying it,
 * would be lighter by a quality delta (Juniper's reactive path rebalancing of DLB flowlets),
 * and walks the collisions no such move mends along their chains of flows (rebalanced()).
 * A TCP acknowledgement echoing congestion (ECE) marks its flow as congested at every switch
 * it passes (sw_echoes): that flow's next flowlet avoids the port it took. Each entry counts
 * its packets and bytes. A packet for the controller (an output to it, or an entry's copy of
 * its first bytes: a punt) goes into the ring buffer sw_punts with its switch, port and
 * length, where the switch's agent reads it and sends it on as a packet-in.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define MAX_SUBTABLES 16
#define MAX_BUCKETS 16

#define F_IN_PORT 1
#define F_ETH_TYPE 2
#define F_ETH_DST 4
#define F_DSCP 8
#define F_PROTO 16
#define F_SPORT 32
#define F_DPORT 64
#define F_ETH_SRC 128

#define A_OUTPUT 1
#define A_GROUP 2
#define A_DROP 3
#define A_CONTROLLER 4

#define G_SELECT 1
#define G_FF 2

/* a SELECT group's selection (testbed/plan/localroute.py is the reference) */
#define TH_SYN 0x02
#define TH_ACK 0x10
#define TH_ECE 0x40

#define SEL_HASH 0
#define SEL_FLOWLET 1
#define SEL_PACKET 2
#define SEL_KIND 3
#define SEL_NEXT 4	/* flag: weighs each bucket's next switch's path quality, publishes its own */
#define NS_PER_US 1000ULL
#define US_PER_S 1000000ULL
#define DRAIN_ALL_S 3600ULL	/* a port idle this long has drained, whatever it held */
#define NS_PER_S 1000000000ULL

#define PUNT_MAX 16384		/* bytes of a packet the controller gets at most */
#define PUNT_RING (1 << 22)	/* testbed/linux/ebpfswitch.py PUNT_RING_BYTES */
#define PUNT_ALL 0xffff		/* OFPCML_NO_BUFFER: the whole packet */

struct port_id { __u32 sw; __u32 port; };
struct port_out { __u32 ifindex; __u32 live; };
struct table_id { __u32 sw; __u32 table; };
struct mask { __u32 fields; __s32 max_priority; __u8 src_len; __u8 dst_len; __u8 valid; __u8 pad; };
struct flow_key {
	__u32 sw, table, in_port, src, dst;
	__u16 eth_type, sport, dport;
	__u8 proto, dscp;
	__u8 eth_dst[6], eth_src[6];
};
struct action {
	__s32 priority; __u32 kind; __u32 arg;
	__u32 punt;		/* bytes copied to the controller as well (0: none) */
	__u64 packets, bytes;	/* counted here, read by the agent (flow statistics) */
};
struct punt_head { __u32 sw, port, total_len, reason; };
struct punt { struct punt_head head; __u8 data[PUNT_MAX]; };
struct group_id { __u32 sw; __u32 group; };
/* beyond a bucket's port: the next switch's group towards the same destinations, whose path
 * quality it weighs (group 0: none), and the first link every way on takes, whose queue it
 * reads (port 0: none) */
struct beyond { __u32 sw, group, link_sw, link_port; };
struct group {
	__u32 kind, basis, n, selection;
	__u64 gap_ns;		/* flowlet: the idle gap after which a flow may move */
	__u32 ports[MAX_BUCKETS];
	__u32 weights[MAX_BUCKETS];
	/* switch-local, weighing the next switch: per bucket, what it weighs beyond its port */
	struct beyond next[MAX_BUCKETS];
	/* flowlet, reactive rebalancing: the quality delta (percent of RECENT_BYTES's time)
	 * and the chance per packet (of 2^32; 0: never) */
	__u32 rb_delta_pct, rb_chance;
};
/* a group's path quality (SEL_NEXT): the least delay its choice found, and when */
struct quality { __u64 delay_ns, at_ns; };
/* a port's load: the bytes sent out of it, drained at its rate since last_ns */
struct port_load {
	struct bpf_spin_lock lock;
	__u32 pad;
	__u64 level;
	__u64 last_ns;
	__u64 rate_bytes_s;
	__u64 sent_bytes;	/* every byte the switch sent to the port (its offered load) */
	__u64 largest;		/* its largest packet (a host's segmentation-offload unit) */
	__u64 recent;		/* the bytes sent to it lately (a rate estimate: RECENT_BYTES) */
	__u64 pushed_ns;	/* when a flow last moved onto it beside another (rebalancing) */
};
struct flowlet_key { __u32 sw, group, hash; };
/* data: it has carried a packet of more than headers (a handshake's carry none) */
struct flowlet { __u32 port, data, moves, pad; __u64 last_ns, decided_ns, recent, walked_ns; };
struct echo_key { __u32 sw, hash; };

struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 65536);
	 __type(key, __u32); __type(value, struct port_id); } sw_ports SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 65536);
	 __type(key, struct port_id); __type(value, struct port_out); } sw_out SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 65536);
	 __type(key, struct table_id); __type(value, struct mask); } sw_masks SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 1048576);
	 __type(key, struct flow_key); __type(value, struct action); } sw_flows SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 65536);
	 __type(key, struct group_id); __type(value, struct group); } sw_groups SEC(".maps");

struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 65536);
	 __type(key, struct port_id); __type(value, struct port_load); } sw_load SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 65536);
	 __type(key, struct group_id); __type(value, struct quality); } sw_quality SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_LRU_HASH); __uint(max_entries, 262144);
	 __type(key, struct flowlet_key); __type(value, struct flowlet); } sw_flowlets SEC(".maps");
/* Packets sent to a port that is not live (its link failed; a group with no live bucket
 * counts them at its first): what the fabric still sends into a failed link */
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 65536);
	 __type(key, struct port_id); __type(value, __u64); } sw_dead SEC(".maps");
/* (switch, the forward flow's hash of basis 0) -> when an acknowledgement of it last passed
 * with ECE set */
struct { __uint(type, BPF_MAP_TYPE_LRU_HASH); __uint(max_entries, 65536);
	 __type(key, struct echo_key); __type(value, __u64); } sw_echoes SEC(".maps");

struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, PUNT_RING); } sw_punts SEC(".maps");
struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __uint(max_entries, 1);
	 __type(key, __u32); __type(value, struct punt); } sw_punt_scratch SEC(".maps");
/* punts the ring had no room for, per CPU */
struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __uint(max_entries, 1);
	 __type(key, __u32); __type(value, __u64); } sw_punt_lost SEC(".maps");

/* the first ``want`` bytes of the packet to the switch's agent (PUNT_ALL: all of it) */
static __always_inline void punt(struct __sk_buff *skb, __u32 sw, __u32 port, __u32 want,
				 __u32 reason)
{
	__u32 zero = 0, len = skb->len;
	struct punt *p = bpf_map_lookup_elem(&sw_punt_scratch, &zero);
	__u64 *lost;

	if (!p)
		return;
	if (want != PUNT_ALL && want < len)
		len = want;
	if (len > PUNT_MAX)
		len = PUNT_MAX;
	if (len == 0)
		return;
	/* the same length, in bounds the verifier can follow: [1, 16384] */
	len -= 1;
	asm volatile("%0 &= 0x3fff" : "+r"(len));
	len += 1;
	p->head.sw = sw;
	p->head.port = port;
	p->head.total_len = skb->len;
	p->head.reason = reason;
	if (bpf_skb_load_bytes(skb, 0, p->data, len) < 0)
		return;
	if (bpf_ringbuf_output(&sw_punts, p, sizeof(p->head) + len, 0) < 0) {
		lost = bpf_map_lookup_elem(&sw_punt_lost, &zero);
		if (lost)
			*lost += 1;
	}
}

static __always_inline __u32 prefix_mask(__u8 len)
{
	return len ? (__u32)(0xffffffffULL << (32 - len)) : 0;
}

static __always_inline __u32 fnv_byte(__u32 h, __u8 b)
{
	return (h ^ b) * 16777619u;
}

/* testbed/plan/groups.py flow_hash: FNV-1a over basis, src, dst (big-endian), proto, ports
 * (big-endian), then MurmurHash3's finalizer */
static __always_inline __u32 flow_hash(__u32 basis, __u32 src, __u32 dst, __u8 proto,
				       __u16 sport, __u16 dport)
{
	__u32 h = 2166136261u;
	int i;

#pragma unroll
	for (i = 24; i >= 0; i -= 8) h = fnv_byte(h, basis >> i);
#pragma unroll
	for (i = 24; i >= 0; i -= 8) h = fnv_byte(h, src >> i);
#pragma unroll
	for (i = 24; i >= 0; i -= 8) h = fnv_byte(h, dst >> i);
	h = fnv_byte(h, proto);
	h = fnv_byte(h, sport >> 8);
	h = fnv_byte(h, sport);
	h = fnv_byte(h, dport >> 8);
	h = fnv_byte(h, dport);
	h ^= h >> 16;
	h *= 0x85ebca6bu;
	h ^= h >> 13;
	h *= 0xc2b2ae35u;
	return h ^ (h >> 16);
}

/* What a port's load has drained since last_ns: whole microseconds of it (the rest is kept
 * for the next time), exactly however long the port went without a packet (a time-scaled
 * fabric's queue can take seconds to drain: a second's cap would keep bytes long gone);
 * after an hour, everything. Whole seconds and the rest apart: 64 bits hold a second's
 * drain at any rate below 18 TB/s. */
static __always_inline __u64 drained(const struct port_load *l, __u64 now, __u64 *elapsed_ns)
{
	__u64 us = now > l->last_ns ? (now - l->last_ns) / NS_PER_US : 0;

	if (us >= DRAIN_ALL_S * US_PER_S) {
		*elapsed_ns = now - l->last_ns;
		return ~0ULL;
	}
	*elapsed_ns = us * NS_PER_US;
	return us / US_PER_S * l->rate_bytes_s + us % US_PER_S * l->rate_bytes_s / US_PER_S;
}

/* The bytes a port has queued now, as its load estimates them */
static __always_inline __u64 queued(const struct port_load *l, __u64 now)
{
	__u64 elapsed, gone = drained(l, now, &elapsed);

	return l->level > gone ? l->level - gone : 0;
}

/* A rate estimate: bytes sent lately, fading linearly as the port's line time passes, a
 * whole RECENT_BYTES of it taking all (at a steady share u of the line, it holds u times
 * RECENT_BYTES) */
#define RECENT_BYTES (256ULL * 1024)
static __always_inline __u64 faded(__u64 recent, __u64 gone)
{
	return gone >= RECENT_BYTES ? 0 : recent * (RECENT_BYTES - gone) / RECENT_BYTES;
}

/* A packet of len bytes joins the port's queue (a function of its own, as local_port) */
__noinline int account(__u32 sw, __u32 port, __u32 len)
{
	struct port_id id = { sw, port };
	struct port_load *l = bpf_map_lookup_elem(&sw_load, &id);
	__u64 now = bpf_ktime_get_ns(), elapsed, gone;

	if (!l)
		return 0;
	bpf_spin_lock(&l->lock);
	gone = drained(l, now, &elapsed);
	l->level = (l->level > gone ? l->level - gone : 0) + len;
	l->recent = faded(l->recent, gone) + len;
	l->last_ns += elapsed;
	l->sent_bytes += len;
	if (len > l->largest)
		l->largest = len;
	bpf_spin_unlock(&l->lock);
	return 1;
}

/* How long the port's line took, of late, to send what it was sent, ns (its share of the
 * line times RECENT_BYTES's time at its rate) */
static __always_inline __u64 busy_ns(__u32 sw, __u32 port, __u64 now)
{
	struct port_id id = { sw, port };
	struct port_load *l = bpf_map_lookup_elem(&sw_load, &id);
	__u64 elapsed;

	if (!l || !l->rate_bytes_s)
		return 0;
	return faded(l->recent, drained(l, now, &elapsed)) * NS_PER_S / l->rate_bytes_s;
}

/* How long a port's queue takes to drain, ns (its load: ports of unlike rates compare) */
static __always_inline __u64 delay_ns(__u32 sw, __u32 port, __u64 now)
{
	struct port_id id = { sw, port };
	struct port_load *l = bpf_map_lookup_elem(&sw_load, &id);

	if (!l || !l->rate_bytes_s)
		return 0;
	return queued(l, now) * NS_PER_S / l->rate_bytes_s;
}

/* Out of a port: to its veth end's egress, where its qdiscs (shaping, the ECN marker) apply.
 * A packet straight from a host's socket still belongs to that socket (the kernel keeps
 * skb->sk across veths and redirects, so a datagram queued deep in the fabric would still fill
 * its sender's send buffer, and TCP Small Queues would count it as its own): a clone, which
 * belongs to no socket, goes on instead, and the original is consumed here, as the wire
 * takes a frame off a real host's NIC. */
/* An acknowledgement of the forward flow of hash h0 echoed congestion through switch sw */
static __always_inline void echoed(__u32 sw, __u32 h0)
{
	struct echo_key key = { sw, h0 };
	__u64 now = bpf_ktime_get_ns();

	bpf_map_update_elem(&sw_echoes, &key, &now, BPF_ANY);
}

static __always_inline int dead_drop(__u32 sw, __u32 port)
{
	struct port_id id = { sw, port };
	__u64 *n = bpf_map_lookup_elem(&sw_dead, &id), one = 1;

	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(&sw_dead, &id, &one, BPF_NOEXIST);
	return TC_ACT_SHOT;
}

static __always_inline int output(struct __sk_buff *skb, __u32 sw, __u32 port)
{
	struct port_id id = { sw, port };
	struct port_out *out = bpf_map_lookup_elem(&sw_out, &id);

	if (!out)
		return TC_ACT_SHOT;
	if (!out->live)
		return dead_drop(sw, port);
	account(sw, port, skb->len);
	if (skb->sk) {
		if (bpf_clone_redirect(skb, out->ifindex, 0))
			return TC_ACT_SHOT;
		return TC_ACT_STOLEN;
	}
	return bpf_redirect(out->ifindex, 0);
}

static __always_inline int live(__u32 sw, __u32 port)
{
	struct port_id id = { sw, port };
	struct port_out *out = bpf_map_lookup_elem(&sw_out, &id);

	return out && out->live;
}

/* The least-loaded live port of a group (ties: the h-th of the least, modulo their number);
 * 0 when none is live. A bucket's load: its port's queue, or the path quality the next
 * switch's group published, or the queue of the link every way on takes (g->next), where
 * that is longer (the path's worse part); a group weighing the next switch publishes its
 * own least (SEL_NEXT). Two passes over the buckets by bpf_loop, each bucket's step
 * verified once (unrolled, the branches of sixteen buckets multiplied past the verifier's
 * limit); the second picks among the least the first found (read again, another CPU's
 * packet could leave no port at the least). */
struct least {
	struct group *g;
	__u64 now, best;
	__u32 sw, ties, pick, port, avoid, least;	/* least: a bit per bucket at the least */
};

/* What is left of a path quality published at at_ns: a queue drains at least as fast as
 * time passes while nothing joins it (none: 0) */
static __always_inline __u64 beyond_ns(struct beyond *next, __u64 now)
{
	struct group_id id = { next->sw, next->group };
	struct quality *q = bpf_map_lookup_elem(&sw_quality, &id);
	__u64 age;

	if (!q)
		return 0;
	age = now > q->at_ns ? now - q->at_ns : 0;
	return q->delay_ns > age ? q->delay_ns - age : 0;
}

/* Bucket i's load: the longest of its port's queue, what the next switch published and the
 * queue of the link every way on takes */
static __always_inline __u64 bucket_ns(struct group *g, __u32 sw, __u32 i, __u64 now)
{
	__u64 d, ahead;

	asm volatile("%0 &= 0xf" : "+r"(i));	/* MAX_BUCKETS - 1: a bound the verifier keeps */
	d = delay_ns(sw, g->ports[i], now);
	if (g->next[i].group) {
		ahead = beyond_ns(&g->next[i], now);
		if (ahead > d)
			d = ahead;
	}
	if (g->next[i].link_port) {
		ahead = delay_ns(g->next[i].link_sw, g->next[i].link_port, now);
		if (ahead > d)
			d = ahead;
	}
	return d;
}

/* A bucket's recent busy time: its port's, or the link's every way on takes, where longer */
static __always_inline __u64 bucket_busy(struct group *g, __u32 sw, __u32 i, __u64 now)
{
	__u64 d, ahead;

	asm volatile("%0 &= 0xf" : "+r"(i));
	d = busy_ns(sw, g->ports[i], now);
	if (g->next[i].link_port) {
		ahead = busy_ns(g->next[i].link_sw, g->next[i].link_port, now);
		if (ahead > d)
			d = ahead;
	}
	return d;
}

static long least_scan(__u32 i, void *arg)
{
	struct least *c = arg;
	__u64 d;

	if (i >= MAX_BUCKETS || i >= c->g->n)
		return 1;
	asm volatile("%0 &= 0xf" : "+r"(i));	/* MAX_BUCKETS - 1: a bound the verifier keeps */
	if (c->g->ports[i] == c->avoid || !live(c->sw, c->g->ports[i]))
		return 0;
	d = bucket_ns(c->g, c->sw, i, c->now);
	if (d < c->best) {
		c->best = d;
		c->ties = 1;
		c->least = 1U << i;
	} else if (d == c->best) {
		c->ties++;
		c->least |= 1U << i;
	}
	return 0;
}

static long least_pick(__u32 i, void *arg)
{
	struct least *c = arg;

	if (i >= MAX_BUCKETS || i >= c->g->n)
		return 1;
	asm volatile("%0 &= 0xf" : "+r"(i));
	if (!(c->least & (1U << i)))
		return 0;
	if (c->pick) {
		c->pick--;
		return 0;
	}
	c->port = c->g->ports[i];
	return 1;
}

/* ... but for port ``avoid`` where another is live; with ``publish``, the least found
 * becomes the group's path quality (what a switch sending it these destinations weighs) */
static __always_inline __u32 least_loaded(struct group *g, __u32 sw, __u32 gid, __u32 h,
					  __u64 now, __u32 avoid, int publish)
{
	struct least c = { .g = g, .now = now, .best = ~0ULL, .sw = sw, .avoid = avoid };
	struct group_id id = { sw, gid };
	struct quality q, *at;

	bpf_loop(MAX_BUCKETS, least_scan, &c, 0);
	if (!c.ties && avoid) {
		c.avoid = 0;
		bpf_loop(MAX_BUCKETS, least_scan, &c, 0);
	}
	if (!c.ties)
		return 0;
	if (publish) {
		/* in place where the group has published before: a hash map's update takes a
		 * new element at every packet; a reader may see one field new, the other not */
		at = bpf_map_lookup_elem(&sw_quality, &id);
		if (at) {
			at->delay_ns = c.best;
			at->at_ns = now;
		} else {
			q.delay_ns = c.best;
			q.at_ns = now;
			bpf_map_update_elem(&sw_quality, &id, &q, BPF_ANY);
		}
	}
	c.pick = h % c.ties;
	bpf_loop(MAX_BUCKETS, least_pick, &c, 0);
	return c.port;
}

/* A flowlet's port: the one its flow took, while its packets come closer than the group's
 * gap and the port is live and still the group's; else the least-loaded, remembered -- but
 * not the port it took if an acknowledgement echoed congestion on it (ECE) more than
 * ECHO_HOLD_GAPS gaps after that port was chosen (earlier echoes speak of the port before).
 * Weighing the next switch, every packet's least is worked out (and published) whatever
 * the flowlet does: the switches sending this one its destinations read it. A flow that has
 * sent headers alone (its handshake) is placed anew at each packet: its first data goes where
 * the load is when it does, not where it was at its SYN. Rebalancing (g->rb_chance), a
 * flowlet may move before its gap: rebalanced(). */
#define ECHO_HOLD_GAPS 4
#define HEADERS_ONLY 94	/* Ethernet, IPv4 and TCP with options: no more than headers */
struct lightest { struct group *g; __u64 now, best; __u32 sw, avoid, port, bucket; };

static long busy_scan(__u32 i, void *arg)
{
	struct lightest *c = arg;
	__u64 d;

	if (i >= MAX_BUCKETS || i >= c->g->n)
		return 1;
	asm volatile("%0 &= 0xf" : "+r"(i));
	if (c->g->ports[i] == c->avoid || !live(c->sw, c->g->ports[i]))
		return 0;
	d = bucket_busy(c->g, c->sw, i, c->now);
	if (d < c->best) {
		c->best = d;
		c->port = c->g->ports[i];
		c->bucket = i;
	}
	return 0;
}

/* A flowlet's recent bytes, and a packet of len more */
static __always_inline void flow_recent(struct flowlet *f, __u32 sw, __u64 now, __u32 len)
{
	struct port_id id = { sw, f->port };
	struct port_load *l = bpf_map_lookup_elem(&sw_load, &id);
	__u64 gone = 0;

	if (l && now > f->last_ns)
		gone = (now - f->last_ns) * l->rate_bytes_s / NS_PER_S;
	f->recent = faded(f->recent, gone) + len;
}

/* Takes a flow's recent bytes off a port's estimate (off), or adds them (on); unlocked, a
 * packet another CPU accounts at the same moment may be lost to the estimate (only that) */
static __always_inline void carry(__u32 sw, __u32 port, __u64 bytes, int on, __u64 push_ns)
{
	struct port_id id = { sw, port };
	struct port_load *l = bpf_map_lookup_elem(&sw_load, &id);

	if (!l)
		return;
	if (on) {
		__sync_fetch_and_add(&l->recent, bytes);
		if (push_ns)
			l->pushed_ns = push_ns;
	} else {
		l->recent = l->recent > bytes ? l->recent - bytes : 0;
	}
}

/* When a flow last moved onto bucket i's path beside another (its port or the link every way
 * on takes), 0: never */
static __always_inline __u64 pushed_at(struct group *g, __u32 sw, __u32 i)
{
	struct port_id id = { sw, 0 };
	struct port_load *l;
	__u64 at = 0;

	asm volatile("%0 &= 0xf" : "+r"(i));
	id.port = g->ports[i];
	l = bpf_map_lookup_elem(&sw_load, &id);
	if (l)
		at = l->pushed_ns;
	if (g->next[i].link_port) {
		id.sw = g->next[i].link_sw;
		id.port = g->next[i].link_port;
		l = bpf_map_lookup_elem(&sw_load, &id);
		if (l && l->pushed_ns > at)
			at = l->pushed_ns;
	}
	return at;
}

/* A flow moves from bucket i to bucket j: its recent bytes with it, on the ports and on the
 * links every way on takes (another switch weighing those reads them at once) */
static __always_inline void carry_flow(struct group *g, __u32 sw, __u32 i, __u32 j, __u64 bytes,
				       __u64 push_ns)
{
	asm volatile("%0 &= 0xf" : "+r"(i));
	asm volatile("%0 &= 0xf" : "+r"(j));
	carry(sw, g->ports[i], bytes, 0, 0);
	carry(sw, g->ports[j], bytes, 1, push_ns);
	if (g->next[i].link_port)
		carry(g->next[i].link_sw, g->next[i].link_port, bytes, 0, 0);
	if (g->next[j].link_port)
		carry(g->next[j].link_sw, g->next[j].link_port, bytes, 1, push_ns);
}

/* Reactive rebalancing: a flowlet held at least a gap since its port was chosen (twice that
 * after one move, up to 2^MOVES_BACKOFF gaps after more: flows that keep moving settle) moves,
 * now, at a chance per packet, to the port (path) busy least of late when, carrying it, that
 * one would be lighter than the flow's own by the quality delta -- or no heavier, while an
 * acknowledgement echoed congestion within the last gap. Its port, or 0: stay.
 *
 * Collisions that one such move cannot mend (in a fat tree: the flows' pairwise constraints,
 * at the edge switches they leave and reach, link them in chains, and a move only shifts a
 * collision along its chain) are walked: a flow held back on a full path (echoes, its own rate
 * under HELD_RATE_PCT of the line, its path over FULL_PCT busy) moves, at a quarter of the
 * chance, to a path no busier by the delta though another flow is on it; a move onto a path
 * carrying half a line or more marks it pushed (*push), and a flow whose path was pushed after
 * its own choice moves at once (no hold) to a path no busier. The collision goes along its
 * chain until it meets another, where a move is a plain one to a lighter path and marks
 * nothing. A flow walks at most once in WALK_HOLD_GAPS gaps: a collision no placement mends
 * (more flows than paths) is not walked round and round. */
#define HELD_RATE_PCT 60
#define FULL_PCT 80
#define WALK_HOLD_GAPS 8
#define MOVES_BACKOFF 3
static __always_inline __u32 rebalanced(struct group *g, __u32 sw, __u64 now,
					struct flowlet *f, __u32 i, struct echo_key *ek, __u32 *to,
					int *push)
{
	struct lightest c = { .g = g, .now = now, .best = ~0ULL, .sw = sw, .avoid = f->port };
	struct port_id id = { sw, f->port };
	struct port_load *l;
	__u64 cur, mine, delta, window, at, hold, *echo;
	int pushed, walk;

	if (i >= MAX_BUCKETS || !g->rb_chance || bpf_get_prandom_u32() >= g->rb_chance)
		return 0;
	at = pushed_at(g, sw, i);
	pushed = at > f->decided_ns && at + g->gap_ns > now;
	hold = g->gap_ns << (f->moves < MOVES_BACKOFF ? f->moves : MOVES_BACKOFF);
	if (now - f->decided_ns < hold && !pushed)
		return 0;
	l = bpf_map_lookup_elem(&sw_load, &id);
	if (!l || !l->rate_bytes_s)
		return 0;
	window = RECENT_BYTES * NS_PER_S / l->rate_bytes_s;
	mine = f->recent * NS_PER_S / l->rate_bytes_s;
	delta = window * g->rb_delta_pct / 100;
	cur = bucket_busy(g, sw, i, now);
	bpf_loop(MAX_BUCKETS, busy_scan, &c, 0);
	if (!c.port)
		return 0;
	*to = c.bucket;
	*push = c.best * 2 >= window;
	if (c.best + mine + delta <= cur)
		return c.port;
	walk = now - f->walked_ns >= WALK_HOLD_GAPS * g->gap_ns;
	if (pushed && walk && c.best <= cur + delta)
		goto walked;
	echo = bpf_map_lookup_elem(&sw_echoes, ek);
	if (!echo || *echo <= f->decided_ns + g->gap_ns || *echo + g->gap_ns <= now)
		return 0;
	if (c.best + mine <= cur + delta)
		return c.port;
	if (walk && mine * 100 <= window * HELD_RATE_PCT && cur * 100 >= window * FULL_PCT &&
	    c.best <= cur + delta && bpf_get_prandom_u32() < g->rb_chance / 4)
		goto walked;
	return 0;
walked:
	f->walked_ns = now;
	return c.port;
}

static __always_inline __u32 flowlet_port(struct group *g, __u32 sw, __u32 gid, __u32 h,
					  __u32 h0, __u64 now, __u32 len)
{
	struct flowlet_key key = { sw, gid, h };
	struct flowlet *f = bpf_map_lookup_elem(&sw_flowlets, &key), fresh = {};
	struct echo_key ek = { sw, h0 };
	__u32 i, avoid = 0, best = 0, to = 0;
	int push = 0;
	__u64 *echo;

	if (g->selection & SEL_NEXT)
		best = least_loaded(g, sw, gid, h, now, 0, 1);
	if (f && live(sw, f->port)) {
		for (i = 0; i < MAX_BUCKETS; i++) {
			if (i >= g->n)
				break;
			if (g->ports[i] != f->port)
				continue;
			if (now - f->last_ns < g->gap_ns && f->data) {
				flow_recent(f, sw, now, len);
				f->last_ns = now;
				best = rebalanced(g, sw, now, f, i, &ek, &to, &push);
				if (best) {
					carry_flow(g, sw, i, to, f->recent, push ? now : 0);
					f->port = best;
					f->decided_ns = now;
					f->moves++;
				}
				return f->port;
			}
			echo = bpf_map_lookup_elem(&sw_echoes, &ek);
			if (echo && *echo > f->decided_ns + ECHO_HOLD_GAPS * g->gap_ns)
				avoid = f->port;
			break;
		}
	}
	fresh.port = best && !avoid ? best : least_loaded(g, sw, gid, h, now, avoid, 0);
	fresh.last_ns = fresh.decided_ns = now;
	fresh.recent = len;
	fresh.data = len > HEADERS_ONLY;
	if (fresh.port)
		bpf_map_update_elem(&sw_flowlets, &key, &fresh, BPF_ANY);
	return fresh.port;
}

/* A switch-local selection's port for a packet of flow hash h (0: none live). A function
 * of its own, verified on its own: inlined, its loops multiplied the flow table's states
 * past the verifier's limit. */
__noinline __u32 local_port(__u32 sw, __u32 gid, __u32 h, __u32 h0, __u32 len)
{
	struct group_id id = { sw, gid };
	struct group *g = bpf_map_lookup_elem(&sw_groups, &id);
	__u64 now = bpf_ktime_get_ns();

	if (!g)
		return 0;
	return (g->selection & SEL_KIND) == SEL_FLOWLET ?
		flowlet_port(g, sw, gid, h, h0, now, len) :
		least_loaded(g, sw, gid, h, now, 0, g->selection & SEL_NEXT);
}

static __always_inline int apply_group(struct __sk_buff *skb, __u32 sw, __u32 gid,
				       struct flow_key *pkt)
{
	struct group_id id = { sw, gid };
	struct group *g = bpf_map_lookup_elem(&sw_groups, &id);
	__u32 total = 0, point, i, port;

	if (!g)
		return TC_ACT_SHOT;
	if (g->kind == G_SELECT && g->selection != SEL_HASH) {
		port = local_port(sw, gid, flow_hash(g->basis, pkt->src, pkt->dst, pkt->proto,
						     pkt->sport, pkt->dport),
				  (g->selection & SEL_KIND) == SEL_FLOWLET ?
				  flow_hash(0, pkt->src, pkt->dst, pkt->proto, pkt->sport,
					    pkt->dport) : 0, skb->len);
		return port ? output(skb, sw, port) : dead_drop(sw, g->ports[0]);
	}
	if (g->kind == G_FF) {
		for (i = 0; i < MAX_BUCKETS; i++) {
			if (i >= g->n)
				break;
			if (live(sw, g->ports[i]))
				return output(skb, sw, g->ports[i]);
		}
		return dead_drop(sw, g->ports[0]);
	}
	for (i = 0; i < MAX_BUCKETS; i++) {
		if (i >= g->n)
			break;
		if (live(sw, g->ports[i]))
			total += g->weights[i];
	}
	if (!total)
		return dead_drop(sw, g->ports[0]);
	point = flow_hash(g->basis, pkt->src, pkt->dst, pkt->proto, pkt->sport, pkt->dport) % total;
	for (i = 0; i < MAX_BUCKETS; i++) {
		if (i >= g->n)
			break;
		if (!live(sw, g->ports[i]))
			continue;
		if (point < g->weights[i])
			return output(skb, sw, g->ports[i]);
		point -= g->weights[i];
	}
	return TC_ACT_SHOT;
}

SEC("tc")
int switch_ingress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct flow_key pkt = {}, key;
	struct action *best = NULL, *hit;
	struct port_id *in;
	__u32 ifindex = skb->ifindex, t;
	__u8 tcp_flags = 0;

	if ((void *)(eth + 1) > end)
		return TC_ACT_SHOT;
	in = bpf_map_lookup_elem(&sw_ports, &ifindex);
	if (!in)
		return TC_ACT_OK;  /* not a switch port */
	pkt.sw = in->sw;
	pkt.in_port = in->port;
	pkt.eth_type = bpf_ntohs(eth->h_proto);
	__builtin_memcpy(pkt.eth_dst, eth->h_dest, 6);
	__builtin_memcpy(pkt.eth_src, eth->h_source, 6);
	if (pkt.eth_type == ETH_P_IP) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end)
			return TC_ACT_SHOT;
		pkt.src = bpf_ntohl(ip->saddr);
		pkt.dst = bpf_ntohl(ip->daddr);
		pkt.proto = ip->protocol;
		pkt.dscp = ip->tos >> 2;
		if ((ip->protocol == IPPROTO_TCP || ip->protocol == IPPROTO_UDP) &&
		    !(ip->frag_off & bpf_htons(0x3fff))) {
			__u16 *ports = (void *)ip + ip->ihl * 4;

			if ((void *)(ports + 2) <= end) {
				pkt.sport = bpf_ntohs(ports[0]);
				pkt.dport = bpf_ntohs(ports[1]);
			}
			if (ip->protocol == IPPROTO_TCP && (void *)ports + 14 <= end)
				tcp_flags = ((__u8 *)ports)[13];
		}
	}
	if ((tcp_flags & (TH_ECE | TH_ACK | TH_SYN)) == (TH_ECE | TH_ACK))
		echoed(pkt.sw, flow_hash(0, pkt.dst, pkt.src, pkt.proto, pkt.dport, pkt.sport));
	for (t = 0; t < MAX_SUBTABLES; t++) {
		struct table_id tid = { pkt.sw, t };
		struct mask *m = bpf_map_lookup_elem(&sw_masks, &tid);

		if (!m || !m->valid)
			break;
		if (best && best->priority >= m->max_priority)
			break;
		__builtin_memset(&key, 0, sizeof(key));
		key.sw = pkt.sw;
		key.table = t;
		if (m->fields & F_IN_PORT) key.in_port = pkt.in_port;
		if (m->fields & F_ETH_TYPE) key.eth_type = pkt.eth_type;
		if (m->fields & F_ETH_DST) __builtin_memcpy(key.eth_dst, pkt.eth_dst, 6);
		if (m->fields & F_ETH_SRC) __builtin_memcpy(key.eth_src, pkt.eth_src, 6);
		if (m->fields & F_DSCP) key.dscp = pkt.dscp;
		if (m->fields & F_PROTO) key.proto = pkt.proto;
		if (m->fields & F_SPORT) key.sport = pkt.sport;
		if (m->fields & F_DPORT) key.dport = pkt.dport;
		key.src = pkt.src & prefix_mask(m->src_len);
		key.dst = pkt.dst & prefix_mask(m->dst_len);
		hit = bpf_map_lookup_elem(&sw_flows, &key);
		if (hit && (!best || hit->priority > best->priority))
			best = hit;
	}
	if (!best)
		return TC_ACT_SHOT;  /* no table-miss entry: OpenFlow drops */
	__sync_fetch_and_add(&best->packets, 1);
	__sync_fetch_and_add(&best->bytes, skb->len);
	if (best->punt)
		punt(skb, pkt.sw, pkt.in_port, best->punt, 1 /* OFPR_APPLY_ACTION */);
	switch (best->kind) {
	case A_OUTPUT:
		return output(skb, pkt.sw, best->arg);
	case A_GROUP:
		return apply_group(skb, pkt.sw, best->arg, &pkt);
	default:
		return TC_ACT_SHOT;  /* dropped, or to the controller only (punted) */
	}
}

char LICENSE[] SEC("license") = "GPL";
