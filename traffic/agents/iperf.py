"""iperf3 on a fabric: TCP flows between hosts, measured by the receiver (the harness the
capacity benchmark and the integration tests share). Every process is a fabric service
(:meth:`testbed.fabric.fabric.Fabric.spawn`), ended by PID.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass

from testbed.errors import TestbedError
from testbed.poll import wait_for

BASE_PORT = 5201
CLIENT_PORT = 40001


@dataclass(frozen=True)
class Flow:
    """One iperf3 flow: ``src`` sends to ``dst`` from TCP port ``cport`` to ``port``."""

    src: str
    dst: str
    port: int
    cport: int


def plan(pairs: list[tuple[str, str]], base_port: int = BASE_PORT,
         client_port: int = CLIENT_PORT) -> list[Flow]:
    """One flow per (source, destination) pair, each with its own server and client port."""
    return [Flow(s, d, base_port + n, client_port + n) for n, (s, d) in enumerate(pairs)]


def _listening(fabric, host: str, port: int) -> bool:
    proc = fabric.spawn(host, ["ss", "-Hltn", f"sport = :{port}"], f"ss:{host}")
    try:
        out, _ = proc.communicate(timeout=10)
    finally:
        fabric.stop(proc)
    return bool(out.strip())


def run(fabric, flows: list[Flow], duration_s: int, on_start=None) -> dict[Flow, float]:
    """Run every flow at once for ``duration_s``; returns the Mbit/s each one's receiver got.

    Args:
        fabric: a running fabric.
        flows: the flows (see :func:`plan`).
        duration_s: how long the clients send.
        on_start: called just before the clients start (e.g. to sample counters).

    Raises:
        TestbedError: a server that does not listen, or a client that fails (with its output).
    """
    servers, clients = [], {}
    try:
        for flow in flows:
            servers.append(fabric.spawn(flow.dst, ["iperf3", "-s", "-1", "-p", str(flow.port)],
                                        f"iperf3-server:{flow.dst}:{flow.port}"))
        for flow in flows:
            wait_for(lambda f=flow: _listening(fabric, f.dst, f.port), 10,
                     f"the iperf3 server on {flow.dst}:{flow.port} to listen")
        if on_start is not None:
            on_start()
        for flow in flows:
            clients[flow] = fabric.spawn(
                flow.src, ["iperf3", "-c", fabric.topo.nodes[flow.dst].ip, "-p", str(flow.port),
                           "--cport", str(flow.cport), "-t", str(duration_s), "-J"],
                f"iperf3-client:{flow.src}")
        out = {}
        for flow, proc in clients.items():
            try:
                stdout, stderr = proc.communicate(timeout=duration_s + 60)
            except subprocess.TimeoutExpired:
                raise TestbedError(f"iperf3 {flow.src} -> {flow.dst} did not finish") from None
            try:
                out[flow] = json.loads(stdout)["end"]["sum_received"]["bits_per_second"] / 1e6
            except (ValueError, KeyError) as err:
                raise TestbedError(f"iperf3 {flow.src} -> {flow.dst} failed (exit "
                                   f"{proc.returncode})", stderr=stdout[-300:] + stderr[-300:]
                                   ) from err
        return out
    finally:
        for proc in [*clients.values(), *servers]:
            fabric.stop(proc)
