"""Grafana dashboards as code (grafana-foundation-sdk): the fabric overview, collective
performance, controller activity and emulator fidelity, over the exporters' metrics.

Every panel is declared once in :data:`DASHBOARDS` (title, PromQL, unit, kind), so the
integration test runs exactly the queries Grafana would. ``python -m telemetry.dashboards``
writes the JSON into ``telemetry/grafana/dashboards/`` (the provisioning layout Grafana and
the lab VM mount); a unit test checks the committed files are what this module generates.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import heatmap, stat, timeseries
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

DATASOURCE_UID = "fabriclab-prometheus"
DATASOURCE = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
OUT_DIR = Path(__file__).resolve().parent / "grafana" / "dashboards"
RATE = "$__rate_interval"
PORT = 'switch=~"$switch", tier=~"$tier"'
UTIL = (f"rate(fabriclab_port_transmit_bytes_total{{{PORT}}}[{RATE}]) * 8"
        f" / fabriclab_port_speed_bits_per_second{{{PORT}}}")
JOB = 'workload_job=~"$job"'


@dataclass(frozen=True)
class PanelSpec:
    """One panel: what it shows and the query behind it."""

    title: str
    expr: str
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | heatmap | stat
    legend: str = ""
    description: str = ""


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


PORT_VARIABLES = (Variable("switch", "fabriclab_port_transmit_bytes_total", "switch"),
                  Variable("tier", "fabriclab_port_transmit_bytes_total", "tier"))

DASHBOARDS = (
    DashboardSpec("fabriclab-fabric", "fabriclab / fabric", PORT_VARIABLES, (
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
                  f"(rate(fabriclab_port_drops_total{{{PORT}}}[{RATE}]))", "pps",
                  legend="{{switch}}:{{port}}"),
        PanelSpec("Ports down", f"count(fabriclab_port_up{{{PORT}}} == 0) or "
                  f"(count(fabriclab_port_up{{{PORT}}}) * 0)", "short", "stat",
                  description="Switch ports whose link has no carrier (failed links)."),
    )),
    DashboardSpec("fabriclab-collectives", "fabriclab / collectives", (
        Variable("job", "fabriclab_collective_busbw_bits_per_second", "workload_job"),), (
        PanelSpec("Bus bandwidth (latest collective)",
                  f"fabriclab_collective_busbw_bits_per_second{{{JOB}}}", "bps",
                  legend="job {{workload_job}} {{label}} {{transport}} {{routing}}"),
        PanelSpec("Efficiency (busbw / link rate)",
                  f"fabriclab_collective_efficiency_ratio{{{JOB}}}", "percentunit",
                  legend="job {{workload_job}} {{label}} {{transport}}"),
        PanelSpec("Collective time p50", "histogram_quantile(0.5, sum by (le, label, op, "
                  f"transport) (fabriclab_collective_duration_seconds_bucket{{{JOB}}}))", "s",
                  legend="{{label}} {{transport}}"),
        PanelSpec("Collectives finished", f"sum by (label, transport) "
                  f"(fabriclab_collective_duration_seconds_count{{{JOB}}})", "short",
                  legend="{{label}} {{transport}}"),
        PanelSpec("Transport: sent", f"sum by (transport) "
                  f"(rate(fabriclab_transport_sent_bytes_total{{{JOB}}}[{RATE}])) * 8", "bps",
                  legend="{{transport}}"),
        PanelSpec("Transport: retransmitted share", f"sum by (transport) "
                  f"(fabriclab_transport_retransmitted_packets_total{{{JOB}}}) / sum by "
                  f"(transport) (fabriclab_transport_sent_packets_total{{{JOB}}})",
                  "percentunit", legend="{{transport}}"),
        PanelSpec("Transport: out-of-order arrivals", f"sum by (transport) "
                  f"(fabriclab_transport_out_of_order_packets_total{{{JOB}}})", "short",
                  legend="{{transport}}"),
        PanelSpec("Transport: rate or window cuts", f"sum by (transport) "
                  f"(fabriclab_transport_rate_cuts_total{{{JOB}}})", "short",
                  legend="{{transport}}"),
    )),
    DashboardSpec("fabriclab-controller", "fabriclab / controller", (), (
        PanelSpec("Switches", "fabriclab_controller_switches", "short", legend="{{state}}"),
        PanelSpec("OpenFlow operations sent", "sum by (kind) "
                  f"(rate(fabriclab_controller_openflow_operations_total[{RATE}]))", "ops",
                  legend="{{kind}}"),
        PanelSpec("Port events (links down or up)", "fabriclab_controller_port_events_total",
                  "short"),
        PanelSpec("Reroutes", "fabriclab_controller_reroutes_total", "short",
                  description="Port events that changed forwarding."),
        PanelSpec("Stats poll p99", "histogram_quantile(0.99, sum by (le) "
                  "(fabriclab_controller_stats_poll_seconds_bucket))", "s"),
        PanelSpec("Elephants placed", "fabriclab_controller_elephants_placed_total", "short"),
        PanelSpec("Controller CPU", f"rate(fabriclab_controller_cpu_seconds_total[{RATE}])",
                  "percentunit"),
    )),
    DashboardSpec("fabriclab-fidelity", "fabriclab / emulator fidelity", PORT_VARIABLES, (
        PanelSpec("Machine CPU busy", "1 - sum by (instance, machine) (rate("
                  f'fabriclab_machine_cpu_seconds_total{{mode=~"idle|iowait"}}[{RATE}])) / '
                  "sum by (instance, machine) (fabriclab_machine_cpu_cores)", "percentunit",
                  legend="{{machine}}",
                  description="Above ~90 % the machine, not the network, decides the result "
                              "(on a cluster, each machine's)."),
        PanelSpec("vswitchd CPU (cores)",
                  f"rate(fabriclab_vswitchd_cpu_seconds_total[{RATE}])", "short",
                  legend="{{machine}} {{vswitchd}}"),
        PanelSpec("Achieved / configured rate of busy ports",
                  f"({UTIL}) and on (switch, port) (sum by (switch, port) "
                  f"(min_over_time(fabriclab_port_queue_bytes{{{PORT}}}[{RATE}])) > 0)",
                  "percentunit", legend="{{switch}}:{{port}}",
                  description="Ports whose queue never emptied over the window send at "
                              "their configured rate in a faithful emulation (1.0)."),
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
    for var in spec.variables:
        board = board.with_variable(
            gdash.QueryVariable(var.name).label(var.name).datasource(DATASOURCE)
            .query(f"label_values({var.metric}, {var.label})").multi(True).include_all(True)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED))
    for panel in spec.panels:
        board = board.with_panel(_panel(panel))
    return json.loads(JSONEncoder(sort_keys=True, indent=2).encode(board.build()))


def render(spec: DashboardSpec) -> str:
    """The dashboard file's text."""
    return json.dumps(build(spec), indent=2, sort_keys=True) + "\n"


def write(out_dir: Path = OUT_DIR) -> list[Path]:
    """Write every dashboard's JSON; returns the files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for spec in DASHBOARDS:
        path = out_dir / f"{spec.uid}.json"
        path.write_text(render(spec))
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT_DIR):
        print(written)
