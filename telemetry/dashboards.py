"""Grafana dashboards as code (grafana-foundation-sdk): the fabric overview, collective
performance, controller activity and emulator fidelity, over the exporters' metrics.

Every panel is declared once in :data:`DASHBOARDS` (title, PromQL, unit, kind), so the
integration test runs exactly the queries Grafana would. ``python -m telemetry.dashboards``
writes the JSON into ``telemetry/grafana/dashboards/`` (the provisioning layout Grafana and
the lab VM mount); a unit test checks the committed files are what this module generates.
"""

from __future__ import annotations

import html
import json
import math
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import heatmap, stat, timeseries
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableOption, VariableRefresh
from testbed.linux.files import make_dirs, write_text_atomic

DATASOURCE_UID = "fabriclab-prometheus"  # the provisioned one: the datasource variable's default
#: every panel's and variable's datasource: the dashboard's ``datasource`` variable, so that a
#: Grafana with several Prometheus servers (one per run kept) shows any of them
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
OUT_DIR = Path(__file__).resolve().parent / "grafana" / "dashboards"
RATE = "$__rate_interval"
#: which run: every series carries the run's experiment, variant and cell (the run's own
#: directory: a sweep cell's, a variant's, a single run's) as labels
RUN = 'experiment=~"$experiment", variant=~"$variant", cell=~"$cell"'
PORT = f'switch=~"$switch", tier=~"$tier", {RUN}'
UTIL = (f"rate(fabriclab_port_transmit_bytes_total{{{PORT}}}[{RATE}])"
        f" / fabriclab_port_speed_bytes{{{PORT}}}")
#: a panel whose series exist only while its feature works (collectives, statistics rounds)
#: shows 0 rather than nothing when it does not
ZERO = " or on() vector(0)"
JOB = f'workload_job=~"$job", {RUN}'


@dataclass(frozen=True)
class PanelSpec:
    """One panel: what it shows and the query behind it."""

    title: str
    expr: str
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | heatmap | stat
    legend: str = ""
    description: str = ""


def resolved(expr: str, variables: dict[str, str], rate_interval: str,
             interval: str | None = None) -> str:
    """``expr`` with its dashboard variables, ``$__rate_interval`` and ``$__interval`` (the
    query's step; default: the rate interval) filled in, as Grafana sends it to Prometheus."""
    expr = expr.replace("$__rate_interval", rate_interval)
    expr = expr.replace("$__interval", interval or rate_interval)
    for name, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(f"${name}", value)
    return expr


@dataclass(frozen=True)
class Variable:
    """A dashboard variable filled from a label's values."""

    name: str
    metric: str
    label: str


@dataclass(frozen=True)
class DashboardSpec:
    uid: str
    title: str
    variables: tuple[Variable, ...]
    panels: tuple[PanelSpec, ...]


#: the run's variables, first on every dashboard
RUN_VARIABLES = tuple(Variable(label, "fabriclab_build_info", label)
                      for label in ("experiment", "variant", "cell"))
PORT_VARIABLES = (Variable("switch", "fabriclab_port_transmit_bytes_total", "switch"),
                  Variable("tier", "fabriclab_port_transmit_bytes_total", "tier"))
ENDED = f"fabriclab_collective_duration_seconds_count{{{RUN}}}"
#: marks on every dashboard's time axis: each collective's start (the first sample of its
#: start timestamp's series) and each collective's end (its count going up, or appearing)
ANNOTATIONS = (
    ("collective starts", "green",
     f"fabriclab_collective_started_timestamp_seconds{{{RUN}}} unless "
     f"fabriclab_collective_started_timestamp_seconds{{{RUN}}} offset $__interval"),
    ("collective ends", "#8e8e8e",
     f"(sum by (workload_job, label) ({ENDED} - {ENDED} offset $__interval) > 0) or "
     f"(sum by (workload_job, label) ({ENDED}) unless sum by (workload_job, label) "
     f"({ENDED} offset $__interval))"),
)

DASHBOARDS = (
    DashboardSpec("fabriclab-fabric", "fabriclab / fabric", (*RUN_VARIABLES, *PORT_VARIABLES), (
        PanelSpec("Utilization per tier (max over links)", f"max by (tier) ({UTIL})",
                  "percentunit", legend="{{tier}}"),
        PanelSpec("Utilization per link", UTIL, "percentunit", "heatmap",
                  "{{switch}}:{{port}} -> {{peer}}"),
        PanelSpec("Egress queue per port", f"sum by (switch, port, peer) "
                  f"(fabriclab_port_queue_bytes{{{PORT}}})", "bytes",
                  legend="{{switch}}:{{port}} -> {{peer}}"),
        PanelSpec("ECN marks", f"sum by (switch, port, priority) "
                  f"(rate(fabriclab_port_ecn_marked_packets_total{{{PORT}}}[{RATE}]))", "pps",
                  legend="{{switch}}:{{port}} p{{priority}}"),
        PanelSpec("PFC pauses received", f"sum by (switch, port, priority) "
                  f"(rate(fabriclab_port_pfc_pause_events_total{{{PORT}}}[{RATE}]))", "ops",
                  legend="{{switch}}:{{port}} p{{priority}}"),
        PanelSpec("Share of time paused by PFC", f"sum by (switch, port, priority) "
                  f"(rate(fabriclab_port_pfc_paused_seconds_total{{{PORT}}}[{RATE}]))",
                  "percentunit", legend="{{switch}}:{{port}} p{{priority}}"),
        PanelSpec("Queue drops", f"sum by (switch, port) "
                  f"(rate(fabriclab_port_queue_dropped_packets_total{{{PORT}}}[{RATE}]))", "pps",
                  legend="{{switch}}:{{port}}"),
        PanelSpec("Ports down", f"count(fabriclab_port_up{{{PORT}}} == 0) or "
                  f"(count(fabriclab_port_up{{{PORT}}}) * 0)", "short", "stat",
                  description="Switch ports whose link has no carrier (failed links)."),
    )),
    DashboardSpec("fabriclab-collectives", "fabriclab / collectives", (
        *RUN_VARIABLES,
        Variable("job", "fabriclab_collective_busbw_bytes_per_second", "workload_job")), (
        PanelSpec("Bus bandwidth (latest collective)",
                  f"fabriclab_collective_busbw_bytes_per_second{{{JOB}}}{ZERO}", "Bps",
                  legend="job {{workload_job}} {{label}} {{transport}} {{routing}}"),
        PanelSpec("Efficiency (busbw / link rate)",
                  f"fabriclab_collective_efficiency_ratio{{{JOB}}}{ZERO}", "percentunit",
                  legend="job {{workload_job}} {{label}} {{transport}}"),
        PanelSpec("Collective time p50", "histogram_quantile(0.5, sum by (le, label, op, "
                  f"transport) (fabriclab_collective_duration_seconds_bucket{{{JOB}}})){ZERO}",
                  "s", legend="{{label}} {{transport}}"),
        PanelSpec("Collectives finished", f"sum by (label, transport) "
                  f"(fabriclab_collective_duration_seconds_count{{{JOB}}}){ZERO}", "short",
                  legend="{{label}} {{transport}}"),
        PanelSpec("Transport: sent", f"sum by (transport) "
                  f"(rate(fabriclab_transport_sent_bytes_total{{{JOB}}}[{RATE}])){ZERO}", "Bps",
                  legend="{{transport}}"),
        PanelSpec("Transport: retransmitted share", f"sum by (transport) "
                  f"(fabriclab_transport_retransmitted_bytes_total{{{JOB}}}) / (sum by "
                  f"(transport) (fabriclab_transport_sent_bytes_total{{{JOB}}}) > 0) or sum by "
                  f"(transport) (fabriclab_transport_sent_bytes_total{{{JOB}}}) * 0{ZERO}",
                  "percentunit", legend="{{transport}}",
                  description="Retransmitted payload bytes over payload bytes sent."),
        PanelSpec("Transport: out-of-order arrivals", f"sum by (transport) "
                  f"(fabriclab_transport_out_of_order_packets_total{{{JOB}}}){ZERO}", "short",
                  legend="{{transport}}"),
        PanelSpec("Transport: rate or window cuts", f"sum by (transport) "
                  f"(fabriclab_transport_rate_cuts_total{{{JOB}}}){ZERO}", "short",
                  legend="{{transport}}",
                  description="The UDP transports' cuts (TCP's are not counted: 0)."),
    )),
    DashboardSpec("fabriclab-controller", "fabriclab / controller", RUN_VARIABLES, (
        PanelSpec("Switches", f"fabriclab_controller_switches{{{RUN}}}", "short",
                  legend="{{state}}"),
        PanelSpec("OpenFlow operations sent", "sum by (kind) "
                  f"(rate(fabriclab_controller_openflow_operations_total{{{RUN}}}[{RATE}]))",
                  "ops", legend="{{kind}}"),
        PanelSpec("Port events (links down or up)",
                  f"fabriclab_controller_port_events_total{{{RUN}}}", "short"),
        PanelSpec("Reroutes", f"fabriclab_controller_reroutes_total{{{RUN}}}", "short",
                  description="Port events that changed forwarding."),
        PanelSpec("Stats poll p99", "histogram_quantile(0.99, sum by (le) "
                  f"(fabriclab_controller_stats_poll_seconds_bucket{{{RUN}}})) >= 0" + ZERO,
                  "s", description="Adaptive routing's statistics rounds (0: no rounds)."),
        PanelSpec("Elephants placed", f"fabriclab_controller_elephants_placed_total{{{RUN}}}",
                  "short"),
        PanelSpec("Controller CPU", f'rate(process_cpu_seconds_total{{job="controller", {RUN}}}'
                  f"[{RATE}])", "percentunit"),
    )),
    DashboardSpec("fabriclab-fidelity", "fabriclab / emulator fidelity",
                  (*RUN_VARIABLES, *PORT_VARIABLES), (
        PanelSpec("Machine CPU busy", "1 - sum by (instance, machine) (rate("
                  f'fabriclab_machine_cpu_seconds_total{{mode=~"idle|iowait"}}[{RATE}])) / '
                  "sum by (instance, machine) (fabriclab_machine_cpu_cores)", "percentunit",
                  legend="{{machine}}",
                  description="Above ~90 % the machine, not the network, decides the result "
                              "(on a cluster, each machine's)."),
        PanelSpec("Switching CPU (cores)", "sum by (machine, vswitchd, switches) (rate("
                  f"fabriclab_vswitchd_cpu_seconds_total[{RATE}])) or on(machine) sum by "
                  f"(machine) (rate(fabriclab_machine_cpu_seconds_total{{mode=\"softirq\"}}"
                  f"[{RATE}]))", "short", legend="{{machine}} {{vswitchd}} {{switches}}",
                  description="Open vSwitch's daemons, each with the switches it serves; "
                              "with eBPF switches, which forward in the kernel, the machine's "
                              "softirq time."),
        PanelSpec("Achieved / configured rate of busy ports",
                  f"({UTIL}) and on (switch, port) (sum by (switch, port) "
                  f"(min_over_time(fabriclab_port_queue_bytes{{{PORT}}}[{RATE}])) > 0){ZERO}",
                  "percentunit", legend="{{switch}}:{{port}}",
                  description="Ports whose queue never emptied over the window send at "
                              "their configured rate in a faithful emulation (1.0); 0 while "
                              "no port's queue stayed non-empty (nothing to judge)."),
    )),
)


def _panel(spec: PanelSpec):
    target = Dataquery().expr(spec.expr).legend_format(spec.legend or "__auto").ref_id("A")
    if spec.kind == "heatmap":
        panel = heatmap.Panel().calculate(False)
    elif spec.kind == "stat":
        panel = stat.Panel()
    else:
        panel = timeseries.Panel()
    panel = panel.title(spec.title).datasource(DATASOURCE).with_target(target).unit(spec.unit)
    if spec.description:
        panel = panel.description(spec.description)
    return panel.height(8).span(12)


def build(spec: DashboardSpec) -> dict:
    """The dashboard's JSON model."""
    board = (gdash.Dashboard(spec.title).uid(spec.uid).tags(["fabriclab", "generated"])
             .refresh("5s").time("now-15m", "now"))
    board = board.with_variable(
        gdash.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        .current(VariableOption(selected=True, text=DATASOURCE_UID, value=DATASOURCE_UID)))
    for var in spec.variables:
        # all: any value, and none (a single run has no variant)
        board = board.with_variable(
            gdash.QueryVariable(var.name).label(var.name).datasource(DATASOURCE)
            .query(f"label_values({var.metric}, {var.label})").multi(True).include_all(True)
            .all_value(".*").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED))
    for title, color, expr in ANNOTATIONS:
        board = board.annotation(gdash.AnnotationQuery().name(title).datasource(DATASOURCE)
                                 .expr(expr).enable(True).icon_color(color))
    for panel in spec.panels:
        board = board.with_panel(_panel(panel))
    return json.loads(JSONEncoder(sort_keys=True, indent=2).encode(board.build()))


def render(spec: DashboardSpec) -> str:
    """The dashboard file's text."""
    return json.dumps(build(spec), indent=2, sort_keys=True) + "\n"


def write(out_dir: Path = OUT_DIR) -> list[Path]:
    """Write every dashboard's JSON; returns the files."""
    make_dirs(out_dir)
    paths = []
    for spec in DASHBOARDS:
        path = out_dir / f"{spec.uid}.json"
        write_text_atomic(path, render(spec))
        paths.append(path)
    return paths


@dataclass(frozen=True)
class GraphLink:
    """One panel as a link to Prometheus's own graph page, its query filled in."""

    dashboard: str
    title: str
    expr: str
    url: str
    description: str = ""


def graph_links(base_url: str, start: float, end: float,
                rate_interval: str) -> dict[str, tuple[str, list[GraphLink]]]:
    """Every dashboard's panels as links into Prometheus's graph page (``/graph``, as its UI
    reads them back: ``g0.expr``, ``g0.range_input``, ``g0.end_input``), the range being the
    run's; variables at "all" and ``$__rate_interval`` as given. Where Grafana cannot run,
    this is the way to look at a run's data as the dashboards group it.

    Returns:
        dashboard title -> (a link showing all of its panels on one page, each panel's).
    """
    range_s = max(1, math.ceil(end - start))
    end_text = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(math.ceil(end)))
    out = {}
    for spec in DASHBOARDS:
        variables = {v.name: ".*" for v in spec.variables}
        exprs = [resolved(p.expr, variables, rate_interval) for p in spec.panels]
        links = [GraphLink(spec.title, p.title, expr,
                           _graph_url(base_url, [expr], range_s, end_text), p.description)
                 for p, expr in zip(spec.panels, exprs)]
        out[spec.title] = (_graph_url(base_url, exprs, range_s, end_text), links)
    return out


def grafana_links(base_url: str, start: float, end: float) -> dict[str, str]:
    """Every dashboard in a Grafana at ``base_url`` over a run's time range (a past run's data
    is found without the time picker): dashboard title -> its URL."""
    span = {"from": math.floor(start * 1000), "to": math.ceil(end * 1000)}
    return {spec.title: f"{base_url}/d/{spec.uid}?{urllib.parse.urlencode(span)}"
            for spec in DASHBOARDS}


def _graph_url(base_url: str, exprs: list[str], range_s: int, end_text: str) -> str:
    params = {}
    for i, expr in enumerate(exprs):
        params |= {f"g{i}.expr": expr, f"g{i}.tab": "0", f"g{i}.range_input": f"{range_s}s",
                   f"g{i}.end_input": end_text}
    return f"{base_url}/graph?{urllib.parse.urlencode(params)}"


def links_page(links: dict[str, tuple[str, list[GraphLink]]], title: str) -> str:
    """:func:`graph_links` as one HTML page, grouped as the dashboards are."""
    parts = [f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:70em;margin:2em auto}"
             "li{margin:.3em 0}small{color:#555}</style>", f"<h1>{html.escape(title)}</h1>",
             "<p>Each link opens Prometheus's graph page with the panel's query and the run's "
             "time range (times in UTC).</p>"]
    for board, (all_url, panels) in links.items():
        parts.append(f"<h2>{html.escape(board)} <small>(<a href=\"{html.escape(all_url)}\">"
                     f"all {len(panels)} panels on one page</a>)</small></h2><ul>")
        for link in panels:
            text = f" <small>{html.escape(link.description)}</small>" if link.description else ""
            parts.append(f"<li><a href=\"{html.escape(link.url)}\">"
                         f"{html.escape(link.title)}</a>{text}</li>")
        parts.append("</ul>")
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    for written in write(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT_DIR):
        print(written)
