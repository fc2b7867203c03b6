"""Telemetry on real fabrics: the exporters' counters agree with the kernel's own, everything
listens on loopback only, and after a short `fabriclab run --telemetry` the run's Prometheus
data answers every dashboard query."""

from __future__ import annotations

import calendar
import html
import json
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import ROOT, experiment
from telemetry import dashboards
from telemetry.exporter import TELEMETRY_FILE, Exporter, FabricCollector, FidelityCollector
from telemetry.prometheus import Prometheus
from testbed.runs.registry import Registry
from traffic.agents.udpflow import run_incast

# 10 Mbit/s hosts, 20 Mbit/s uplinks; priority 3 (DSCP 26) lossless, ECN marked at a step on
# the uplinks (the host ports' queues are PFC's alone, so the incast's stays standing)
FABRIC = ("version: 1\nname: telemetry\nfabric:\n  topology: leaf_spine\n  leaves: 2\n"
          "  spines: 1\n  hosts_per_leaf: 3\n  host_link: {rate_mbps: 10}\n"
          "  fabric_link: {rate_mbps: 20, ecn: {mode: step}}\n  queue: {size_kb: 128}\n"
          "  mtu: 9000\n  traffic_classes: {dscp_to_priority: {26: 3}}\n"
          "  pfc: {priorities: [3]}\n  hosts: {ecn: true}\n")
# a TCP incast in the lossless class (pauses, marks at leaf2's uplink, a standing queue at
# leaf1's port to h1_1 for about 7 s), then a uet all-reduce (the transport's counters)
WORKLOAD = ("workload:\n  dscp: 26\n  timeout_s: 120\n  collectives:\n"
            "    - {op: flows, label: incast, size: 3MiB, pairs: [[h2_1, h1_1], [h2_2, h1_1], "
            "[h2_3, h1_1]]}\n"
            "    - {op: all_reduce, label: uet-ring, size: 1MiB, ranks: [h1_2, h1_3, h2_1, h2_2],"
            " transport: uet}\n")
RATE_INTERVAL = "4s"  # Grafana's $__rate_interval at a 1 s scrape (4 x the interval)


def _text(target: str) -> str:
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as resp:
        return resp.read().decode()


def _parse(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _scrape(target: str) -> dict[str, list]:
    return _parse(_text(target))


def _kernel_links(names: set[str]) -> dict[str, dict]:
    out = subprocess.run(["ip", "-s", "-j", "link", "show"], capture_output=True, text=True,
                         check=True).stdout
    return {l["ifname"]: l["stats64"] for l in json.loads(out) if l["ifname"] in names}


def _kernel_qdisc_drops(ifname: str) -> int:
    """Drops of the port's leaf queues (``tc -s qdisc``: every qdisc below the HTB root)."""
    out = subprocess.run(["tc", "-s", "-j", "qdisc", "show", "dev", ifname],
                         capture_output=True, text=True, check=True).stdout
    return sum(q.get("drops", 0) for q in json.loads(out)
               if q["kind"] in ("bfifo", "pfifo", "tbf", "red", "netem"))


def test_port_counters_agree_with_the_kernel_and_the_exporter_listens_on_loopback(make_fabric):
    fabric = make_fabric(experiment(FABRIC.replace("  pfc: {priorities: [3]}\n", "")))
    run_incast(fabric, ["h2_1", "h2_2", "h2_3"], "h1_1", 120, dscp=26)  # drops at leaf1-eth1
    collector = FabricCollector(fabric)
    with Exporter([collector, FidelityCollector(fabric)]) as exporter:
        listening = subprocess.run(["ss", "-Hltn", f"sport = :{exporter.port}"],
                                   capture_output=True, text=True, check=True).stdout
        assert listening.split()[3] == f"127.0.0.1:{exporter.port}", listening
        exporter_text = _text(exporter.target)
        metrics = _parse(exporter_text)
        kernel = _kernel_links(set(collector.ports))
    ours = {s.labels["switch"] + ":" + s.labels["port"]: s.value
            for s in metrics["fabriclab_port_transmit_bytes"]}
    assert len(ours) == len(collector.ports) == len(kernel)
    for ifname, who in collector.ports.items():
        mine = ours[f"{who.switch}:{who.port}"]
        theirs = kernel[ifname]["tx"]["bytes"]
        assert mine == pytest.approx(theirs, rel=0.02), (ifname, mine, theirs)
    drops = {}
    for s in metrics["fabriclab_port_queue_dropped_packets"]:
        key = s.labels["switch"] + ":" + s.labels["port"]
        drops[key] = drops.get(key, 0) + s.value
    assert drops["leaf1:1"] > 0  # the incast overflowed the receiver's port
    for ifname, who in collector.ports.items():
        assert drops.get(f"{who.switch}:{who.port}", 0) == pytest.approx(
            _kernel_qdisc_drops(ifname), rel=0.02, abs=0), ifname
    vswitchd = metrics["fabriclab_vswitchd_cpu_seconds"]
    assert vswitchd, "no vswitchd CPU"
    served = {sw for s in vswitchd for sw in s.labels["switches"].split(",")}
    assert served == {sw.name for sw in fabric.topo.switches}  # named by their switches
    assert collector.scrape_s < 1.0
    # Prometheus's own linter on both exporters' output: the fabric's and the controller's
    for target in (exporter_text, _text(fabric.controller_status()["metrics"])):
        check = subprocess.run(["promtool", "check", "metrics"], input=target,
                               capture_output=True, text=True, check=False)
        assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr
    assert "process_cpu_seconds_total" in exporter_text
    assert "fabriclab_build_info{" in exporter_text


def test_a_run_with_telemetry_answers_every_dashboard_query(state_dir, tmp_path):
    exp = tmp_path / "telemetry.yaml"
    exp.write_text(FABRIC + WORKLOAD)
    out = tmp_path / "out"
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state_dir),
                           "run", str(exp), "--out", str(out), "--telemetry", "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=400, check=False)
    ended = time.time()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    tele = doc["telemetry"]
    assert set(tele["targets"]) == {"fabric", "controller"}
    assert all(t.startswith("127.0.0.1:") for ts in tele["targets"].values() for t in ts)
    config = yaml.safe_load((out / "prometheus" / "prometheus.yml").read_text())
    assert config["global"]["scrape_interval"] == "1000ms"
    # the data outlives the run: served again as `fabriclab telemetry DIR` does
    with Prometheus(out / "prometheus", {}) as prom:
        assert not _panels_without_data(prom, started, ended)
        busbw = prom.api("query_range", query="fabriclab_collective_busbw_bytes_per_second",
                         start=f"{started:.3f}", end=f"{ended:.3f}", step="1")["result"]
        labels = {s["metric"]["label"]: s["metric"] for s in busbw}
        assert labels["uet-ring"]["transport"] == "uet" and labels["uet-ring"][
            "experiment"] == "telemetry"
        measured = {r["label"]: r["busbw_GBps"] * 1e9 for r in doc["collectives"]}
        assert float(next(s for s in busbw if s["metric"]["label"] == "incast")["values"][-1][
            1]) == pytest.approx(measured["incast"])


def test_a_quickstart_run_with_telemetry_answers_every_dashboard_panel(state_dir, tmp_path):
    """The default experiment as shipped (TCP, ECMP, eBPF switches where the machine has
    them: no PFC, no statistics rounds, maybe no vswitchd): every panel of every dashboard
    has data over the run, what is not in use at 0."""
    out = tmp_path / "quickstart"
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state_dir),
                           "run", str(ROOT / "experiments" / "quickstart.yaml"), "--out",
                           str(out), "--telemetry", "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)
    ended = time.time()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    with Prometheus(out / "prometheus", {}) as prom:
        missing = _panels_without_data(prom, started, ended)
        panels = sum(len(spec.panels) for spec in dashboards.DASHBOARDS)
        assert not missing, f"{len(missing)} of {panels} panels without data:\n" + \
            "\n".join(missing)
        tcp = prom.api("query", query="sum(fabriclab_transport_sent_bytes_total"
                                      '{transport="tcp"})', time=f"{ended:.3f}")["result"]
        # what the ranks of a ring all-reduce (2 (n-1) x size) and an all-to-all ((n-1) x
        # size) send together
        sent = sum({"all_reduce": 2, "all_to_all": 1}[r["op"]] * (r["communicator_size"] - 1)
                   * r["bytes"] for r in json.loads(proc.stdout)["collectives"])
        assert float(tcp[0]["value"][1]) >= sent  # TCP_INFO: every byte sent, and more
    _served_links_show_data(state_dir, out)


def _served_links_show_data(state_dir, out) -> None:
    """``fabriclab telemetry DIR`` (no Grafana): its page of links into Prometheus's graph
    page holds every panel, and each link's query, asked of the Prometheus it serves over the
    link's range, has data."""
    serve = subprocess.Popen([sys.executable, "-m", "fabriclab.cli", "--state-dir",
                              str(state_dir), "telemetry", str(out)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        said = ""
        while "dashboards.html" not in said:
            line = serve.stdout.readline()
            assert line, f"fabriclab telemetry ended: {said}"
            said += line
        page = (out / "prometheus" / "dashboards.html").read_text()
        urls = [html.unescape(u) for u in re.findall(r'<li><a href="([^"]+)"', page)]
        assert len(urls) == sum(len(spec.panels) for spec in dashboards.DASHBOARDS)
        for url in urls:
            parts = urllib.parse.urlsplit(url)
            query = {k: v[0] for k, v in urllib.parse.parse_qs(parts.query).items()}
            end = calendar.timegm(time.strptime(query["g0.end_input"], "%Y-%m-%d %H:%M:%S"))
            start = end - float(query["g0.range_input"].removesuffix("s"))
            params = urllib.parse.urlencode({"query": query["g0.expr"], "start": start,
                                             "end": end, "step": 1})
            base = f"{parts.scheme}://{parts.netloc}"
            with urllib.request.urlopen(f"{base}/api/v1/query_range?{params}",
                                        timeout=10) as resp:
                result = json.load(resp)["data"]["result"]
            assert any(v != "NaN" for s in result for _, v in s["values"]), query["g0.expr"]
            assert parts.path == "/graph"
    finally:
        serve.send_signal(signal.SIGINT)
        serve.communicate(timeout=30)


def _panels_without_data(prom: Prometheus, start: float, end: float) -> list[str]:
    """Every dashboard panel whose query (variables at "all", as Grafana opens a dashboard)
    has no value other than NaN over the run; each variable resolves to something."""
    missing = []
    for spec in dashboards.DASHBOARDS:
        for values in _variable_values(prom, spec, start, end):
            assert values, f"{spec.uid}: a variable resolves to nothing"
        variables = {v.name: ".*" for v in spec.variables}
        for panel in spec.panels:
            expr = dashboards.resolved(panel.expr, variables, RATE_INTERVAL)
            result = prom.api("query_range", query=expr, start=f"{start:.3f}",
                              end=f"{end:.3f}", step="1")["result"]
            if not any(v != "NaN" for series in result for _, v in series["values"]):
                missing.append(f"{spec.uid}: {panel.title}: {expr}")
    for name, _color, expr in dashboards.ANNOTATIONS:  # every collective's marks
        query = dashboards.resolved(expr, {v: ".*" for v in ("experiment", "variant", "cell")},
                                    RATE_INTERVAL, "1s")
        marks = prom.api("query_range", query=query, start=f"{start:.3f}", end=f"{end:.3f}",
                         step="1")["result"]
        if not marks:
            missing.append(f"annotation {name}: {query}")
    return missing


def _variable_values(prom: Prometheus, spec, start: float, end: float) -> list[list[str]]:
    """Each variable's values, as Grafana's ``label_values(metric, label)`` asks for them."""
    out = []
    for var in spec.variables:
        values = prom.api(f"label/{var.label}/values", **{"match[]": var.metric,
                                                          "start": f"{start:.3f}",
                                                          "end": f"{end:.3f}"})
        out.append([v for v in values if re.fullmatch(r"[\w>.:-]+", v)])
    return out


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_top_shows_a_running_fabric_under_tmux(state_dir, tmp_path):
    exp = tmp_path / "telemetry.yaml"
    exp.write_text(FABRIC + WORKLOAD)
    session = f"fabriclab-top-{tmp_path.name}"[:40]
    cli = f"{sys.executable} -m fabriclab.cli --state-dir {state_dir}"
    _tmux("new-session", "-d", "-s", session, "-x", "150", "-y", "60", "-c", str(ROOT),
          f"{cli} run {exp} --out {tmp_path / 'out'} --telemetry --keep; sleep 600")
    try:
        def pane(window: str) -> str:
            return _tmux("capture-pane", "-p", "-t", f"{session}:{window}")

        _wait(lambda: "telemetry: Prometheus at" in pane("0"), 120, "the run to start")
        # every exporter and Prometheus listen on loopback only
        record = _wait(lambda: next(iter(Registry(state_dir).runs()), None), 30, "the record")
        tele = json.loads((Path(record.run_dir) / TELEMETRY_FILE).read_text())
        ports = [t.rsplit(":", 1)[1] for ts in tele["targets"].values() for t in ts]
        ports.append(re.search(r"Prometheus at http://127\.0\.0\.1:(\d+)", pane("0"))[1])
        assert len(ports) == 3, tele
        for port in ports:
            bound = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True,
                                   text=True, check=True).stdout.split()
            assert bound[3] == f"127.0.0.1:{port}", bound
        _tmux("new-window", "-t", session, "-c", str(ROOT), f"{cli} top --interval 1; sleep 600")
        seen = _wait(lambda: (lambda text: text if "latest" in text and "incast" in text
                              else None)(pane("1")), 180, "top to show the finished incast")
        assert "fabriclab top: run" in seen and "leaf->host" in seen, seen
        assert "leaf1:1 -> h1_1" in seen or "leaf1:2 -> h1_2" in seen, seen
        _wait(lambda: "fabric and telemetry stay up" in pane("0"), 120, "the --keep prompt")
        _tmux("send-keys", "-t", f"{session}:1", "C-c")
        _tmux("send-keys", "-t", f"{session}:0", "C-c")
        _wait(lambda: "results:" in pane("0"), 120, "the run's teardown")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["complete"], doc.get("error")


def test_a_standing_prometheus_discovers_the_fabric_that_is_up(make_fabric, tmp_path):
    """The lab VM's Prometheus (on 9090 there) scrapes whichever fabric is up: each run
    announces its exporters in the discovery folder while it runs, and withdraws them."""
    from telemetry.exporter import RunTelemetry
    from telemetry.model.promconfig import standing_config

    discovery = tmp_path / "sd"
    discovery.mkdir()
    fabric = make_fabric(experiment(FABRIC))
    run_id = fabric.record.run_id
    with Prometheus(tmp_path / "standing", {}, config=standing_config(discovery)) as prom:
        with RunTelemetry(fabric, None, 1.0, {"experiment": "telemetry"}, "ecmp",
                          discovery_dir=discovery) as tele:
            files = sorted(p.name for p in discovery.iterdir())
            assert files == [f"{run_id}.controller.json", f"{run_id}.fabric.json"]
            groups = json.loads((discovery / f"{run_id}.fabric.json").read_text())
            assert groups == [{"targets": tele.targets["fabric"],
                               "labels": {"experiment": "telemetry", "run": run_id}}]
            assert str(discovery / f"{run_id}.fabric.json") in fabric.record.files

            def both_up() -> bool:
                up = {s["metric"]["job"]: s["value"][1]
                      for s in prom.query(f'up{{run="{run_id}"}}')}
                return up == {"fabric": "1", "controller": "1"}
            _wait(both_up, 30, "the standing Prometheus to scrape both exporters")
            ports = prom.query(f'count(fabriclab_port_transmit_bytes_total{{run="{run_id}"}})')
            assert int(ports[0]["value"][1]) == len(FabricCollector(fabric).ports)
        assert list(discovery.iterdir()) == []  # withdrawn when the run's telemetry stops
    # a file left by a run that died is removed with the run's other leftovers
    stale = discovery / f"{run_id}.fabric.json"
    stale.write_text("[]")
    fabric.track_file(stale)
    fabric.down()
    assert not stale.exists()
