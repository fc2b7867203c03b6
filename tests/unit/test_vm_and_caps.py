"""Offline parts of the vm backend and of the capability probe: a hostile results tar from the
guest writes nothing outside its folder; the capability cache is used within a boot, redone
after a reboot or when unreadable."""

import io
import json
import tarfile

from testbed.linux import capabilities

from testbed.vm import guest as vm
from testbed.vm import labvm


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"x", **fields) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data) if fields.get("type", tarfile.REGTYPE) == tarfile.REGTYPE else 0
    for key, value in fields.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if info.size else None)


def test_a_hostile_results_tar_stays_in_its_folder(tmp_path):
    disk, out, console = tmp_path / "out.img", tmp_path / "guest" / "out", tmp_path / "c.log"
    console.write_text("")
    with tarfile.open(disk, "w") as tar:
        _add(tar, "./rc", b"0\n")
        _add(tar, "./output.txt", b"all pairs reachable\n")
        _add(tar, "./results/results.json", b"{}", mode=0o4777)
        _add(tar, "../escaped", b"evil")
        _add(tar, "/tmp/absolute-escape", b"evil")
        _add(tar, "./results/../../escaped2", b"evil")
        _add(tar, "./link", type=tarfile.SYMTYPE, linkname="/etc/passwd")
        _add(tar, "./hard", type=tarfile.LNKTYPE, linkname="/etc/passwd")
        _add(tar, "./dev", type=tarfile.CHRTYPE, devmajor=1, devminor=3)
    result = vm._collect(disk, out, console, 1.0)
    assert (result.returncode, result.output) == (0, "all pairs reachable\n")
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert written == ["c.log", "guest", "guest/out", "guest/out/output.txt",
                       "guest/out/rc", "guest/out/results", "guest/out/results/results.json",
                       "out.img"]
    assert (out / "results" / "results.json").stat().st_mode & 0o7777 == 0o755


def test_results_without_an_exit_code_count_as_a_failed_job(tmp_path):
    disk, out, console = tmp_path / "out.img", tmp_path / "out", tmp_path / "c.log"
    console.write_text("")
    with tarfile.open(disk, "w") as tar:
        _add(tar, "./rc", b"not a number")
    assert vm._collect(disk, out, console, 1.0).returncode == 3


def test_the_capability_cache_is_used_within_a_boot(tmp_path, monkeypatch):
    probes = []
    monkeypatch.setattr(capabilities, "_boot_id", lambda: "boot-1")
    monkeypatch.setattr(capabilities, "probe_qdiscs",
                        lambda: probes.append("qdiscs") or {"htb": True, "netem": False})
    monkeypatch.setattr(capabilities, "probe_ovs_kernel_datapath",
                        lambda: probes.append("ovs") or False)
    caps = capabilities.probe(tmp_path)
    assert (caps.datapath_type, caps.has_qdisc("htb"), caps.has_qdisc("netem")) == (
        "netdev", True, False)
    assert json.loads((tmp_path / "capabilities.json").read_text())["boot_id"] == "boot-1"
    assert capabilities.probe(tmp_path).qdiscs == caps.qdiscs and len(probes) == 2  # cached
    monkeypatch.setattr(capabilities, "_boot_id", lambda: "boot-2")  # rebooted
    capabilities.probe(tmp_path)
    assert len(probes) == 4
    (tmp_path / "capabilities.json").write_text('{"boot_id": "boot-2"}')  # damaged
    assert capabilities.probe(tmp_path).has_qdisc("htb") and len(probes) == 6
    capabilities.probe(tmp_path, refresh=True)
    assert len(probes) == 8


def test_a_congestion_control_this_kernel_lacks_moves_auto_to_the_vm(tmp_path, monkeypatch):
    from fabriclab.model import experiment as xp
    from fabriclab.modes import resolve_backend
    from testbed.model.spec import Requirement

    caps = capabilities.Capabilities("6.x-test", False, {"htb": True, "bfifo": True,
                                                         "clsact": True},
                                     tcp_congestion=["reno", "cubic", "bbr"])
    monkeypatch.setattr(capabilities, "probe", lambda state_dir, refresh=False: caps)
    base = {"version": 1, "fabric": {"topology": "leaf_spine", "leaves": 2, "spines": 1,
                                     "hosts_per_leaf": 1}}
    dctcp = xp.parse({**base, "workload": {"collectives": [
        {"op": "all_reduce", "size": 64, "congestion_control": "dctcp"}]}})
    cubic = xp.parse({**base, "workload": {"congestion_control": "cubic",
                                           "collectives": [{"op": "all_reduce", "size": 64}]}})
    assert resolve_backend(dctcp, None, tmp_path) == "vm"
    assert resolve_backend(cubic, None, tmp_path) == "host"
    assert resolve_backend(dctcp, "host", tmp_path) == "host"  # asked for: the build refuses
    need = Requirement("workload job 0.congestion_control", "tcp_cc", "dctcp")
    assert need in dctcp.requirements() and not caps.has(need)
    assert "'dctcp'" in caps.explain_missing(need) and "reno, cubic, bbr" in \
        caps.explain_missing(need)


def test_the_lab_vms_console_tail_is_plain_text_and_says_when_there_is_none(tmp_path):
    log = tmp_path / "console.log"
    assert "no console log at" in labvm.console_tail(log)
    log.write_bytes(b"")
    assert "is empty" in labvm.console_tail(log)
    log.write_bytes(b"[    1.0] kernel line\n\x1b[0;32m  OK  \x1b[0m] Started ssh\r\n"
                    b"\x1bM\x1b[K[ \x1b[0;31m*\x1b[0m] (1 of 2) Job ssh-host-keys.service/start "
                    b"running (250s / no limit)\r\xff\n\n")
    assert labvm.console_tail(log).splitlines() == [
        "[    1.0] kernel line", "  OK  ] Started ssh",
        "[ *] (1 of 2) Job ssh-host-keys.service/start running (250s / no limit)", "\ufffd"]
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert labvm.console_tail(log, lines=3).splitlines() == ["line 97", "line 98", "line 99"]


def test_a_guest_run_keeps_its_console_and_results_and_removes_its_disks(tmp_path, monkeypatch):
    """The job and results disks (64 MiB in the state directory, a tmpfs) go when the run
    ends; the console log and what the job left stay. QEMU's part is played by a process that
    writes the results tar onto the results disk, as the guest does."""
    import sys

    from testbed.runs.registry import Registry

    script = ("import io, sys, tarfile\n"
              "with tarfile.open(sys.argv[1], 'w') as tar:\n"
              "    for name, data in (('./rc', b'0\\n'), ('./output.txt', b'done\\n')):\n"
              "        info = tarfile.TarInfo(name); info.size = len(data)\n"
              "        tar.addfile(info, io.BytesIO(data))\n")
    monkeypatch.setattr(vm, "qemu_command", lambda image, job, out, console, *rest:
                        [sys.executable, "-c", script, str(out)])
    work = tmp_path / "vm" / "run"
    result = vm.run(None, "true", {}, work, Registry(tmp_path / "state"), timeout_s=60)
    assert result.returncode == 0 and result.output == "done\n"
    assert sorted(p.name for p in work.iterdir()) == ["console.log", "out"]
    assert (work / "out" / "rc").read_text() == "0\n"
