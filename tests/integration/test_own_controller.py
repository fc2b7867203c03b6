"""A controller of your own: the os-ken apps in ``examples/`` (``controller.app``), run by
fabriclab's launcher in place of its routing, and a controller the test runs itself
(``controller.remote``), route real fabrics to every pair reachable; os-ken's LLDP discovery
finds the links on both datapaths, and the classic OpenFlow 1.3 learning switch reaches every
pair of a loop-free fabric (root: real fabrics)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from testbed.poll import wait_for
from tests.integration.conftest import DATAPATHS, ROOT

QUICKSTART = (ROOT / "experiments" / "quickstart.yaml").read_text()


def _cli(state, *args: str, timeout_s: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state),
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout_s)


def _check(tmp_path, experiment: str) -> dict:
    path = tmp_path / "exp.yaml"
    path.write_text(experiment)
    done = _cli(tmp_path / "state", "up", "--check", "--json", str(path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:] + _logs(done.stdout)
    return json.loads(done.stdout)


def _logs(stdout: str) -> str:
    """The ends of the logs a failed check kept (the controller's, every vswitchd's)."""
    try:
        kept = json.loads(stdout).get("logs")
    except ValueError:
        return ""
    return "".join(f"\n--- {log}\n" + log.read_text(errors="replace")[-3000:]
                   for log in sorted(Path(kept).rglob("*")) if log.is_file()) if kept else ""


def _with_controller(text: str, controller: str) -> str:
    """The quickstart experiment with its controller section replaced."""
    head, _, rest = text.partition("controller:\n")
    tail = rest.split("\nworkload:", 1)[1]
    return f"{head}controller: {controller}\nworkload:{tail}"


def test_an_app_from_examples_routes_the_quickstart_fabric(tmp_path):
    app = ROOT / "examples" / "shortest_path.py"
    doc = _check(tmp_path, _with_controller(QUICKSTART, f"{{app: {app}}}"))
    reach = doc["reachability"]
    assert (reach["ok"], reach["pairs"], reach["lost"]) == (240, 240, 0), reach


def test_a_remote_controller_the_user_runs_routes_the_quickstart_fabric(tmp_path):
    """The controller is os-ken with the same example app, started here as a user would start
    theirs, on a port of the OS's choosing; the fabric starts no controller of its own."""
    exp = tmp_path / "qs.yaml"
    exp.write_text(QUICKSTART)
    topo = tmp_path / "topology.json"
    drawn = _cli(tmp_path / "state", "graph", str(exp), "--format", "json", "-o", str(topo))
    assert drawn.returncode == 0, drawn.stderr
    port_file, log = tmp_path / "port", tmp_path / "remote.log"
    remote = subprocess.Popen([sys.executable, "-m", "controllers.launcher", "--topology",
                               str(topo), "--status", str(tmp_path / "status.json"), "--port",
                               "0", "--port-file", str(port_file), "--log", str(log),
                               "--user-app", str(ROOT / "examples" / "shortest_path.py")],
                              cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        port = wait_for(lambda: port_file.exists() and port_file.read_text().strip(), 30,
                        "the remote controller to listen")
        doc = _check(tmp_path, _with_controller(QUICKSTART, f"{{remote: '127.0.0.1:{port}'}}"))
        assert doc["controller"] == f"127.0.0.1:{port}"
        reach = doc["reachability"]
        assert (reach["ok"], reach["pairs"], reach["lost"]) == (240, 240, 0), reach
        assert remote.poll() is None, remote.stderr.read()
    finally:
        remote.terminate()
        remote.wait(10)
        remote.stderr.close()
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def _leaf_spine(app: str, datapath: str, spines: int) -> str:
    return f"""version: 1
name: own
fabric: {{topology: leaf_spine, leaves: 3, spines: {spines}, hosts_per_leaf: 2,
          host_link: {{rate_mbps: 5}}, fabric_link: {{rate_mbps: 5}}}}
emulator: {{datapath: {datapath}}}
controller: {{app: {ROOT / "examples" / app}}}
"""


@DATAPATHS
def test_lldp_discovery_finds_the_links_for_an_openflow_1_3_app(tmp_path, datapath):
    """os-ken's LLDP discovery speaks OpenFlow 1.3 (not 1.5): both datapaths' switches take
    it, and its links route every pair."""
    # settle_s 10: on a loaded machine a switch's links were once found more than 2 s after
    # the tables last changed (a leaf's LLDP through its vswitchd, the packet-in, the app's
    # half-second reroute), and the default settle declared the fabric ready without them;
    # under the whole suite on two cores, a leaf's links once took longer than 5 s (Open
    # vSwitch: its pairs unreachable)
    doc = _check(tmp_path, _leaf_spine("shortest_path_lldp.py", datapath, 2)
                 .replace("controller: {app:", "controller: {settle_s: 10, app:"))
    reach = doc["reachability"]
    assert (reach["ok"], reach["pairs"], reach["lost"]) == (30, 30, 0), reach


@DATAPATHS
def test_the_classic_openflow_1_3_learning_switch_reaches_every_pair(tmp_path, datapath):
    """examples/learning_switch.py (OpenFlow 1.3 only: table-miss to the controller,
    flooding packet-outs, flows on in_port, eth_dst and eth_src) on a loop-free leaf-spine."""
    doc = _check(tmp_path, _leaf_spine("learning_switch.py", datapath, 1))
    reach = doc["reachability"]
    assert (reach["ok"], reach["pairs"], reach["lost"]) == (30, 30, 0), reach


@DATAPATHS
def test_a_failed_check_keeps_the_logs_and_every_switchs_tables(tmp_path, datapath):
    """An app that routes nothing: the check fails (exit 1) and says where it kept the run's
    logs, the controller's and every switch's flow table among them."""
    app = tmp_path / "nothing.py"
    app.write_text("from os_ken.base import app_manager\n"
                   "from os_ken.controller import ofp_event\n"
                   "from os_ken.controller.handler import CONFIG_DISPATCHER, set_ev_cls\n"
                   "from os_ken.ofproto import ofproto_v1_3\n\n\n"
                   "class Nothing(app_manager.OSKenApp):\n"
                   "    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]\n\n"
                   "    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)\n"
                   "    def switch_features(self, ev):\n"
                   "        pass  # a switch connected: nothing installed\n")
    path = tmp_path / "exp.yaml"
    path.write_text(_leaf_spine("learning_switch.py", datapath, 1)
                    .replace(str(ROOT / "examples" / "learning_switch.py"), str(app)))
    done = _cli(tmp_path / "state", "up", "--check", "--json", str(path))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["reachability"]["ok"] == 0
    kept = Path(doc["logs"])
    assert kept.is_relative_to(tmp_path / "state" / "logs") and (kept / "controller.log").is_file()
    tables = {p.stem: p.read_text() for p in (kept / "tables").glob("*.txt")}
    assert set(tables) == {"spine1", "leaf1", "leaf2", "leaf3"}, sorted(tables)
    assert all("OFPST_FLOW reply" in text for text in tables.values()), tables
