"""Pure link-shaping plans: what HTB class and leaf queue each link end gets.

Every link end shapes its egress with ``htb 1: -> class 1:1 (rate = ceil) -> fifo 10:``, or
``netem 10:`` as the leaf when the link has a delay (each direction's packets meet the delay
once, at the end they leave by; netem's queue limit counts packets). A link's random loss is
the eBPF program's (:mod:`testbed.fabric.ecn`), on both backends: no netem needed. With
TSO/GSO on, the queue holds super-packets of up to 64 KiB, so queues are sized in bytes (bfifo)
unless the experiment asks for a packet count, and the HTB burst covers one super-packet (but
see ``LOSSLESS_BURST_FRAMES``).

A host NIC of one traffic class sends TCP's pure acknowledgements first (``acks_first``): class
``1:1`` then holds two children, ``1:10`` for everything (leaf ``10:``, as a priority-0 class)
and ``1:20`` (HTB prio 0, leaf ``20:``) that a classic-BPF filter on ``1:`` fills with TCP
segments of at most ``ACK_MAX_BYTES`` (:data:`TCP_ACK_FILTER`). A real NIC drains its queue at
line rate and a host's fq qdisc serves each flow in turn, so an acknowledgement never waits
behind another flow's bulk data; behind the emulated NIC's megabytes of queue it would (80 ms
at 100 Mbit/s), and a delay-based sender (BBR) whose acknowledgements wait there runs short of
window: ring steps measured 10-60 % slow with both directions busy, at line rate with this.
A switch port of one class without RED does the same when the experiment asks
(``queue.acks_first``): its emulated queue holds as long as a NIC's.

With more than one traffic class, class ``1:1`` holds the port's rate and one child class per
priority ``p``, ``1:(0x10 + p)`` (guaranteed an equal share, borrowing up to the port's rate; a
strict priority's class has HTB prio 0, the others 1, so it is served first), with its own leaf
``(0x10 + p):``; the ECN marker steers packets into them by DSCP. A lossless
priority's leaf is a TBF that runs faster than the port (HTB sets the pace) and is the PFC
agent's actuator: ``tc qdisc change`` to a crawl pauses it (TBF resets its bucket, so at most
the frame its burst allows still leaves), back to full speed resumes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.model.congestion import frame_bytes
from testbed.model.spec import DEFAULT_QUEUE_KB

GSO_MAX_BYTES = 65536
HTB_MAX_QUANTUM = 200000
BURST_TIME_S = 0.001  # tokens for 1 ms at line rate, at least one super-packet
HTB_MAJOR = 0x10000  # 1:
CLASS_BASE = 0x10  # priority p's class is 1:(0x10 + p), its leaf (0x10 + p):
TBF_RUN_FACTOR = 2  # an unpaused lossless TBF runs at twice the port's rate
TBF_MAX_BUFFER_S = 4.0  # the kernel clamps TBF's bucket to 2^32 ns
PAUSE_MIN_KBIT = 20
#: With lossless classes a link end's HTB burst is this many frames (at least 1 ms of line
#: rate), not a super-packet: HTB keeps saving tokens while a pause holds its class back, and a
#: super-packet's worth sent at once on resume lands on a queue that is only at XON.
LOSSLESS_BURST_FRAMES = 2


ACK_CLASS_MINOR = 0x20  # 1:20, leaf 20:
ACK_MAX_BYTES = 128  # a frame this short carrying TCP is an acknowledgement (or a few bytes)
ACK_SHARE = 0.01  # the acknowledgements' class is guaranteed this share of the port
ACK_QUEUE_PACKETS = 1000
#: classic BPF (code, jt, jf, k), run on the frame from its Ethernet header: IPv4, protocol
#: TCP, frame length at most ACK_MAX_BYTES -> match (the filter's class); otherwise none
TCP_ACK_FILTER: tuple[tuple[int, int, int, int], ...] = (
    (0x28, 0, 0, 12),           # ldh [12]: EtherType
    (0x15, 0, 5, 0x0800),       # jeq IPv4, else no match
    (0x30, 0, 0, 23),           # ldb [23]: IP protocol
    (0x15, 0, 3, 6),            # jeq TCP, else no match
    (0x80, 0, 0, 0),            # ld len
    (0x25, 1, 0, ACK_MAX_BYTES),  # jgt ACK_MAX_BYTES: no match
    (0x06, 0, 0, 0xFFFFFFFF),   # ret -1: match
    (0x06, 0, 0, 0),            # ret 0: no match
)


def class_id(priority: int) -> int:
    """The HTB class of a priority (``1:(0x10 + p)``)."""
    return HTB_MAJOR | (CLASS_BASE + priority)


def leaf_handle(priority: int) -> int:
    """The handle of a priority's leaf queue (``(0x10 + p):``; priority 0's is ``10:``)."""
    return (CLASS_BASE + priority) << 16


def priority_of_leaf(handle: int) -> int | None:
    """The priority whose leaf has this handle, None for any other qdisc."""
    major = handle >> 16
    return major - CLASS_BASE if CLASS_BASE <= major < CLASS_BASE + 8 and not handle & 0xFFFF \
        else None


@dataclass(frozen=True)
class RedPlan:
    """A kernel RED leaf that marks ECN (where the kernel has RED: the vm guest): marking
    probability 0 below ``min``, rising to ``max_p`` at ``max`` (a step at K is min = K, max =
    K + one frame, max_p = 1), over the instantaneous backlog (EWMA weight 1); ``nodrop``: a
    packet that is not ECN-capable is queued, not dropped early, as the eBPF marker does."""

    min_bytes: int
    max_bytes: int
    max_p: float
    limit_bytes: int


@dataclass(frozen=True)
class ClassPlan:
    """One priority's HTB class and leaf at a link end."""

    priority: int
    rate_kbit: int  # guaranteed share; the ceiling is the port's rate
    lossless: bool
    limit_bytes: int  # the leaf's limit (a lossless class's is XOFF + headroom)
    red: RedPlan | None = None  # a RED leaf instead of the fifo (lossy classes)
    strict: bool = False  # served before the other classes (HTB prio 0, theirs 1)

    @property
    def htb_prio(self) -> int:
        """HTB serves the lowest ``prio`` first among classes that may send."""
        return 0 if self.strict else 1


@dataclass(frozen=True)
class TbfSetting:
    """A lossless leaf's TBF, running or paused."""

    rate_kbit: int
    burst_bytes: int
    limit_bytes: int


@dataclass(frozen=True)
class Shaping:
    """The tc configuration of one link end."""

    rate_kbit: int
    burst_bytes: int
    quantum_bytes: int
    queue_kind: str  # bfifo (limit in bytes), pfifo or netem (limit in packets)
    queue_limit: int
    delay_us: float = 0.0
    classes: tuple[ClassPlan, ...] = ()  # one per priority; empty: one class (1:1 -> 10:)
    mtu: int = 1500
    red: RedPlan | None = None  # one class: a RED leaf 10: instead of the fifo
    acks_first: bool = False  # one class: TCP's acknowledgements in 1:20 first

    def describe(self) -> str:
        """One line of what this link end's tc holds (the run's provenance)."""
        leaf = ("netem" if self.queue_kind == "netem" else "red" if self.red
                else self.queue_kind)
        unit = "packets" if self.queue_kind in ("netem", "pfifo") else "bytes"
        text = (f"htb rate {self.rate_kbit} kbit burst {self.burst_bytes} B quantum "
                f"{self.quantum_bytes} B, {leaf} limit {self.queue_limit} {unit}")
        if self.delay_us:
            text += f", delay {self.delay_us:g} us"
        if self.classes:
            text += ", classes " + " ".join(
                f"p{c.priority}:{'lossless tbf' if c.lossless else 'red' if c.red else 'fifo'}"
                f"{' strict' if c.strict else ''}" for c in self.classes)
        return text + (", TCP acknowledgements first" if self.acks_first else "")

    @property
    def ack_rate_kbit(self) -> int:
        """What the acknowledgements' class is guaranteed (the rest is the data class's)."""
        return max(8, int(self.rate_kbit * ACK_SHARE))

    @property
    def rate_mbps(self) -> float:
        return self.rate_kbit / 1000

    def running(self, cls: ClassPlan) -> TbfSetting:
        """A lossless leaf's TBF when not paused: faster than the port, a super-packet's burst."""
        return TbfSetting(self.rate_kbit * TBF_RUN_FACTOR, self.burst_bytes, cls.limit_bytes)

    def paused(self, cls: ClassPlan) -> TbfSetting:
        """The same TBF paused: a bucket of one frame (so nothing larger is dropped at enqueue)
        at the slowest rate whose bucket the kernel still holds (one frame per 4 s)."""
        frame = frame_bytes(self.mtu)
        kbit = max(PAUSE_MIN_KBIT, -(-frame * 8 // int(TBF_MAX_BUFFER_S * 1000)))
        return TbfSetting(kbit, frame, cls.limit_bytes)


def red_plan(mode: str, k_bytes: int, kmin_bytes: int, kmax_bytes: int, pmax: float,
             limit_bytes: int, mtu: int) -> RedPlan | None:
    """The RED leaf that marks like the eBPF marker's ``step`` or ``red`` mode (None: off)."""
    if mode == "step":
        return RedPlan(k_bytes, k_bytes + frame_bytes(mtu), 1.0, limit_bytes)
    if mode == "red":
        return RedPlan(kmin_bytes, kmax_bytes, pmax, limit_bytes)
    return None


def htb_burst_bytes(rate_mbps: float, mtu: int) -> int:
    """The HTB burst of a link end without lossless classes (with them it is less): tokens
    for :data:`BURST_TIME_S` at line rate, at least one super-packet. An idle link end sends
    that much at once, and one packet more (a class may send while its tokens are not
    negative): what a transfer starting on idle links can gain on the line rate
    (:mod:`traffic.measure.flows`)."""
    return int(max(rate_mbps * 1e6 / 8 * BURST_TIME_S, GSO_MAX_BYTES + mtu))


def plan_shaping(rate_mbps: float, mtu: int, queue_kb: int | None = None,
                 queue_packets: int | None = None, delay_us: float = 0.0,
                 priorities: tuple[int, ...] = (),
                 lossless: dict[int, int] | None = None,
                 red: dict[int, tuple] | None = None,
                 strict: tuple[int, ...] = (), acks_first: bool = False) -> Shaping:
    """Plan the shaping of one link end.

    Args:
        rate_mbps: line rate.
        mtu: link MTU in bytes.
        queue_kb: queue size in KiB (bfifo); used when ``queue_packets`` is None.
        queue_packets: queue size in packets (pfifo).
        delay_us: one-way delay of the link (netem leaf).
        priorities: the traffic classes in use; more than one (or any lossless) gives one HTB
            class per priority.
        lossless: lossless priority -> its leaf's limit in bytes.
        red: priority -> (mode, k, kmin, kmax, pmax) of the ECN marking a RED leaf does (a
            byte queue's lossy classes only; the others keep the eBPF marker).
        strict: priorities served before the others (strict priority).
        acks_first: with one class and no delay line, TCP's acknowledgements go first (a
            host NIC's end; a switch's with ``queue.acks_first``; see the module's text).

    Returns:
        The plan.
    """
    lossless = lossless or {}
    rate_bytes_s = rate_mbps * 1e6 / 8
    burst = htb_burst_bytes(rate_mbps, mtu)
    if lossless:  # a paused class saves up its burst and sends it at once when resumed
        burst = int(max(rate_bytes_s * BURST_TIME_S, LOSSLESS_BURST_FRAMES * frame_bytes(mtu)))
    quantum = int(min(HTB_MAX_QUANTUM, max(frame_bytes(mtu), GSO_MAX_BYTES)))
    if queue_packets is not None:
        kind, limit = "pfifo", int(queue_packets)
    else:
        kind, limit = "bfifo", int((queue_kb if queue_kb is not None else DEFAULT_QUEUE_KB)
                                     * 1024)
    if delay_us:
        packets = limit if kind == "pfifo" else max(1, -(-limit // frame_bytes(mtu)))
        # netem holds the packets in flight on the delay line too: add the bandwidth-delay product
        packets += int(rate_bytes_s * delay_us / 1e6 / frame_bytes(mtu)) + 1
        return Shaping(round(rate_mbps * 1000), burst, quantum, "netem", packets,
                       float(delay_us), mtu=mtu)
    rate_kbit = round(rate_mbps * 1000)
    prios = sorted(set(priorities) | set(lossless) | {0})

    def red_for(prio: int, leaf_limit: int) -> RedPlan | None:
        if kind != "bfifo" or prio in lossless or not red or prio not in red:
            return None
        return red_plan(*red[prio], leaf_limit, mtu)

    if len(prios) == 1 and not lossless:
        return Shaping(rate_kbit, burst, quantum, kind, limit, mtu=mtu, red=red_for(0, limit),
                       acks_first=acks_first)
    classes = tuple(
        ClassPlan(p, max(1, rate_kbit // len(prios)), p in lossless, lossless.get(p, limit),
                  red_for(p, lossless.get(p, limit)), p in strict)
        for p in prios)
    return Shaping(rate_kbit, burst, quantum, kind, limit, classes=classes, mtu=mtu)
