"""What could stall a command forever ends with a named error instead (root: a private
ovsdb-server)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from testbed.errors import TestbedError
from testbed.linux import ovs
from testbed.linux.procfs import read_stat


def test_an_ovsdb_transaction_with_a_stopped_server_fails_in_its_deadline(tmp_path, monkeypatch):
    """A stopped ovsdb-server (SIGSTOP: the socket accepts, nothing answers) once hung a
    failure's signal, ``fabriclab fail`` and process exit: now a named error at the deadline."""
    inst = ovs.Instance(tmp_path / "ovs", "stall")
    try:
        inst.start_db({"vlan-limit": "0"})
        pid = inst.pids["ovsdb-server"]
        query = [{"op": "select", "table": "Open_vSwitch", "where": [], "columns": ["_uuid"]}]
        assert ovs.transact(inst.db, query, "a select")[0]["rows"]
        monkeypatch.setattr(ovs, "TRANSACT_TIMEOUT_S", 1)
        os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(TestbedError) as err:
            ovs.transact(inst.db, query, "a select")
        took = time.monotonic() - start
        assert "did not answer in 1 s" in str(err.value) and "a select" in str(err.value)
        assert 0.9 <= took < 3.0, took
    finally:
        _end(inst.pids.get("ovsdb-server"))


def _end(pid: int | None) -> None:
    """End the test's own server by its PID (resumed first: a stopped process ignores TERM)."""
    if pid is None:
        return
    for sig in (signal.SIGCONT, signal.SIGTERM):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
    for _ in range(50):
        stat = read_stat(pid)
        if stat is None or stat.gone:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
