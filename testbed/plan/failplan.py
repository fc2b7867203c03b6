"""Link and switch failures, the pure part: the experiment file's ``failures`` section as
events checked against the model (:func:`plan_failures`), a target of ``fabriclab fail`` as
links (:func:`live_links`), the fabric's delivered throughput before, during and after an
event (:func:`throughput_around`), and how long the traffic offered to a failed or degraded
link's ports took to fit what they can carry (:func:`time_to_move_off`). The adapter that
applies them is :mod:`testbed.fabric.failures`.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.errors import ConfigError
from testbed.model.topology import ROLE_TIER, Topology

#: The delivered throughput is sampled this often while failures are planned.
SAMPLE_S = 0.25
#: "Before" is the window up to the event, "after" the one that follows "during", which is
#: the settling time: detection (60-80 ms for a veth's carrier here), the controller's reroute
#: (tens of ms), and the transports' recovery (a TCP retransmission timeout is 200 ms or more).
WINDOW_S = 3.0
SETTLE_S = 1.0
#: The ports of a failed or degraded link are sampled this often for this long after it, and
#: their offered rate measured over windows of MOVE_WINDOW_S (:func:`time_to_move_off`).
FINE_SAMPLE_S = 0.001
FINE_SPAN_S = 2.0
MOVE_WINDOW_S = 0.005
#: ... or over windows that hold this many of the largest packets offered at the port's rate,
#: where that is longer (:func:`move_window_s`): a slow or time-scaled port's frame (a
#: 9,000-byte frame takes 21.6 ms of a 3.3 Mbit/s port: a 5 ms window, which holds one or
#: none, would read a port offered twice its rate as fitting it), kernel TCP's
#: segmentation-offload unit, which passes the switches whole (64 KiB: 10.5 ms of a
#: 50 Mbit/s port)
MOVE_PACKETS = 4
#: A port's offered rate fits its link when at most this share above the link's rate, plus
#: one packet per window (one in passage: a frame, or the largest packet offered).
MOVE_TOLERANCE = 1.05
#: ... and has moved off once every window fits for this long (TCP's bursts aside)
MOVE_SETTLE_S = 0.05


@dataclass(frozen=True)
class FailureEvent:
    """One failure or repair: ``links`` (node pairs) go ``down`` or ``up`` at ``at_s``, or
    ``degrade`` to ``rate_factor`` of their rate (1: restored)."""

    at_s: float
    action: str  # "down", "up" or "degrade"
    target: str  # "link agg1_1-core1" or "switch core1"
    links: tuple[tuple[str, str], ...]
    rate_factor: float | None = None  # degrade: the share of the links' rate left


def plan_failures(topo: Topology, raw: list[dict]) -> tuple[FailureEvent, ...]:
    """The events of a (schema-checked) ``failures`` section, in time order.

    Raises:
        ConfigError: an unknown node, a pair that is no link, a host given as a switch, or a
            rate factor missing from a ``degrade`` (or given to another action), naming the
            field.
    """
    events = []
    for i, item in enumerate(raw):
        where = f"failures[{i}]"
        factor = item.get("rate_factor")
        if (item["action"] == "degrade") != (factor is not None):
            raise ConfigError(f"{where}.rate_factor",
                              "a degrade gives the share of the rate left (rate_factor: 0.5 "
                              "halves it, 1 restores it)" if factor is None else
                              f"only a degrade takes a rate factor, not {item['action']}")
        if "link" in item:
            a, b = item["link"]
            for j, node in enumerate((a, b)):
                if node not in topo.nodes:
                    raise ConfigError(f"{where}.link[{j}]", f"no node {node!r} in the fabric")
            try:
                topo.find_link(a, b)
            except (KeyError, ValueError):
                raise ConfigError(f"{where}.link", f"{a} and {b} share no link") from None
            events.append(FailureEvent(float(item["at_s"]), item["action"], f"link {a}-{b}",
                                       ((a, b),), factor))
        else:
            name = item["switch"]
            node = topo.nodes.get(name)
            if node is None or not node.is_switch:
                raise ConfigError(f"{where}.switch", f"no switch {name!r} in the fabric")
            links = tuple((name, link.other(name).node) for link in topo.ports(name).values())
            events.append(FailureEvent(float(item["at_s"]), item["action"], f"switch {name}",
                                       links, factor))
    return tuple(sorted(events, key=lambda e: e.at_s))


def target_link(topo: Topology, a: str, b: str):
    """The link between nodes ``a`` and ``b`` of a running fabric, as a user names it.

    Raises:
        ConfigError: naming ``target``: an unknown node, or no link between them.
    """
    for node in (a, b):
        if node not in topo.nodes:
            raise ConfigError("target", f"no node {node!r} in the running fabric")
    try:
        return topo.find_link(a, b)
    except KeyError:
        raise ConfigError("target", f"{a} and {b} share no link") from None


def live_links(topo: Topology, target: list[str]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """``[node, node]`` (a link) or ``[switch]`` (all its links) as a target and node pairs.

    Raises:
        ConfigError: naming ``target`` for an unknown node, no link, or a host alone.
    """
    if len(target) == 2:
        a, b = target
        target_link(topo, a, b)
        return f"link {a}-{b}", ((a, b),)
    if len(target) == 1:
        name = target[0]
        node = topo.nodes.get(name)
        if node is None or not node.is_switch:
            raise ConfigError("target", f"no switch {name!r} in the running fabric")
        return f"switch {name}", tuple((name, l.other(name).node)
                                       for l in topo.ports(name).values())
    raise ConfigError("target", "give two nodes (a link) or one switch")


def _bytes_at(samples: list[tuple[float, int]], t: float) -> float:
    """The cumulative byte count at ``t``, interpolated between the samples around it."""
    for (t0, b0), (t1, b1) in zip(samples, samples[1:]):
        if t0 <= t <= t1:
            return b0 if t1 == t0 else b0 + (b1 - b0) * (t - t0) / (t1 - t0)
    raise ValueError(f"{t} outside the samples")


def rate_mbps(samples: list[tuple[float, int]], start_s: float, end_s: float) -> float | None:
    """Mean Mbit/s over ``[start_s, end_s]`` of cumulative ``(seconds, bytes)`` samples, the
    window clipped to what was sampled; None when less than one sample interval remains."""
    if len(samples) < 2:
        return None
    start_s, end_s = max(start_s, samples[0][0]), min(end_s, samples[-1][0])
    if end_s - start_s < SAMPLE_S * 0.99:
        return None
    moved = _bytes_at(samples, end_s) - _bytes_at(samples, start_s)
    return round(moved * 8 / (end_s - start_s) / 1e6, 4)


def throughput_around(samples: list[tuple[float, int]], at_s: float,
                      window_s: float = WINDOW_S, settle_s: float = SETTLE_S) -> dict:
    """The delivered throughput before an event at ``at_s`` (``window_s`` up to it), during it
    (the ``settle_s`` after it) and after it (the ``window_s`` that follows), in Mbit/s (None
    where nothing was sampled), with the windows used and during/before and after/before.

    Args:
        samples: ``(seconds since the workload began, cumulative bytes delivered)``, in order.
    """
    windows = {"before": (at_s - window_s, at_s), "during": (at_s, at_s + settle_s),
               "after": (at_s + settle_s, at_s + settle_s + window_s)}
    doc: dict = {f"{name}_mbps": rate_mbps(samples, a, b) for name, (a, b) in windows.items()}
    before = doc["before_mbps"]
    for name in ("during", "after"):
        value = doc[f"{name}_mbps"]
        doc[f"{name}_vs_before"] = (round(value / before, 3) if before and value is not None
                                    else None)
    doc["windows_s"] = {name: [round(a, 3), round(b, 3)] for name, (a, b) in windows.items()}
    return doc


def move_window_s(rate_bytes_s: float, packet_bytes: int) -> float:
    """The window a port's offered rate is measured over: :data:`MOVE_WINDOW_S`, or long
    enough to hold :data:`MOVE_PACKETS` packets of ``packet_bytes`` (the largest offered, a
    frame at least) at ``rate_bytes_s`` (a failed link's: its rate as built), whichever is
    longer; the first at rate 0. It is the resolution of :func:`time_to_move_off`."""
    if rate_bytes_s <= 0:
        return MOVE_WINDOW_S
    return max(MOVE_WINDOW_S, MOVE_PACKETS * packet_bytes / rate_bytes_s)


def move_off_unmeasured(times: list[float], at_s: float,
                        window_s: float = MOVE_WINDOW_S) -> str | None:
    """Why the samples taken at ``times`` (s) cannot say when a port moved off after an event
    at ``at_s`` (None: they can): they must cover a settling period and a window after it,
    or "never fitted" and "not measured" would read the same."""
    after = [t for t in times if t >= at_s]
    need = MOVE_SETTLE_S + window_s
    covered = after[-1] - after[0] if len(after) > 1 else 0.0
    if covered < need:
        return (f"{len(after)} samples over {covered * 1000:.0f} ms after the event, under the "
                f"{need * 1000:.0f} ms a move needs (the next event came first, or the machine "
                "held the watcher back)")
    return None


def time_to_move_off(samples: list[tuple[float, int]], at_s: float, rate_bytes_s: float,
                     packet_bytes: int, window_s: float = MOVE_WINDOW_S,
                     siblings: list[tuple[float, int]] | None = None,
                     sibling_rate_bytes_s: float = 0.0) -> float | None:
    """How long after an event at ``at_s`` the traffic offered to a port took to fit what it
    carries now: the end of the last window of ``window_s`` in which it did not fit before
    the windows first fit for :data:`MOVE_SETTLE_S` in a row, less ``at_s``; 0.0 if they fit
    from the start; None if they never fit that long.

    Windows end at every sample from a whole window after the first on; a window's start
    falls between two samples, whose bytes count as coming evenly between them.
    A window fits when the port was offered at most its rate (more by at most
    :data:`MOVE_TOLERANCE`, plus one packet of ``packet_bytes``: a frame, or the largest
    offered; 0 for a failed link), or, with ``siblings`` (the
    cumulative bytes offered to the ports its switch could send the same traffic to instead,
    of ``sibling_rate_bytes_s`` together), when its share of what all of them were offered is
    at most its share of their rate (with the same tolerance and one packet): a loaded group
    moves traffic off a degraded port by giving it less of the load, even while every port
    is busy.

    Args:
        samples: ``(seconds, cumulative bytes offered to the port)``, in order, at least
            from ``at_s`` on; ``siblings`` likewise, at the same times.
    """
    after, theirs = _aligned(samples, siblings, at_s)
    if len(after) < 2:
        return None
    last_over, settled_from, start = None, None, 0
    for k, (t, b) in enumerate(after):
        while start + 1 < k and after[start + 1][0] <= t - window_s:
            start += 1
        if t - after[start][0] < window_s:  # not a whole window since the first sample
            continue
        # the counters at the window's start, between two samples: as though their bytes
        # came evenly between them (a sampler held back leaves a gap: a window cut short at
        # the sample after it and scaled up would read a few packets as a burst)
        lo = t - window_s
        mine = b - _between(after, start, lo)
        rest = None if theirs is None else theirs[k][1] - _between(theirs, start, lo)
        if _over(mine, rest, window_s, rate_bytes_s, packet_bytes, sibling_rate_bytes_s):
            last_over, settled_from = t, None
            continue
        settled_from = t if settled_from is None else settled_from
        if t - settled_from >= MOVE_SETTLE_S:
            return 0.0 if last_over is None else round(last_over - at_s, 4)
    return None


def time_to_fit_on_average(samples: list[tuple[float, int]], at_s: float,
                           rate_bytes_s: float, packet_bytes: int,
                           siblings: list[tuple[float, int]] | None = None,
                           sibling_rate_bytes_s: float = 0.0,
                           span_s: float = MOVE_SETTLE_S) -> float | None:
    """How long after an event at ``at_s`` the traffic offered to a port took to fit on
    average: the first sample from which every window of ``span_s`` that starts within the
    next ``span_s`` fits (by :func:`time_to_move_off`'s rules), less ``at_s``; 0.0 if that
    is the first; None if none did while the samples last.

    :func:`time_to_move_off`'s short windows catch a single burst, a frame beyond the
    port's share in a few milliseconds (as per-packet choices by several switches make while
    every path holds a queue); this reads when the traffic's level moved, to the samples'
    spacing, a burst counting by its bytes alone."""
    after, theirs = _aligned(samples, siblings, at_s)
    fits, j = [], 0
    for k, (t, b) in enumerate(after):  # whether the window of span_s starting here fits
        end = t + span_s
        if end > after[-1][0]:
            break
        while after[j + 1][0] < end:
            j += 1
        mine = _between(after, j, end) - b
        rest = None if theirs is None else _between(theirs, j, end) - theirs[k][1]
        fits.append((t, not _over(mine, rest, span_s, rate_bytes_s, packet_bytes,
                                  sibling_rate_bytes_s)))
    i = 0
    while i < len(fits) and fits[-1][0] >= fits[i][0] + span_s:
        j = i  # the first window within span_s of this one that does not fit, if any
        while j < len(fits) and fits[j][0] <= fits[i][0] + span_s and fits[j][1]:
            j += 1
        if j == len(fits) or fits[j][0] > fits[i][0] + span_s:
            return 0.0 if i == 0 else round(fits[i][0] - at_s, 4)
        i = j + 1  # no window up to j can start the span: j is within span_s of each
    return None


def _aligned(samples: list[tuple[float, int]], siblings: list[tuple[float, int]] | None,
             at_s: float) -> tuple[list[tuple[float, int]], list[tuple[float, int]] | None]:
    """A port's samples from ``at_s`` on, and its alternatives' at the same times (None
    without alternatives, or where their samples do not match the port's)."""
    after = [s for s in samples if s[0] >= at_s]
    others = dict(s for s in (siblings or ()) if s[0] >= at_s)
    if siblings is None or any(t not in others for t, _ in after):
        return after, None
    return after, [(t, others[t]) for t, _ in after]


def _over(mine: float, rest: float | None, window_s: float, rate_bytes_s: float,
          packet_bytes: int, sibling_rate_bytes_s: float) -> bool:
    """Whether a port offered ``mine`` bytes in a window of ``window_s`` did not fit: more
    than its rate allows, and, where its alternatives were offered ``rest`` (None: not
    known, or none), more than its share of all of it by their rates."""
    if mine <= rate_bytes_s * MOVE_TOLERANCE * window_s + packet_bytes:
        return False
    if rest is None:
        return True
    total_rate = rate_bytes_s + sibling_rate_bytes_s
    share = rate_bytes_s / total_rate if total_rate else 0.0
    return mine > share * MOVE_TOLERANCE * (mine + rest) + packet_bytes


def _between(samples: list[tuple[float, int]], i: int, at: float) -> float:
    """A cumulative counter at ``at``, from its samples ``i`` and ``i + 1`` (the last one's
    where there is none after it, or ``at`` is not past sample ``i``)."""
    t0, b0 = samples[i]
    if at <= t0 or i + 1 >= len(samples):
        return b0
    t1, b1 = samples[i + 1]
    return b0 + (b1 - b0) * min(1.0, (at - t0) / (t1 - t0)) if t1 > t0 else b1


def alternatives(topo: Topology, link, switch: str) -> list:
    """The ports (link ends) over which the fabric could carry the traffic ``switch`` sends
    into ``link`` instead. Going up a Clos: ``switch``'s other links to switches of the same
    role as the link's other end (an aggregation switch's other uplinks to the core). Going
    down there is one path from ``switch`` to each destination, but the switches above
    choose among ``switch`` and its peers: the other links into the same switch from
    switches of ``switch``'s role (core2's link down to agg1_1 beside core1's), at their
    upper ends. None towards a host."""
    mine, peer = topo.nodes[switch], topo.nodes[link.other(switch).node]
    if not peer.is_switch:
        return []
    if ROLE_TIER.get(peer.role, -1) > ROLE_TIER.get(mine.role, -1):
        return [l.end(switch) for l in topo.ports(switch).values() if l is not link
                and topo.nodes[l.other(switch).node].role == peer.role]
    return [l.other(peer.name) for l in topo.ports(peer.name).values() if l is not link
            and topo.nodes[l.other(peer.name).node].role == mine.role]


def _live(topo: Topology, link, port_up: dict[str, bool]) -> bool:
    """Whether every switch end of ``link`` is up (an interface name not in ``port_up`` is)."""
    return all(port_up.get(e.ifname, True) for e in (link.a, link.b)
               if topo.nodes[e.node].is_switch)


def unreachable_pairs(topo: Topology, port_up: dict[str, bool], dead_switches: set[str],
                      hosts: list[str]) -> list[tuple[str, str]]:
    """Pairs of ``hosts`` that no live path joins: a link is gone when one of its switch ends
    is down (``port_up`` by interface name; a name not in it counts as up) or belongs to a
    switch in ``dead_switches``. One pair per host cut off from the first host's group."""
    parent = {name: name for name in topo.nodes}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for link in topo.links:
        ends = (link.a, link.b)
        if any(e.node in dead_switches for e in ends):
            continue
        if not _live(topo, link, port_up):
            continue
        parent[root(link.a.node)] = root(link.b.node)
    if not hosts:
        return []
    first = hosts[0]
    return [(first, h) for h in hosts[1:] if root(h) != root(first)]


def cut_off_reason(topo: Topology, port_up: dict[str, bool], dead_switches: set[str],
                   hosts: list[str]) -> str | None:
    """Why some of ``hosts`` cannot reach each other (who cannot reach whom, the links down,
    the dead switches), or None while every one reaches every other."""
    pairs = unreachable_pairs(topo, port_up, dead_switches, hosts)
    if not pairs:
        return None
    down = sorted(link.name for link in topo.links if not _live(topo, link, port_up))
    return (", ".join(f"{a} cannot reach {b}" for a, b in pairs[:5])
            + (f" (and {len(pairs) - 5} more)" if len(pairs) > 5 else "")
            + (f"; links down: {', '.join(down[:10])}" if down else "")
            + (f"; switches without vswitchd: {', '.join(sorted(dead_switches))}"
               if dead_switches else ""))
