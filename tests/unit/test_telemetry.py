"""Telemetry without root: metric names, types, labels and help; the exposition parses; the
Prometheus configuration; the dashboards are what the code generates and query only metrics
the exporters define."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from telemetry import dashboards

from telemetry.model import metrics
from telemetry.exporter import (CallbackCollector, Exporter, WorkloadCollector, WorkloadState,
                                standard_registry)
from telemetry.model.promconfig import (DISCOVERY_JOBS, discovery_groups, scrape_config, server_args,
                                  standing_config)
from telemetry.model import promconfig
from testbed.model.builders import leaf_spine
from traffic.measure.rows import CollectiveRow

TOPO = leaf_spine(2, 1, 2, host_rate_mbps=10, fabric_rate_mbps=20)
PORTS = metrics.port_labels(TOPO)


def _links(tx: int = 1000) -> dict:
    return {name: {"rx_bytes": 2 * tx, "tx_bytes": tx, "rx_packets": 2, "tx_packets": 1,
                   "rx_dropped": 0, "tx_dropped": 0, "up": name != "spine1-eth1"}
            for name in PORTS}


def _congestion() -> dict:
    return {name: {"queue": {"bytes": 10, "packets": 1, "drops": 3, "backlog_bytes": 9014},
                   "priorities": {
                       0: {"queue": {"bytes": 10, "packets": 1, "drops": 3,
                                     "backlog_bytes": 9014, "marked": 2},
                           "packets": 5, "ect": 4, "marked": 1, "loss_drops": 0},
                       3: {"pfc": {"pause_events": 7, "paused_s": 0.5, "watchdog_events": 0,
                                   "paused": False, "xoff_events": 1}}}}
            for name in PORTS}


ROWS = [CollectiveRow.from_json(
    {"job": 0, "op": "all_reduce", "label": "", "bytes": 1 << 20, "time_us": d * 1e6,
     "busbw_GBps": 0.0005, "algbw_GBps": 0.00025, "efficiency": 0.4,
     "transport": {"transport": "uet", "tx_bytes": 100, "tx_packets": 10,
                   "tx_retransmitted": 1, "rx_out_of_order": 2, "tx_cnps": 0,
                   "tx_rate_cuts": 1, "tx_timeouts": 0}}) for d in (0.3, 3.0)]
STATS = {"switches_expected": 3, "connected": 3, "programmed": 3,
         "ops": {"flow_add": 40, "group_add": 6}, "port_events": 2, "reroutes": 1,
         "links_down": 1, "placements": 4, "moves": 1, "cpu_s": 1.5}


def _all_families() -> list:
    poll = metrics.poll_histogram()
    poll.observe((), 0.02)
    return [*metrics.fabric_families(PORTS, _links(), _congestion()),
            *metrics.collective_families(ROWS, "ecmp",
                                         [{"job": 1, "op": "all_to_all", "label": "moe",
                                           "started_s": 1e9}]),
            *metrics.controller_families(STATS, poll),
            *metrics.fidelity_families({"lab": {"cpu": {"user": 10.0, "idle": 90.0},
                                                  "cores": 2, "vswitchd": {"ovs0": 3.5}}})]


def _exposition() -> str:
    registry = standard_registry()
    registry.register(CallbackCollector(_all_families))
    return generate_latest(registry).decode()


def test_metric_names_types_labels_and_help_follow_node_exporter_style():
    families = list(text_string_to_metric_families(_exposition()))
    assert len(families) >= 35
    for fam in families:
        assert fam.name.startswith(("fabriclab_", "process_")), fam.name  # ours, the standard
        assert fam.documentation, f"{fam.name} has no help"
        assert fam.type in ("counter", "gauge", "histogram"), (fam.name, fam.type)
        for sample in fam.samples:
            # Prometheus's own target labels are never ours; no per-flow labels
            assert not {"job", "instance", "flow", "src", "dst"} & set(sample.labels), sample
            if fam.type == "counter":
                assert sample.name.endswith(("_total", "_created")), sample.name
    units = {f.name for f in families}
    assert {"fabriclab_port_transmit_bytes", "fabriclab_port_queue_bytes",
            "fabriclab_port_pfc_paused_seconds", "fabriclab_collective_duration_seconds",
            "fabriclab_port_speed_bytes", "fabriclab_collective_busbw_bytes_per_second",
            "fabriclab_collective_started_timestamp_seconds"} <= units
    assert not {"fabriclab_controller_cpu_seconds", "fabriclab_port_drops"} & units
    assert not [u for u in units if "bits" in u]  # base units: bytes


def test_port_metrics_carry_the_kernel_and_marker_counters_with_their_labels():
    fams = {f.name: f for f in text_string_to_metric_families(_exposition())}
    tx = fams["fabriclab_port_transmit_bytes"].samples
    assert len(tx) == len(PORTS) and all(s.value == 1000 for s in tx)
    one = next(s for s in tx if s.labels["switch"] == "leaf1" and s.labels["peer"] == "spine1")
    assert one.labels["tier"] == "leaf->spine"
    down = [s.labels["switch"] + ":" + s.labels["port"]
            for s in fams["fabriclab_port_up"].samples if s.value == 0]
    assert down == ["spine1:1"]
    marked = {(s.labels["priority"], s.value)
              for s in fams["fabriclab_port_ecn_marked_packets"].samples}
    assert marked == {("0", 3), ("3", 0)}  # the marker's 1 and the RED leaf's 2; none at 3
    pauses = fams["fabriclab_port_pfc_pause_events"].samples
    assert {(s.labels["priority"], s.value) for s in pauses} == {("0", 0), ("3", 7)}
    drops = {(s.labels["priority"], s.value)
             for s in fams["fabriclab_port_queue_dropped_packets"].samples}
    assert drops == {("0", 3), ("3", 0)}
    speed = {s.labels["tier"]: s.value for s in fams["fabriclab_port_speed_bytes"].samples}
    assert speed == {"leaf->host": 10e6 / 8, "leaf->spine": 20e6 / 8, "spine->leaf": 20e6 / 8}


def test_every_series_a_port_could_have_is_there_at_zero_when_its_feature_is_off():
    """No marker, no PFC, no loss, no queue reading: the port's series still exist (0), so
    a dashboard shows 0 and not "No data"."""
    fams = {f.name: f for f in metrics.fabric_families(PORTS, _links(), {})}
    for family in ("port_queue_dropped_packets", "port_queue_bytes", "port_ecn_marked_packets",
                   "port_link_loss_dropped_packets", "port_trimmed_packets",
                   "port_corrupted_frames", "port_llr_replayed_frames",
                   "port_bad_fcs_dropped_packets", "port_pfc_pause_events",
                   "port_pfc_paused_seconds", "port_cbfc_stall_events",
                   "port_cbfc_stalled_seconds"):
        samples = fams[f"fabriclab_{family}"].samples
        assert len(samples) == len(PORTS) and {s.value for s in samples} == {0}, family
        assert {s.labels["priority"] for s in samples} == {"0"}


def test_collective_metrics_are_cumulative_histograms_and_sums():
    fams = {f.name: f for f in text_string_to_metric_families(_exposition())}
    buckets = {s.labels["le"]: s.value for s in fams["fabriclab_collective_duration_seconds"]
               .samples if s.name.endswith("_bucket")}
    assert buckets["0.25"] == 0 and buckets["0.5"] == 1 and buckets["5"] == 2
    assert buckets["+Inf"] == 2
    sent = {s.labels["transport"]: s for s in fams["fabriclab_transport_sent_bytes"].samples}
    assert sent["uet"].value == 200 and sent["tcp"].value == 0  # tcp: running, from 0
    assert sent["uet"].labels["routing"] == "ecmp"
    assert sent["uet"].labels["label"] == "all_reduce"
    running = fams["fabriclab_collective_started_timestamp_seconds"].samples
    assert [(s.labels["label"], s.labels["transport"], s.value) for s in running] == [
        ("moe", "tcp", 1e9)]
    busbw = fams["fabriclab_collective_busbw_bytes_per_second"].samples
    assert {s.value for s in busbw} == {0.0005e9}
    ops = {s.labels["kind"]: s.value for s in
           fams["fabriclab_controller_openflow_operations"].samples}
    assert ops == {"flow_add": 40, "group_add": 6}


def test_the_exporter_serves_on_loopback_from_a_port_the_os_picks():
    state = WorkloadState("ecmp")
    state.measured(0, ROWS[:1])
    with Exporter([WorkloadCollector(state)]) as exporter:
        assert exporter.host == "127.0.0.1" and exporter.port > 0
        with urllib.request.urlopen(f"http://{exporter.target}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    assert "fabriclab_collective_busbw_bytes_per_second" in text
    # every exporter: the standard process metrics and its build
    assert "process_cpu_seconds_total" in text and 'fabriclab_build_info{python_version="' in text


def test_the_scrape_configuration():
    cfg = scrape_config({"fabric": ["127.0.0.1:9100"], "controller": ["127.0.0.1:9101"],
                         "none": []}, 0.5, {"experiment": "x"})
    assert cfg["global"]["scrape_interval"] == "500ms"
    assert cfg["global"]["scrape_timeout"] == "450ms"
    assert [j["job_name"] for j in cfg["scrape_configs"]] == ["controller", "fabric"]
    assert cfg["scrape_configs"][1]["static_configs"][0] == {
        "targets": ["127.0.0.1:9100"], "labels": {"experiment": "x"}}
    yaml.safe_dump(cfg)
    with pytest.raises(ValueError, match="> 0"):
        scrape_config({}, 0)
    args = server_args("prometheus", "c.yml", "d", "127.0.0.1:9090")
    assert "--web.listen-address=127.0.0.1:9090" in args
    # nobody stops it or deletes its data over HTTP
    assert not any(a.startswith(("--web.enable-lifecycle", "--web.enable-admin-api"))
                   for a in args)


def test_the_standing_configuration_discovers_the_runs_exporters(tmp_path, capsys):
    """The lab VM's Prometheus: one job per exporter kind, as in a run's own configuration (so
    the dashboards work on both), targets from the files runs write while they are up."""
    cfg = standing_config(tmp_path, 2.0)
    assert cfg["global"]["scrape_interval"] == "2000ms"
    jobs = {j["job_name"]: j["file_sd_configs"][0]["files"] for j in cfg["scrape_configs"]}
    assert jobs == {job: [str(tmp_path / f"*.{job}.json")] for job in DISCOVERY_JOBS}
    assert set(DISCOVERY_JOBS) == {j["job_name"] for j in scrape_config(
        {"fabric": ["a:1"], "controller": ["b:2"]})["scrape_configs"]}
    assert discovery_groups(["127.0.0.1:1"], {"run": "r"}) == [
        {"targets": ["127.0.0.1:1"], "labels": {"run": "r"}}]
    with pytest.raises(ValueError, match="> 0"):
        standing_config(tmp_path, 0)
    assert cfg["global"]["scrape_timeout"] == "2000ms"  # a slow scrape is late, not down
    assert promconfig.main(["standing", str(tmp_path)]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == standing_config(tmp_path)
    assert promconfig.main(["other"]) == 2
    assert promconfig.main(["standing", "--virt"]) == 2


@pytest.mark.parametrize("virt,interval,grafana", [("kvm", 1.0, "1s"), ("none", 1.0, "1s"),
                                                   ("qemu", 5.0, "5s"), ("qemu\n", 5.0, "5s")])
def test_the_standing_interval_follows_whether_the_cpu_is_emulated(tmp_path, capsys, virt,
                                                                    interval, grafana):
    """Under QEMU without KVM the exporter answers in 0.5-1.4 s: 1 s scrapes would time out."""
    assert promconfig.standing_interval(virt) == interval
    assert promconfig.main(["standing", str(tmp_path), "--virt", virt]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg == standing_config(tmp_path, interval)
    assert promconfig.main(["grafana-interval", "--virt", virt]) == 0
    assert capsys.readouterr().out.strip() == grafana
    assert promconfig.grafana_interval(1.5) == "1500ms"
    assert promconfig.scrape_interval_of(cfg) == interval  # read back when a run is served


def test_a_scrape_interval_is_read_back_from_a_configuration():
    of = promconfig.scrape_interval_of
    assert of(scrape_config({"fabric": ["a:1"]}, 2.5)) == 2.5
    assert of({"global": {"scrape_interval": "15s"}}) == 15.0 and of({}) == 60.0
    with pytest.raises(ValueError, match="scrape_interval"):
        of({"global": {"scrape_interval": "1m30s"}})


def test_the_committed_dashboards_are_what_the_code_generates_and_fit_the_sdk_model():
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    for spec in dashboards.DASHBOARDS:
        path = dashboards.OUT_DIR / f"{spec.uid}.json"
        assert path.read_text() == dashboards.render(spec), \
            f"{path} is stale: run python -m telemetry.dashboards"
        doc = json.loads(path.read_text())
        model = Dashboard.from_json(doc)  # the SDK's model reads it back unchanged
        assert json.loads(JSONEncoder(sort_keys=True).encode(model)) == doc
        assert model.uid == spec.uid and len(model.panels) == len(spec.panels)


def test_every_dashboard_query_uses_exported_metrics_and_resolvable_variables():
    exported = set()
    for fam in text_string_to_metric_families(_exposition()):
        exported |= {s.name for s in fam.samples}
    for spec in dashboards.DASHBOARDS:
        board = json.loads(dashboards.render(spec))
        names = {v["name"] for v in board.get("templating", {}).get("list", [])}
        for var in spec.variables:
            assert var.metric in exported
            if var in dashboards.RUN_VARIABLES:  # the run's labels: Prometheus puts them on
                assert var.label in scrape_config({"fabric": ["h:1"]}, 1.0, {
                    "experiment": "x", "variant": "v", "cell": "c"})[
                    "scrape_configs"][0]["static_configs"][0]["labels"]
                continue
            assert any(var.label in s.labels for f in text_string_to_metric_families(
                _exposition()) for s in f.samples if s.name == var.metric), var
        # the datasource is a variable (any Prometheus), the provisioned one by default
        (source,) = [v for v in board["templating"]["list"] if v["name"] == "datasource"]
        assert source["current"]["value"] == dashboards.DATASOURCE_UID
        assert source["query"] == "prometheus"
        for mark in board["annotations"]["list"]:
            assert mark["datasource"]["uid"] == "${datasource}"
            used = set(re.findall(r"fabriclab_[a-z_]+", mark["expr"]))
            assert used and used <= exported, mark["name"]
        for panel in board["panels"]:
            assert panel["datasource"]["uid"] == "${datasource}"
            for target in panel["targets"]:
                used = set(re.findall(r"(?:fabriclab|process)_[a-z_]+", target["expr"]))
                assert used and used <= exported, (panel["title"], used - exported)
                assert set(re.findall(r"\$(\w+)", target["expr"])) <= names | {
                    "__rate_interval"}, panel["title"]


def test_top_shows_the_busiest_links_per_tier_and_the_collectives():
    from rich.console import Console

    from telemetry.model import top

    def text(tx: int) -> str:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(CallbackCollector(lambda: [
            *metrics.fabric_families(PORTS, _links(tx), _congestion()),
            *metrics.collective_families(ROWS, "ecmp", [{"job": 1, "op": "all_to_all",
                                                        "label": "moe", "started_s": 100.0}])]))
        return generate_latest(registry).decode()

    fr = top.frame(top.parse(text(1000)), top.parse(text(1000 + 625_000)), 1.0, 130.0)
    util = {(r.switch, r.port): r.utilization for r in fr.ports}
    assert util[("leaf1", "1")] == pytest.approx(0.5)  # 5 Mbit/s on a 10 Mbit/s host link
    assert util[("leaf1", "3")] == pytest.approx(0.25)  # on the 20 Mbit/s uplink
    assert [r.up for r in fr.ports if r.switch == "spine1" and r.port == "1"] == [False]
    assert fr.running == [("moe", "all_to_all", "tcp", 30.0)]
    console = Console(width=120, record=True)
    console.print(top.render(fr, per_tier=2))
    shown = console.export_text()
    assert "leaf->spine" in shown and "leaf1:3 -> spine1" in shown
    assert "running 30 s" in shown and "(down)" in shown


def test_the_command_line_telemetry_options_name_the_bad_flag():
    from rich.console import Console

    from fabriclab.cli import main as cli
    from testbed.errors import ConfigError

    parser = cli.build_parser()

    def options(*argv):
        return cli.telemetry_options(parser.parse_args(["run", "x.yaml", "--out", "o", *argv]),
                                     Console())

    opts = options("--telemetry", "--scrape-interval", "0.5", "--exporter", "127.0.0.1:9105")
    assert (opts.prometheus, opts.interval_s, opts.exporter_port) == (True, 0.5, 9105)
    assert options().exporter_host == "127.0.0.1"
    for argv, flag in ((["--keep"], "--keep"), (["--scrape-interval", "0"], "--scrape-interval"),
                       (["--exporter", "9100"], "--exporter"),
                       (["--exporter", "127.0.0.1:99999"], "--exporter")):
        with pytest.raises(ConfigError) as err:
            options(*argv)
        assert err.value.path == flag


def test_grafana_has_a_random_admin_password_kept_0600_and_anonymous_viewers_only(tmp_path):
    import stat

    from telemetry.grafana import grafana_environment, save_password

    env = grafana_environment(9090, 3000, 1.0, "x9Vq-3kLm_pQ2rTz")
    assert env["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"  # never Admin or Editor
    assert env["GF_SECURITY_ADMIN_PASSWORD"] == "x9Vq-3kLm_pQ2rTz"
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    for weak in ("admin", "short"):
        with pytest.raises(ValueError):
            grafana_environment(9090, 3000, 1.0, weak)
    path = save_password(tmp_path, "x9Vq-3kLm_pQ2rTz")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip() == "x9Vq-3kLm_pQ2rTz"


def test_every_panel_becomes_a_link_into_prometheus_graph_page():
    """Where Grafana cannot run: each dashboard's panels as links whose parameters Prometheus's
    graph page reads back (the query with variables at "all", the run's range and end)."""
    from urllib.parse import parse_qs, urlsplit

    links = dashboards.graph_links("http://127.0.0.1:9090", 1_800_000_000.2, 1_800_000_090.5,
                                   "4s")
    assert list(links) == [spec.title for spec in dashboards.DASHBOARDS]
    for spec in dashboards.DASHBOARDS:
        all_url, panels = links[spec.title]
        assert [p.title for p in panels] == [p.title for p in spec.panels]
        together = parse_qs(urlsplit(all_url).query)
        assert len([k for k in together if k.endswith(".expr")]) == len(spec.panels)
        for panel, link in zip(spec.panels, panels):
            url = urlsplit(link.url)
            assert (url.scheme, url.netloc, url.path) == ("http", "127.0.0.1:9090", "/graph")
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            assert query["g0.expr"] == link.expr == dashboards.resolved(
                panel.expr, {v.name: ".*" for v in spec.variables}, "4s")
            assert "$" not in link.expr
            assert (query["g0.range_input"], query["g0.end_input"], query["g0.tab"]) == (
                "91s", "2027-01-15 08:01:31", "0")
    page = dashboards.links_page(links, "fabriclab: quickstart")
    assert page.count("<h2>") == len(dashboards.DASHBOARDS)
    assert page.count("<li>") == sum(len(s.panels) for s in dashboards.DASHBOARDS)


def test_a_past_runs_dashboards_open_on_its_time_range():
    links = dashboards.grafana_links("http://127.0.0.1:3000", 1000.2, 1060.7)
    assert set(links) == {spec.title for spec in dashboards.DASHBOARDS}
    assert links["fabriclab / fabric"] == (
        "http://127.0.0.1:3000/d/fabriclab-fabric?from=1000200&to=1060700")
