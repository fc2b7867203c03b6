"""Integration tests of your own against a live fabric, with fabriclab's pytest plugin (as
root: ``.venv/bin/python -m pytest examples/test_my_fabric.py``). Each test gets the fabric
its marker names, built before it and torn down after it."""

import pytest


@pytest.mark.fabriclab("examples/small.yaml")
def test_every_pair_is_reachable(fabric):
    reach = fabric.check()
    assert reach.complete, reach.failed


@pytest.mark.fabriclab("examples/small.yaml")
def test_hosts_stay_reachable_with_a_spine_link_down(fabric):
    fabric.fail("leaf2", "spine2")
    ping = fabric.exec("h1_1", ["fping", "-c3", "-p", "200", fabric.ip("h2_2")])
    assert ping.returncode == 0, ping.stdout + ping.stderr
