"""The agent's UDP engine compiled: :class:`NativeUdpEngine` keeps :class:`UdpEngine`'s
interface, sockets and settings, and hands the queue pairs, the loop, pacing, timers, the
delay line and credit grants to ``traffic.native._engine.Host``, which runs them in a thread
of its own without Python's lock (traffic/native/src/host.c). The same packets and counters as
the Python engine (the state machines are checked against it: tests/unit/test_native_*.py);
a fraction of its CPU per packet (bench/agents.py).

Completions come back as tokens: a thread here waits for them and calls the agent's callbacks,
as the Python engine's thread does.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable

from testbed.plan.delayline import EDGES_US, OVER
from traffic.agents import engine as engine_module
from traffic.agents.engine import UdpEngine
from traffic.measure.transport import counter_totals, transport_settings
from traffic.native import engine as compiled
from traffic.transports.packet import wire_bytes

WAIT_S = 0.2  # the completion thread's longest wait (it looks at the stop flag between)


def choose(options: dict | None) -> tuple[type, str]:
    """The engine class the options ask for, and a line saying why another runs ('' where
    the one asked for runs)."""
    wanted = (options or {}).get("engine", "native")
    if wanted == "native" and compiled is None:
        from traffic.native import WHY_NOT
        return UdpEngine, f"transport engine: python ({WHY_NOT})"
    return (NativeUdpEngine if wanted == "native" else UdpEngine), ""


class NativeUdpEngine(UdpEngine):
    """:class:`UdpEngine` compiled (see the module)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.sel.close()  # the compiled loop waits on its own epoll
        credit = None
        if self.credit is not None:
            scale = self.scale
            credit = (self.nic_rate_bps / 8 * scale.mss / wire_bytes(scale.mss),
                      self.cfg.rccc_window_bytes, scale.mss, self.cfg.rccc_initial_bytes)
        addresses = sorted(self.ip_rank.items())
        self.host = compiled.Host(
            self.transport, self.cfg, self.rank, len(self.ips), addresses, self.port,
            self.listen.fileno(), [s.fileno() for s in self.pool], self.nic_rate_bps,
            self.nic_slack_s, self.cnp_tos[2][0], credit, self.timing.delays_s,
            self.timing.rtts_s, engine_module.STALL_LIMIT_S)
        self.callbacks: dict[int, Callable[[], None]] = {}
        self.tokens = itertools.count(1)
        self._errors: list[str] = []
        self.thread = threading.Thread(target=self._complete, name="udp-engine-done",
                                       daemon=True)

    # the base class's constructor sets ``errors``; here they are the compiled loop's
    @property
    def errors(self) -> list[str]:
        if not self._errors and hasattr(self, "host") and self.host.error:
            self._errors.append(self.host.error)
        return self._errors

    @errors.setter
    def errors(self, value: list[str]) -> None:
        self._errors = value

    def start(self) -> None:
        self.host.start()
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.host.stop()
        if self.thread.is_alive():
            self.thread.join(5)
        for sock in [self.listen, *self.pool]:
            sock.close()
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)

    def _complete(self) -> None:
        while not self.stop.is_set():
            for token in self.host.wait(WAIT_S):
                self.callbacks.pop(token)()

    def _token(self, done: Callable[[], None]) -> int:
        token = next(self.tokens)
        self.callbacks[token] = done
        return token

    def send(self, peer: int, channel: int, nbytes: int, done: Callable[[], None]) -> None:
        self.host.send(peer, channel, nbytes, self._token(done), self.address(peer, channel))

    def expect(self, peer: int, channel: int, nbytes: int, done: Callable[[], None]) -> None:
        self.host.expect(peer, channel, nbytes, self._token(done))

    def ping(self, peers: list[int]) -> None:
        for peer in peers:
            self.host.ping(peer, self.address(peer, 0))

    def pinged(self) -> int:
        return self.host.snapshot()["pongs"]

    def summary(self) -> dict:
        snap = self.host.snapshot()
        keys = [f"le_{e}" for e in EDGES_US] + [OVER]
        timing: dict = {"lateness_us": {"tx": dict(zip(keys, snap["late_tx"])),
                                        "rx": dict(zip(keys, snap["late_rx"]))}}
        if snap["rtt_min_s"] is not None:
            timing["rtt_min_us"] = round(snap["rtt_min_s"] * 1e6, 1)
        if snap["rtt_min_ratio"] is not None:
            timing["rtt_min_ratio"] = round(snap["rtt_min_ratio"], 4)
        if snap["probe_min_s"] is not None:
            timing["probe_excess_min_us"] = round(snap["probe_min_s"] * 1e6, 1)
            timing["probe_excess_max_us"] = round(snap["probe_max_s"] * 1e6, 1)
        out = {**transport_settings(self.transport, self.spray, self.cfg), "engine": "native",
               "local_drops": snap["local_drops"], **timing}
        if self.credit is not None:
            out["rx_grants"] = snap["grants"]
        return {**out, **counter_totals(snap["senders"], snap["receivers"])}

    def retransmitted(self, peer: int) -> int:
        snap = self.host.snapshot()
        return sum(s["retransmitted"] for (p, _ch), s in zip(snap["tx_keys"], snap["senders"])
                   if p == peer)

    def stalled(self) -> list[str]:
        out = []
        for row in self.host.snapshot()["stalled"]:
            if row[0] == "tx":
                out.append(f"{self.transport} to rank {row[1]} channel {row[2]}: {row[3]}")
            else:
                out.append(f"{self.transport} from rank {row[1]} channel {row[2]}: "
                           f"{row[3]}/{row[4]} bytes in order")
        return out
