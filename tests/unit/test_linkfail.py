"""A link failure's order of steps (testbed/fabric/linkfail.py): the cut first, then the switches told
of the loss of signal, then the veths down; a repair backwards. Fakes stand in for netlink, the
cut program and Open vSwitch; the steps are recorded in the order they happen."""

from __future__ import annotations

from testbed.fabric.linkfail import End, set_links


class Steps:
    def __init__(self) -> None:
        self.log: list[tuple] = []

    # netlink
    def set_state(self, ifname, up, pid=None):
        self.log.append(("up" if up else "down", ifname))

    # the cut program
    def cut(self, netlink, end):
        self.log.append(("cut", end.ifname))

    def mend(self, netlink, end):
        self.log.append(("mend", end.ifname))

    # Open vSwitch
    def signal(self, ends, lost):
        self.log += [("lost" if lost else "regained", end.ifname) for end in ends]


LINKS = [(End("edge1_1-eth3", None, True, "/run/a.sock"), End("agg1_1-eth1", None, True)),
         (End("h1_1_1-eth0", 4242, False), End("edge1_1-eth1", None, True))]


def _kinds(log: list[tuple]) -> list[str]:
    """The step kinds in order, each run of one kind once."""
    out: list[str] = []
    for kind, _ in log:
        if not out or out[-1] != kind:
            out.append(kind)
    return out


def test_a_failure_cuts_then_tells_the_switches_then_takes_the_veths_down():
    steps = Steps()
    times = set_links(steps, LINKS, False, steps, steps.signal)
    assert _kinds(steps.log) == ["cut", "lost", "down"]
    assert sorted(i for k, i in steps.log if k == "cut") == sorted(
        e.ifname for pair in LINKS for e in pair)  # every end, hosts' too
    assert sorted(i for k, i in steps.log if k == "lost") == [  # switch ends only
        "agg1_1-eth1", "edge1_1-eth1", "edge1_1-eth3"]
    assert list(times) == ["cut_s", "signalled_s", "down_s"]
    assert times["cut_s"] <= times["signalled_s"] <= times["down_s"]


def test_a_repair_brings_the_veths_up_then_mends_then_tells_the_switches():
    steps = Steps()
    times = set_links(steps, LINKS, True, steps, steps.signal)
    assert _kinds(steps.log) == ["up", "mend", "regained"]
    assert list(times) == ["up_s", "mended_s", "signalled_s"]


def test_without_the_cut_program_the_switches_are_still_told_first():
    steps = Steps()
    assert list(set_links(steps, LINKS, False, None, steps.signal)) == ["signalled_s", "down_s"]
    assert _kinds(steps.log) == ["lost", "down"]
