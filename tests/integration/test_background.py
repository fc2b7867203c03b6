"""Fabrics in the background: ``fabriclab up -d`` returns once the fabric is up with its run
id, ``ls`` lists it, a second one is refused by name, ``down`` tears it down and nothing is
left (root: real fabrics)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from tests.integration.conftest import ROOT

EXPERIMENT = """version: 1
name: background
fabric: {topology: leaf_spine, leaves: 2, spines: 1, hosts_per_leaf: 2}
emulator: {datapath: ebpf}
"""


def _cli(state, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state),
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout_s)


def test_a_fabric_kept_up_in_the_background_is_listed_and_taken_down(tmp_path):
    exp = tmp_path / "bg.yaml"
    exp.write_text(EXPERIMENT)
    state = tmp_path / "state"
    up = _cli(state, "up", "-d", str(exp))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        run_id = up.stdout.strip()
        listed = json.loads(_cli(state, "ls", "--json").stdout)
        assert [(r["run"], r["experiment"], r["hosts"]) for r in listed] == \
            [(run_id, "background", 4)]
        assert listed[0]["controller"].startswith("127.0.0.1:")
        again = _cli(state, "up", "-d", str(exp))
        assert again.returncode == 3 and f"another fabric is up (run {run_id}" in again.stderr
        table = _cli(state, "ls").stdout
        assert run_id in table and "background" in table
        # the eBPF switches answer ovs-ofctl through their management sockets
        flows = _cli(state, "ofctl", "leaf1", "dump-flows")
        assert flows.returncode == 0 and "nw_dst=10.0.1.1 actions=output:1" in flows.stdout, \
            flows.stdout + flows.stderr
        groups = _cli(state, "ofctl", "leaf1", "dump-groups")
        assert groups.returncode == 0 and "type=select" in groups.stdout, groups.stderr
    finally:
        down = _cli(state, "down", "--json")
    assert down.returncode == 0, down.stdout + down.stderr
    assert json.loads(down.stdout) == {"down": [run_id]}
    assert json.loads(_cli(state, "ls", "--json").stdout) == []
    gone = _cli(state, "down")
    assert gone.returncode == 3 and "no running fabric" in gone.stdout + gone.stderr


def test_into_the_network_exec_in_a_host_and_ofctl_on_a_switch(tmp_path):
    """On a fabric kept up in the background (Open vSwitch): ``exec h1_1 -- fping`` reaches
    another host, ``exec`` runs in the host's namespace (its address), ``ofctl leaf1
    dump-flows`` shows the controller's routes through the switch's private socket; a host or
    switch that is not there is named."""
    exp = tmp_path / "bg.yaml"
    exp.write_text(EXPERIMENT.replace("datapath: ebpf", "datapath: ovs"))
    state = tmp_path / "state"
    up = _cli(state, "up", "-d", str(exp))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        ping = _cli(state, "exec", "h1_1", "--", "fping", "-c1", "-t", "2000", "10.0.2.1")
        assert ping.returncode == 0 and "1/1/0%" in ping.stdout + ping.stderr, ping.stderr
        addr = _cli(state, "exec", "h1_1", "--", "ip", "-br", "addr")
        assert "10.0.1.1/" in addr.stdout and "h1_1-eth0" in addr.stdout, addr.stdout
        flows = _cli(state, "ofctl", "leaf1", "dump-flows")
        assert flows.returncode == 0 and "OF1.5" in flows.stdout, flows.stderr
        assert "nw_dst=10.0.1.1 actions=output:1" in flows.stdout, flows.stdout
        named = subprocess.run(["ip", "netns", "exec", "h2_1", "ip", "-br", "addr"],
                               capture_output=True, text=True, check=False)
        assert named.returncode == 0 and "10.0.2.1/" in named.stdout, named.stderr
        _capture_a_ping(state, tmp_path / "h1.pcap")
        nohost = _cli(state, "exec", "h9_9", "--", "true")
        assert nohost.returncode == 3 and "no host 'h9_9'" in nohost.stdout + nohost.stderr
        noswitch = _cli(state, "ofctl", "spine9", "show")
        assert noswitch.returncode == 3 and \
            "no switch 'spine9'" in noswitch.stdout + noswitch.stderr
    finally:
        down = _cli(state, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not {"h1_1", "h1_2", "h2_1", "h2_2"} & {line.split()[0] for line in
                                                     names.splitlines() if line.strip()}


def _capture_a_ping(state, pcap) -> None:
    """``capture leaf1 h1_1 -w FILE`` while h1_1 pings h2_1 three times, stopped with Ctrl-C
    (SIGINT): the pcap holds the three requests and three replies, as ``tcpdump -r`` reads
    them; a switch alone is refused, naming its links."""
    cap = subprocess.Popen([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state),
                            "capture", "leaf1", "h1_1", "-w", str(pcap), "--filter", "icmp"],
                           stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        seen = ""
        while "listening on" not in seen:  # tcpdump says so once the capture is open
            line = cap.stderr.readline()
            assert line, f"capture ended early: {seen}"
            seen += line
        assert "leaf1-eth" in seen, seen
        ping = _cli(state, "exec", "h1_1", "--", "fping", "-c3", "-p", "100", "10.0.2.1")
        assert ping.returncode == 0, ping.stderr
    finally:
        cap.send_signal(signal.SIGINT)
        rest = cap.communicate(timeout=30)[1]
    assert cap.returncode == 0, rest
    read = subprocess.run(["tcpdump", "-r", str(pcap), "-n"], capture_output=True, text=True)
    assert read.returncode == 0, read.stderr
    lines = read.stdout.splitlines()
    assert sum("10.0.1.1 > 10.0.2.1: ICMP echo request" in l for l in lines) == 3, lines
    assert sum("10.0.2.1 > 10.0.1.1: ICMP echo reply" in l for l in lines) == 3, lines
    switch = _cli(state, "capture", "leaf1")
    assert switch.returncode == 2 and "leaf1 has" in switch.stdout + switch.stderr
