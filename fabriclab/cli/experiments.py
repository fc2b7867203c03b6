"""``fabriclab validate`` and ``fabriclab schema``: experiment files checked and explained,
nothing built. Imports only pure modules: fast, and no root needed."""

from __future__ import annotations

import dataclasses
import os
import platform
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from fabriclab.cli.output import EXIT_CONFIG, EXIT_OK, emit, error_console
from fabriclab.cli.requests import SchemaRequest, ValidateRequest
from fabriclab.model import experiment as xp
from fabriclab.model import prediction
from fabriclab.model.document import json_schema as results_schema
from testbed.errors import ConfigError
from testbed.model import servers
from testbed.model.partition import Machine, Partition, partition
from testbed.plan.datapaths import expected as expected_datapath
from testbed.plan.fidelity import assess, machine_budget_mbit_hops, saturation_table


def validate(req: ValidateRequest, ui: Console) -> int:
    """Every file checked (a bad one does not stop the rest); what each would build."""
    docs, failed = [], 0
    for path in req.files:
        try:
            exp = xp.load(path)
        except ConfigError as err:
            failed += 1
            error_console().print(f"[red]{escape(str(path))}: config error:[/red] "
                                  f"{escape(str(err))}")
            docs.append({"file": str(path), "ok": False, "field": err.path,
                         "error": err.message,
                         "errors": [{"field": f, "message": m} for f, m in err.problems]})
            continue
        doc, ok = _explain(exp, path, req.machines, ui)
        failed += not ok
        docs.append(doc)
    if req.json:
        emit(docs)
    return EXIT_CONFIG if failed else EXIT_OK


def _explain(exp: xp.Experiment, path, machines: int, ui: Console) -> tuple[dict, bool]:
    """What ``exp`` builds, printed; its JSON line, and whether its partition (if asked) fits."""
    counts = exp.topology.counts()
    # the kernel's Open vSwitch module, as far as validate looks (no netlink probe here)
    ovs_kernel = Path("/sys/module/openvswitch").is_dir()
    datapath = expected_datapath(exp, ovs_kernel, platform.machine())
    verdict = assess(exp.topology, exp.fabric.mtu, saturation_table(datapath))
    ui.print(f"{path}: ok ({exp.topology.kind}, {counts['switches']} switches, "
             f"{counts['hosts']} hosts, {counts['links']} links)")
    where = ("the eBPF datapath" if datapath == "ebpf" else
             "Open vSwitch's kernel datapath (no budget measured; the userspace one's)"
             if ovs_kernel else "the userspace datapath")
    ui.print(f"  on {where}: {verdict.explain()}"
             + ("" if verdict.fits else " -- over the headroom"))
    if exp.topology.servers:
        ui.print(f"  servers: {servers.describe(exp.topology)}")
    count = machines or (exp.cluster.machines if exp.cluster else 0)
    if exp.cluster is not None:
        ui.print(f"  on the Ray cluster at {exp.cluster.address}"
                 + ("" if count else " (--machines N shows a plan over N machines like this "
                                     "one)"))
    plan, ok = None, True
    if count:
        budget = machine_budget_mbit_hops(exp.fabric.mtu, os.cpu_count() or 1,
                                          saturation_table(datapath))
        try:
            plan = partition(exp.topology, [Machine(f"machine{i + 1}", budget)
                                            for i in range(count)])
        except ConfigError as err:
            ok = False
            error_console().print(f"[red]{escape(str(path))}: over {count} machines:[/red] "
                                  f"{escape(str(err))}")
        else:
            ui.print(f"  over {count} machines like this one:")
            for line in plan.describe():
                ui.print(f"    {line}")
    scale = None
    if exp.time_scale is not None:
        scale = {**exp.time_scale.to_json(), "expected_wall_s": _expected_wall_s(exp)}
        ui.print(f"  {exp.time_scale.describe()}")
        for bound in exp.time_scale.bounds:
            ui.print(f"    N >= {bound.least:,.0f} for {bound.name}: {bound.why}")
        walls = scale["expected_wall_s"]
        ui.print(f"  expected workload wall time: at least {sum(walls.values()):,.0f} s"
                 + (f" ({', '.join(f'{k} {v:,.0f} s' for k, v in walls.items())})"
                    if len(walls) > 1 else "")
                 + " (the predicted transfers and one base RTT per step; losses, timeouts "
                   "and bring-up come on top)")
    ecn = ecn_text(exp)
    for tier, text in ecn.items():
        ui.print(f"  ECN at the switch ports of {tier} links: {text}")
    pfc = exp.pfc.describe() if exp.pfc is not None else None
    if pfc:
        ui.print(f"  PFC (lossless) {pfc}")
    if exp.variants:
        ui.print(f"  variants: {', '.join(v.variant for v in exp.variants)}")
    if exp.cells:
        groups = list(dict.fromkeys(c.plan.group for c in exp.cells))
        reps = len(exp.cells) // len(groups)
        ui.print(f"  sweep: {len(exp.cells)} runs: {len(groups)} cells x {reps} "
                 f"repetition(s): {', '.join(groups[:6])}"
                 + (f", ... {groups[-1]}" if len(groups) > 6 else ""))
    doc = {"file": str(path), "ok": True, "experiment": exp.name, "counts": counts,
           "collectives": exp.workload.collective_count if exp.workload else 0,
           "fidelity": {"load": verdict.load, "fits": verdict.fits,
                        "max_rate_mbps": verdict.max_rate_mbps},
           "ecn": ecn, "pfc": pfc, "base_rtt_s": exp.base_rtt_s,
           "variants": [v.variant for v in exp.variants],
           "sweep": [c.name for c in exp.cells]}
    if plan is not None:
        doc["partition"] = _partition_doc(plan)
    if scale is not None:
        doc["time_scale"] = scale
    return doc, ok


MAX_WALL_TARGETS = 20  # variants or cells whose wall time validate predicts one by one


def _expected_wall_s(exp: xp.Experiment) -> dict[str, float]:
    """A time-scaled experiment's workload in wall seconds, per variant (or the base): the
    predicted transfers (a few hash draws) and one emulated base RTT per step, which the
    prediction leaves out and a scaled fabric makes long."""
    out = {}
    targets = prediction.targets(exp)
    if len(targets) > MAX_WALL_TARGETS:  # a large sweep: its first cells, the rest alike
        first = _expected_wall_s(dataclasses.replace(exp, variants=(), cells=()))
        return {f"{len(targets)} runs of about": next(iter(first.values()))}
    for name, one in targets:
        out[name or exp.name] = round(prediction.workload_wall_s(one), 1)
    return out


def _partition_doc(plan: Partition) -> dict:
    return {"machines": {m.name: {"nodes": plan.nodes(m.name),
                                  "load_mbit_hops": plan.load[m.name],
                                  "budget_mbit_hops": m.budget_mbit_hops}
                         for m in plan.machines},
            "cut_links": [link.name for link in plan.cut]}


def ecn_text(exp: xp.Experiment) -> dict[str, str]:
    """Per link tier, the marking of each priority (``0-7: step K=26.4 KiB``), when any."""
    out = {}
    for tier in ("host", "fabric"):
        table = exp.port_ecn(tier)
        if all(t.mode == "off" for t in table):
            continue
        groups: dict[str, list[int]] = {}
        for prio, th in enumerate(table):
            groups.setdefault(th.describe(), []).append(prio)
        out[tier] = "; ".join(f"priority {','.join(map(str, p)) if len(p) < 8 else '0-7'}: {d}"
                              for d, p in groups.items())
    return out

def schema(req: SchemaRequest, _ui: Console) -> int:
    """The experiment file's JSON Schema (``--results``: results.json's), on stdout."""
    emit(results_schema() if req.results else xp.schema())
    return EXIT_OK
