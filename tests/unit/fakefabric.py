"""A fake running fabric (:class:`testbed.contract.RunningFabric`): no namespaces, no
switches, no processes. Its congestion counters grow by what the test says, its monitor
answers fixed samples, its services run as real threads; everything it is asked is logged."""

from __future__ import annotations

import threading
from pathlib import Path

from testbed.model.spec import TestbedSpec
from testbed.plan.reachability import Reachability


class FakeMonitor:
    def __init__(self) -> None:
        self.stopped = False

    def snapshot(self) -> dict:
        return {}

    def report(self) -> dict:
        return {"verdict": "ok", "reasons": [], "idle_pct": {"median": 50.0}}

    def timeline(self) -> dict:
        return {"t_s": [0.0], "idle_pct": [50.0]}


class FakeFabric:
    """A fabric that is up from ``__enter__`` to ``down``; ``run_dir`` is a real folder."""

    plan = None
    fidelity = None
    red_marking = False
    pfc_agent = None

    def __init__(self, spec: TestbedSpec, state_dir: Path, **_kwargs) -> None:
        self.spec = spec
        self.topo = spec.topology
        self.state_dir = Path(state_dir)
        self.timings: dict[str, float] = {}
        self.warnings: list[str] = []
        self.dead: set[str] = set()  # switches whose vswitchd a test declares dead
        self.service_errors: list[str] = []
        self.controller_events: list[dict] = []
        self.record = None
        self.log: list[str] = []
        self.sent_bytes = 0  # what the switch ports' counters say, summed
        self.threads: list[tuple[threading.Thread, threading.Event]] = []
        self.monitor = FakeMonitor()

    # -- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> FakeFabric:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "controller.log").write_text("controller started\n")
        self.record = object()
        self.log.append("up")

    def down(self) -> None:
        for thread, stop in self.threads:
            stop.set()
            thread.join(5)
        self.threads.clear()
        self.record = None
        self.log.append("down")

    def restart_controller(self, spec: TestbedSpec) -> None:
        self.spec = spec
        self.log.append("restart")

    # -- what it is ---------------------------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        return self.state_dir / "work" / "fake"

    @property
    def datapath_type(self) -> str | None:
        return "fake"

    @property
    def vswitchd_count(self) -> int:
        return 0

    @property
    def controller_address(self) -> str:
        return "127.0.0.1:0"

    def controller_status(self) -> dict:
        return {"routing": str(self.spec.controller.routing), "cpu_s": 0.5, "links_down": []}

    def placement(self) -> dict | None:
        return None

    def delay_relay_counters(self) -> dict | None:
        return None

    # -- services and processes ---------------------------------------------------------------
    def spawn(self, host, argv, role, **popen_kwargs):
        raise AssertionError(f"the fake fabric runs no process ({role})")

    def stop(self, proc, timeout_s: float = 5.0) -> int | None:
        return 0

    def start_thread(self, target, role: str) -> threading.Thread:
        stop = threading.Event()
        thread = threading.Thread(target=target, args=(stop,), name=role, daemon=True)
        self.threads.append((thread, stop))
        thread.start()
        return thread

    def stop_thread(self, thread: threading.Thread) -> None:
        for item in [t for t in self.threads if t[0] is thread]:
            item[1].set()
            thread.join(5)
            self.threads.remove(item)

    def start_monitor(self, queue_interval_s: float):
        self.log.append("monitor")

        def stop() -> None:
            self.monitor.stopped = True
            self.log.append("monitor stopped")

        return self.monitor, stop

    def track_process(self, pid: int, role: str) -> None:
        self.log.append(f"track {role}")

    def track_file(self, path: Path) -> None:
        self.log.append(f"track {path}")

    def write_file(self, name: str, text: str) -> Path:
        path = self.run_dir / name
        path.write_text(text)
        return path

    def read_file(self, name: str, host: str | None = None) -> str:
        return (self.run_dir / name).read_text()

    def run_parallel(self, commands, timeout_s: float):
        return {host: (0, "", "") for host in commands}

    # -- what it measures ---------------------------------------------------------------------
    def reachability(self, count: int = 2, timeout_s: float = 120.0) -> Reachability:
        raise AssertionError("the fake fabric probes nothing")

    def cut_off(self, hosts: list[str]) -> str | None:
        return None

    def dead_switches(self) -> set[str]:
        return set(self.dead)

    def switch_ports(self) -> set[str]:
        return {e.ifname for link in self.topo.links for e in (link.a, link.b)
                if self.topo.nodes[e.node].is_switch}

    def congestion(self, netlink=None) -> dict[str, dict]:
        """Every switch port with the same counters: ``sent_bytes`` spread evenly."""
        ports = sorted(self.switch_ports())
        each = self.sent_bytes // max(1, len(ports))
        return {p: {"queue": {"bytes": each, "packets": each // 1500, "drops": 0,
                              "overlimits": 0, "backlog_bytes": 0, "backlog_packets": 0}}
                for p in ports}

    def link_counters(self, names: set[str], netlink=None) -> dict:
        return {}

    def vswitchd_pids(self) -> dict[str, int]:
        return {}

    def cpu_times(self) -> dict[str, dict]:
        return {}

    def set_links(self, pairs, up: bool, netlink=None) -> dict[str, float]:
        self.log.append(f"set_links {pairs} {'up' if up else 'down'}")
        return {"cut_s": 0.0}

    def cut_drops(self, pairs, netlink=None) -> int | None:
        return None

    def set_rates(self, pairs, factor: float, netlink=None) -> dict[str, float]:
        self.log.append(f"set_rates {pairs} x{factor:g}")
        return {"rated_s": 0.0}

    def offered_bytes(self, names: set[str]) -> dict[str, int] | None:
        return None

    def rate_factors(self) -> dict[str, float]:
        return {}

    def switch_notices(self) -> list[tuple[float, str, int, tuple[int, ...]]]:
        return []

    def largest_packets(self, names: set[str]) -> dict[str, int]:
        return {}
