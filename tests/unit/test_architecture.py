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
PURE = ["testbed/model/topology.py", "testbed/model/spec.py", "testbed/plan/tcplan.py", "testbed/plan/reachability.py",
        "testbed/plan/fidelity.py", "testbed/errors.py", "testbed/poll.py", "testbed/linux/procfs.py",
        "traffic/workloads/schedules.py", "traffic/measure/metrics.py", "traffic/workloads/patterns.py",
        "traffic/workloads/workload.py", "traffic/workloads/training.py", "traffic/workloads/nccl_log.py",
        "traffic/measure/results.py", "traffic/workloads/protocol.py", "traffic/measure/transport.py",
        "controllers/routing/policy.py", "controllers/routing/session.py", "fabriclab/model/experiment.py",
        "testbed/model/congestion.py", "testbed/plan/pause.py", "testbed/plan/portplan.py",
        "traffic/transports/packet.py", "traffic/transports/rocev2.py",
        "traffic/transports/uet.py",
        "fabriclab/model/results.py", "telemetry/model/metrics.py", "telemetry/model/promconfig.py",
        "testbed/plan/failplan.py", "traffic/measure/outage.py", "fabriclab/model/sweep.py",
        "fabriclab/model/rundir.py", "fabriclab/model/scale.py", "fabriclab/report.py",
        "traffic/workloads/hierarchical.py", "testbed/model/servers.py", "testbed/model/partition.py",
        "traffic/measure/ideal.py"]
ADAPTERS = {"mininet", "os_ken", "pyroute2", "subprocess", "socket", "ctypes", "testbed.fabric.fabric",
            "testbed.linux.netlink", "testbed.linux.ovs", "testbed.linux.hosts", "testbed.vm.guest",
            "testbed.linux.bpf", "testbed.fabric.ecn", "testbed.fabric.pfc", "http", "urllib",
            "docker", "prometheus_client.start_http_server", "telemetry.exporter",
            "telemetry.prometheus", "testbed.linux.environment", "testbed.fabric.monitor"}


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
