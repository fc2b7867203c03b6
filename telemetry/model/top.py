"""Pure logic of ``fabriclab top``: from two scrapes of a fabric's exporter, the busiest links
per tier (utilization, queue, ECN marks, PFC pauses and drops per second) and the workload's
collectives (running, and the latest bus bandwidth), as rich tables."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Group
from rich.table import Table

Samples = dict[str, list]  # sample name -> samples


def parse(text: str) -> Samples:
    """An exposition's samples by sample name (``fabriclab_port_transmit_bytes_total``)."""
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def _per_port(samples: Samples, name: str) -> dict[tuple[str, str], float]:
    """(switch, port) -> the value, summed over priorities."""
    out: dict[tuple[str, str], float] = {}
    for s in samples.get(name, []):
        key = (s.labels["switch"], s.labels["port"])
        out[key] = out.get(key, 0.0) + s.value
    return out


@dataclass
class PortRow:
    switch: str
    port: str
    peer: str
    tier: str
    utilization: float
    queue_bytes: float
    marks_per_s: float
    pauses_per_s: float
    drops_per_s: float
    up: bool


@dataclass
class Frame:
    """One refresh: port rows and the workload's collectives."""

    ports: list[PortRow] = field(default_factory=list)
    running: list[tuple[str, str, str, float]] = field(default_factory=list)  # label, op,
    # transport, seconds so far
    latest: list[tuple[str, str, str, float, float]] = field(default_factory=list)  # label,
    # op, transport, busbw GB/s (NCCL-tests' unit), efficiency


def frame(before: Samples, after: Samples, seconds: float, now: float) -> Frame:
    """Rates between two scrapes ``seconds`` apart; ``now`` (Unix time) for running
    collectives."""
    out = Frame()
    if seconds <= 0:
        return out
    rates = {}
    for name in ("fabriclab_port_transmit_bytes_total", "fabriclab_port_ecn_marked_packets_total",
                 "fabriclab_port_pfc_pause_events_total",
                 "fabriclab_port_queue_dropped_packets_total"):
        b, a = _per_port(before, name), _per_port(after, name)
        rates[name] = {k: max(0.0, v - b.get(k, v)) / seconds for k, v in a.items()}
    queue = _per_port(after, "fabriclab_port_queue_bytes")
    up = _per_port(after, "fabriclab_port_up")
    for s in after.get("fabriclab_port_speed_bytes", []):
        key = (s.labels["switch"], s.labels["port"])
        sent = rates["fabriclab_port_transmit_bytes_total"].get(key, 0.0)
        out.ports.append(PortRow(
            key[0], key[1], s.labels["peer"], s.labels["tier"], sent / s.value,
            queue.get(key, 0.0), rates["fabriclab_port_ecn_marked_packets_total"].get(key, 0.0),
            rates["fabriclab_port_pfc_pause_events_total"].get(key, 0.0),
            rates["fabriclab_port_queue_dropped_packets_total"].get(key, 0.0),
            up.get(key, 1.0) > 0))
    for s in after.get("fabriclab_collective_started_timestamp_seconds", []):
        out.running.append((s.labels["label"], s.labels["op"], s.labels["transport"],
                            max(0.0, now - s.value)))
    eff = {tuple(s.labels[k] for k in ("label", "op", "transport")): s.value
           for s in after.get("fabriclab_collective_efficiency_ratio", [])}
    for s in after.get("fabriclab_collective_busbw_bytes_per_second", []):
        key = tuple(s.labels[k] for k in ("label", "op", "transport"))
        out.latest.append((*key, s.value / 1e9, eff.get(key, 0.0)))
    return out


def render(fr: Frame, per_tier: int = 4, title: str = "fabriclab top") -> Group:
    """The busiest ``per_tier`` links of each tier, then the collectives."""
    links = Table(title=title, box=None, header_style="bold")
    for col in ("tier", "link", "util", "queue KiB", "marks/s", "pauses/s", "drops/s"):
        links.add_column(col, justify="left" if col in ("tier", "link") else "right")
    tiers: dict[str, list[PortRow]] = {}
    for row in fr.ports:
        tiers.setdefault(row.tier, []).append(row)
    for tier in sorted(tiers):
        rows = sorted(tiers[tier], key=lambda r: (-r.utilization, -r.queue_bytes))[:per_tier]
        for r in rows:
            link = f"{r.switch}:{r.port} -> {r.peer}" + ("" if r.up else " [red](down)[/red]")
            links.add_row(tier, link, f"{r.utilization:.0%}", f"{r.queue_bytes / 1024:.1f}",
                          f"{r.marks_per_s:.0f}", f"{r.pauses_per_s:.1f}",
                          f"{r.drops_per_s:.0f}")
    work = Table(title="collectives", box=None, header_style="bold")
    for col in ("collective", "op", "transport", "state", "busbw GB/s", "eff"):
        work.add_column(col, justify="left" if col in ("collective", "op", "transport", "state")
                        else "right")
    for label, op, transport, elapsed in fr.running:
        work.add_row(label, op, transport, f"running {elapsed:.0f} s", "-", "-")
    for label, op, transport, busbw, eff in fr.latest:
        work.add_row(label, op, transport, "latest", f"{busbw:.4g}", f"{eff:.2f}")
    if not fr.running and not fr.latest:
        work.add_row("(none yet)", "", "", "", "", "")
    return Group(links, work)
