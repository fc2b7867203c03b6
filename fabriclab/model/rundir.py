"""What a run directory holds besides ``results.json`` (pure): the experiment as run and its
SHA-256, and the per-collective and per-flow CSV tables.

``DIR/experiment.json``
    the experiment's data as it ran (the variant's and sweep cell's fields set), with
    ``sha256`` over its canonical JSON: two runs of the same experiment have the same hash.
``DIR/environment.json``
    software versions and machine facts (:mod:`testbed.linux.environment`).
``DIR/collectives.csv``, ``DIR/flows.csv``
    one row per collective run / per transfer.
``DIR/ports.csv``
    with failures: the bytes offered to a failed or degraded link's switch ports and to
    their alternatives every millisecond after each event (``failures[].move_off``'s data).
``DIR/logs/``
    the controller's log and the traffic agents' stderr.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json

from traffic.measure.rows import CollectiveRow

COLLECTIVE_COLUMNS = ("job", "repetition", "label", "op", "algorithm", "communicator_size",
                      "bytes", "time_us", "algbw_GBps", "busbw_GBps", "ideal_s",
                      "efficiency", "end_p50_s", "end_p99_s", "end_max_s", "fct_p50_s",
                      "fct_p99_s", "fct_max_s", "slowdown_p50", "slowdown_p99", "iteration",
                      "gap_s", "transport", "goodput_ratio")
#: flows.csv: one row per transfer. ``start_s``/``end_s``: from its collective's start (its
#: first rank's, ``start_unix_s`` less ``start_s``); ``fct_s`` = end - start; ``ideal_fct_s``:
#: alone on the idle fabric as emulated, ``slowdown`` = fct / ideal (at least 1), and
#: ``line_rate_fct_s`` alone at line rate, as ns-3 and htsim take it
#: (:mod:`traffic.measure.flows`);
#: ``retransmitted``: on its connections while it was the last transfer started on them
#: (TCP segments from TCP_INFO; the UDP transports' packets); ``src_ports``: one per
#: connection (channel) or queue pair it was split over (``sprayed``: a UDP transport's that
#: sprays, one per packet), ``path``: each one's path as the switches hash it
#: (eBPF switches under ECMP; empty where not known), channels separated by " | "
FLOW_COLUMNS = ("job", "repetition", "label", "op", "src", "dst", "step", "bytes",
                "start_unix_s", "start_s", "end_s", "fct_s", "ideal_fct_s", "slowdown",
                "line_rate_fct_s", "retransmitted", "protocol", "src_ip", "src_ports", "dst_ip",
                "dst_port", "path")

#: ports.csv: ``event``, the index in ``failures``; ``t_s``, from the workload's start (the
#: event's ``applied_s`` on the same clock); ``offered_bytes``, cumulative since the fabric
#: came up (a difference over a window is what the port was offered in it)
PORT_COLUMNS = ("event", "t_s", "port", "offered_bytes")


def experiment_document(raw: dict) -> dict:
    """The experiment as run, with the SHA-256 of its canonical JSON (keys sorted, no
    whitespace)."""
    canonical = json.dumps(raw, sort_keys=True, separators=(",", ":"), default=str)
    return {"sha256": hashlib.sha256(canonical.encode()).hexdigest(), "experiment": raw}


def collectives_csv(rows: list[CollectiveRow]) -> str:
    """``results.json``'s collectives, one CSV row each (:data:`COLLECTIVE_COLUMNS`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLLECTIVE_COLUMNS)
    for r in rows:
        end, fct, slow, transport = r.flow_end_s, r.fct_s, r.slowdown, r.transport
        writer.writerow([r.job, r.repetition, r.label, r.op, r.algorithm, r.communicator_size,
                         r.bytes, _num(r.time_us), _num(r.algbw_GBps), _num(r.busbw_GBps),
                         _num(r.ideal_s), _num(r.efficiency), _num(end.p50), _num(end.p99),
                         _num(end.max), _num(fct.p50), _num(fct.p99), _num(fct.max),
                         _num(slow.p50), _num(slow.p99),
                         "" if r.iteration is None else r.iteration,
                         _num(r.gap_s), transport.transport if transport else "tcp",
                         _num(transport.goodput_ratio if transport else None)])
    return out.getvalue()


def flow_rows(job: int, results: list, connections: tuple = (),
              hashed: list[dict] | None = None) -> list[list]:
    """One job's transfers (``CollectiveResult.flows``), as :data:`FLOW_COLUMNS` rows.
    ``connections``: the job's connections (:class:`traffic.protocol.Connection`, by rank);
    ``hashed``: their paths as hashed (``traffic.json``'s ``connections`` rows)."""
    paths = {(h["src"], h["dst"], h["channel"]): ">".join(
        [h["path"][0].split("->")[0], *(link.split("->")[1] for link in h["path"])])
        for h in hashed or () if h.get("job") == job and h.get("path")}
    by_pair: dict[tuple[str, str], list] = {}  # one job, one rank list: its connections
    if results:
        hosts = results[0].ranks
        for c in sorted(connections, key=lambda c: (c.src, c.dst, c.channel)):
            by_pair.setdefault((hosts[c.src], hosts[c.dst]), []).append(c)
    rows = []
    for repetition, r in enumerate(results):
        transport = r.transport or {}
        protocol = "tcp" if transport.get("transport", "tcp") == "tcp" else "udp"
        for f in r.flows:
            conns = by_pair.get((f.src, f.dst), [])
            first = conns[0] if conns else None
            ports = " ".join(str(c.sport) for c in conns) or (
                "sprayed" if transport.get("spray") else "")
            rows.append([job, repetition, r.label, r.op, f.src, f.dst, f.step, f.bytes,
                         f"{r.start_unix_s + f.start_s:.6f}", _num(f.start_s),
                         _num(f.end_s), _num(round(f.fct_s, 6)), _num(_round(f.ideal_fct_s)),
                         _num(_round(f.slowdown, 4)), _num(_round(f.line_rate_fct_s)),
                         "" if f.retransmitted is None else f.retransmitted,
                         protocol, first.src_ip if first else "", ports,
                         first.dst_ip if first else "", first.dport if first else "",
                         " | ".join(paths.get((f.src, f.dst, c.channel), "") for c in conns)
                         if any((f.src, f.dst, c.channel) in paths for c in conns) else ""])
    return rows


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


def flows_csv(rows: list[list]) -> str:
    """The per-transfer table (:data:`FLOW_COLUMNS`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FLOW_COLUMNS)
    writer.writerows(rows)
    return out.getvalue()


def _num(value) -> str:
    return "" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)


def ports_csv(rows: list[tuple[int, float, str, int]]) -> str:
    """The watched ports' samples (:data:`PORT_COLUMNS`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(PORT_COLUMNS)
    writer.writerows([event, f"{t:.9f}", port, count] for event, t, port, count in rows)
    return out.getvalue()
