"""A probe stream's outage, from its send times and answers (pure; :mod:`traffic.agents.probe` sends
and echoes the probes)."""

from __future__ import annotations


def outage(sent: list[float], rtt: dict[int, float], interval_s: float) -> dict:
    """The longest stretch without answers, from the probes' send times and the round-trip
    times of the answered ones (sequence number -> s).

    Returns:
        ``outage_s``: the longest run of unanswered probes, as the time they cover (from the
        first one's send time to the last one's, plus one interval; 0 when nothing was lost):
        the time without replies as the probes sampled it; ``gap_s``: the time between the
        answered probes around it (also counts a stall of the sender itself, e.g. while the
        machine is busy taking the link down); ``lost``: unanswered probes, those at the very
        end not counted; ``started_s``: the first lost probe's send time, relative to the
        first probe; ``answered``, ``sent``.
    """
    answered = sorted(rtt)
    out = {"sent": len(sent), "answered": len(answered), "outage_s": 0.0, "gap_s": 0.0,
           "lost": 0, "started_s": None}
    if not answered:
        span = sent[-1] - sent[0] + interval_s if sent else 0.0
        return {**out, "outage_s": span, "gap_s": span, "lost": len(sent)}
    out["lost"] = answered[-1] + 1 - len(answered)
    for a, b in zip(answered, answered[1:]):
        if b - a < 2:
            continue
        span = sent[b - 1] - sent[a + 1] + interval_s
        if span > out["outage_s"]:
            out.update(outage_s=span, gap_s=sent[b] - sent[a] - interval_s,
                       started_s=sent[a + 1] - sent[0])
    return out
