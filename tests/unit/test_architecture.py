"""The layering the code promises (README "Layout"): an acyclic import graph across packages,
and pure modules that import no system adapter. Imports inside functions count too."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fabriclab", "testbed", "traffic", "controllers", "telemetry")
# what each package may import from the others (the experiment layer sits on top)
ALLOWED = {"testbed": set(), "traffic": {"testbed"}, "controllers": {"testbed", "telemetry"},
           "telemetry": {"testbed"}, "fabriclab": {"testbed", "traffic", "telemetry"}}
PURE = ["testbed/topology.py", "testbed/spec.py", "testbed/tcplan.py", "testbed/reachability.py",
        "testbed/fidelity.py", "testbed/errors.py", "testbed/poll.py", "testbed/procfs.py",
        "traffic/schedules.py", "traffic/metrics.py", "traffic/patterns.py",
        "traffic/workload.py", "traffic/training.py", "traffic/nccl_log.py",
        "traffic/results.py", "traffic/protocol.py", "traffic/transport.py",
        "controllers/policy.py", "controllers/session.py", "fabriclab/experiment.py",
        "testbed/congestion.py", "testbed/pause.py", "testbed/portplan.py",
        "traffic/transports/packet.py", "traffic/transports/rocev2.py",
        "traffic/transports/uet.py",
        "fabriclab/results.py", "telemetry/metrics.py", "telemetry/promconfig.py",
        "testbed/failplan.py", "traffic/outage.py", "fabriclab/sweep.py",
        "fabriclab/rundir.py", "fabriclab/scale.py", "fabriclab/report.py",
        "traffic/hierarchical.py", "testbed/servers.py", "testbed/partition.py",
        "traffic/ideal.py"]
ADAPTERS = {"mininet", "os_ken", "pyroute2", "subprocess", "socket", "ctypes", "testbed.fabric",
            "testbed.netlink", "testbed.ovs", "testbed.mininet_hosts", "testbed.vm",
            "testbed.bpf", "testbed.ecn", "testbed.pfc", "http", "urllib",
            "docker", "prometheus_client.start_http_server", "telemetry.exporter",
            "telemetry.prometheus", "testbed.environment", "testbed.monitor"}


def imports(path: Path) -> set[str]:
    """Every module a file imports, anywhere in it (absolute names)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_import_only_the_layers_below(package):
    wrong = {}
    for path in modules(package):
        used = {name.split(".")[0] for name in imports(path)} & set(PACKAGES)
        bad = used - ALLOWED[package] - {package}
        if bad:
            wrong[str(path.relative_to(ROOT))] = sorted(bad)
    assert not wrong, f"{package} imports layers above or beside it: {wrong}"


def test_the_package_graph_is_acyclic():
    graph = {p: ALLOWED[p] for p in PACKAGES}
    seen, stack = set(), set()

    def visit(node: str) -> None:
        assert node not in stack, f"cycle through {node}"
        if node in seen:
            return
        stack.add(node)
        for nxt in graph[node]:
            visit(nxt)
        stack.discard(node)
        seen.add(node)

    for package in PACKAGES:
        visit(package)


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_adapter(module):
    used = imports(ROOT / module)
    bad = sorted(n for n in used if n in ADAPTERS or n.split(".")[0] in ADAPTERS)
    assert not bad, f"{module} is pure but imports {bad}"
