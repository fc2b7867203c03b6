// SPDX-License-Identifier: GPL-2.0
/* fabriclab link cut: the instant a link fails, every frame either end sends into it is lost.
 *
 * Taking a veth down is not instant: the kernel's close waits for an RCU grace period (9-74 ms
 * measured here) before it drops the carrier, and until then the link carries packets. A
 * failure therefore attaches this program at the egress of both ends first (clsact, ahead of
 * the marker and the qdisc), so the link stops at once, as a cut cable does; the switches are
 * told and the veths go down after it. It drops everything (the emulator's frames too: a cut
 * cable carries no LLDP) and counts what it dropped per interface (cut_drops), which the
 * failure's report gives as the packets the cut cost.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);	/* ifindex (a host's end: in its namespace) */
	__type(value, __u64);	/* frames dropped */
} cut_drops SEC(".maps");

SEC("tc")
int link_cut(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	__u64 one = 1, *count = bpf_map_lookup_elem(&cut_drops, &ifindex);

	if (count)
		__sync_fetch_and_add(count, 1);
	else
		bpf_map_update_elem(&cut_drops, &ifindex, &one, BPF_NOEXIST);
	return TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "GPL";
